"""The optimizer step's kernels: DeepSpeed's ZeRO optimizer of 2020 on a GPU (overflow check, gradient
norm, fused Adam and its casts), and the runtime's chunked Adam on a CPU host."""

from __future__ import annotations

import functools
import math

from zsim.compute.kernel_list import BOOL_REDUCE_SHARE, UNROLLED_SHARE, Kernel, KernelList, mem, red


# The runtime's Adam on a CPU host (runtime/zero/optimizer.py FlatAdam.step): the partition in chunks of
# HOST_ADAM_CHUNK elements (apex multi_tensor_apply's chunk_size), each updated by 7 aten ops (lerp_,
# mul_, addcmul_, sqrt, div_, add_, addcdiv_) whose temporaries stay in cache.
HOST_ADAM_CHUNK = 65536


HOST_ADAM_OPS_PER_CHUNK = 7


@functools.lru_cache(maxsize=64)
def host_adam_kernels(elements: int, tensors: int) -> KernelList:
    """The update as a CPU host runs it: HOST_ADAM_OPS_PER_CHUNK aten ops per chunk of each of the
    `tensors` segments (at most one partial chunk per segment), streaming the state once (28 B per
    element, as the fused kernel: the chunk's temporaries stay in cache)."""
    chunks = math.ceil(elements / HOST_ADAM_CHUNK) + max(0, tensors - 1)
    return KernelList("optimizer.adam.host", (mem("adam.chunk_ops", 28 * elements,
                                                   count=HOST_ADAM_OPS_PER_CHUNK * chunks),))


# Multi-tensor apply processes 65,536-element chunks, up to 320 per launch (apex csrc/multi_tensor_apply.cuh:
# depth_to_max_blocks, chunk_size 2048·32): one launch per 20,971,520 elements.
_MTA_ELEMENTS = 65536 * 320


@functools.lru_cache(maxsize=64)
def optimizer_kernels(elements: int, tensors: int, dtype: str, master: bool = True,
                      moments: str = "fp32") -> dict[str, KernelList]:
    """The optimizer step's kernels over this rank's partition of `elements` in `tensors` pieces, as
    DeepSpeed's ZeRO optimizer of 2020 ran them (deepspeed/pt/deepspeed_zero_optimizer.py, step()):
      overflow: per gradient tensor `float(x.float().sum())` (_has_inf_or_nan): a cast (2 B read,
          4 B written) and a sum (4 B read) per element, a host sync per tensor (mixed precision only);
      norm: per tensor `g.data.double().norm(2)` and `.item()` (get_grad_norm_direct): 2 B read, 8 B
          written, 8 B read per element (fp32 training: 4 + 8 + 8);
      adam: the fp16 partition flattened and cast to fp32 (2 + 2, 2 + 4 B), unscale and clip
          (`mul_`, 4 + 4 B), fused Adam (apex FusedAdam: reads fp32 master, m, v, gradient, writes
          master, m, v: 28 B per element, Kingma & Ba 2015 Alg. 1), the fp32 → fp16 copy (4 + 2 B).
    Pure bf16 (`master` false, precision.master_weights): no overflow check, no cast, no copy back; the norm
    reads 2 B, the clip reads and writes the bf16 gradient (4 B), the update reads and writes the bf16
    parameter, momentum and variance and reads the gradient (14 B per element; PyTorch's foreach Adam, the
    same update rule). bf16 moments beside the master (`moments` 'bf16', precision.adam_moments): the update reads
    and writes momentum and variance at 2 bytes, 20 B per element.
    Returns {'overflow', 'norm', 'adam'}; 'overflow' is empty for fp32 and pure bf16 training."""
    n, pieces = elements, max(1, tensors)
    mixed = dtype != "fp32" and master
    launches = max(1, math.ceil(n / _MTA_ELEMENTS))
    overflow = (mem("overflow.cast", 6 * n, count=pieces), red("overflow.sum", 4 * n, count=pieces)) if mixed else ()
    pure = dtype != "fp32" and not master
    norm = (mem("grad_norm.to_double", (10 if mixed or pure else 12) * n, count=pieces),
            red("grad_norm.norm", 8 * n, count=pieces))
    adam: tuple[Kernel, ...] = ()
    if mixed:
        adam += (mem("grads.flatten", 4 * n), mem("grads.to_fp32", 6 * n))
    if pure:
        adam += (mem("grads.unscale_clip", 4 * n), mem("fused_adam", 14 * n, count=launches))
    else:
        adam += (mem("grads.unscale_clip", 8 * n), mem("fused_adam", (20 if moments == "bf16" else 28) * n, count=launches))
    if mixed:
        adam += (mem("params.to_fp16", 6 * n),)
    return {"overflow": KernelList("optimizer.overflow", overflow), "norm": KernelList("optimizer.norm", norm),
            "adam": KernelList("optimizer.adam", adam)}



