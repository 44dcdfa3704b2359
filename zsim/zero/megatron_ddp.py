"""Megatron-Core's data-parallel buffers: what `zero.implementation: megatron-core` reduces and gathers, and
when (stages 0-1: Megatron-Core's DistributedDataParallel, and at stage 1 its distributed optimizer).

Read from Megatron-LM at tag core_r0.8.0 (`fetch NVIDIA/Megatron-LM`):
  - every parameter and gradient lives in one contiguous buffer per dtype; the gradient buffer is fp32 for a
    bf16 model (megatron/training/arguments.py L302-305: "bfloat16 requires gradient accumulation and
    all-reduce to be done in fp32", forcing --accumulate-allreduce-grads-in-fp32, which becomes
    DistributedDataParallelConfig.grad_reduce_in_fp32), the parameters' dtype otherwise (fp16 and fp32);
  - the buffer is cut into buckets from the model's end (param_and_grad_buffer.py L296-345: parameters in
    reverse order, "to roughly follow backprop order"); a bucket closes once it holds `bucket_size`
    elements, max(40,000,000, 1,000,000 × dp) by default (distributed_data_parallel.py L47-54). With the
    distributed optimizer every parameter starts at a multiple of 64 elements (L259-266) and every bucket
    ends padded to a multiple of lcm(dp, 128) (L247-256), so that it splits evenly over the DP ranks;
  - bucketing is off (one bucket for the whole chunk) on pipeline stages after the first and for the model
    chunks after the first of the interleaved schedule (distributed_data_parallel.py L66-74;
    megatron/training/training.py L458 `disable_bucketing=(model_chunk_idx > 0)`): only the chunk that
    holds the embedding is bucketed. With the distributed optimizer and a tied head across stages, the
    shared word-embedding weight is a bucket of its own on both stages that hold it (L305-330);
  - with --overlap-grad-reduce (zsim: zero.overlap_comm) a bucket is reduced as soon as the last
    micro-batch's backward has made every gradient in it (register_grad_ready, L172-194), asynchronously,
    one bucket's collective after another on NCCL's stream: a reduce-scatter with the distributed optimizer
    (stage 1), an all-reduce without (stage 0) (start_grad_sync, L96-152). Without it the buffer is one
    bucket, reduced synchronously once backward is done (L55-57, finish_grad_sync);
  - after the step the distributed optimizer all-gathers the updated bf16 parameters bucket by bucket in
    forward order (optimizer/distrib_optimizer.py L1339-1410, _all_gather_base per bucket): synchronously
    right after the step, or with --overlap-param-gather (zsim: zero.overlap_param_gather) under the next
    step's forward, the first bucket's gather dispatched in zero_grad and each module's forward pre-hook
    waiting for the buckets that hold its parameters (L1310-1337, L1413-1475).

zsim prices a bucket's readiness at the end of the backward of the module whose parameters close it (a
module's parameter gradients are all made by its backward op).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from zsim.workload.transformer import Module
from zsim.zero.inputs import Scenario

IMPLEMENTATION = "megatron-core"
# distributed_data_parallel.py @ core_r0.8.0 L51-54: bucket_size = max(40000000, 1000000 * dp_size)
MIN_BUCKET_ELEMENTS = 40_000_000
BUCKET_ELEMENTS_PER_RANK = 1_000_000
# param_and_grad_buffer.py @ core_r0.8.0 L259-266 (a parameter starts at a multiple of 64 elements) and
# L247-256 (a bucket ends at a multiple of lcm(dp, 128)), both only with the distributed optimizer.
PARAM_ALIGNMENT = 64
BUCKET_ALIGNMENT = 128


def grad_bytes(dtype: str, in_fp32: bool | None = None) -> int:
    """Bytes per element of Megatron-Core's gradient buffer: by default fp32 for bf16 and fp32 models, fp16 for fp16
    (arguments.py @ core_r0.8.0 L302-305; --accumulate-allreduce-grads-in-fp32 is off by default); `in_fp32`
    (zero.grad_reduce_in_fp32) True: fp32, False: the model's 16-bit dtype (Megatron-Bridge's
    `ddp.grad_reduce_in_fp32 = False`)."""
    if in_fp32 is None or dtype == "fp32":
        return 2 if dtype == "fp16" else 4
    return 4 if in_fp32 else 2


def bucket_elements(dp: int, configured: int | None) -> int:
    """A bucket's size in parameter elements: `configured` (--ddp-bucket-size) or Megatron-Core's default."""
    return configured if configured is not None else max(MIN_BUCKET_ELEMENTS, BUCKET_ELEMENTS_PER_RANK * dp)


@dataclass(frozen=True, slots=True)
class Bucket:
    """One bucket of the gradient (and parameter) buffer: `elements` as laid out (padded with the distributed
    optimizer), `closer` the module whose backward makes its last gradient, `modules` the names of the modules
    with parameters in it (forward order)."""

    elements: int
    closer: str
    modules: tuple[str, ...]


def ddp_buckets(modules: Sequence[Module], dp: int, limit: int, distributed: bool, bucketed: bool,
                shared: frozenset[tuple[str, int]] = frozenset()) -> list[Bucket]:
    """The buckets of one model chunk's buffer (`modules` in forward order), first reduced first (module
    docstring). `limit`: bucket_elements; `distributed`: the distributed optimizer's padding; `bucketed`: False
    for a chunk whose bucketing is off (one bucket, shared weights apart); `shared`: (module name, tensor index)
    of the tied word embedding, a bucket of its own."""
    buckets: list[Bucket] = []
    size, members, last = 0, [], ""

    def close() -> None:
        nonlocal size, members
        padded = _pad(size, math.lcm(dp, BUCKET_ALIGNMENT)) if distributed else size
        buckets.append(Bucket(padded, last, tuple(reversed(members))))
        size, members = 0, []

    for m in reversed(modules):
        for i in reversed(range(len(m.tensors))):
            own = (m.name, i) in shared
            if own and size:
                close()
            start = _pad(size, PARAM_ALIGNMENT) if distributed else size
            size, last = start + m.tensors[i], m.name
            if not members or members[-1] != m.name:
                members.append(m.name)
            if own or (bucketed and size >= limit):
                close()
    if size:
        close()
    return buckets


def _pad(n: int, divisor: int) -> int:
    return -(-n // divisor) * divisor


def chunk_buckets(scenario: Scenario, modules: Sequence[Module]) -> list[Bucket]:
    """The buckets of one model chunk of `scenario` (`modules`, forward order; a pipeline stage's chunk or the
    whole model): bucketed only where the chunk holds the embedding (pipeline stage 0's first chunk, or no
    pipeline); the tied word embedding a bucket of its own on both stages when pp > 1 (module docstring)."""
    z, lay = scenario.zero, scenario.layout
    shared: frozenset[tuple[str, int]] = frozenset()
    if lay.pp > 1 and z.stage == 1 and getattr(scenario.model, "tied_head", True):
        # the embedding's word-embedding tensor (its first), and the last stage's copy of it, appended to the
        # head's tensors (zsim.zero.pipeline_plan.pipeline_stages)
        shared = frozenset((m.name, 0 if m.name == "embed" else len(m.tensors) - 1)
                           for m in modules if m.name in ("embed", "head") and m.tensors)
    # without --overlap-grad-reduce (zero.overlap_comm false) no chunk is bucketed (L55-57)
    bucketed = z.overlap_comm and any(m.name == "embed" for m in modules)
    return ddp_buckets(modules, lay.dp, bucket_elements(lay.dp, z.ddp_bucket_elements), z.stage == 1, bucketed,
                       shared)
