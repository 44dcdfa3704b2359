"""One micro-batch's forward and another's backward merged, layer by layer, with each one's EP all-to-alls beside
the other's compute: Megatron-Core's --overlap-moe-expert-parallel-comm (parallel.ep_overlap).

What Megatron-Core runs (NVIDIA/Megatron-LM @ d98e8a6):
  - pipeline_parallel/schedules.py: in the interleaved schedule's steady state each forward and the backward after
    it run as one step (combined_1f1b_schedule_for_interleaved_pipelining), after one more warm-up forward
    (zsim.parallel.pipeline.stage_schedule, `merged`);
  - models/common/model_chunk_schedule_plan.py TransformerModelChunkSchedulePlan.run: the forward chunk's
    pre-process (the embedding), the backward chunk's post-process (the head and loss), then forward layer i beside
    backward layer n-1-i for as many layers as both have, the backward's remaining layers, the forward's remaining
    layers, the forward's post-process and the backward's pre-process;
  - TransformerLayerSchedulePlan.run, per layer pair: the dispatch and combine (the all-to-alls) on a communication
    stream, the rest on the compute stream, "overlapping the communications (dispatch or combine) of one with the
    computations (pre_dispatch or mlp) of the other".

What zsim keeps of it: its ops are whole modules (one kernel list a block and pass), so a forward block's all-to-alls
run on the 'comm' stream after that block's compute and before the next forward block, which waits for them, while
the compute stream runs the paired backward block; the backward block's all-to-alls likewise beside the next
forward block. A layer pair then takes about max(compute of both, all-to-alls of both) where Megatron-Core's
sub-module split can hide an all-to-all only behind the part of the other pass its dependencies leave free (the
dispatch between attention and the experts): zsim's overlap is the upper bound of Megatron-Core's. Not modelled:
the SMs DeepEP's kernels take from the compute they overlap (Megatron-Core moe_flex_dispatcher_num_sms, 20 by
default), and --delay-wgrad-compute's split of the weight gradients (they stay in their block's backward).
"""

from __future__ import annotations

from zsim.zero.ops import EP_GROUPS, PlanBuilder


def _is_ep_all_to_all(op) -> bool:
    return op.collective == "all_to_all" and op.group in EP_GROUPS


def _groups(ops: list, lo: int, hi: int, blocks: frozenset[str]) -> tuple[list[int], list[list[int]]]:
    """The op indices of [lo, hi) as a prologue (before the first block's compute op) and one group per block, each
    from its block's compute op to the op before the next one's."""
    prologue: list[int] = []
    groups: list[list[int]] = []
    for i in range(lo, hi):
        if ops[i].name in blocks:
            groups.append([i])
        elif groups:
            groups[-1].append(i)
        else:
            prologue.append(i)
    return prologue, groups


def overlap_passes(b: PlanBuilder, start: int, mid: int, end: int, fwd_blocks: frozenset[str],
                   bwd_blocks: frozenset[str]) -> None:
    """Merge the forward built at b.ops[start:mid] and the backward at b.ops[mid:end] in place, as
    TransformerModelChunkSchedulePlan.run orders them (module docstring), their EP all-to-alls moved to the 'comm'
    stream. `fwd_blocks` and `bwd_blocks` are the names of the two passes' block compute ops ('fwd/layer.3').

    The dependencies the compute stream's order gave are made explicit: an all-to-all waits for the compute op before
    it in its own pass, and the next compute op of that pass waits for the all-to-all."""
    ops = b.ops
    assert start <= mid <= end == len(ops), "the two passes must be the builder's last ops"
    extra: dict[int, list[int]] = {}
    for lo, hi in ((start, mid), (mid, end)):
        last_compute, pending = None, []
        for i in range(lo, hi):
            op = ops[i]
            if _is_ep_all_to_all(op):
                if last_compute is not None:
                    extra.setdefault(i, []).append(last_compute)
                if pending:  # combine after dispatch: the comm stream's order keeps it, the dependency says it
                    extra.setdefault(i, []).append(pending[-1])
                pending.append(i)
            elif op.stream == "compute":
                if pending:
                    extra.setdefault(i, []).append(pending[-1])
                    pending = []
                last_compute = i
    f_pro, f_groups = _groups(ops, start, mid, fwd_blocks)
    b_pro, b_groups = _groups(ops, mid, end, bwd_blocks)
    both = min(len(f_groups), len(b_groups))
    order = f_pro + b_pro
    for i in range(both):
        order += f_groups[i] + b_groups[i]
    for g in b_groups[both:] + f_groups[both:]:
        order += g
    assert sorted(order) == list(range(start, end)), "every op of the two passes placed once"
    where = {old: start + k for k, old in enumerate(order)}
    moved = []
    for old in order:
        op = ops[old]
        deps = tuple(where.get(d, d) for d in op.deps + tuple(extra.get(old, ())))
        moved.append(op._replace(deps=deps, stream="comm" if _is_ep_all_to_all(op) else op.stream))
    ops[start:end] = moved
    b.last_compute = max((i for i in range(start, end) if ops[i].stream == "compute"), default=b.last_compute)
    b.last_comm = max((i for i in range(start, end) if ops[i].stream == "comm"), default=b.last_comm)
