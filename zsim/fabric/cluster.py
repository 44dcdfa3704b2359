"""The cluster the simulator sees: GPUs, nodes, network tiers and NCCL's terms on them, in SI units (bytes,
seconds, FLOP/s), built once from the hardware profile files (zsim.config.profile_files reads and checks
them; docs/profiles.md lists every key and its unit). Everything downstream sees only the `Cluster`
dataclasses below. It lives in fabric because it holds the fabric's own terms (zsim.fabric.nccl's
NcclKernel) and the fabric's algorithms take it; config, below, may not import them (docs/architecture.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from zsim.compute.terms import ComputeTerms, GemmTerms
from zsim.config.profile_files import (GB, GiB, ComputeOverride, ComputeSection, GemmSection, GpuFile, LinkFile,
                                       NetworkFile, NetworkFit, SystemFile, check_name, load_profile, parsed_file,
                                       raw_file)
from zsim.config.profiles import Profiles
from zsim.config.validation import validate
from zsim.errors import ConfigError
from zsim.fabric.cube_mesh import MESH_GPUS, cube_mesh_links_per_gpu
from zsim.fabric.gpudirect import nic_bytes_per_s
from zsim.fabric.nccl import HW_LAT_US, PROTOCOLS, NcclKernel

if TYPE_CHECKING:  # host profiles (CPU machines) are imported where one is loaded: a GPU run never needs them
    from zsim.config.host import HostFile, HostModel


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
    nvls: bool = False  # the NVSwitches do NVLink SHARP (profile intra_node.nvls; zsim.fabric.nvls)
    nvls_tree_share: float | None = None  # NVLSTree's share of the NICs relative to Simple's; None: the tree's
    gpudirect_rdma: bool = True  # NICs read and write GPU memory directly; False: staged (zsim.fabric.gpudirect)
    nic_line_bytes_per_s: float = 0.0  # one NIC port's line rate per direction (0: no NIC, a CPU host)

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
    def nvls_tree_efficiency(self) -> float:
        """NVLSTree's share of the NICs relative to the ring's Simple: the network's fitted
        `nvls_tree_share`, or, where no NVLSTree table was fitted, the tree's share (an assumption)."""
        return self.tree_efficiency if self.nvls_tree_share is None else self.nvls_tree_share

    @property
    def world(self) -> int:
        return self.gpus_per_node * self.nodes


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
                        sustained_ratio=base.get("sustained_ratio", 1.0), burst_ratio=base.get("burst_ratio", 1.0),
                        host_module_s=base.get("host_module_us", 0.0) * 1e-6)


def default_tuner(compute_capability: int) -> str:
    """The NCCL release whose tuner a system profile without `nccl.tuner` runs: "2.23" (standing for 2.19-2.26)
    on Hopper and newer, whose GPUs NCCL's tuner knows only from v2.15.1-1 (src/graph/tuning.cc), so no older
    release zsim ports ran on them; else "2.7" (mid 2020, zsim's default since it had tuners)."""
    return "2.23" if compute_capability >= 90 else "2.7"


