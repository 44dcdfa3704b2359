"""A micro-batch's pass made from the one before it instead of built again (issue 28: gradient
accumulation's plan in the time of about one micro-batch's).

zsim.zero.step_pass builds the forward and backward of micro-batch k of a step from the scenario, the
workload, the step, k, the reduce flag and the builder's state. k enters in exactly these places, so the
pass of k + 1 is the pass of k with them changed, where both reduce or both do not and neither waits for
an op of an earlier step (`first_dep` empty; steps after the first make their micro-batch 1 afresh). A
pipeline stage's passes are a chunk's forward or its backward (zsim.zero.pipeline_plan), each copied from
the same chunk's previous one of that kind, with other passes, sends and receives between them:

  - tags: a tensor of the micro-batch is tagged `<what>.s<step>.m<k>` (StepPass._tags); the copy's end
    in `.m<k+1>`. A tag without that ending is the step's (stages 0/1's full gradients, stages 2/3's
    gradient partition): the step's first micro-batch allocates it and the later ones accumulate into it
    (StepPass._backward, Reductions._reduce), so the copy of micro-batch 0 leaves those allocations out;
    a later micro-batch allocating or freeing one cannot be copied;
  - `micro_batch`: k + 1;
  - dependencies: indices inside the pass move by its distance from the copy; the pass's entry, the last compute op
    before it (the forward's `phase_dep`, which its first gathers wait for: zsim.zero.gathers), becomes
    the copy's entry. Micro-batch 0 of the first step has no entry: the ops that would wait for one
    (`StepPass.entry_users`) wait for the copy's. Any other dependency outside the pass: no copy.

Everything else of an op (name, stream, costs, collective, kernels) is the pass's own, unchanged. The
rule is checked, op for op, against building every pass (build_plan(..., copy_passes=False)) across the
shipped scenarios and drawn ones (tests/test_pass_copy.py); where it cannot apply, build_plan builds.
"""

from __future__ import annotations

from dataclasses import dataclass

from zsim.zero.ops import Alloc, Op, PlanBuilder


@dataclass(frozen=True, slots=True)
class PassRecord:
    """One built or copied pass: ops [start, end) of `builder.ops`, of micro-batch `mb` of `step`; `entry`,
    the last compute op before it (None when there was none); `entry_users`, the ops that wait for the
    entry (indices in the pass, from 0); `reduce`, whether it reduced its gradients."""

    start: int
    end: int
    step: int
    mb: int
    entry: int | None
    entry_users: frozenset[int]
    reduce: bool


def _suffix(step: int, mb: int) -> str:
    """The ending of the tags of micro-batch `mb` of `step` (zsim.zero.step_pass.StepPass._tags)."""
    return f".s{step}.m{mb}"


def copyable(ops: list[Op] | tuple[Op, ...], previous: PassRecord, reduce: bool, entry: int | None) -> bool:
    """Whether the pass after `previous` is it copied (module docstring): `ops` hold the pass at
    [previous.start, previous.end); `entry`, the copy's entry (the last compute op before it)."""
    if reduce != previous.reduce:
        return False
    start, end, old = previous.start, previous.end, _suffix(previous.step, previous.mb)
    no_entry = previous.entry is None
    for k in range(start, end):
        op = ops[k]
        if op.deps and min(op.deps) < start and not all(d >= start or d == previous.entry for d in op.deps):
            return False  # an op before the pass that is not its entry (an earlier step's)
        if no_entry and k - start in previous.entry_users and (op.deps or entry is None):
            return False
        if op.frees and not all(tag.endswith(old) for tag in op.frees):
            return False  # the step's tensor freed by a micro-batch
        if previous.mb and op.allocs and not all(a.tag.endswith(old) for a in op.allocs):
            return False  # the step's tensor: only micro-batch 0 allocates it
    return True


def copy_pass(b: PlanBuilder, previous: PassRecord, reduce: bool, mb: int | None = None) -> PassRecord | None:
    """Append to `b` the pass of micro-batch `mb` (default the next) copied from `previous` (module
    docstring), wherever `previous` lies in `b` (a pipeline stage runs other passes between a chunk's), and
    return its record; None (and `b` unchanged) where the rule does not apply (copyable)."""
    start, end, n = previous.start, previous.end, previous.end - previous.start
    entry = b.last_compute
    if not copyable(b.ops, previous, reduce, entry):
        return None
    mb = previous.mb + 1 if mb is None else mb
    old, new = _suffix(previous.step, previous.mb), _suffix(previous.step, mb)
    cut, offset = -len(old), len(b.ops) - start
    users = previous.entry_users if previous.entry is None else ()
    ops: list[Op] = []
    for k, op in enumerate(b.ops[start:end]):
        deps = op.deps
        if k in users:
            deps = (entry,)
        elif deps:
            deps = tuple([d + offset if d >= start else entry for d in deps])
        allocs = op.allocs
        if allocs:  # the step's tensors (micro-batch 0's only) left out
            allocs = tuple([tuple.__new__(Alloc, (a.category, a.nbytes, a.tag[:cut] + new, a.where, a.arena, a.stream))
                            for a in allocs if a.tag.endswith(old)])
        frees = op.frees
        if frees:
            frees = tuple([tag[:cut] + new for tag in frees])
        fields = list(op)
        fields[2], fields[8], fields[9], fields[11] = deps, allocs, frees, mb
        ops.append(tuple.__new__(Op, fields))
    at = len(b.ops)
    b.extend(ops)
    return PassRecord(at, at + n, previous.step, mb, entry, previous.entry_users, reduce)


@dataclass(frozen=True, slots=True)
class Second:
    """Micro-batch 1 of a step's first two, where it is micro-batch 0 copied, described without being
    made (zsim.engine.shifted_unit's proof needs its dependencies and memory calls, not its ops): `first`,
    micro-batch 0's record; `entry`, the copy's entry (micro-batch 0's last compute op)."""

    first: PassRecord
    entry: int | None

    def deps(self, op: Op, k: int) -> tuple[int, ...]:
        """The copy's dependencies of micro-batch 0's op `op`, its `k`-th, in the plan of both."""
        if self.first.entry is None and k in self.first.entry_users:
            return (self.entry,)
        n, start = self.first.end - self.first.start, self.first.start
        return tuple(d + n if d >= start else self.entry for d in op.deps)

    @property
    def suffix(self) -> str:
        """The ending of micro-batch 0's tags (and, in allocs' answers, of the copy's)."""
        return _suffix(self.first.step, self.first.mb)

    def allocs(self, op: Op, suffix: str) -> tuple[Alloc, ...]:
        """What the copy of `op` allocates, under micro-batch 0's tags (ending in `suffix`, self.suffix): its
        own less the step's tensors."""
        kept = [a for a in op.allocs if a.tag.endswith(suffix)]
        return op.allocs if len(kept) == len(op.allocs) else tuple(kept)