@functools.lru_cache(maxsize=64)
def runtime_step_kernels(elements: int, segments: int, dtype: str) -> dict[str, KernelList]:
    """The step of zsim's runtime on a GPU with master weights (runtime/zero/engine.py _optimizer_step,
    runtime/zero/optimizer.py FlatAdam), one pass per optimizer segment, as its Kineto traces show them
    (data/device/20261126-h200-kineto, PyTorch 2.13):
      overflow: `torch.isfinite(g).all()`, which ATen computes as `(g == g) & (g.abs() != inf)`
          (aten/src/ATen/native/TensorCompare.cpp isfinite): abs (e B read, e written), two compares
          (e read, 1 written), their `&` (2 read, 1 written), then `all` (a reduction reading 1 B, BOOL_REDUCE_SHARE);
      norm: `g.double().norm(2) ** 2` added into a float64 accumulator: the cast (e read, 8 written; an
          unrolled dynamic-casting copy, UNROLLED_SHARE), the norm (a reduction reading 8 B), and two
          one-element kernels (pow, add) per segment, the accumulator's fill once;
      grads_copy: `.float()` of each segment's gradient (e read, 4 written; unrolled);
      adam: torch's fused Adam (`torch._fused_adam_`: multi_tensor_apply, 28 B an element as
          optimizer_kernels's) and, per segment, the fp32 master's copy into the e-byte parameters.
    No flatten, cast or unscale pass inside the step (the runtime's `grads_copy` is its own op).
    Returns {'overflow', 'norm', 'grads_copy', 'adam'}; 'overflow' is empty for fp32."""
    n, pieces, e = elements, max(1, segments), 4 if dtype == "fp32" else 2
    mixed = dtype != "fp32"
    overflow = (mem("overflow.abs", 2 * e * n, count=pieces), mem("overflow.compare", 2 * (e + 1) * n, count=2 * pieces),
                mem("overflow.and", 3 * n, count=pieces), red("overflow.all", n, count=pieces, efficiency=BOOL_REDUCE_SHARE)) if mixed else ()
    norm = (mem("grad_norm.accumulator", 8), mem("grad_norm.to_double", (e + 8) * n, count=pieces, efficiency=UNROLLED_SHARE[8]),
            red("grad_norm.norm", 8 * n, count=pieces), mem("grad_norm.square_add", 24, count=2 * pieces))
    copy = (mem("grads.to_fp32", (e + 4) * n, count=pieces, efficiency=UNROLLED_SHARE[4]),) if mixed else ()
    adam = (mem("fused_adam", 28 * n, count=max(1, math.ceil(n / _MTA_ELEMENTS))),)
    if mixed:
        adam += (mem("params.to_working", 6 * n, count=pieces),)
    return {"overflow": KernelList("optimizer.overflow.runtime", overflow),
            "norm": KernelList("optimizer.norm.runtime", norm),
            "grads_copy": KernelList("optimizer.grads_copy.runtime", copy),
            "adam": KernelList("optimizer.adam.runtime", adam)}
