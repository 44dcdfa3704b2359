"""The ZeRO plan: the ops one rank executes per step, for each stage (Rajbhandari et al., ZeRO).

What each stage does, as DeepSpeed implements it:
  stage 0 (DP):     backward produces full gradients; buckets of them are all-reduced on the comm
                    stream while backward goes on; the optimizer updates all Ψ parameters.
  stage 1 (Pos):    after the last backward the gradients are reduce-scattered in DeepSpeed v0.2's
                    comm intervals; the optimizer updates this rank's 1/Nd of each; the updated
                    parameters are all-gathered after the step, interval by interval (§5.1, §7.2.1).
  stage 2 (Pos+g):  the buckets are reduce-scattered while backward goes on and a bucket's gradients
                    are freed once reduced: each rank keeps only its gradient partition (§5.2); after
                    the step the partition is all-gathered in DeepSpeed v0.2's shards.
The stage 1-2 layout (which rank owns what, what each collective moves) is zsim.zero.buckets', which
the runtime (runtime/zero/) follows too: one plan, op for op (docs/runtime.md, "One ZeRO plan").
  stage 3 (Pos+g+p): parameters are partitioned; each module's parameters are all-gathered before
                    its forward (prefetching `prefetch_layers` ahead) and again before its backward,
                    freed after use; its gradients are reduce-scattered right after its backward (§5.3,
                    §7.2.2: 3Ψ of traffic instead of 2Ψ).
Megatron MP all-reduces run in line on the compute stream (Shoeybi et al. 2019, §3). With gradient
accumulation, stages 0/1 reduce only on the last micro-batch (no_sync); stages 2/3 reduce every
micro-batch, as DeepSpeed does.

ZeRO-R (§6; sizes in zsim.zero.residual, explained in docs/memory.md):
  checkpointing keeps one layer input every `checkpoint_every` layers; backward recomputes a segment's
      layers in forward order, then runs their backward in reverse (Megatron-LM checkpoint_num_layers);
  Pa keeps 1/mp of each checkpoint and all-gathers it over the MP group, in line on the compute
      stream, before the segment's recompute (DeepSpeed checkpointing.py get_full_inputs);
  Pa+cpu copies each partition to host memory on the 'offload' stream once the forward made it, and
      back one segment ahead of its recompute;
  CB: constant-size gradient buckets; without it stages 0-2 reduce all gradients at once from one
      fused fp32 buffer of 4Ψ bytes (§3.2), and stage 3's optimizer upcasts its whole partition;
  MD: checkpoints and stage 2/3 gradients are placed in contiguous arenas reserved at the start.
Every compute op also holds its working memory while it runs: a forward under checkpointing its
layer's activations, a backward the gradients of its input and output.

zero.implementation replaces parts of this with DeepSpeed's code of a given version (v0.2's per-owner
reduces at stage 2; v0.3.13-v0.5.10's per-tensor, synchronised stage 3 gathers; v0.14's coalesced
gathers and their unflatten), or stages 0-1 with Megatron-Core's buffers and distributed optimizer
(zsim.zero.megatron_ddp): zsim.zero.implementation, docs/zero-implementations.md.

Files: build_plan here is the one interface; zsim.zero.step_pass schedules a micro-batch's items,
with zsim.zero.gathers (stage 3), .checkpoints (ZeRO-R), .reductions (DP gradients) mixed in;
zsim.zero.optimizer_step the step; zsim.zero.rank_states what a rank owns.
"""

from __future__ import annotations

from zsim.zero.inputs import Scenario
from zsim.memory.context import context_memory
from zsim.workload.transformer import Workload
from zsim.zero.checkpoints import md_checkpoints
from zsim.zero.ep_overlap import overlap_passes
from zsim.zero.model_states import PARAM_BYTES
from zsim.zero.ops import Alloc, Plan, PlanBuilder
from zsim.zero.optimizer_step import ADAM_BYTES_PER_ELEMENT, optimizer_step
from zsim.zero.pass_copy import PassRecord, Second, copy_pass, copyable
from zsim.zero.pipeline_plan import block_ops, build_pipeline_plan
from zsim.zero.rank_states import (expert_dp, expert_partition, fp8_cache_bytes, rank_model_states, rank_partition,
                                   rank_pieces, scenario_workload, selective)
