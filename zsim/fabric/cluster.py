"""Hardware profiles: YAML files with units in key names, converted to SI once, here.

A system profile (<name>.yaml) names its GPU (gpus/), its inter-node network (networks/) and its
host-offload link (links/), and gives the node's own figures. zsim.config.profiles finds the files
(user folders first, then the built-in hwprofiles/); docs/profiles.md lists every key and its unit.
Everything downstream sees only the `Cluster` dataclasses below, in bytes, seconds and FLOP/s.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import msgspec

from zsim.compute.terms import ComputeTerms, GemmTerms
from zsim.config.profiles import Profiles
from zsim.config.schema import Name, ProfileName, profile_name
from zsim.config.struct import Meta, Section, field
from zsim.config.validation import validate
from zsim.config.yamlfile import read_yaml_mapping
from zsim.errors import ConfigError, printable
from zsim.fabric.cube_mesh import MESH_GPUS, cube_mesh_links_per_gpu
from zsim.fabric.nccl import HW_LAT_US, LL128_CEILING, LL128_COLLECTIVES, PROTOCOLS, NcclKernel

if TYPE_CHECKING:  # host profiles (CPU machines) are imported where one is loaded: a GPU run never needs them
    from zsim.config.host import HostFile, HostModel

GB = 1e9
GiB = 2**30


class _Profile(Section, kw_only=True):
    """A profile file or section: unknown keys are errors, no coercion, finite numbers, and every
    number bounded (issue 13): a rate or size > 0, an efficiency in (0, 1], a latency >= 0, and upper
    bounds far above any real hardware (so no product overflows and no division is by zero)."""


# Bounds shared by the profile files (far above real hardware of 2026: an H100 is ~1e3 TFLOPS,
# ~3e3 GB/s of HBM, 80 GiB; NDR is 400 Gb/s).
_TFLOPS = Meta(gt=0, le=1e6)
_GBPS = Meta(gt=0, le=1e6)
_EFFICIENCY = Meta(gt=0, le=1)
_LATENCY_US = Meta(ge=0, le=1e6)
Efficiency = Annotated[float, _EFFICIENCY]
LatencyUs = Annotated[float, _LATENCY_US]
Bandwidth = Annotated[float, _GBPS]
PROTOCOLS = ("LL", "LL128", "Simple")
LL128Collective = Literal[LL128_COLLECTIVES]  # the keys of a per-collective LL128 efficiency
Tile = Annotated[list[Annotated[int, Meta(gt=0)]], Meta(min_length=2, max_length=2)]  # (rows, columns) of a GEMM tile


class GemmSection(_Profile, kw_only=True):
    """The GEMM model's terms for one dtype (docs/compute.md; zsim.compute.terms.GemmTerms)."""

    efficiency: Annotated[float, Meta(gt=0, le=1)]
    tile_TBps: Annotated[float, Meta(gt=0)]
    k_overhead: Annotated[float, Meta(ge=0)]
    fixed_us: Annotated[float, Meta(ge=0)]
    hbm_efficiency: Annotated[float, Meta(gt=0, le=1)]


class GemmOverride(_Profile, kw_only=True):
    efficiency: Annotated[float, Meta(gt=0, le=1)] | None = None
    tile_TBps: Annotated[float, Meta(gt=0)] | None = None
    k_overhead: Annotated[float, Meta(ge=0)] | None = None
    fixed_us: Annotated[float, Meta(ge=0)] | None = None
    hbm_efficiency: Annotated[float, Meta(gt=0, le=1)] | None = None


class ComputeSection(_Profile, kw_only=True):
    """A GPU profile's `compute:` section: the kernel-level compute model's terms (docs/compute.md)."""

    sms: Annotated[int, Meta(gt=0)]
    tiles: Annotated[list[Tile], Meta(min_length=1)]
    hbm_efficiency: Annotated[float, Meta(gt=0, le=1)]
    kernel_us: Annotated[float, Meta(ge=0)]
    reduce_kernel_us: Annotated[float, Meta(ge=0)] | None = None
    host_op_us: Annotated[float, Meta(ge=0)]
    # tensor-core rate kept under the power cap for minutes / the GEMM tables' short-burst rate (docs/compute.md)
    sustained_ratio: Annotated[float, Meta(gt=0, le=1)] = 1.0
    gemm: dict[Literal["fp16", "bf16", "fp32", "tf32"], GemmSection]


