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
gathers and their unflatten): zsim.zero.implementation, docs/zero-implementations.md.

Files: build_plan here is the one interface; zsim.zero.step_pass schedules a micro-batch's items,
with zsim.zero.gathers (stage 3), .checkpoints (ZeRO-R), .reductions (DP gradients) mixed in;
zsim.zero.optimizer_step the step; zsim.zero.rank_states what a rank owns.
"""

from __future__ import annotations

from zsim.zero.inputs import Scenario
from zsim.memory.context import context_memory
from zsim.workload.transformer import Workload
from zsim.zero.checkpoints import md_checkpoints
from zsim.zero.model_states import PARAM_BYTES
from zsim.zero.ops import Alloc, Op, Plan, PlanBuilder
from zsim.zero.optimizer_step import ADAM_BYTES_PER_ELEMENT, optimizer_step
from zsim.zero.buckets import padded_tensors
from zsim.zero.pass_copy import PassRecord, Second, copy_pass, copyable
from zsim.zero.pipeline_plan import build_pipeline_plan
from zsim.zero.rank_states import (expert_dp, expert_partition, rank_model_states, rank_partition, rank_pieces,
                                   scenario_workload, selective)
from zsim.zero.reductions import STAGE1_COPY_TENSORS, _stage1_flat_copy
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
    return None if first_dep else PassRecord(built.start, len(b.ops), step, mb, entry, frozenset(built.entry_users),
                                             reduce)


def _plan(scenario: Scenario, workload: Workload, b: PlanBuilder) -> Plan:
    """The Plan of the ops in `b`, with the scenario's model states, arenas and context."""
    states = rank_model_states(scenario, workload)
    # Gradients are not persistent: DeepSpeed's fp16 gradients (all of them at stages 0/1, the
    # partition at 2/3) appear during backward and are freed in the optimizer step (_grads_tags).
    persistent = (
        Alloc("params", states.params, "model.params"),
        Alloc("optimizer", states.optimizer, "model.optimizer"),
    )
    lay = scenario.layout
    context = context_memory(lay.world, lay.dp, lay.mp, scenario.cluster.nvlink_links).items()
    arenas = _arenas(scenario, workload) if scenario.zero.defragment else {}
    ops = tuple(b.ops)
    if scenario.zero.setup_residue == "runtime" and scenario.cluster.host is None:
        # torch 2.x takes cuBLAS's workspaces from the caching allocator (allocator_workspaces), not beside it
        context = [(name, n) for name, n in context if name != "context.cublas"]
        ops, persistent = runtime_gradients(ops, persistent, scenario.zero.stage, states.grads, lay.dp)
        ops = runtime_step_temporaries(ops, runtime_segments(scenario, workload), PARAM_BYTES[scenario.precision.dtype])
        ops = runtime_gathers(ops, scenario.zero.stage, lay.dp)
        ops = allocator_workspaces(ops, scenario.cluster.gpu.compute_capability)
    return Plan(persistent=persistent, ops=ops, steps=scenario.run.steps, arenas=tuple(arenas.items()),
                context=tuple(context), setup=setup_residue(scenario, workload))