from zsim.zero.reductions import STAGE1_COPY_TENSORS, _stage1_flat_copy
from zsim.zero.runtime_requests import runtime_requests
from zsim.zero.residual import checkpoint_bytes_per_rank, checkpoint_segments, md_arena_bytes
from zsim.zero.step_pass import StepPass

# The plan's one interface is build_plan; these names are re-exported for its callers.
__all__ = ["ADAM_BYTES_PER_ELEMENT", "STAGE1_COPY_TENSORS", "_stage1_flat_copy", "build_plan", "build_unit_plan",
           "expert_dp", "expert_partition", "rank_model_states", "rank_partition", "rank_pieces", "scenario_workload",
           "selective"]


def build_plan(scenario: Scenario, workload: Workload, copy_passes: bool = True) -> Plan:
    """The ops of `scenario.run.steps` optimizer steps for one rank (all ranks of a class are alike); with
    pipeline parallelism, for one rank of each stage (zsim.zero.pipeline_plan). A micro-batch's pass is
    made from the one before it where zsim.zero.pass_copy's rule applies (the same ops as building it;
    `copy_passes=False` builds every one, the tests' reference)."""
    if scenario.layout.pp > 1:
        return build_pipeline_plan(scenario, workload, copy_passes)
    b = PlanBuilder()
    if scenario.parallel.ep_overlap:
        for step in range(scenario.run.steps):
            _combined_step(b, scenario, workload, step)
            optimizer_step(b, scenario, workload, step)
        return _plan(scenario, workload, b)
    for step in range(scenario.run.steps):
        boundary = b.last()
        previous: PassRecord | None = None
        for mb in range(scenario.grad_accum):
            reduce = scenario.zero.stage >= 2 or mb == scenario.grad_accum - 1
            copied = copy_pass(b, previous, reduce) if copy_passes and previous is not None else None
            previous = copied or _build_pass(b, scenario, workload, step, mb, boundary, reduce)
        optimizer_step(b, scenario, workload, step)
    return _plan(scenario, workload, b)


def build_unit_plan(scenario: Scenario, workload: Workload) -> tuple[Plan, Second] | None:
    """`scenario` (2 micro-batches, 1 step, no pipeline) planned with micro-batch 1 left out, where it is
    micro-batch 0 copied (zsim.zero.pass_copy), for zsim.engine.shifted_unit's proof: micro-batch 0's pass
    and the optimizer step, with the Second that describes micro-batch 1; else None. The optimizer step
    waits only for the last comm op before it (optimizer_step), micro-batch 1's copy of micro-batch 0's
    last: here micro-batch 0's, its counterpart (build_plan's plan with micro-batch 1 cut out and its
    dependencies moved so: tests/test_pass_copy.py)."""
    assert scenario.grad_accum == 2 and scenario.run.steps == 1 and scenario.layout.pp == 1, scenario
    b = PlanBuilder()
    first = _build_pass(b, scenario, workload, 0, 0, None, reduce=scenario.zero.stage >= 2)
    if first is None or not copyable(b.ops, first, True, b.last_compute):
        return None
    second = Second(first, b.last_compute)
    optimizer_step(b, scenario, workload, 0)
    return _plan(scenario, workload, b), second


def _build_pass(b: PlanBuilder, scenario: Scenario, workload: Workload, step: int, mb: int, boundary: int | None,
                reduce: bool) -> PassRecord | None:
    """Build micro-batch `mb`'s pass of `step` (after op `boundary`, the step's first op's wait); its
    record, or None where it waits for an earlier step (not copied: zsim.zero.pass_copy)."""
    first_dep = (boundary,) if boundary is not None and mb == 0 else ()
    entry = b.last_compute
    built = StepPass(b, scenario, workload, step, mb, first_dep)
    built.run(reduce=reduce)
    # a pass that gathers megatron-core's parameters (the step's first) is not copied from (zsim.zero.pass_copy)
    return None if first_dep or built.gathers_params else PassRecord(built.start, len(b.ops), step, mb, entry, frozenset(built.entry_users),
                                             reduce)