class ComputeOverride(_Profile, kw_only=True):
    """A system profile's `compute:` section: any key of the GPU's, replacing it (e.g. fitted by
    `zsim calibrate`); `gemm.<dtype>` entries replace key by key."""

    sms: Annotated[int, Meta(gt=0)] | None = None
    tiles: Annotated[list[Tile], Meta(min_length=1)] | None = None
    hbm_efficiency: Annotated[float, Meta(gt=0, le=1)] | None = None
    kernel_us: Annotated[float, Meta(ge=0)] | None = None
    reduce_kernel_us: Annotated[float, Meta(ge=0)] | None = None
    host_op_us: Annotated[float, Meta(ge=0)] | None = None
    sustained_ratio: Annotated[float, Meta(gt=0, le=1)] | None = None
    gemm: dict[Literal["fp16", "bf16", "fp32", "tf32"], GemmOverride] = field(default_factory=dict)


class GpuFile(_Profile, kw_only=True):
    name: Name
    peak_fp16_tflops: Annotated[float, _TFLOPS]
    peak_bf16_tflops: Annotated[float, Meta(gt=0, le=1e6)] | None = None
    peak_fp32_tflops: Annotated[float, _TFLOPS]
    # TF32 tensor-core peak, dense: what fp32 GEMMs reach where the library allows TF32 (XLA's f32 rows)
    peak_tf32_tflops: Annotated[float, Meta(gt=0, le=1e6)] | None = None
    hbm_GBps: Annotated[float, _GBPS]
    memory_GiB: Annotated[float, Meta(gt=0, le=1e6)]
    compute_capability: Annotated[int, Meta(gt=0, le=1000)]
    nccl_nvlink_GBps: Annotated[float, _GBPS]
    compute: ComputeSection
    # The names CUDA reports for this part (cudaDeviceProp.name: nvidia-smi, Kineto's deviceProperties,
    # nccl-tests' Rank lines) where they are not `name` with an 'NVIDIA '/'Tesla ' prefix: zsim calibrate
    # refuses measurements of another GPU (zsim.calibrate.machines).
    device_names: list[Annotated[str, Meta(min_length=1, max_length=100)]] = []


class NetworkFit(_Profile, kw_only=True):
    """Where a network profile's terms come from: the cluster and tables they were fitted to, the node
    counts those tables span, and which terms the fit set (the rest are assumptions)."""

    cluster: Annotated[str, Meta(max_length=200)]
    tables: Annotated[str, Meta(max_length=400)]
    nodes: Annotated[list[Annotated[int, Meta(gt=0, le=1 << 20)]], Meta(min_length=2, max_length=2)]
    terms: list[Literal["efficiency", "tree_efficiency", "ll128_share", "latency_us", "latency_growth_us"]]


class NetworkFile(_Profile, kw_only=True):
    name: Name
    port_Gbps: Annotated[float, Meta(gt=0, le=1e7)]
    efficiency: Annotated[float, _EFFICIENCY]
    latency_us: Annotated[float, _LATENCY_US]
    latency_growth_us: Annotated[float, Meta(ge=0, le=1e4, description=(
        "added to every inter-node step's latency per doubling of the nodes beyond 2 (a larger fabric: "
        "more switch levels, longer proxy queues); zsim.fabric.cluster.Cluster.network_step_s"))] = 0.0
    tree_efficiency: Annotated[float, Meta(gt=0, le=1.0, description=(
        "NCCL's tree's share of the NICs relative to its ring (its kernels pipeline smaller chunks through "
        "more peers; NCCL's own tuner caps the tree per channel, tuning.cc perChMaxTreeBw)"))] = 1.0
    ll128_share: Annotated[float, Meta(gt=0, le=1.0, description=(
        "LL128's share of the NICs relative to Simple's (at most its 120/128 data share; NCCL's own tuner "
        "gives 0.92); LL keeps its 8-of-16-byte wire share"))] = 0.9375
    fit: NetworkFit | None = None  # None: every term is an assumption


