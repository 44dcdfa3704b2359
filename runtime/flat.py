"""Flat parameter buffers: each unit (embedding, block, head) keeps its parameters in one 1-D
buffer, and the module's parameters become views of it. That makes partitioning, padding and byte
accounting exact.

Stages 0-2 keep a unit's n elements unpadded (stages 1-2 pad per gradient bucket instead,
`runtime/zero/partition.py`). Stage 3 pads like DeepSpeed ZeRO-3 and like the simulator
(`zsim.zero.buckets.padded_tensors`): every parameter tensor of n_i elements is padded to
P_i = ceil(n_i / Nd)·Nd and split on its own, so rank r owns chunk r (c_i = P_i / Nd elements) of
every tensor. The unit's gathered buffer is tensor-major (tensor 0 padded, tensor 1 padded, ...);
its rank-major form (row r = the chunks rank r owns, one after another) is what all-gather and
reduce-scatter move.
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
    numels: tuple[int, ...]  # n_i per tensor
    padded_numels: tuple[int, ...]  # P_i per tensor (= n_i unless padded per tensor)
    numel: int  # n, the unit's real elements
    padded: int  # Σ P_i
    parts: int  # Nd when padded per tensor (stage 3), 1 otherwise

    @classmethod
    def of(cls, module: nn.Module, parts: int = 1) -> FlatLayout:
        """The layout of `module`'s parameters, each tensor padded to a multiple of `parts`."""
        named = list(module.named_parameters())
        numels = tuple(p.numel() for _, p in named)
        padded = tuple(math.ceil(n / parts) * parts for n in numels)
        return cls(names=tuple(name for name, _ in named), shapes=tuple(p.shape for _, p in named),
                   numels=numels, padded_numels=padded, numel=sum(numels), padded=sum(padded), parts=parts)

    @property
    def shard(self) -> int:
        """Elements per rank: Σ c_i = padded / Nd."""
        return self.padded // self.parts

    def _chunks(self):
        """(offset in the buffer, chunk c_i, column in a rank-major row, n_i) per tensor."""
        offset = column = 0
        for n, p in zip(self.numels, self.padded_numels):
            c = p // self.parts
            yield offset, c, column, n
            offset += p
            column += c

    def shard_real(self, rank: int) -> int:
        """Real (not padding) elements in rank `rank`'s chunks."""
        return sum(max(0, min(n, (rank + 1) * c) - rank * c) for _, c, _, n in self._chunks())

    def flatten(self, module: nn.Module) -> torch.Tensor:
        """The module's parameters as one fp32 buffer of `padded` elements (padding zero)."""
        flat = torch.zeros(self.padded, dtype=torch.float32)
        for (offset, _, _, n), (_, p) in zip(self._chunks(), module.named_parameters()):
            flat[offset:offset + n] = p.detach().reshape(-1).float()
        return flat

    def views(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """name -> view of `flat`, for torch.func.functional_call.

        One `split` (not a slice per parameter), so backward assembles the flat gradient with one
        concatenation instead of one zero-filled buffer per parameter.
        """
        pieces = torch.split(flat, list(self.padded_numels))
        return {name: piece[:n].view(shape) if n != piece.numel() else piece.view(shape)
                for name, piece, n, shape in zip(self.names, pieces, self.numels, self.shapes)}

    def rank_major(self, full: torch.Tensor) -> torch.Tensor:
        """(parts, shard): row r = the chunks rank r owns of a tensor-major `full` buffer (a copy
        when padded per tensor, a view otherwise)."""
        if len(self.numels) == 1 or self.parts == 1:
            return full.view(self.parts, self.shard)
        return torch.cat([full[o:o + c * self.parts].view(self.parts, c) for o, c, _, _ in self._chunks()], dim=1)

    def copy_rank_major(self, full: torch.Tensor, out: torch.Tensor) -> None:
        """Write rank_major(full) into `out` (parts, shard) without a temporary."""
        for o, c, col, _ in self._chunks():
            out[:, col:col + c].copy_(full[o:o + c * self.parts].view(self.parts, c))

    def from_rank_major(self, rows: torch.Tensor, full: torch.Tensor) -> None:
        """Fill the tensor-major `full` from `rows` (parts, shard), the inverse of rank_major."""
        for o, c, col, _ in self._chunks():
            full[o:o + c * self.parts].view(self.parts, c).copy_(rows[:, col:col + c])
