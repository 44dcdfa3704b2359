"""Per-GPU model-state memory of each ZeRO-DP stage (Rajbhandari et al., ZeRO, §5 and Table 1).

Mixed-precision Adam keeps 2Ψ bytes of fp16/bf16 parameters, 2Ψ of fp16/bf16 gradients and KΨ of
optimizer states: an fp32 master copy, momentum and variance, K = 4 + 4 + 4 = 12 (§3.1). Stage 1
(Pos) partitions the optimizer states across the Nd data-parallel ranks, stage 2 (Pos+g) also the
gradients, stage 3 (Pos+g+p) also the parameters:
    stage 0: (2 + 2 + K)Ψ      stage 1: 4Ψ + KΨ/Nd      stage 2: 2Ψ + (2 + K)Ψ/Nd      stage 3: (2 + 2 + K)Ψ/Nd
When Ψ is not a multiple of Nd, a rank holds ceil(Ψ/Nd) elements (the largest partition: DeepSpeed
pads the flat partitions to equal size, stage_1_and_2.py / partition_parameters.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

PARAM_BYTES = {"fp16": 2, "bf16": 2}
ADAM_K = 12  # fp32 master weights + momentum + variance, 4 bytes each (ZeRO §3.1)


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


def model_states(psi: int, nd: int, stage: int, dtype: str = "fp16", k: int = ADAM_K) -> ModelStates:
    """Model-state bytes per GPU for Ψ = `psi` parameters (per MP rank) on Nd = `nd` DP ranks.

    Raises:
        ValueError: stage not in 0..3, or dtype unknown.
    """
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"stage(={stage}) must be 0, 1, 2 or 3")
    if dtype not in PARAM_BYTES:
        raise ValueError(f"dtype(={dtype!r}) must be one of {sorted(PARAM_BYTES)}")
    e = PARAM_BYTES[dtype]
    part = partition(psi, nd)
    return ModelStates(
        params=e * (part if stage >= 3 else psi),
        grads=e * (part if stage >= 2 else psi),
        optimizer=k * (part if stage >= 1 else psi),
    )