class LinkFile(_Profile, kw_only=True):
    name: Name
    GBps_per_direction: Annotated[float, _GBPS]
    efficiency: Annotated[float, _EFFICIENCY]


class IntraNodeSection(_Profile, kw_only=True):
    fabric: Literal["nvswitch", "cube-mesh"]
    nvlink_links_per_gpu: Annotated[int, Meta(gt=0, le=1024)]
    nvlink_GBps_per_link: Annotated[float, _GBPS]
    nvswitches: Annotated[int, Meta(ge=0, le=1024)] = 0
    baseboards: Annotated[int, Meta(gt=0, le=1024)] = 1
    gpus_per_pcie_switch: Annotated[int, Meta(gt=0, le=1024)] = 2


class InterNodeSection(_Profile, kw_only=True):
    network: ProfileName
    nics_per_node: Annotated[int, Meta(gt=0, le=1024)]
    oversubscription: Annotated[float, Meta(ge=1.0, le=1e6)] = 1.0
    port_Gbps: Annotated[float, Meta(gt=0, le=1e7, description=(
        "one NIC port's line rate when this system's differs from the network profile's (RoCE at 100, "
        "200 or 400 Gb/s); the network's fitted efficiency and latencies still apply"))] | None = None


class NcclSection(_Profile, kw_only=True):
    launch_us: Annotated[float, _LATENCY_US]
    efficiency: Annotated[dict[Literal["LL", "LL128", "Simple"], Efficiency | dict[LL128Collective, Efficiency]],
                          Meta(description=(
                              "achieved bus bandwidth / raw bottleneck-link bandwidth per protocol; LL128 may be "
                              "one number or one per collective (broadcast, reduce, all_gather, reduce_scatter, "
                              "all_reduce), as NCCL's tuner caps it per collective (zsim.fabric.nccl)"))]
    latency_us: dict[Literal["LL", "LL128", "Simple"], LatencyUs]
    step_latency_us: dict[Literal["LL", "LL128", "Simple"], LatencyUs]
    unaligned_copy_GBps: Annotated[float, _GBPS]
    unaligned_reduce_GBps: Annotated[float, _GBPS]  # one element-wise reduce rate (zsim.fabric.nccl)
    tuner: Annotated[Literal["2.5", "2.7", "2.8", "2.23"], Meta(description=(
        "the NCCL release whose tuner picks each call's algorithm and protocol (zsim.fabric.nccl): 2.5 "
        "(v2.5.6/2.5.7, to March 2020), 2.7 (v2.7.3-2.7.8, mid 2020), 2.8 (2.8-2.9, 2021: 2.7's formulas "
        "with 2.8.4's latencies) or 2.23 (v2.23.4, 2024; stands for "
        "2.19-2.26, zsim.fabric.nccl_223; across nodes the cheapest cell)"))] = "2.7"

    def __post_init__(self) -> None:  # every protocol
        super().__post_init__()
        for key in ("efficiency", "latency_us", "step_latency_us"):
            missing = [p for p in PROTOCOLS if p not in getattr(self, key)]
            if missing:
                raise ValueError(f"{key} needs a value for each protocol {', '.join(PROTOCOLS)} "
                                 f"(missing {', '.join(missing)})")
        for proto, value in self.efficiency.items():
            if isinstance(value, dict) and proto != "LL128":
                raise ValueError(f"efficiency.{proto} must be one number; only LL128 may be given per collective")
            missing = [fn for fn in LL128_COLLECTIVES if isinstance(value, dict) and fn not in value]
            if missing:
                raise ValueError(f"efficiency.LL128 per collective needs each of {', '.join(LL128_COLLECTIVES)} "
                                 f"(missing {', '.join(missing)})")
        ll128 = self.efficiency.get("LL128")
        over = {k: v for k, v in (ll128.items() if isinstance(ll128, dict) else [("", ll128)]) if v > LL128_CEILING}
        if over:  # zsim.fabric.nccl.LL128_CEILING: 120 data bytes per 128-byte line
            where = ", ".join(f"efficiency.LL128{'.' + k if k else ''} = {v}" for k, v in over.items())
            raise ValueError(f"{where}: LL128 carries 120 data bytes per 128-byte line, so at most "
                             f"{LL128_CEILING} of a link")


