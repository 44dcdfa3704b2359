"""The optimizer step in the plan: the fp16 checks, the gradients' fp32 copy, Adam on the rank's
partition, and stages 1-2's all-gather of the updated parameters."""

from __future__ import annotations

import math

from zsim.compute.fp8 import copies, weight_kernels
from zsim.compute.optimizer_kernels import host_adam_kernels, optimizer_kernels, runtime_step_kernels
from zsim.zero.inputs import Scenario
from zsim.workload.transformer import Module, Workload
from zsim.zero.buckets import allgather_shards
from zsim.zero.implementation import list_copy_launches, list_copy_tail, shard_list
from zsim.zero.megatron_ddp import IMPLEMENTATION as MEGATRON, chunk_buckets, grad_bytes
from zsim.zero.model_states import PARAM_BYTES
from zsim.zero.ops import Alloc, PlanBuilder
from zsim.zero.rank_states import (expert_dp, expert_param_bytes, expert_partition, fp8_weight_elements, full_grad_tag,
                                   param_bytes_per_element, partition_grad_tag, rank_partition, rank_pieces)
from zsim.zero.runtime_requests import runtime_segments
from zsim.zero.residual import StepGradients, list_collective_staging_bytes, step_gradient_bytes

# Adam's update streams, per element: reads fp32 master, momentum, variance and the fp16 gradient
# (4+4+4+2 bytes) and writes master, momentum, variance and the fp16 parameter (4+4+4+2): memory-bound
# (DeepSpeed FusedAdam; counts from the update rule in Kingma & Ba 2015, Alg. 1).
ADAM_BYTES_PER_ELEMENT = 28
# Pure bf16 (precision.master_weights false): bf16 parameter, momentum and variance read and written, the bf16
# gradient read: 14 bytes (the same update rule, PyTorch's foreach Adam on bf16 tensors).
PURE_BF16_ADAM_BYTES_PER_ELEMENT = 14
# bf16 moments beside the fp32 master (precision.adam_moments bf16): momentum and variance read and written at 2 bytes
# each, 28 − 4 × 2 = 20 bytes
BF16_MOMENTS_ADAM_BYTES_PER_ELEMENT = 20


