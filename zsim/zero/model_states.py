"""Per-GPU model-state memory of each ZeRO-DP stage (Rajbhandari et al., ZeRO, §5 and Table 1).

Mixed-precision Adam (fp16 or bf16) keeps 2Ψ bytes of 16-bit parameters, 2Ψ of 16-bit gradients and
KΨ of optimizer states: an fp32 master copy, momentum and variance, K = 4 + 4 + 4 = 12 (§3.1).
Plain fp32 training has no 16-bit copy and no master copy: 4Ψ of parameters, 4Ψ of gradients and
Adam's momentum and variance, K = 4 + 4 = 8 (16Ψ in all, as for mixed precision; Kingma & Ba 2015).
Stage 1 (Pos) partitions the optimizer states across the Nd data-parallel ranks, stage 2 (Pos+g) also
the gradients, stage 3 (Pos+g+p) also the parameters:
with e the parameter (and gradient) bytes, 2 or 4:
    stage 0: (2e + K)Ψ    stage 1: 2eΨ + KΨ/Nd    stage 2: eΨ + (e + K)Ψ/Nd    stage 3: (2e + K)Ψ/Nd
Uneven division, as DeepSpeed does it (the partition zsim uses is the one every rank holds, padding
included):
  stages 1/2: the flat buffer of all parameters is padded to a multiple of 2·Nd elements
      (deepspeed/runtime/zero/stage_1_and_2.py: align_dense_tensors(..., nccl_start_alignment_factor
      × dp_size) with nccl_start_alignment_factor = 2, for 4-byte aligned partitions), so each rank
      holds ceil(Ψ / 2Nd) · 2 elements. The plan (zsim.zero.buckets.flat_pieces) pads piece by piece
      instead (stage 1: DeepSpeed v0.2's comm intervals; stage 2: each gradient bucket): pass
      `pieces` for that layout; the flat buffer is then T = Σ pieces elements and a rank owns T/Nd.
      The 16-bit parameters are that whole padded buffer (e·T), stage 1's gradients the unpadded Ψ
      (autograd's, DeepSpeed v0.2 copies the reduced chunks back into them);
  stage 3: each parameter tensor is padded to a multiple of Nd and partitioned on its own
      (deepspeed/runtime/zero/partition_parameters.py: _padding_size, _partition_param), so a rank
      holds Σ ceil(n_i / Nd) elements over the tensors n_i.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

PARAM_BYTES = {"fp16": 2, "bf16": 2, "fp32": 4}
# Optimizer bytes per parameter, K (ZeRO §3.1): mixed precision keeps an fp32 master copy, momentum
# and variance (12); fp32 training updates the parameters in place and keeps momentum and variance (8).
ADAM_K_BY_DTYPE = {"fp16": 12, "bf16": 12, "fp32": 8}
ADAM_K = ADAM_K_BY_DTYPE["fp16"]
# The paper's names for the stages (Table 1).
STAGE_NAMES = {0: "baseline", 1: "Pos", 2: "Pos+g", 3: "Pos+g+p"}
FLAT_ALIGNMENT = 2  # DeepSpeed stage_1_and_2.py: nccl_start_alignment_factor (elements per rank)


@dataclass(frozen=True, slots=True)
class ModelStates:
    """Model-state bytes on one GPU, by category."""

    params: int
    grads: int
    optimizer: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer

    def as_dict(self) -> dict[str, int]:
        return {"params": self.params, "grads": self.grads, "optimizer": self.optimizer, "total": self.total}


def partition(elements: int, nd: int) -> int:
    """Elements of the largest of nd partitions of `elements`: ceil(elements / nd)."""
    if elements < 0 or nd <= 0:
        raise ValueError(f"partition({elements}, {nd}): need elements >= 0 and nd > 0")
    return math.ceil(elements / nd)


def flat_partition(psi: int, nd: int) -> int:
    """Elements per rank of a flat buffer of Ψ = `psi` elements padded to a multiple of 2·Nd
    (DeepSpeed stages 1/2, see the module docstring). nd = 1 holds everything, unpadded."""
    if nd == 1:
        return psi
    return FLAT_ALIGNMENT * partition(psi, FLAT_ALIGNMENT * nd)


def tensor_partition(tensors: Sequence[int], nd: int) -> int:
    """Elements per rank when each tensor is padded to a multiple of Nd and split (DeepSpeed stage 3)."""
    return sum(partition(n, nd) for n in tensors)


# Pure bf16 training (precision.master_weights false): Adam's momentum and variance in bf16, no master
# copy (torch.optim.Adam: exp_avg, exp_avg_sq = torch.zeros_like(p)): K = 2 + 2.
PURE_BF16_K = 4


# Megatron-Core's precision-aware optimizer with bf16 moments (--use-precision-aware-optimizer --exp-avg-dtype bf16
# --exp-avg-sq-dtype bf16, precision.adam_moments bf16; Transformer Engine's FusedAdam with those state dtypes): the
# fp32 master copy and 2 + 2 bytes of momentum and variance, K = 4 + 2 + 2.
BF16_MOMENTS_K = 8


def optimizer_k(dtype: str, master_weights: bool = True, moments: str = "fp32") -> int:
    """K for training in `dtype`, with (mixed precision) or without an fp32 master copy (PURE_BF16_K), and with
    Adam's moments in fp32 or, beside a master copy, in bf16 (BF16_MOMENTS_K)."""
    if not master_weights:
        return PURE_BF16_K
    return BF16_MOMENTS_K if moments == "bf16" and dtype != "fp32" else adam_k(dtype)