class SystemFile(_Profile, kw_only=True):
    name: Name
    gpu: ProfileName
    gpus_per_node: Annotated[int, Meta(gt=0, le=1024)]
    intra_node: IntraNodeSection
    inter_node: InterNodeSection
    offload_link: ProfileName
    nccl: NcclSection
    compute: ComputeOverride | None = None
    provenance: dict[str, Any] | None = None  # written by `zsim calibrate`: inputs, date, residuals


@dataclass(frozen=True, slots=True)
class Gpu:
    """One GPU, SI units."""

    name: str
    peak_flops: dict[str, float]  # dtype -> FLOP/s (tensor-core peak)
    hbm_bytes_per_s: float
    memory_bytes: int
    compute_capability: int  # 70 Volta, 80 Ampere, 90 Hopper
    nccl_nvlink_GBps: float  # NCCL's per-NVLink speed for its tuner (topo.h SMxx_NVLINK_BW)
    compute: ComputeTerms | None  # the kernel-level compute model's terms (docs/compute.md); None on a CPU
    # host, whose profile gives achieved rates (zsim.config.host): its ops are priced by flops and bytes
    device_names: tuple[str, ...] = ()  # names CUDA reports for the part besides `name` (GpuFile)


@dataclass(frozen=True, slots=True)
class Tier:
    """A network tier a collective can cross: per-stream bandwidth and per-step latency."""

    name: str
    bytes_per_s: float  # achievable, per direction, per link instance
    latency_s: float  # per algorithm step (α)


@dataclass(frozen=True, slots=True)
class CalibrationNote:
    """What `zsim calibrate` wrote into a profile's `provenance`, for the run summary: the base it started
    from, when, the dotted terms it fitted, those it kept from the base unmeasured (with their values,
    profile units), and the causes of a poor fit it was told to accept (empty for a good fit)."""

    base: str
    date: str
    fitted: tuple[str, ...] = ()
    kept: tuple[tuple[str, float], ...] = ()
    warning: tuple[str, ...] = ()


def calibration_note(provenance: dict[str, Any] | None) -> CalibrationNote | None:
    """The CalibrationNote of a profile's `provenance` block; None for a profile `zsim calibrate` did not
    write. Entries of unexpected types are left out (the block is provenance, not a term)."""
    if not isinstance(provenance, dict) or provenance.get("tool") != "zsim calibrate":
        return None
    kept = provenance.get("kept_from_base")
    warning = (provenance.get("warning") or {}).get("poor_fit") if isinstance(provenance.get("warning"), dict) else None
    fitted = provenance.get("fitted_terms")
    return CalibrationNote(
        str(provenance.get("base", "?")), str(provenance.get("date", "?")),
        tuple(str(t) for t in fitted) if isinstance(fitted, list) else (),
        tuple((str(k), float(v)) for k, v in kept.items() if isinstance(v, (int, float)))
        if isinstance(kept, dict) else (),
        tuple(str(w) for w in warning) if isinstance(warning, list) else ())


