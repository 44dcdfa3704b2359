"""Host profiles: a CPU machine running the runtime's ranks over gloo, as a cluster the simulator can
run (`hardware.profile: <host>` with `hardware.nodes: 1`). docs/host-profiles.md explains the keys.

A host profile (hwprofiles/hosts/<name>.yaml) says how many ranks share the machine's cores and with
how many threads each, what one rank's matmuls and memory-bound kernels achieve (per dtype: CPU
half precision is a different code path), the per-op overhead of the framework, and a
latency-bandwidth model of each gloo collective per group size, t = latency + S / bandwidth, with S
the payload as nccl-tests counts it. gloo's reduce_scatter is an all_reduce of the whole buffer
(DESIGN.md, measured facts), so it has its own terms rather than NCCL's ring. Units are in the key
names and converted to SI once, here. The numbers come from `python -m zsim.runtime.hostprobe`, which
measures them on the machine with real gloo processes and writes the file (with the fit's residuals).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from zsim.config.struct import Meta, Section

from zsim.errors import ConfigError

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all")


class _Strict(Section, kw_only=True):
    """A host profile file or section (zsim.config.struct: no unknown keys, no coercion, frozen)."""


class LatencyBandwidth(_Strict, kw_only=True):
    """t = latency_us + bytes / (GBps · 1e9) for one collective on one group size."""

    latency_us: Annotated[float, Meta(ge=0)]
    GBps: Annotated[float, Meta(gt=0)]
    fit: Annotated[dict[str, float], Meta(description="provenance: residuals of the fit")] | None = None


class HostCompute(_Strict, kw_only=True):
    """What one rank achieves with `threads_per_rank` threads (the compute model's terms for a CPU:
    matmul throughput, memory-bound bandwidth, per-op overhead; docs/compute.md uses the same terms)."""

    matmul_GFLOPS: Annotated[dict[str, float], Meta(description=(
        "achieved GEMM rate per dtype (fp32, fp16, bf16), GFLOP/s"))]
    memory_GBps: Annotated[float, Meta(gt=0, description="achieved streaming (copy) bandwidth of one rank, GB/s")]
    op_overhead_us: Annotated[float, Meta(ge=0, description=(
        "framework time per aten op (dispatch of a tiny op), µs; paid once per kernel of an op's kernel list"))]

    optimizer_op_overhead_us: Annotated[float, Meta(ge=0, le=1e6, description=(
        "the optimizer's ops (norms, flat copy, Adam): framework time per aten op, µs; absent: op_overhead_us"))] | None = None
    optimizer_memory_GBps: Annotated[float, Meta(gt=0, le=1e6, description=(
        "the optimizer's ops: streaming bandwidth over the partition (host memory, not caches), GB/s; absent:"
        " memory_GBps"))] | None = None
    module_overhead_us: Annotated[float, Meta(ge=0, le=1e6, description=(
        "the runtime's time per compute op beyond its launches (a unit's forward or backward: the module call, "
        "the ZeRO engine's hooks and parameter views, the trace span), µs; fitted by zsim calibrate from runtime "
        "traces, 0 where not measured (the probe times bare launches)"))] = 0.0
    slowest_rank_factor: Annotated[float, Meta(ge=1, le=10, description=(
        "the slowest rank's compute time per step over the ranks' mean, measured by zsim calibrate "
        "(zsim.calibrate.stragglers): ranks meet at every collective, so the symmetric simulated ranks run "
        "every compute op this much slower; 1 where not measured"))] = 1.0

    def __post_init__(self) -> None:  # rates positive
        super().__post_init__()
        bad = {k: v for k, v in self.matmul_GFLOPS.items() if v <= 0 or k not in ("fp32", "fp16", "bf16")}
        if bad:
            raise ValueError(f"matmul_GFLOPS needs positive rates for fp32/fp16/bf16, got {bad}")


class HostFile(_Strict, kw_only=True):
    """hwprofiles/hosts/<name>.yaml."""

    name: str
    kind: Annotated[str, Meta(pattern="^host$", description="always 'host': this is a CPU machine profile")]
    cpu: Annotated[str, Meta(description="CPU model name (/proc/cpuinfo)")]
    cores: Annotated[int, Meta(gt=0, description="logical cores the ranks may use")]
    memory_GiB: Annotated[float, Meta(gt=0, description="host memory")]
    ranks: Annotated[int, Meta(gt=0, description="ranks on the host (the 'GPUs per node' of a host)")]
    threads_per_rank: Annotated[int, Meta(gt=0, description="intra-op threads per rank (torch.set_num_threads)")]
    backend: Annotated[str, Meta(description="torch.distributed backend the collectives were timed on")] = "gloo"
    transport: Annotated[str, Meta(description="how gloo's ranks talk on one host")] = "tcp-loopback"
    torch: Annotated[str, Meta(description="torch version the numbers were measured with")]
    compute: HostCompute
    gloo_core_share: Annotated[float, Meta(gt=0, lt=1, description=(
        "the share of a rank's cores gloo's thread gets while a compute op runs beside it (zsim.engine.cores); "
        "0.5, processor sharing, where not measured; zsim calibrate fits it from collectives that overlapped "
        "compute"))] = 0.5
    collectives: Annotated[dict[str, dict[int, LatencyBandwidth]], Meta(description=(
        "collective -> group size -> latency-bandwidth terms"))]
    measured: Annotated[dict[str, str | float | int], Meta(description="provenance: date, command")] | None = None
    provenance: Annotated[dict[str, Any], Meta(description=(
        "written by zsim calibrate: inputs, date, fits"))] | None = None

    def __post_init__(self) -> None:  # known collectives
        super().__post_init__()
        unknown = sorted(set(self.collectives) - set(COLLECTIVES))
        if unknown:
            raise ValueError(f"unknown collective(s) {unknown}; known: {', '.join(COLLECTIVES)}")


@dataclass(frozen=True, slots=True)
class HostModel:
    """A host's collective and overhead model in SI units (the Cluster's `host`)."""

    name: str
    cores: int
    ranks: int
    threads_per_rank: int
    op_overhead_s: float
    collectives: dict[tuple[str, int], tuple[float, float]]  # (op, group size) -> (latency s, bytes/s)
    optimizer_overhead_s: float  # the optimizer's ops' own terms (the general ones where the file has none)
    optimizer_bytes_per_s: float
    slowest_rank_factor: float = 1.0  # every compute op × this (zsim.calibrate.stragglers)
    module_overhead_s: float = 0.0  # per compute op (not the optimizer's), beyond its launches
    gloo_share: float = 0.5  # of a rank's cores, for gloo while compute runs beside it (HostFile.gloo_core_share)
    cpu: str = ""  # the CPU model the profile was measured on (HostFile.cpu)

    @property
    def ranks_share_cores(self) -> bool:
        """More threads than cores: ranks time-slice, and compute cannot overlap communication."""
        return self.ranks * self.threads_per_rank > self.cores

    def collective_seconds(self, op: str, nbytes: float, group: int) -> float:
        """Seconds of collective `op` with payload `nbytes` on a group of `group` ranks.

        Raises:
            ConfigError: the profile has no terms for this collective and group size.
        """
        if group == 1:
            return 0.0  # nothing moves
        terms = self.collectives.get((op, group))
        if terms is None:
            have = sorted(f"{o}×{n}" for o, n in self.collectives)
            raise ConfigError(f"host profile '{self.name}' has no {op} terms for a group of {group} ranks "
                              f"(it has {', '.join(have)}); measure them with python -m zsim.runtime.hostprobe")
        latency, rate = terms
        return latency + nbytes / rate


def host_model(spec: HostFile) -> HostModel:
    return HostModel(
        name=spec.name, cores=spec.cores, ranks=spec.ranks, threads_per_rank=spec.threads_per_rank,
        op_overhead_s=spec.compute.op_overhead_us * 1e-6,
        collectives={(op, n): (t.latency_us * 1e-6, t.GBps * 1e9)
                     for op, by_size in spec.collectives.items() for n, t in by_size.items()},
        optimizer_overhead_s=(spec.compute.op_overhead_us if spec.compute.optimizer_op_overhead_us is None
                              else spec.compute.optimizer_op_overhead_us) * 1e-6,
        optimizer_bytes_per_s=(spec.compute.memory_GBps if spec.compute.optimizer_memory_GBps is None
                               else spec.compute.optimizer_memory_GBps) * 1e9,
        slowest_rank_factor=spec.compute.slowest_rank_factor,
        module_overhead_s=spec.compute.module_overhead_us * 1e-6,
        gloo_share=spec.gloo_core_share,
        cpu=spec.cpu,
    )
