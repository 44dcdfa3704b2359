"""A micro-batch's pass made from the one before it instead of built again (issue 28: gradient
accumulation's plan in the time of about one micro-batch's).

zsim.zero.step_pass builds the forward and backward of micro-batch k of a step from the scenario, the
workload, the step, k, the reduce flag and the builder's state. k enters in exactly these places, so the
pass of k + 1 is the pass of k with them changed, where both reduce or both do not and neither waits for
an op of an earlier step (`first_dep` empty; steps after the first make their micro-batch 1 afresh):

  - tags: a tensor of the micro-batch is tagged `<what>.s<step>.m<k>` (StepPass._tags); the copy's end
    in `.m<k+1>`. A tag without that ending is the step's (stages 0/1's full gradients, stages 2/3's
    gradient partition): the step's first micro-batch allocates it and the later ones accumulate into it
    (StepPass._backward, Reductions._reduce), so the copy of micro-batch 0 leaves those allocations out;
    a later micro-batch allocating or freeing one cannot be copied;
  - `micro_batch`: k + 1;
  - dependencies: indices inside the pass move by its length; the pass's entry, the last compute op
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


def copy_pass(b: PlanBuilder, previous: PassRecord, reduce: bool) -> PassRecord | None:
    """Append to `b` the pass after `previous` (module docstring) and return its record, or None (and `b`
    unchanged) where the rule does not apply: the reduce flags differ, the builder has ops after the
    pass, or an op of the pass depends on, allocates or frees what the rule does not move."""
    start, end, n = previous.start, previous.end, previous.end - previous.start
    if reduce != previous.reduce or len(b.ops) != end:
        return None
    entry = b.last_compute
    old, new = f".s{previous.step}.m{previous.mb}", f".s{previous.step}.m{previous.mb + 1}"
    cut = len(old)
    renamed: dict[str, str] = {}

    def rename(tag: str) -> str | None:
        found = renamed.get(tag)
        if found is None:
            if not tag.endswith(old):
                return None
            found = renamed[tag] = tag[:-cut] + new
        return found

    mb = previous.mb + 1
    ops: list[Op] = []
    for k, op in enumerate(b.ops[start:end]):
        deps = []
        for d in op.deps:
            if d >= start:
                deps.append(d + n)
            elif d == previous.entry:
                deps.append(entry)
            else:
                return None  # an op before the pass that is not its entry (an earlier step's)
        if k in previous.entry_users and previous.entry is None:
            if deps or entry is None:
                return None
            deps = [entry]
        allocs = op.allocs
        if allocs:
            moved = []
            for a in allocs:
                tag = rename(a.tag)
                if tag is None:  # the step's: only micro-batch 0 allocates it
                    if previous.mb != 0:
                        return None
                    continue
                moved.append(tuple.__new__(Alloc, (a.category, a.nbytes, tag, a.where, a.arena, a.stream)))
            allocs = tuple(moved)
        frees = op.frees
        if frees:
            frees = tuple(rename(tag) for tag in frees)
            if None in frees:
                return None
        fields = list(op)
        fields[2], fields[8], fields[9], fields[11] = tuple(deps), allocs, frees, mb
        ops.append(tuple.__new__(Op, fields))
    b.extend(ops)
    return PassRecord(end, end + n, previous.step, mb, entry, previous.entry_users, reduce)