@dataclass(frozen=True, slots=True)
class Cluster:
    """A cluster of identical nodes. `nvlink` and `nic_pool` are raw capacities per direction (the
    protocol's efficiency is applied per collective, zsim.fabric.nccl); latencies live in `nccl`."""

    name: str
    gpu: Gpu
    gpus_per_node: int
    nodes: int
    fabric: str  # 'nvswitch' or 'cube-mesh'
    nvlink_links: int  # NVLinks per GPU
    nvlink_link_bytes_per_s: float  # one NVLink, per direction
    nvswitches: int
    baseboards: int
    gpus_per_pcie_switch: int
    nvlink: Tier  # one GPU's NVLinks together
    nic_pool: Tier  # all NICs of one node together, at the network's efficiency
    nics_per_node: int
    nic_bytes_per_s: float  # one NIC port, per direction, at the network's efficiency
    oversubscription: float  # fat-tree: node injection bandwidth / bandwidth up to the spines
    offload: Tier  # host link of one GPU
    nccl: NcclKernel
    host: HostModel | None = None  # a CPU host (hwprofiles/hosts/): gloo collectives, no NVLink fabric
    nccl_tuner: str = "2.7"  # the NCCL release whose tuner chooses (zsim.fabric.nccl.TUNERS)
    nic_latency_growth_s: float = 0.0  # per inter-node step, per doubling of nodes beyond 2
    network_fit: NetworkFit | None = None  # where the inter-node terms come from (None: assumed)
    network_profile: str = ""  # the network profile's name (hwprofiles/networks/)
    network_efficiency: float = 1.0  # the share of a NIC's line rate in `nic_bytes_per_s` (the profile's)
    tree_efficiency: float = 1.0  # the tree's share of the NICs relative to the ring's (fitted per network)
    ll128_share: float = 0.9375  # LL128's share of the NICs relative to Simple's (fitted per network)

    def network_step_s(self, nodes: int, algo: str = "ring", proto: str = "Simple") -> float:
        """Latency of one inter-node step of a collective spanning `nodes` nodes, run as `algo`/`proto`.

        α(N) = α₂ · r + γ · log2(N/2): α₂ is the network's fitted latency of a ring/Simple step on 2
        nodes (switch hops, NIC, NCCL's proxy thread posting the send and polling its completion), r
        the ratio NCCL's own tuner gives this algorithm and protocol's network latency to that of
        ring/Simple (tuning.cc hwLat[NET], the profile's release: an LL step ~0.3×, a 2.7 tree/Simple
        step ~5×, its 256 KB chunk), and γ the fitted growth per doubling of the nodes (a larger
        fabric: more switch levels, longer queues). Fitted per network (hwprofiles/networks/)."""
        net = HW_LAT_US[self.nccl_tuner]["net"]
        ratio = net[algo][PROTOCOLS.index(proto)] / net["ring"][PROTOCOLS.index("Simple")]
        return self.nic_pool.latency_s * ratio + self.nic_latency_growth_s * math.log2(max(nodes, 2) / 2)
    calibration: CalibrationNote | None = None  # a profile written by `zsim calibrate`: what it fitted and kept

    @property
    def world(self) -> int:
        return self.gpus_per_node * self.nodes


def _contained(kind: str, name: str) -> None:
    """Raises ConfigError unless `name` is a profile name (containment, issue 13: a name, never a path
    to any YAML on disk); an explicit file the user named on the command line ends in .yaml."""
    if not name.endswith(".yaml"):
        try:
            profile_name(name)
        except ValueError as exc:
            raise ConfigError(f"{kind} profile {printable(name, 60)!r}: {exc}") from None


def load_profile(profiles: Profiles, kind: str, name: str, model: type[Section]) -> Section:
    """Find profile `name` of `kind` and validate it against `model`. Raises ConfigError."""
    _contained(kind, name)
    path = profiles.path(kind, name)
    stat = path.stat()
    return _parsed(str(path), stat.st_mtime_ns, stat.st_size, model)


@functools.lru_cache(maxsize=64)
def _raw(path: str, mtime_ns: int, size: int) -> dict:
    """A profile file's YAML mapping, read once per (path, modification time, size); not modified by
    its callers (validation builds new objects)."""
    return read_yaml_mapping(Path(path))


@functools.lru_cache(maxsize=256)
def _parsed(path: str, mtime_ns: int, size: int, model: type[Section]) -> Section:
    """A profile file parsed and validated once per (path, modification time, size): a sweep loads the
    same 4 files per point, and YAML parsing was ~90% of planning a point (measured by H5 on issue 11:
    19.4 ms → 3.0 ms CPU per flagship point). The models are frozen, so sharing them is safe; an edited
    file has a new mtime or size and is read again."""
    return validate(model, _raw(path, mtime_ns, size), path)


