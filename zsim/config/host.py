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
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from zsim.errors import ConfigError

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class LatencyBandwidth(_Strict):
    """t = latency_us + bytes / (GBps · 1e9) for one collective on one group size."""

    latency_us: float = Field(ge=0)
    GBps: float = Field(gt=0)
    fit: dict[str, float] | None = Field(default=None, description="provenance: residuals of the fit")


class HostCompute(_Strict):
    """What one rank achieves with `threads_per_rank` threads (the compute model's terms for a CPU:
    matmul throughput, memory-bound bandwidth, per-op overhead; docs/compute.md uses the same terms)."""

    matmul_GFLOPS: dict[str, float] = Field(description="achieved GEMM rate per dtype (fp32, fp16, bf16), GFLOP/s")
    memory_GBps: float = Field(gt=0, description="achieved streaming (copy) bandwidth of one rank, GB/s")
    op_overhead_us: float = Field(ge=0, description="framework time per aten op (dispatch of a tiny op), µs; "
                                                   "paid once per kernel of an op's kernel list")

    optimizer_op_overhead_us: float | None = Field(
        default=None, ge=0, le=1e6, description="the optimizer's ops (norms, flat copy, Adam): framework time per "
                                                "aten op, µs; absent: op_overhead_us")
    optimizer_memory_GBps: float | None = Field(
        default=None, gt=0, le=1e6, description="the optimizer's ops: streaming bandwidth over the partition "
                                                "(host memory, not caches), GB/s; absent: memory_GBps")

    @model_validator(mode="after")
    def _rates_positive(self) -> HostCompute:
        bad = {k: v for k, v in self.matmul_GFLOPS.items() if v <= 0 or k not in ("fp32", "fp16", "bf16")}
        if bad:
            raise ValueError(f"matmul_GFLOPS needs positive rates for fp32/fp16/bf16, got {bad}")
        return self


class HostFile(_Strict):
    """hwprofiles/hosts/<name>.yaml."""

    name: str
    kind: str = Field(pattern="^host$", description="always 'host': this is a CPU machine profile")
    cpu: str = Field(description="CPU model name (/proc/cpuinfo)")
    cores: int = Field(gt=0, description="logical cores the ranks may use")
    memory_GiB: float = Field(gt=0, description="host memory")
    ranks: int = Field(gt=0, description="ranks on the host (the 'GPUs per node' of a host)")
    threads_per_rank: int = Field(gt=0, description="intra-op threads per rank (torch.set_num_threads)")
    backend: str = Field(default="gloo", description="torch.distributed backend the collectives were timed on")
    transport: str = Field(default="tcp-loopback", description="how gloo's ranks talk on one host")
    torch: str = Field(description="torch version the numbers were measured with")
    compute: HostCompute
    collectives: dict[str, dict[int, LatencyBandwidth]] = Field(
        description="collective -> group size -> latency-bandwidth terms")
    measured: dict[str, str | float | int] | None = Field(default=None, description="provenance: date, command")
    provenance: dict[str, Any] | None = Field(default=None, description="written by zsim calibrate: inputs, date, fits")

    @model_validator(mode="after")
    def _known_collectives(self) -> HostFile:
        unknown = sorted(set(self.collectives) - set(COLLECTIVES))
        if unknown:
            raise ValueError(f"unknown collective(s) {unknown}; known: {', '.join(COLLECTIVES)}")
        return self


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
    )