def load_cluster(profile: str, nodes: int, profiles: Profiles | None = None, *, gpu: str | None = None,
                 gpus_per_node: int | None = None, nics_per_node: int | None = None, nic_Gbps: float | None = None,
                 nic_latency_us: float | None = None, gpu_memory_GiB: float | None = None,
                 oversubscription: float | None = None, gpudirect_rdma: bool | None = None,
                 nvls: bool | None = None, network: str | None = None) -> Cluster:
    """Load system profile `profile` and the component profiles it names, for `nodes` nodes, from
    `profiles` (default: $ZSIM_PROFILE_PATH, then the built-in profiles).

    The keyword arguments replace the profile's value (the scenario's `hardware.*` overrides, same
    names and units): `gpu` a GPU profile name; `gpus_per_node`; `nics_per_node`; `nic_Gbps` one NIC
    port's line rate per direction (the network profile's efficiency still applies); `nic_latency_us`;
    `gpu_memory_GiB`; `oversubscription`; `gpudirect_rdma` (False: NCCL stages inter-node bytes through
    host memory, zsim.fabric.gpudirect); `nvls` (False: NCCL_NVLS_ENABLE=0, no NVLink SHARP algorithm;
    True only where the profile's NVSwitches do it); `network` a network profile name (hwprofiles/networks/)
    whose fitted terms (efficiency, latency, tree share, ...) replace the system's network's, on the same NICs:
    the port rate stays the system's (its `inter_node.port_Gbps`, else its own network's) unless `nic_Gbps` is
    set too. Values are range-checked by the scenario schema.
    A different `gpus_per_node` keeps the node's fabric: an NVSwitch node spreads its GPUs evenly over
    its baseboards (so it must be a multiple of them), a cube-mesh node of n <= 8 GPUs keeps the
    sub-mesh among GPUs 0..n-1 (zsim.fabric.cube_mesh) and has no cube-mesh beyond 8.

    Raises:
        ConfigError: a profile file is missing or invalid, or an override the node cannot have;
            `path` is the scenario key at fault ('hardware.profile', 'hardware.gpu', ...).
    """
    profiles = Profiles.from_environment() if profiles is None else profiles
    check_name("system", profile)
    not_on_host = {"gpu": gpu, "nics_per_node": nics_per_node, "nic_Gbps": nic_Gbps, "nic_latency_us": nic_latency_us,
                   "gpu_memory_GiB": gpu_memory_GiB, "oversubscription": oversubscription,
                   "gpudirect_rdma": gpudirect_rdma, "nvls": nvls, "network": network}
    try:
        path = profiles.path("system", profile)
    except ConfigError as exc:
        if ("system", profile) in profiles.pinned or not profiles.names("host").get(profile):
            raise ConfigError(str(exc), path="hardware.profile") from None
        _refuse_on_host(profile, not_on_host)
        return load_host_cluster(profile, nodes, profiles, gpus_per_node)  # a CPU host (hosts/<profile>.yaml)
    try:
        stat = path.stat()
        if raw_file(str(path), stat.st_mtime_ns, stat.st_size).get("kind") == "host":  # a host file the user named
            from zsim.config.host import HostFile

            data = raw_file(str(path), stat.st_mtime_ns, stat.st_size)  # (`zsim calibrate -o my-host.yaml`)
            _refuse_on_host(profile, not_on_host)
            return host_cluster(validate(HostFile, data, str(path)), profile, nodes,  # type: ignore[arg-type]
                                gpus_per_node)
        system: SystemFile = parsed_file(str(path), stat.st_mtime_ns, stat.st_size, SystemFile)  # type: ignore[assignment]
        own_net: NetworkFile = load_profile(  # type: ignore[assignment]
            profiles, "network", system.inter_node.network, NetworkFile)
        link: LinkFile = load_profile(profiles, "link", system.offload_link, LinkFile)  # type: ignore[assignment]
    except ConfigError as exc:
        raise ConfigError(str(exc), path="hardware.profile") from None
    net = own_net
    if network is not None:
        try:
            net = load_profile(profiles, "network", network, NetworkFile)  # type: ignore[assignment]
        except ConfigError as exc:
            raise ConfigError(str(exc), path="hardware.network") from None
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
    if gpu_file.peak_fp8_tflops is not None:
        peaks["fp8"] = gpu_file.peak_fp8_tflops * 1e12
    if gpu_file.peak_fp4_tflops is not None:
        peaks["fp4"] = gpu_file.peak_fp4_tflops * 1e12
    port = inter.port_Gbps if inter.port_Gbps is not None else own_net.port_Gbps  # the node's NICs, whatever the fabric
    line = (nic_Gbps if nic_Gbps is not None else port) / 8 * GB
    gdr = inter.gpudirect_rdma if gpudirect_rdma is None else gpudirect_rdma
    if nvls and not intra.nvls:
        raise ConfigError(f"true: {system.name}'s NVSwitches do no NVLink SHARP (its profile's intra_node.nvls is "
                          "false), so NCCL has no NVLS algorithm to enable", path="hardware.nvls")
    offload = Tier(link.name, link.GBps_per_direction * GB * link.efficiency, 0.0)
    nic = nic_bytes_per_s(line * net.efficiency, gdr, offload.bytes_per_s)
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
        offload=offload,
        nccl=NcclKernel(
            efficiency={p: v for p, v in system.nccl.efficiency.items() if not isinstance(v, dict)},
            ll128_efficiency=dict(ll128) if isinstance(ll128 := system.nccl.efficiency["LL128"], dict) else {},
            latency_s={k: v * 1e-6 for k, v in system.nccl.latency_us.items()},
            step_latency_s={k: v * 1e-6 for k, v in system.nccl.step_latency_us.items()},
            launch_s=system.nccl.launch_us * 1e-6,
            unaligned_copy_Bps=system.nccl.unaligned_copy_GBps * GB,
            unaligned_reduce_Bps=system.nccl.unaligned_reduce_GBps * GB,
        ),
        nccl_tuner=system.nccl.tuner or default_tuner(gpu_file.compute_capability),
        nic_latency_growth_s=net.latency_growth_us * 1e-6,
        network_fit=net.fit if nic_latency_us is None and nic_Gbps is None else None,
        network_profile=network or system.inter_node.network,
        network_efficiency=net.efficiency,
        tree_efficiency=net.tree_efficiency,
        calibration=calibration_note(system.provenance),
        ll128_share=net.ll128_share,
        nvls=intra.nvls if nvls is None else nvls,  # NCCL_NVLS_ENABLE=0 turns it off (NCCL env docs)
        nvls_tree_share=net.nvls_tree_share,
        gpudirect_rdma=gdr,
        nic_line_bytes_per_s=line,
    )