def runtime_gradients(ops: tuple[Op, ...], persistent: tuple[Alloc, ...], stage: int, grad_bytes: int, dp: int
                      ) -> tuple[tuple[Op, ...], tuple[Alloc, ...]]:
    """zsim's runtime's gradients, where the plan has DeepSpeed's: one flat buffer made in setup and kept
    (runtime/zero/stage1.py `grad_flat`, the full e·Ψ that autograd accumulates into; stage2.py and
    stage3.py `grad_partition`, e·Ψ/Nd), between the parameters and the optimizer's states, in place of
    gradients made in backward and freed by the step; and every tensor from the training loop's stream
    (the runtime allocates its buckets and gathers there, data/device/20261127-h200-memhist: one stream);
    at stage 3 each reduce-scatter's output, the bucket's row of this rank (ReduceScatterBuckets `out`,
    e·width, freed when the bucket is delivered: here with the reduce-scatter)."""
    persistent = persistent[:1] + (Alloc("grads", grad_bytes, "model.grads"),) + persistent[1:]
    def made_in_pass(tag: str) -> bool:
        return (tag.startswith("grad.") and tag.rsplit(".", 1)[-1].startswith("s")) if stage <= 1 \
            else tag.startswith("grads.partition.")
    out = []
    for op in ops:
        allocs = tuple(a._replace(stream="compute") for a in op.allocs if not made_in_pass(a.tag))
        frees = tuple(t for t in op.frees if not made_in_pass(t))
        if stage == 3 and op.name.startswith("reduce_scatter/grads.bucket."):
            row = f"runtime.out.{op.name}.s{op.step}.m{op.micro_batch}"
            allocs += (Alloc("buffers", op.nbytes // dp, row, stream="compute"),)
            frees += (row,)
        out.append(op._replace(allocs=allocs, frees=frees))
    return tuple(out), persistent


def runtime_segments(scenario: Scenario, workload: Workload) -> list[int]:
    """Elements of each of the runtime optimizer's segments on this rank (runtime/zero/optimizer.py
    FlatAdam.segments): its share of each flat piece at stages 1-2 (zsim.zero.buckets.flat_pieces), of each
    module's padded tensors at stage 3 (one segment per unit), the whole model at stage 0."""
    dp = scenario.layout.dp
    pieces = rank_pieces(scenario, workload)
    if pieces:
        return [-(-n // dp) for n in pieces]
    if scenario.zero.stage == 3:
        return [padded_tensors(m.tensors, dp) // dp for m in workload.modules if m.params]
    return [workload.params_per_mp_rank]


def largest_segment(scenario: Scenario, workload: Workload) -> int:
    """Elements of the runtime optimizer's largest segment on this rank (runtime_segments)."""
    return max(runtime_segments(scenario, workload))


def runtime_step_temporaries(ops: tuple[Op, ...], segments: list[int], e: int) -> tuple[Op, ...]:
    """The temporaries of zsim's runtime's step checks, made segment by segment and freed before the next
    (runtime/zero/engine.py, optimizer.py), sized for the `largest` segment: the overflow check's
    `torch.isfinite` (the |g| copy, e bytes an element, and its boolean mask), the norm's
    `g.double()` (8 bytes an element; DeepSpeed's get_grad_norm_direct casts per parameter, the runtime per
    segment); and the fp32 gradient copy as one tensor per segment (`.float()` each, no transient beside
    them), held until the step's last op (a local of _optimizer_step, alive through after_step's gathers).
    Seen on the H200 (data/device/20261127-h200-memhist, h4096's 604M-element segment: 1208.3 MB and
    604.1 MB in the overflow check, 4833.2 MB in the norm, which sets that run's reserved peak)."""
    largest = max(segments)
    temporaries = {"optimizer/overflow": ((e * largest, "overflow.abs"), (largest, "overflow.mask")),
                   "optimizer/norm": ((8 * largest, "norm.double"),)}
    out = []
    for op in ops:
        extra = temporaries.get(op.name, ())
        tags = tuple(f"runtime.{name}.s{op.step}" for _, name in extra)
        allocs = op.allocs + tuple(Alloc("buffers", n, tag, stream="compute") for (n, _), tag in zip(extra, tags))
        frees = op.frees + tags
        if op.name == "optimizer/grads_copy":
            allocs = tuple(a for a in allocs if not a.tag.startswith("optimizer.grads_pieces."))
            frees = tuple(t for t in frees if not t.startswith("optimizer.grads_pieces."))
            held = [a for a in allocs if a.tag.startswith("optimizer.grads_copy.")]
            if held:  # one fp32 copy per segment
                allocs = tuple(a for a in allocs if a not in held) + tuple(
                    Alloc("buffers", 4 * n, f"{held[0].tag}.{j}", stream="compute") for j, n in enumerate(segments))
        if op.name == "optimizer/step":  # the copies stay referenced until the step's gathers are done
            frees = tuple(t for t in frees if not t.startswith("optimizer.grads_copy."))
        out.append(op._replace(allocs=allocs, frees=frees) if extra or frees != op.frees or allocs != op.allocs
                   else op)
    last = {op.step: i for i, op in enumerate(out)}  # each step's last op: the runtime's _optimizer_step returns
    for step, i in last.items():
        tag = f"optimizer.grads_copy.s{step}"
        if any(a.tag.startswith(tag + ".") for op in out for a in op.allocs if op.step == step):
            out[i] = out[i]._replace(frees=out[i].frees + tuple(f"{tag}.{j}" for j in range(len(segments))))
    return tuple(out)


def runtime_gathers(ops: tuple[Op, ...], stage: int, dp: int) -> tuple[Op, ...]:
    """zsim's runtime's parameter gathers after the step, where the plan has DeepSpeed v0.2's lists:
    stage 1 gathers each interval in place into the flat buffer (runtime/zero/stage1.py after_step), no
    staging; stage 2 makes per shard `mine` (its e·n/Nd rows) and `rows` (e·n) and rebinds both for the
    next shard, so a shard's `rows` lives until the next shard's are made (stage2.py after_step): `mine`
    freed with its gather, `rows` with the next gather, the last with the step's last op. h4096's step ends
    with three 1,020 MB buffers live (data/device/20261127-h200-memhist)."""
    if stage not in (1, 2):
        return ops
    out = list(ops)
    pending: dict[int, str] = {}  # step -> the last shard's `rows`, not yet freed
    for i, op in enumerate(ops):
        staged = [a for a in op.allocs if a.tag.startswith("ag_list.step.")]
        if not (op.name.startswith("all_gather/params.bucket.") and staged):
            continue
        kept = tuple(a for a in op.allocs if a not in staged)
        frees = tuple(t for t in op.frees if t not in {a.tag for a in staged})
        if stage == 1:
            out[i] = op._replace(allocs=kept, frees=frees)
            continue
        mine, rows = f"runtime.mine.{op.name}.s{op.step}", f"runtime.rows.{op.name}.s{op.step}"
        previous = (pending.pop(op.step),) if op.step in pending else ()
        out[i] = op._replace(allocs=kept + (Alloc("buffers", op.nbytes // dp, mine, stream="compute"),
                                            Alloc("buffers", op.nbytes, rows, stream="compute")),
                             frees=frees + (mine,) + previous)
        pending[op.step] = rows
    last = {op.step: i for i, op in enumerate(out)}
    for step, tag in pending.items():
        out[last[step]] = out[last[step]]._replace(frees=out[last[step]].frees + (tag,))
    return tuple(out)


# cuBLAS workspaces under torch 2.x (aten/src/ATen/cuda/CublasHandlePool.cpp): one per (cuBLAS handle,
# stream), taken from the caching allocator at the handle's first GEMM and kept for the process's life
# (cublas_handle_stream_to_workspace); handles are per thread, so the training loop's thread and autograd's
# backward thread each hold one. Default size CUBLAS_WORKSPACE_CONFIG ":4096:8" (32 MiB) on Hopper,
# ":4096:2:16:8" (8 MiB + 128 KiB) before; cuBLASLt's own workspace, 1 MiB, for the GEMMs it runs (a linear
# with a bias: addmm's epilogue). Seen block by block on an H200 under torch 2.11
# (data/device/20261127-h200-memhist): 33,554,432 B and 1,048,576 B at the first forward GEMM, 33,554,432 B
# at the first backward GEMM, and 1,048,576 B more at the first recomputed forward (autograd's thread).
HOPPER_CUBLAS_WORKSPACE = 4096 * 1024 * 8
CUBLAS_WORKSPACE = 4096 * 1024 * 2 + 16 * 1024 * 8
CUBLASLT_WORKSPACE = 1 << 20


def allocator_workspaces(ops: tuple[Op, ...], capability: int | None) -> tuple[Op, ...]:
    """`ops` with cuBLAS's workspaces allocated where torch 2.x allocates them (see above), never freed:
    at step 0's first layer forward (cuBLAS and cuBLASLt, the loop's thread), its first backward
    (cuBLAS, autograd's thread) and its first recompute (cuBLASLt, autograd's thread). `capability`:
    the GPU's compute capability × 10 (90 Hopper), None when unknown (the pre-Hopper size)."""
    workspace = HOPPER_CUBLAS_WORKSPACE if capability is not None and capability >= 90 else CUBLAS_WORKSPACE
    wanted = {"fwd/layer.": (("cublas.loop", workspace), ("cublaslt.loop", CUBLASLT_WORKSPACE)),
              "bwd/": (("cublas.autograd", workspace),),
              "recompute/": (("cublaslt.autograd", CUBLASLT_WORKSPACE),)}
    out = list(ops)
    # the head's backward GEMMs run in its `.logits` op where the plan splits the head's backward (StepPass)
    first_gemm_bwd = next((op.name for op in ops if op.step == 0 and op.name.endswith(".logits")), None)
    for i, op in enumerate(ops):
        if op.step != 0 or op.stream != "compute":
            continue
        if first_gemm_bwd is not None and op.name.startswith("bwd/") and op.name != first_gemm_bwd:
            continue
        for prefix in [p for p in wanted if op.name.startswith(p)]:
            extra = tuple(Alloc("buffers", n, tag, stream="compute") for tag, n in wanted.pop(prefix))
            out[i] = op._replace(allocs=op.allocs + extra)
        if not wanted:
            break
    return tuple(out)


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
