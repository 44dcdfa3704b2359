"""Flat parameter buffers: each unit (embedding, block, head) keeps its parameters in one 1-D
buffer, and the module's parameters become views of it. That makes partitioning, padding and byte
accounting exact: a unit of n elements is padded to P = ceil(n / Nd) x Nd when it is partitioned
across Nd ranks, and rank r owns the shard [r·P/Nd, (r+1)·P/Nd).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class FlatLayout:
    """Where each parameter of a module lives in its unit's flat buffer."""

    names: tuple[str, ...]
    shapes: tuple[torch.Size, ...]
    numels: tuple[int, ...]
    numel: int  # n, the unit's real elements
    padded: int  # P, n rounded up to a multiple of `parts`
    parts: int  # Nd when partitioned, 1 otherwise

    @classmethod
    def of(cls, module: nn.Module, parts: int) -> FlatLayout:
        named = list(module.named_parameters())
        numels = tuple(p.numel() for _, p in named)
        n = sum(numels)
        return cls(names=tuple(name for name, _ in named), shapes=tuple(p.shape for _, p in named),
                   numels=numels, numel=n, padded=math.ceil(n / parts) * parts, parts=parts)

    @property
    def shard(self) -> int:
        """Elements per rank: P / Nd."""
        return self.padded // self.parts

    def shard_real(self, rank: int) -> int:
        """Real (not padding) elements in rank `rank`'s shard."""
        return max(0, min(self.numel, (rank + 1) * self.shard) - rank * self.shard)

    def flatten(self, module: nn.Module) -> torch.Tensor:
        """The module's parameters as one fp32 buffer of P elements (padding zero)."""
        flat = torch.zeros(self.padded, dtype=torch.float32)
        torch.cat([p.detach().reshape(-1).float() for _, p in module.named_parameters()], out=flat[:self.numel])
        return flat

    def views(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """name -> view of `flat`, for torch.func.functional_call.

        One `split` (not a slice per parameter), so backward assembles the flat gradient with one
        concatenation instead of one zero-filled buffer per parameter.
        """
        pieces = torch.split(flat, [*self.numels, self.padded - self.numel])
        return {name: piece.view(shape) for name, piece, shape in zip(self.names, pieces, self.shapes)}