def compute_terms(section: ComputeSection, override: ComputeOverride | None = None, source: str = "") -> ComputeTerms:
    """The GPU's compute terms in SI, with a system profile's `compute:` keys replacing the GPU's.

    Raises:
        ConfigError: an override names a dtype the GPU has no GEMM terms for and leaves some unset.
    """
    base = msgspec.to_builtins(section)
    if override is not None:
        for key, value in msgspec.to_builtins(override).items():
            if value is not None and key != "gemm":
                base[key] = value
        for dtype, entry in override.gemm.items():
            merged = dict(base["gemm"].get(dtype) or {})
            merged.update({k: v for k, v in msgspec.to_builtins(entry).items() if v is not None})
            base["gemm"][dtype] = msgspec.to_builtins(validate(GemmSection, merged, f"{source} compute.gemm.{dtype}"))
    gemm = {dtype: GemmTerms(efficiency=g["efficiency"], tile_bytes_per_s=g["tile_TBps"] * 1e12,
                             k_overhead=g["k_overhead"], fixed_s=g["fixed_us"] * 1e-6,
                             hbm_efficiency=g["hbm_efficiency"]) for dtype, g in base["gemm"].items()}
    return ComputeTerms(sms=base["sms"], tiles=tuple((t[0], t[1]) for t in base["tiles"]), gemm=gemm,
                        hbm_efficiency=base["hbm_efficiency"], kernel_s=base["kernel_us"] * 1e-6,
                        host_op_s=base["host_op_us"] * 1e-6,
                        reduce_kernel_s=(base["kernel_us"] if base.get("reduce_kernel_us") is None
                                         else base["reduce_kernel_us"]) * 1e-6,
                        sustained_ratio=base.get("sustained_ratio", 1.0))


