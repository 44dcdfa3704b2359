"""Hardware profile files: their schema (YAML with units in key names) and reading them, once per file
version. Only the files: the `Cluster` the simulator sees, in SI units, is built from them in
zsim.fabric.cluster. A system profile (<name>.yaml) names its GPU (gpus/), its inter-node network
(networks/) and its host-offload link (links/), and gives the node's own figures. zsim.config.profiles
finds the files (user folders first, then the built-in hwprofiles/); docs/profiles.md lists every key and
its unit.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Annotated, Any, Literal

from zsim.config.profiles import Profiles
from zsim.config.schema import Name, ProfileName, profile_name
from zsim.config.struct import Meta, Section, field
from zsim.config.validation import validate
from zsim.config.yamlfile import read_yaml_mapping
from zsim.errors import ConfigError, printable

# NCCL's protocols and the collectives whose LL128 efficiency a profile may give apart: the keys a profile
# may use, the same as zsim.fabric.nccl's PROTOCOLS and LL128_COLLECTIVES (tests/test_layers.py checks it;
# config sits below fabric and cannot import them). LL128 carries 120 data bytes per 128-byte line (NCCL
# src/device/prims_ll128.h: NCCL_LL128_DATAELEMS 15 of NCCL_LL128_LINEELEMS 16), so no profile may claim
# more of a link than LL128_CEILING.
PROTOCOLS = ("LL", "LL128", "Simple")
LL128_COLLECTIVES = ("broadcast", "reduce", "all_gather", "reduce_scatter", "all_reduce")
LL128_CEILING = 120 / 128

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
    # CPU time per module op beyond its launches (docs/compute.md); 0: not known
    host_module_us: Annotated[float, Meta(ge=0)] = 0.0
    # tensor-core rate kept under the power cap for minutes / the GEMM tables' short-burst rate (docs/compute.md)
    sustained_ratio: Annotated[float, Meta(gt=0, le=1)] = 1.0
    # a burst's tensor-core rate / the one carried terms give at this GPU's datasheet peak (docs/compute.md)
    burst_ratio: Annotated[float, Meta(gt=0, le=1)] = 1.0
    gemm: dict[Literal["fp16", "bf16", "fp32", "tf32", "fp8", "fp4"], GemmSection]


class ComputeOverride(_Profile, kw_only=True):
    """A system profile's `compute:` section: any key of the GPU's, replacing it (e.g. fitted by
    `zsim calibrate`); `gemm.<dtype>` entries replace key by key."""

    sms: Annotated[int, Meta(gt=0)] | None = None
    tiles: Annotated[list[Tile], Meta(min_length=1)] | None = None
    hbm_efficiency: Annotated[float, Meta(gt=0, le=1)] | None = None
    kernel_us: Annotated[float, Meta(ge=0)] | None = None
    reduce_kernel_us: Annotated[float, Meta(ge=0)] | None = None
    host_op_us: Annotated[float, Meta(ge=0)] | None = None
    host_module_us: Annotated[float, Meta(ge=0)] | None = None
    sustained_ratio: Annotated[float, Meta(gt=0, le=1)] | None = None
    burst_ratio: Annotated[float, Meta(gt=0, le=1)] | None = None
    gemm: dict[Literal["fp16", "bf16", "fp32", "tf32", "fp8", "fp4"], GemmOverride] = field(default_factory=dict)


class GpuFile(_Profile, kw_only=True):
    name: Name
    peak_fp16_tflops: Annotated[float, _TFLOPS]
    peak_bf16_tflops: Annotated[float, Meta(gt=0, le=1e6)] | None = None
    peak_fp32_tflops: Annotated[float, _TFLOPS]
    # TF32 tensor-core peak, dense: what fp32 GEMMs reach where the library allows TF32 (XLA's f32 rows)
    peak_tf32_tflops: Annotated[float, Meta(gt=0, le=1e6)] | None = None
    # FP8 (E4M3/E5M2) tensor-core peak, dense: what precision.fp8's GEMMs run at (Hopper and later); None: no FP8
    peak_fp8_tflops: Annotated[float, Meta(gt=0, le=1e6)] | None = None
    # FP4 (NVFP4, E2M1 with E4M3 block scales) tensor-core peak, dense: what precision.fp4's GEMMs run at (Blackwell
    # and later); None: no FP4
    peak_fp4_tflops: Annotated[float, Meta(gt=0, le=1e6)] | None = None
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
    terms: list[Literal["efficiency", "tree_efficiency", "ll128_share", "latency_us", "latency_growth_us",
                        "nvls_tree_share"]]
    # Terms the fit did not set but held at a published figure: term -> its source (docs/fabric.md)
    held: dict[Literal["efficiency", "tree_efficiency", "ll128_share", "latency_us", "latency_growth_us",
                       "nvls_tree_share"], Annotated[str, Meta(min_length=1, max_length=400)]] = {}


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
    nvls_tree_share: Annotated[float, Meta(gt=0, le=1.0, description=(
        "NCCL's NVLSTree's share of the NICs relative to its ring's Simple (NVLink SHARP nodes: "
        "intra_node.nvls); unset: the tree's share (tree_efficiency), an assumption"))] | None = None
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
    nvls: Annotated[bool, Meta(description=(
        "the NVSwitches support NVLink SHARP (multicast and in-switch reduction: third-generation NVSwitch, "
        "HGX/DGX H100, H200, B200) and NCCL may use it (NCCL_NVLS_ENABLE's default); false on DGX-2 "
        "(V100) and DGX A100. NCCL >= 2.17 then runs NVLS inside a node and NVLSTree across nodes "
        "(zsim.fabric.nvls)"))] = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.nvls and self.fabric != "nvswitch":
            raise ValueError(f"nvls: true needs fabric: nvswitch (NVLink SHARP reduces in the NVSwitches; "
                             f"got fabric: {self.fabric})")


class InterNodeSection(_Profile, kw_only=True):
    network: ProfileName
    nics_per_node: Annotated[int, Meta(gt=0, le=1024)]
    oversubscription: Annotated[float, Meta(ge=1.0, le=1e6)] = 1.0
    port_Gbps: Annotated[float, Meta(gt=0, le=1e7, description=(
        "one NIC port's line rate when this system's differs from the network profile's (RoCE at 100, "
        "200 or 400 Gb/s); the network's fitted efficiency and latencies still apply"))] | None = None
    gpudirect_rdma: Annotated[bool, Meta(description=(
        "true: NCCL moves inter-node bytes between GPU memory and the NICs directly (GPUDirect RDMA: "
        "nvidia-peermem loaded, NIC on the GPU's PCIe switch); false: its proxy stages them through host "
        "memory, and a NIC carries min(2/3 of its rate, half its PCIe switch's uplink) (zsim.fabric.gpudirect)"))] = True


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
    tuner: Annotated[Literal["2.5", "2.7", "2.8", "2.23"] | None, Meta(description=(
        "the NCCL release whose tuner picks each call's algorithm and protocol (zsim.fabric.nccl): 2.5 "
        "(v2.5.6/2.5.7, to March 2020), 2.7 (v2.7.3-2.7.8, mid 2020), 2.8 (v2.8.3-2.9.9, 2021: "
        "zsim.fabric.nccl_28) or 2.23 (v2.23.4, 2024; stands for "
        "2.19-2.26, zsim.fabric.nccl_223; across nodes the cheapest cell); unset: 2.23 on Hopper and newer "
        "GPUs (NCCL's tuner knows Hopper from v2.15.1-1), else 2.7"))] = None

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



def check_name(kind: str, name: str) -> None:
    """Raises ConfigError unless `name` is a profile name (containment, issue 13: a name, never a path
    to any YAML on disk); an explicit file the user named on the command line ends in .yaml."""
    if not name.endswith(".yaml"):
        try:
            profile_name(name)
        except ValueError as exc:
            raise ConfigError(f"{kind} profile {printable(name, 60)!r}: {exc}") from None


def load_profile(profiles: Profiles, kind: str, name: str, model: type[Section]) -> Section:
    """Find profile `name` of `kind` and validate it against `model`. Raises ConfigError."""
    check_name(kind, name)
    path = profiles.path(kind, name)
    stat = path.stat()
    return parsed_file(str(path), stat.st_mtime_ns, stat.st_size, model)


@functools.lru_cache(maxsize=64)
def raw_file(path: str, mtime_ns: int, size: int) -> dict:
    """A profile file's YAML mapping, read once per (path, modification time, size); not modified by
    its callers (validation builds new objects)."""
    return read_yaml_mapping(Path(path))


@functools.lru_cache(maxsize=256)
def parsed_file(path: str, mtime_ns: int, size: int, model: type[Section]) -> Section:
    """A profile file parsed and validated once per (path, modification time, size): a sweep loads the
    same 4 files per point, and YAML parsing was ~90% of planning a point (measured by H5 on issue 11:
    19.4 ms → 3.0 ms CPU per flagship point). The models are frozen, so sharing them is safe; an edited
    file has a new mtime or size and is read again."""
    return validate(model, raw_file(path, mtime_ns, size), path)
