"""What zsim's runtime asks the caching allocator for, where a plan has DeepSpeed's requests: the rules
`zero.setup_residue: runtime` adds to a GPU plan (zsim.zero.plan), read off the runtime's code and checked
block by block against its allocator histories on an H200 (`python -m zsim.runtime --cuda-memory-history`,
data/device/20261127-h200-memhist; docs/device-check.md). Three of its ops are made while the plan is
built (zsim.zero.step_pass: stage 3's `bucket/<module>`, the head's `bwd/head.cast` and `bwd/head.logits`);
the rest rewrite the built ops here. Sizes are bytes, elements where named."""

from __future__ import annotations

from zsim.zero.buckets import padded_tensors
from zsim.zero.inputs import Scenario
from zsim.workload.transformer import Workload
from zsim.zero.model_states import PARAM_BYTES
from zsim.zero.ops import Alloc, Op
from zsim.zero.rank_states import rank_model_states, rank_pieces


def runtime_requests(scenario: Scenario, workload: Workload, ops: tuple[Op, ...], persistent: tuple[Alloc, ...],
                     context: tuple[tuple[str, int], ...]
                     ) -> tuple[tuple[Op, ...], tuple[Alloc, ...], tuple[tuple[str, int], ...]]:
    """(ops, persistent allocations, context) of a GPU plan rewritten as zsim's runtime requests them."""
    lay = scenario.layout
    # torch 2.x takes cuBLAS's workspaces from the caching allocator (allocator_workspaces), not beside it
    context = tuple((name, n) for name, n in context if name != "context.cublas")
    ops, persistent = runtime_gradients(ops, persistent, scenario.zero.stage,
                                        rank_model_states(scenario, workload).grads, lay.dp)
    ops = runtime_step_temporaries(ops, runtime_segments(scenario, workload), PARAM_BYTES[scenario.precision.dtype])
    ops = runtime_gathers(ops, scenario.zero.stage, lay.dp)
    return allocator_workspaces(ops, scenario.cluster.gpu.compute_capability), persistent, context


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
    (runtime/zero/engine.py, optimizer.py), sized for the largest of `segments` (elements): the overflow check's
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
