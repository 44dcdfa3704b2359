"""The ops of a ZeRO plan: what each rank's streams execute, with dependencies and memory effects."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from zsim.compute.kernel_list import KernelList


class Alloc(NamedTuple):
    """Memory taken when an op starts: `nbytes` of `category`, released later by `tag`.
    `where` is "gpu" or "host" (Pa+cpu's offloaded checkpoints); `arena` names the MD buffer the
    tensor is placed in ("" for the caching allocator). Immutable; a named tuple rather than a frozen
    dataclass because a plan makes thousands (a third of the cost to make each)."""

    category: str
    nbytes: int
    tag: str
    where: str = "gpu"
    arena: str = ""
    stream: str = ""  # the allocator pool (CUDA stream) it comes from; "" = the op's own stream


# The groups a MoE block's dispatch and combine all-to-alls run in: the EP group, or the experts' TP × EP group
# (zsim.zero.rank_states.ep_dispatch); their time and bytes are the run's EP all-to-all.
EP_GROUPS = ("ep", "tpep")


class Op(NamedTuple):
    """One op on one stream. Ops on a stream run in order; `deps` are ops (by index) on any stream
    that must finish first. Compute ops have `flops` and `hbm_bytes` and, when built from the workload,
    `kernels` (the kernel list zsim.compute prices; ops without one are priced from flops and bytes);
    collectives have `collective`, `group` ('dp', 'mp', or for experts 'ep', 'tpep', 'edp') and `nbytes` (payload S as nccl-tests counts it);
    pipeline point-to-point ops have `collective` 'send' or 'recv', group 'pp' and the bytes one rank sends; host copies (on the
    'offload' stream) have `transfer` ('d2h' or 'h2d') and `nbytes`. Allocations happen when the op
    starts, frees when it ends. Immutable (a named tuple, as Alloc: a plan makes one per op)."""

    name: str
    stream: str
    deps: tuple[int, ...] = ()
    flops: float = 0.0
    hbm_bytes: float = 0.0
    collective: str = ""
    group: str = ""
    nbytes: int = 0
    allocs: tuple[Alloc, ...] = ()
    frees: tuple[str, ...] = ()
    step: int = 0
    micro_batch: int = 0
    transfer: str = ""
    kernels: KernelList | None = None  # compute ops: the kernels the GPU runs (zsim.compute), shared per shape
    elements: int = 0  # the optimizer step: elements this rank updates (its partition, padding included)
    stage: int = 0  # the pipeline stage whose representative rank runs it (zsim.zero.pipeline_plan)
    nic_share: float = 1.0  # an all_to_all's bytes across nodes relative to an even spread (DeepEP: Moe.nic_share)
    # A zero-cost op that only allocates or frees, at a point of the runtime's order that no op of its own marks
    # (zero.setup_residue runtime: `bucket/<module>`, `bwd/head.cast`, `bwd/head.logits`): no measured span corresponds to it.
    memory_only: bool = False

    @property
    def is_collective(self) -> bool:
        return bool(self.collective)


@dataclass(frozen=True, slots=True)
class Plan:
    """A rank class's whole run: persistent allocations (model states), MD arenas reserved at the
    start (name, bytes), and the ops of every step."""

    persistent: tuple[Alloc, ...]
    ops: tuple[Op, ...]
    steps: int
    arenas: tuple[tuple[str, int], ...] = ()
    context: tuple[tuple[str, int], ...] = ()  # held outside the allocator all run (zsim.memory.context)
    # Pipeline parallelism: each stage's persistent allocations (stage 0's are `persistent`), one per stage.
    stage_persistent: tuple[tuple[Alloc, ...], ...] = ()
    # Made before `persistent` and freed right after it, before the first step: what the framework's setup
    # leaves cached in the allocator (zero.setup_residue); the peaks count from the first step.
    setup: tuple[Alloc, ...] = ()

    @property
    def stages(self) -> int:
        """Pipeline stages the plan's ops run on (1 without pipeline parallelism)."""
        return max(1, len(self.stage_persistent))


class PlanBuilder:
    """Appends ops and hands out their indices."""

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self.last_comm: int | None = None
        self.last_compute: int | None = None

    def add(self, **fields) -> int:
        self.ops.append(Op(**fields))
        if fields["stream"] == "comm":
            self.last_comm = len(self.ops) - 1
        elif fields["stream"] == "compute":
            self.last_compute = len(self.ops) - 1
        return len(self.ops) - 1

    def extend(self, ops: list[Op]) -> None:
        """Append `ops` (their dependencies already indices of this builder), as add() would one by one."""
        for op in ops:
            self.ops.append(op)
            if op.stream == "comm":
                self.last_comm = len(self.ops) - 1
            elif op.stream == "compute":
                self.last_compute = len(self.ops) - 1

    def last(self) -> int | None:
        return len(self.ops) - 1 if self.ops else None