def load_cluster(profile: str, nodes: int, profiles: Profiles | None = None, *, gpu: str | None = None,
                 gpus_per_node: int | None = None, nics_per_node: int | None = None, nic_Gbps: float | None = None,
                 nic_latency_us: float | None = None, gpu_memory_GiB: float | None = None,
                 oversubscription: float | None = None) -> Cluster:
    """Load system profile `profile` and the component profiles it names, for `nodes` nodes, from
    `profiles` (default: $ZSIM_PROFILE_PATH, then the built-in profiles).

    The keyword arguments replace the profile's value (the scenario's `hardware.*` overrides, same
    names and units): `gpu` a GPU profile name; `gpus_per_node`; `nics_per_node`; `nic_Gbps` one NIC
    port's line rate per direction (the network profile's efficiency still applies); `nic_latency_us`;
    `gpu_memory_GiB`; `oversubscription`. Values are range-checked by the scenario schema.
    A different `gpus_per_node` keeps the node's fabric: an NVSwitch node spreads its GPUs evenly over
    its baseboards (so it must be a multiple of them), a cube-mesh node of n <= 8 GPUs keeps the
    sub-mesh among GPUs 0..n-1 (zsim.fabric.cube_mesh) and has no cube-mesh beyond 8.

    Raises:
        ConfigError: a profile file is missing or invalid, or an override the node cannot have;
            `path` is the scenario key at fault ('hardware.profile', 'hardware.gpu', ...).
    """
    profiles = Profiles.from_environment() if profiles is None else profiles
    _contained("system", profile)
    try:
        path = profiles.path("system", profile)
    except ConfigError as exc:
        if ("system", profile) in profiles.pinned or not profiles.names("host").get(profile):
            raise ConfigError(str(exc), path="hardware.profile") from None
        return load_host_cluster(profile, nodes, profiles)  # a CPU host (hosts/<profile>.yaml)
    try:
        stat = path.stat()
        if _raw(str(path), stat.st_mtime_ns, stat.st_size).get("kind") == "host":  # a host file the user named
            from zsim.config.host import HostFile

            data = _raw(str(path), stat.st_mtime_ns, stat.st_size)  # (`zsim calibrate -o my-host.yaml`)
            return host_cluster(validate(HostFile, data, str(path)), profile, nodes)  # type: ignore[arg-type]
        system: SystemFile = _parsed(str(path), stat.st_mtime_ns, stat.st_size, SystemFile)  # type: ignore[assignment]
        net: NetworkFile = load_profile(profiles, "network", system.inter_node.network, NetworkFile)  # type: ignore[assignment]
        link: LinkFile = load_profile(profiles, "link", system.offload_link, LinkFile)  # type: ignore[assignment]
    except ConfigError as exc:
        raise ConfigError(str(exc), path="hardware.profile") from None
    try:
        gpu_file: GpuFile = load_profile(profiles, "gpu", gpu or system.gpu, GpuFile)  # type: ignore[assignment]
    except ConfigError as exc:
        raise ConfigError(str(exc), path="hardware.gpu" if gpu else "hardware.profile") from None
    intra, inter = system.intra_node, system.inter_node
    per_node = gpus_per_node or system.gpus_per_node
    nvlink_links = intra.nvlink_links_per_gpu
    if intra.fabric == "cube-mesh" and gpus_per_node is not None:
        if not 0 < per_node <= MESH_GPUS:
            raise ConfigError(f"{per_node}: {system.name}'s NVLink hybrid cube-mesh connects at most {MESH_GPUS} "
                              "GPUs (a node of n <= 8 keeps the sub-mesh among GPUs 0..n-1); a larger node needs "
                              "an NVSwitch profile", path="hardware.gpus_per_node")
        nvlink_links = cube_mesh_links_per_gpu(per_node)
    if intra.fabric == "nvswitch" and per_node % intra.baseboards:
        raise ConfigError(f"{per_node}: {system.name} spreads its GPUs evenly over its {intra.baseboards} "
                          f"NVSwitch baseboards, so GPUs per node must be a multiple of {intra.baseboards}",
                          path="hardware.gpus_per_node")
    gpu_mem = gpu_memory_GiB if gpu_memory_GiB is not None else gpu_file.memory_GiB
    nics = nics_per_node or inter.nics_per_node
    peaks = {"fp16": gpu_file.peak_fp16_tflops * 1e12, "fp32": gpu_file.peak_fp32_tflops * 1e12}
    if gpu_file.peak_bf16_tflops is not None:
        peaks["bf16"] = gpu_file.peak_bf16_tflops * 1e12
    if gpu_file.peak_tf32_tflops is not None:
        peaks["tf32"] = gpu_file.peak_tf32_tflops * 1e12
    port = inter.port_Gbps if inter.port_Gbps is not None else net.port_Gbps
    nic = (nic_Gbps if nic_Gbps is not None else port) / 8 * GB * net.efficiency
    latency_s = (nic_latency_us if nic_latency_us is not None else net.latency_us) * 1e-6
    return Cluster(
        name=system.name,
        gpu=Gpu(
            name=gpu_file.name,
            peak_flops=peaks,
            hbm_bytes_per_s=gpu_file.hbm_GBps * GB,
            memory_bytes=int(gpu_mem * GiB),
            compute_capability=gpu_file.compute_capability,
            nccl_nvlink_GBps=gpu_file.nccl_nvlink_GBps,
            # The system's own `compute:` terms were fitted on its GPU: another GPU keeps its own.
            compute=compute_terms(gpu_file.compute, system.compute if gpu in (None, system.gpu) else None,
                                  f"system profile '{profile}'"),
            device_names=tuple(gpu_file.device_names),
        ),
        gpus_per_node=per_node,
        nodes=nodes,
        fabric=intra.fabric,
        nvlink_links=nvlink_links,
        nvlink_link_bytes_per_s=intra.nvlink_GBps_per_link * GB,
        nvswitches=intra.nvswitches,
        baseboards=intra.baseboards,
        gpus_per_pcie_switch=intra.gpus_per_pcie_switch,
        nvlink=Tier("nvlink", nvlink_links * intra.nvlink_GBps_per_link * GB, 0.0),
        nic_pool=Tier(net.name, nics * nic, latency_s),
        nics_per_node=nics,
        nic_bytes_per_s=nic,
        oversubscription=oversubscription if oversubscription is not None else inter.oversubscription,
        offload=Tier(link.name, link.GBps_per_direction * GB * link.efficiency, 0.0),
        nccl=NcclKernel(
            efficiency={p: v for p, v in system.nccl.efficiency.items() if not isinstance(v, dict)},
            ll128_efficiency=dict(ll128) if isinstance(ll128 := system.nccl.efficiency["LL128"], dict) else {},
            latency_s={k: v * 1e-6 for k, v in system.nccl.latency_us.items()},
            step_latency_s={k: v * 1e-6 for k, v in system.nccl.step_latency_us.items()},
            launch_s=system.nccl.launch_us * 1e-6,
            unaligned_copy_Bps=system.nccl.unaligned_copy_GBps * GB,
            unaligned_reduce_Bps=system.nccl.unaligned_reduce_GBps * GB,
        ),
        nccl_tuner=system.nccl.tuner,
        nic_latency_growth_s=net.latency_growth_us * 1e-6,
        network_fit=net.fit if nic_latency_us is None and nic_Gbps is None else None,
        network_profile=system.inter_node.network,
        network_efficiency=net.efficiency,
        tree_efficiency=net.tree_efficiency,
        calibration=calibration_note(system.provenance),
        ll128_share=net.ll128_share,
    )


