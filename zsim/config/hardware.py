"""Hardware profiles: YAML files with units in key names, converted to SI once, here.

A system profile (<name>.yaml) names its GPU (gpus/), its inter-node network (networks/) and its
host-offload link (links/), and gives the node's own figures. zsim.config.profiles finds the files
(user folders first, then the built-in hwprofiles/); docs/profiles.md lists every key and its unit.
Everything downstream sees only the `Cluster` dataclasses below, in bytes, seconds and FLOP/s.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from zsim.config.profiles import Profiles
from zsim.config.schema import Name, ProfileName, profile_name
from zsim.config.yamlfile import printable, read_yaml_mapping, validate
from zsim.errors import ConfigError
from zsim.fabric.nccl import NcclKernel

GB = 1e9
GiB = 2**30


class _Profile(BaseModel):
    """A profile file or section: unknown keys are errors, no coercion, finite numbers, and every
    number bounded (issue 13): a rate or size > 0, an efficiency in (0, 1], a latency >= 0, and upper
    bounds far above any real hardware (so no product overflows and no division is by zero)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)


# Bounds shared by the profile files (far above real hardware of 2026: an H100 is ~1e3 TFLOPS,
# ~3e3 GB/s of HBM, 80 GiB; NDR is 400 Gb/s).
_TFLOPS = Field(gt=0, le=1e6)
_GBPS = Field(gt=0, le=1e6)
_EFFICIENCY = Field(gt=0, le=1)
_LATENCY_US = Field(ge=0, le=1e6)
Efficiency = Annotated[float, _EFFICIENCY]
LatencyUs = Annotated[float, _LATENCY_US]
Bandwidth = Annotated[float, _GBPS]
PROTOCOLS = ("LL", "LL128", "Simple")


class GpuFile(_Profile):
    name: Name
    peak_fp16_tflops: float = _TFLOPS
    peak_bf16_tflops: float | None = Field(default=None, gt=0, le=1e6)
    peak_fp32_tflops: float = _TFLOPS
    hbm_GBps: float = _GBPS
    memory_GiB: float = Field(gt=0, le=1e6)
    matmul_efficiency: float = _EFFICIENCY
    hbm_efficiency: float = _EFFICIENCY
    compute_capability: int = Field(gt=0, le=1000)
    nccl_nvlink_GBps: float = _GBPS


class NetworkFile(_Profile):
    name: Name
    port_Gbps: float = Field(gt=0, le=1e7)
    efficiency: float = _EFFICIENCY
    latency_us: float = _LATENCY_US


class LinkFile(_Profile):
    name: Name
    GBps_per_direction: float = _GBPS
    efficiency: float = _EFFICIENCY


class IntraNodeSection(_Profile):
    fabric: Literal["nvswitch", "cube-mesh"]
    nvlink_links_per_gpu: int = Field(gt=0, le=1024)
    nvlink_GBps_per_link: float = _GBPS
    nvswitches: int = Field(default=0, ge=0, le=1024)
    baseboards: int = Field(default=1, gt=0, le=1024)
    gpus_per_pcie_switch: int = Field(default=2, gt=0, le=1024)


class InterNodeSection(_Profile):
    network: ProfileName
    nics_per_node: int = Field(gt=0, le=1024)
    oversubscription: float = Field(default=1.0, ge=1.0, le=1e6)


class NcclSection(_Profile):
    launch_us: float = _LATENCY_US
    efficiency: dict[Literal["LL", "LL128", "Simple"], Efficiency]
    latency_us: dict[Literal["LL", "LL128", "Simple"], LatencyUs]
    step_latency_us: dict[Literal["LL", "LL128", "Simple"], LatencyUs]
    unaligned_copy_GBps: float = _GBPS
    unaligned_reduce_GBps: dict[Annotated[int, Field(gt=0, le=1024)], Bandwidth] = Field(min_length=1, max_length=64)

    @model_validator(mode="after")
    def _every_protocol(self) -> NcclSection:
        for key in ("efficiency", "latency_us", "step_latency_us"):
            missing = [p for p in PROTOCOLS if p not in getattr(self, key)]
            if missing:
                raise ValueError(f"{key} needs a value for each protocol {', '.join(PROTOCOLS)} "
                                 f"(missing {', '.join(missing)})")
        return self


class SystemFile(_Profile):
    name: Name
    gpu: ProfileName
    gpus_per_node: int = Field(gt=0, le=1024)
    intra_node: IntraNodeSection
    inter_node: InterNodeSection
    offload_link: ProfileName
    nccl: NcclSection


