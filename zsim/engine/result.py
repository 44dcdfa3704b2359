"""What a simulation produces: timings, communication, memory and the trace events."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from zsim.scenario.scenario import Scenario
from zsim.memory.ledger import MemoryLedger
from zsim.workload.transformer import Workload
from zsim.zero.model_states import ModelStates


@dataclass(slots=True)
class CommStats:
    """One kind of collective (group, op) over the whole run, for one rank."""

    count: int = 0
    payload_bytes: float = 0.0  # Σ S (nccl-tests payload)
    sent_bytes: float = 0.0  # bytes this rank sent, Σ of the algorithm's per-rank fraction × S
    seconds: float = 0.0  # time on its stream, latency included


@dataclass(slots=True)
class Result:
    """A finished simulation of one rank class (every rank of a symmetric scenario is alike)."""

    scenario: Scenario
    workload: Workload
    model_states: ModelStates
    step_seconds: list[float]
    # Per rank; with pipeline parallelism the mean over the stages' representatives.
    compute_seconds: float  # Σ compute-kernel time on the compute stream (MP all-reduces excluded)
    mp_comm_seconds: float  # Σ MP all-reduce time (in line on the compute stream)
    hardware_flops: float  # FLOPs executed by one rank over the run, recompute included
    model_flops: float  # FLOPs of the model's forward and backward, without recompute
    comm: dict[tuple[str, str], CommStats]
    ledger: MemoryLedger
    events: list[dict[str, Any]]  # trace events (empty when simulated with trace=False)
    sim_events: int  # simpy events scheduled
    wall_seconds: float
    algorithms: dict[str, str] = field(default_factory=dict)  # group -> algorithm of its largest collective
    mode: str = "class"  # 'class' or 'per_rank' (zsim.engine.simulation)
    host_ledger: MemoryLedger | None = None  # host memory (Pa+cpu's offloaded checkpoints)
    offload_seconds: float = 0.0  # Σ host-copy time on the offload stream
    ep_comm_seconds: float = 0.0  # Σ MoE all-to-all time over the EP group (in line, or beside compute: ep_overlap)
    # Σ compute-stream time lost to the SMs of collectives beside it (fabric.sm_contention; in compute_seconds)
    contention_seconds: float = 0.0
    # The caching allocator's state as each step ended (zsim.memory.allocator.CachingAllocator.state): two
    # equal last entries mean the run's memory repeats from there on (zsim maxsize's steady state).
    step_memory_states: list[tuple] = field(default_factory=list)
    # Pipeline parallelism (zsim.engine.pipeline_result): every stage's ledger (`ledger` is the worst
    # stage's) and the pipeline block of result.json; empty and None without it.
    stage_ledgers: list[MemoryLedger] = field(default_factory=list)
    pipeline: dict[str, Any] | None = None
    # Micro-batches of each step not simulated but spliced in as copies of one proven to repeat
    # (zsim.engine.repeat); 0 when every micro-batch was simulated.
    repeated_micro_batches: int = 0

    @property
    def total_seconds(self) -> float:
        return sum(self.step_seconds)

    @property
    def fits(self) -> bool:
        return self.ledger.oom is None