def load_host_cluster(profile: str, nodes: int, profiles: Profiles | None = None) -> Cluster:
    """A CPU host (hosts/<profile>.yaml found by `profiles`, zsim.config.host) as a one-node cluster whose
    "GPUs" are the host's ranks: each computes at the profile's per-rank rates and holds 1/ranks of
    the host's memory; collectives follow the profile's gloo terms (no NVLink, NIC or NCCL).

    Raises:
        ConfigError: an invalid profile, or nodes != 1 (gloo between hosts is not measured).
    """
    from zsim.config.host import HostFile

    profiles = Profiles.from_environment() if profiles is None else profiles
    spec: HostFile = load_profile(profiles, "host", profile, HostFile)  # type: ignore[assignment]
    return host_cluster(spec, profile, nodes)


def host_cluster(spec: HostFile, profile: str, nodes: int) -> Cluster:
    """The Cluster of a validated host profile (see load_host_cluster)."""
    from zsim.config.host import host_model

    if nodes != 1:
        raise ConfigError(f"host profile '{profile}' describes one machine: hardware.nodes must be 1 (got {nodes})")
    rates = {dtype: gflops * 1e9 for dtype, gflops in spec.compute.matmul_GFLOPS.items()}
    none = Tier("none", 1.0, 0.0)  # a host has no NVLink, NIC or offload link: never used (cluster.host is set)
    return Cluster(
        name=spec.name,
        gpu=Gpu(name=spec.cpu, peak_flops=rates, hbm_bytes_per_s=spec.compute.memory_GBps * GB,
                memory_bytes=int(spec.memory_GiB * GiB / spec.ranks),
                compute_capability=0, nccl_nvlink_GBps=1.0,
                compute=None),  # the profile's rates are achieved ones: no GPU kernel model
        gpus_per_node=spec.ranks, nodes=1, fabric="host", nvlink_links=0, nvlink_link_bytes_per_s=0.0,
        nvswitches=0, baseboards=1, gpus_per_pcie_switch=1, nvlink=none, nic_pool=none, nics_per_node=0,
        nic_bytes_per_s=0.0, oversubscription=1.0, offload=none,
        nccl=NcclKernel(efficiency={}, latency_s={}, step_latency_s={}, launch_s=0.0, unaligned_copy_Bps=1.0,
                        unaligned_reduce_Bps={}),
        host=host_model(spec),
        calibration=calibration_note(spec.provenance),
    )