@dataclass(frozen=True, slots=True)
class Gpu:
    """One GPU, SI units."""

    name: str
    peak_flops: dict[str, float]  # dtype -> FLOP/s (tensor-core peak)
    hbm_bytes_per_s: float
    memory_bytes: int
    matmul_efficiency: float  # achieved / peak for large GEMMs
    hbm_efficiency: float  # achieved / peak for streaming kernels
    compute_capability: int  # 70 Volta, 80 Ampere, 90 Hopper
    nccl_nvlink_GBps: float  # NCCL's per-NVLink speed for its tuner (topo.h SMxx_NVLINK_BW)


@dataclass(frozen=True, slots=True)
class Tier:
    """A network tier a collective can cross: per-stream bandwidth and per-step latency."""

    name: str
    bytes_per_s: float  # achievable, per direction, per link instance
    latency_s: float  # per algorithm step (α)


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

    @property
    def world(self) -> int:
        return self.gpus_per_node * self.nodes


def load_profile(profiles: Profiles, kind: str, name: str, model: type[BaseModel]) -> BaseModel:
    """Find profile `name` of `kind` and validate it against `model`. Raises ConfigError."""
    if not name.endswith(".yaml"):  # an explicit file the user named on the command line is a path
        try:
            profile_name(name)
        except ValueError as exc:  # containment (issue 13): a name, never a path to any YAML on disk
            raise ConfigError(f"{kind} profile {printable(name, 60)!r}: {exc}") from None
    path = profiles.path(kind, name)
    return validate(model, read_yaml_mapping(path), str(path))


def load_cluster(profile: str, nodes: int, profiles: Profiles | None = None) -> Cluster:
    """Load system profile `profile` and the component profiles it names, for `nodes` nodes, from
    `profiles` (default: $ZSIM_PROFILE_PATH, then the built-in profiles).

    Raises:
        ConfigError: a profile file is missing or invalid.
    """
    profiles = Profiles.from_environment() if profiles is None else profiles
    system: SystemFile = load_profile(profiles, "system", profile, SystemFile)  # type: ignore[assignment]
    gpu: GpuFile = load_profile(profiles, "gpu", system.gpu, GpuFile)  # type: ignore[assignment]
    net: NetworkFile = load_profile(profiles, "network", system.inter_node.network, NetworkFile)  # type: ignore[assignment]
    link: LinkFile = load_profile(profiles, "link", system.offload_link, LinkFile)  # type: ignore[assignment]
    peaks = {"fp16": gpu.peak_fp16_tflops * 1e12, "fp32": gpu.peak_fp32_tflops * 1e12}
    if gpu.peak_bf16_tflops is not None:
        peaks["bf16"] = gpu.peak_bf16_tflops * 1e12
    intra, inter = system.intra_node, system.inter_node
    nic = net.port_Gbps / 8 * GB * net.efficiency
    return Cluster(
        name=system.name,
        gpu=Gpu(
            name=gpu.name,
            peak_flops=peaks,
            hbm_bytes_per_s=gpu.hbm_GBps * GB,
            memory_bytes=int(gpu.memory_GiB * GiB),
            matmul_efficiency=gpu.matmul_efficiency,
            hbm_efficiency=gpu.hbm_efficiency,
            compute_capability=gpu.compute_capability,
            nccl_nvlink_GBps=gpu.nccl_nvlink_GBps,
        ),
        gpus_per_node=system.gpus_per_node,
        nodes=nodes,
        fabric=intra.fabric,
        nvlink_links=intra.nvlink_links_per_gpu,
        nvlink_link_bytes_per_s=intra.nvlink_GBps_per_link * GB,
        nvswitches=intra.nvswitches,
        baseboards=intra.baseboards,
        gpus_per_pcie_switch=intra.gpus_per_pcie_switch,
        nvlink=Tier("nvlink", intra.nvlink_links_per_gpu * intra.nvlink_GBps_per_link * GB, 0.0),
        nic_pool=Tier(net.name, inter.nics_per_node * nic, net.latency_us * 1e-6),
        nics_per_node=inter.nics_per_node,
        nic_bytes_per_s=nic,
        oversubscription=inter.oversubscription,
        offload=Tier(link.name, link.GBps_per_direction * GB * link.efficiency, 0.0),
        nccl=NcclKernel(
            efficiency=dict(system.nccl.efficiency),
            latency_s={k: v * 1e-6 for k, v in system.nccl.latency_us.items()},
            step_latency_s={k: v * 1e-6 for k, v in system.nccl.step_latency_us.items()},
            launch_s=system.nccl.launch_us * 1e-6,
            unaligned_copy_Bps=system.nccl.unaligned_copy_GBps * GB,
            unaligned_reduce_Bps={k: v * GB for k, v in system.nccl.unaligned_reduce_GBps.items()},
        ),
    )
