"""The optimizer step's kernels: DeepSpeed's ZeRO optimizer of 2020 on a GPU (overflow check, gradient
norm, fused Adam and its casts), and the runtime's chunked Adam on a CPU host."""

from __future__ import annotations

import functools
import math

from zsim.compute.kernel_list import Kernel, KernelList, mem, red


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
def optimizer_kernels(elements: int, tensors: int, dtype: str, master: bool = True) -> dict[str, KernelList]:
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
    same update rule).
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
        adam += (mem("grads.unscale_clip", 8 * n), mem("fused_adam", 28 * n, count=launches))
    if mixed:
        adam += (mem("params.to_fp16", 6 * n),)
    return {"overflow": KernelList("optimizer.overflow", overflow), "norm": KernelList("optimizer.norm", norm),
            "adam": KernelList("optimizer.adam", adam)}