def _combined_step(b: PlanBuilder, scenario: Scenario, workload: Workload, step: int) -> None:
    """One step's micro-batches as Megatron-Core's combined 1F1B without pipelining runs them under
    --overlap-moe-expert-parallel-comm (pipeline_parallel/combined_1f1b.py @ d98e8a6,
    combined_1f1b_schedule_for_no_pipelining): the first micro-batch's forward alone, then each next forward
    merged with the previous micro-batch's backward, layer by layer, their EP all-to-alls beside the other's
    compute (zsim.zero.ep_overlap), then the last backward alone. Two micro-batches' activations are held
    while a pair runs. Every pass is built (none is copied: a merged pass's ops are reordered); stages 0-1
    reduce on the last backward (no_sync), the scenario loader refuses stages 2-3 with the overlap."""
    m, mods = scenario.grad_accum, list(workload.modules)
    boundary = b.last()
    StepPass(b, scenario, workload, step, 0, (boundary,) if boundary is not None else ()).forward(mods)
    fwd_blocks, bwd_blocks = block_ops("fwd", workload.modules), block_ops("bwd", workload.modules)
    for mb in range(1, m):
        start = len(b.ops)
        StepPass(b, scenario, workload, step, mb, ()).forward(mods)
        mid = len(b.ops)
        StepPass(b, scenario, workload, step, mb - 1, ()).backward(mods, reduce=False)
        overlap_passes(b, start, mid, len(b.ops), fwd_blocks, bwd_blocks)
    StepPass(b, scenario, workload, step, m - 1, ()).backward(mods, reduce=True)


def _plan(scenario: Scenario, workload: Workload, b: PlanBuilder) -> Plan:
    """The Plan of the ops in `b`, with the scenario's model states, arenas and context."""
    states = rank_model_states(scenario, workload)
    # Gradients are not persistent: DeepSpeed's fp16 gradients (all of them at stages 0/1, the
    # partition at 2/3) appear during backward and are freed in the optimizer step (_grads_tags).
    persistent = (
        Alloc("params", states.params, "model.params"),
        Alloc("optimizer", states.optimizer, "model.optimizer"),
    )
    if cache := fp8_cache_bytes(scenario, workload):  # Transformer Engine's cached FP8 weights (zsim.compute.fp8)
        persistent += (Alloc("params", cache, "model.fp8_weights"),)
    lay = scenario.layout
    context = context_memory(lay.world, lay.dp, lay.mp, scenario.cluster.nvlink_links).items()
    arenas = _arenas(scenario, workload) if scenario.zero.defragment else {}
    ops = tuple(b.ops)
    if scenario.zero.setup_residue == "runtime" and scenario.cluster.host is None:
        ops, persistent, context = runtime_requests(scenario, workload, ops, persistent, tuple(context))
    return Plan(persistent=persistent, ops=ops, steps=scenario.run.steps, arenas=tuple(arenas.items()),
                context=tuple(context), setup=setup_residue(scenario, workload))


def setup_residue(scenario: Scenario, workload: Workload) -> tuple[Alloc, ...]:
    """zero.setup_residue 'runtime': what zsim's runtime allocates in setup and frees before the first step,
    in its order (zsim.config.schema ZeroSection.setup_residue cites the code): each module's fp32 initial
    values, 4 B a parameter of this MP rank, then at stages 1-2 the fp32 flat copy of them all, padded as the
    flat buffer is (4 B a padded element). () for 'none'."""
    if scenario.zero.setup_residue == "none":
        return ()
    residue = tuple(Alloc("buffers", 4 * m.params, f"setup.init32.{m.name}") for m in workload.modules if m.params)
    if scenario.zero.stage in (1, 2):
        flat = rank_model_states(scenario, workload).params // PARAM_BYTES[scenario.precision.dtype]
        residue += (Alloc("buffers", 4 * flat, "setup.flat32"),)
    return residue


def _arenas(s: Scenario, w: Workload) -> dict[str, int]:
    """MD's arenas for this scenario (zsim.zero.residual.md_arena_bytes), and with md_checkpoints:
    reserved, the checkpoints' arena: every checkpoint of one micro-batch that lives on the GPU."""
    z = s.zero
    arenas = md_arena_bytes(z.stage, PARAM_BYTES[s.precision.dtype], w.params_per_mp_rank, z.reduce_bucket_elements,
                            z.constant_buffers, z.overlap_comm)
    if md_checkpoints(z) == "arena" and w.blocks:
        per = checkpoint_bytes_per_rank(w.blocks[0].checkpoint_bytes, s.layout.mp, z.partition_activations)
        arenas = {"checkpoints": per * checkpoint_segments(len(w.blocks), z.checkpoint_every), **arenas}
    return arenas