def optimizer_step(b: PlanBuilder, s: Scenario, w: Workload, step: int,
                   chunks: tuple[tuple[Module, ...], ...] | None = None) -> None:
    """The Adam step on this rank's partition, after every reduction, holding the copy of the
    gradients it reads (zsim.zero.residual.step_gradient_bytes); stages 1/2 then all-gather the
    updated parameters: stage 1 per comm interval, stage 2 in shards, all at once without CB (§7.2.1).
    megatron-core: Adam reads its fp32 gradient buffer in place, and stage 1 gathers each bucket of each
    model chunk (`chunks`, a pipeline stage's; the whole model by default) in line after the step, or
    under the next forward with overlap_param_gather (zsim.zero.megatron_ddp)."""
    z, nd, dtype = s.zero, s.layout.dp, s.precision.dtype
    megatron = z.implementation == MEGATRON
    elements = rank_partition(s, w)
    deps = (b.last_comm,) if b.last_comm is not None else ()
    last_mb = s.grad_accum - 1  # the runtime stamps what follows the last micro-batch with its index
    # The step's checks before Adam (DeepSpeed ZeRO optimizer of 2020, step()): the fp16 overflow check
    # and the gradient norm, each a kernel pass over the partition, then a 4-byte all-reduce (MAX,
    # SUM) over the DP group and, with MP, over the MP group; in line on the compute stream, as the
    # optimizer waits for the result (zsim.compute.optimizer_kernels.optimizer_kernels has the kernels).
    tensors = math.ceil(len(w.tensors) / nd) if z.stage >= 1 else len(w.tensors)
    runtime_gpu = z.setup_residue == "runtime" and s.cluster.host is None
    if runtime_gpu:
        # zsim's runtime checks and casts segment by segment, not tensor by tensor (runtime/zero/engine.py
        # _overflow, _grad_norm over FlatAdam.segments), with its own kernels (runtime_step_kernels), as its
        # Kineto traces show (data/device/20261126-h200-kineto: h1024's one segment, h2048's ten units)
        tensors = len(runtime_segments(s, w))
    master = s.precision.master_weights
    moments = s.precision.adam_moments
    kernels = optimizer_kernels(elements, tensors, dtype, master, moments)
    runtime = runtime_gpu and master
    if runtime:  # zsim's runtime's own step kernels (runtime_step_kernels)
        kernels = runtime_step_kernels(elements, tensors, dtype)
    for check in ("overflow", "norm"):
        if not kernels[check].kernels:
            continue
        # hbm_bytes: what the kernels stream, for a model that prices bytes, not kernels (a CPU host).
        b.add(name=f"optimizer/{check}", stream="compute", deps=deps, kernels=kernels[check],
              hbm_bytes=kernels[check].bytes, step=step, micro_batch=last_mb)
        deps = ()
        # with pipeline stages, over the pipeline group too (Megatron-LM clip_grad_norm: the model-parallel
        # group spans tp and pp; the runtime's all_reduce/<check>.pp)
        groups = ("dp", "mp") if s.layout.mp > 1 else ("dp",)
        for group in groups + (("pp",) if s.layout.pp > 1 else ()):
            b.add(name=f"all_reduce/{check}.{group}", stream="compute", collective="all_reduce", group=group,
                  nbytes=4, step=step, micro_batch=last_mb)
    # The gradients' copy the update reads (zsim.zero.residual.step_gradient_bytes): made by one cast
    # pass, which then frees the fp16 gradients; held until the update has run.
    sub_group = z.sub_group_elements if z.constant_buffers else elements
    # pure bf16 (no master copy): Adam reads the bf16 gradients in place, as fp32 training reads its own
    grads = step_gradient_bytes(z.stage, elements, dtype, sub_group) if master else StepGradients(0, 0)
    e = PARAM_BYTES[dtype]
    ge = grad_bytes(dtype, z.grad_reduce_in_fp32) if megatron else e
    if megatron and ge == 4:
        # Megatron-Core hands the optimizer its fp32 gradient buffer's shard as the main gradients, no copy
        # (distrib_optimizer.py @ core_r0.8.0 _copy_model_grads_to_main_grads: `model_grad.float()` of fp32)
        grads = StepGradients(0, 0)
    held, transient = f"optimizer.grads_copy.s{step}", f"optimizer.grads_pieces.s{step}"
    grad_tags = tuple(full_grad_tag(m.name, step) for m in w.modules) if z.stage <= 1 else (partition_grad_tag(step),)
    if z.stage <= 1:  # a MoE model's expert gradients (StepPass._expert_grads)
        grad_tags += tuple(full_grad_tag(f"{m.name}.experts", step) for m in w.modules if m.expert_params)
    converted = min(elements, sub_group) if z.stage == 3 else elements
    # fp32 training holds no copy (Adam reads the gradients in place): no pass, no bytes.
    copy_bytes = (e + grads.held / max(1, converted)) * converted if grads.held else 0.0
    b.add(name="optimizer/grads_copy", stream="compute", deps=deps, hbm_bytes=copy_bytes,
          kernels=kernels["grads_copy"] if runtime and kernels["grads_copy"].kernels else None,
          allocs=(Alloc("buffers", grads.held, held), Alloc("buffers", grads.transient, transient)),
          frees=(transient,) + grad_tags, step=step, micro_batch=last_mb)
    # A CPU host runs the runtime's chunked update, not the fused kernel: its launches are its aten ops.
    adam = host_adam_kernels(elements, tensors) if s.cluster.fabric == "host" else kernels["adam"]
    # megatron-core: Adam reads a 4-byte gradient where ADAM_BYTES_PER_ELEMENT counts an e-byte one
    per_element = (PURE_BF16_ADAM_BYTES_PER_ELEMENT if not master else BF16_MOMENTS_ADAM_BYTES_PER_ELEMENT
                   if moments == "bf16" else ADAM_BYTES_PER_ELEMENT) + ge - e
    opt = b.add(name="optimizer/step", stream="compute", hbm_bytes=per_element * elements,
                frees=(held,), step=step, kernels=adam, micro_batch=last_mb, elements=elements)
    if (recipe := s.precision.linear_recipe) != "none":
        # Transformer Engine quantizes the updated weights into their cached FP8 (or NVFP4) copies once a step, at
        # the first micro-batch's forward (zsim.compute.fp8); priced here, on the compute stream, as a step's work
        weights = fp8_weight_elements(w)
        n = copies(recipe, s.cluster.gpu.compute_capability)
        quantize = weight_kernels(weights, math.ceil(weights / nd), recipe, e, n, s.precision.fp8_params)
        b.add(name="optimizer/fp8_weights", stream="compute", kernels=quantize, hbm_bytes=quantize.bytes, step=step,
              micro_batch=last_mb)
    if z.stage in (1, 2) and w.expert_params_per_rank:  # the experts' partitions, over the expert-data-parallel group
        b.add(name="all_gather/params.experts", stream="comm", deps=(opt,), collective="all_gather", group="edp",
              nbytes=expert_param_bytes(s) * expert_dp(s) * expert_partition(s, w), step=step, micro_batch=last_mb)
    if z.stage == 1 and megatron:
        for mods in () if z.overlap_param_gather else (chunks or (w.modules,)):
            # each bucket's _all_gather_base into the parameter buffer, synchronous: on the compute stream
            # (distrib_optimizer.py @ core_r0.8.0 L1583-1595, async_op False without --overlap-param-gather)
            pe = param_bytes_per_element(s, w)  # e, less with FP8 parameters
            for j, bucket in enumerate(reversed(chunk_buckets(s, mods))):
                b.add(name=f"all_gather/params.bucket.{j}", stream="compute", collective="all_gather", group="dp",
                      nbytes=round(pe * bucket.elements), step=step, micro_batch=last_mb)
    elif z.stage in (1, 2):
        # Stage 1 (v0.2) all-gathers each comm interval, stage 2 (v0.2) its partition in shards
        # (zsim.zero.buckets: flat_pieces, allgather_shards); both pass a list, which PyTorch stages
        # through one flat buffer of the whole gather.
        if z.stage == 1:
            gathers = rank_pieces(s, w)
        else:
            shard_bucket = z.allgather_bucket_elements if z.constant_buffers else nd * elements
            gathers = [nd * n for n in allgather_shards(elements, nd, shard_bucket)]
        v02 = z.stage == 2 and z.implementation == "deepspeed-0.2" and s.cluster.host is None
        for j, n in enumerate(gathers):
            stage_buf = Alloc("buffers", list_collective_staging_bytes(n, e), f"ag_list.step.{j}.s{step}",
                              stream="compute")
            if v02:  # the host's list, the gather, its copy-outs launched beside the transfer (implementation)
                listed = b.add(name=f"list/params.bucket.{j}", stream="host", deps=(opt,), kernels=shard_list(nd),
                               step=step, micro_batch=last_mb)
                b.add(name=f"all_gather/params.bucket.{j}", stream="comm", deps=(opt, listed), collective="all_gather",
                      group="dp", nbytes=e * n, allocs=(stage_buf,), step=step, micro_batch=last_mb)
                launched = b.add(name=f"launch/params.bucket.{j}", stream="host", kernels=list_copy_launches(n, nd),
                                 step=step, micro_batch=last_mb)
                tail = list_copy_tail(n, nd, e)
                b.add(name=f"copy/params.bucket.{j}", stream="comm", deps=(launched,), kernels=tail,
                      hbm_bytes=tail.bytes, frees=(stage_buf.tag,), step=step, micro_batch=last_mb)
                continue
            b.add(name=f"all_gather/params.bucket.{j}", stream="comm", deps=(opt,), collective="all_gather",
                  group="dp", nbytes=e * n, allocs=(stage_buf,), frees=(stage_buf.tag,), step=step,
                  micro_batch=last_mb)