# The hardware.* overrides a CPU host has nothing to apply to: no GPU, NIC, fat tree or GPUDirect.
_NOT_ON_A_HOST = {
    "gpu": "a host's ranks compute at its measured rates, not a GPU profile's",
    "nics_per_node": "a host profile is one machine, whose ranks talk over gloo on loopback",
    "nic_Gbps": "a host profile is one machine, whose ranks talk over gloo on loopback",
    "nic_latency_us": "a host profile is one machine, whose ranks talk over gloo on loopback",
    "oversubscription": "a host profile is one machine: there is no fat tree",
    "gpudirect_rdma": "a host profile is one machine: there is no NIC to reach GPU memory",
    "nvls": "a host profile has no NVSwitch to reduce in",
    "network": "a host profile is one machine, whose ranks talk over gloo on loopback",
    "gpu_memory_GiB": "the ranks share the host's memory_GiB (each gets 1/ranks of it): edit the host profile",
}


def _refuse_on_host(profile: str, overrides: dict[str, object]) -> None:
    """Raise on the first `hardware.*` override (by key, None: unset) a CPU host cannot honour (all but
    gpus_per_node).

    Raises:
        ConfigError: `path` is the override's scenario key.
    """
    for key, value in overrides.items():
        if value is not None:
            raise ConfigError(f"'{profile}' is a CPU host profile: {_NOT_ON_A_HOST[key]}", path=f"hardware.{key}")


def load_host_cluster(profile: str, nodes: int, profiles: Profiles | None = None,
                      gpus_per_node: int | None = None) -> Cluster:
    """A CPU host (hosts/<profile>.yaml found by `profiles`, zsim.config.host) as a one-node cluster whose
    "GPUs" are the host's ranks: each computes at the profile's per-rank rates and holds 1/ranks of
    the host's memory; collectives follow the profile's gloo terms (no NVLink, NIC or NCCL).
    `gpus_per_node` runs fewer ranks than the profile measured (the scenario's hardware.gpus_per_node).

    Raises:
        ConfigError: an invalid profile, nodes != 1 (gloo between hosts is not measured), or more
            ranks than the profile measured.
    """
    from zsim.config.host import HostFile

    profiles = Profiles.from_environment() if profiles is None else profiles
    spec: HostFile = load_profile(profiles, "host", profile, HostFile)  # type: ignore[assignment]
    return host_cluster(spec, profile, nodes, gpus_per_node)


def host_cluster(spec: HostFile, profile: str, nodes: int, gpus_per_node: int | None = None) -> Cluster:
    """The Cluster of a validated host profile (see load_host_cluster)."""
    from zsim.config.host import host_model

    if nodes != 1:
        raise ConfigError(f"host profile '{profile}' describes one machine: hardware.nodes must be 1 (got {nodes})")
    if gpus_per_node is not None and gpus_per_node > spec.ranks:
        # its rates were measured with `ranks` ranks at once; more would share the cores in ways it never saw
        raise ConfigError(f"{gpus_per_node}: host profile '{profile}' was measured with {spec.ranks} ranks, so it can "
                          f"run 1 to {spec.ranks}; measure more with python -m zsim.runtime.hostprobe --ranks "
                          f"{gpus_per_node}", path="hardware.gpus_per_node")
    if gpus_per_node is not None:
        spec = msgspec.structs.replace(spec, ranks=gpus_per_node)
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