def adam_k(dtype: str) -> int:
    """K, optimizer-state bytes per parameter, for training in `dtype`. Raises ValueError."""
    if dtype not in ADAM_K_BY_DTYPE:
        raise ValueError(f"dtype(={dtype!r}) must be one of {sorted(ADAM_K_BY_DTYPE)}")
    return ADAM_K_BY_DTYPE[dtype]


def stage_partition(psi: int, nd: int, stage: int, tensors: Sequence[int] | None = None,
                    pieces: Sequence[int] | None = None) -> int:
    """Elements of the model-state partition a rank holds at `stage` (Ψ at stage 0): for stages 1/2
    1/Nd of every piece of the flat buffer (`pieces`, zsim.zero.buckets.flat_pieces; without them
    the whole buffer padded once to 2·Nd), the per-tensor partition for stage 3 (`tensors`; without
    them the flat ceil(Ψ/Nd))."""
    if stage == 0:
        return psi
    if stage == 3:
        return tensor_partition(tensors, nd) if tensors is not None else partition(psi, nd)
    if pieces is not None:
        assert all(p % nd == 0 for p in pieces) and sum(pieces) >= psi, "pieces do not lay out Ψ over Nd"
        return sum(pieces) // nd
    return flat_partition(psi, nd)


def model_states(psi: int, nd: int, stage: int, dtype: str = "fp16", k: int | None = None,
                 tensors: Sequence[int] | None = None, pieces: Sequence[int] | None = None) -> ModelStates:
    """Model-state bytes per GPU for Ψ = `psi` parameters (per MP rank) on Nd = `nd` DP ranks.

    `k` defaults to K of `dtype` (12 for fp16/bf16 mixed precision, 8 for fp32); `tensors` are the
    element counts of the parameter tensors, for stage 3's per-tensor padding (their sum is Ψ);
    `pieces` the stage 1-2 layout of the flat buffer (stage_partition).

    Raises:
        ValueError: stage not in 0..3, dtype unknown, or tensors that do not sum to Ψ.
    """
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"stage(={stage}) must be 0, 1, 2 or 3")
    k = adam_k(dtype) if k is None else k
    e = PARAM_BYTES[dtype]
    if tensors is not None and sum(tensors) != psi:
        raise ValueError(f"tensors sum to {sum(tensors)}, not Ψ(={psi})")
    part = stage_partition(psi, nd, stage, tensors, pieces)
    whole = psi if stage == 0 else nd * part  # the 16-bit parameters: stages 1/2 keep the padded flat buffer
    return ModelStates(
        params=e * (part if stage >= 3 else whole),
        grads=e * (part if stage >= 2 else psi),
        optimizer=k * (part if stage >= 1 else psi),
    )
