"""Saved-tensor hooks: what backward keeps alive, by unit.

Every tensor autograd saves passes through `pack`. A tensor whose storage is a unit's parameter
buffer is not an activation: it is skipped (stages 0-2), or, in stage 3, replaced by a `ParamRef`
(unit, size, stride, offset) so that the gathered buffer can be released after the forward and
re-gathered for the backward (`unpack` re-materialises the view from the re-gathered buffer).
Every other storage counts once (deduplicated by storage) as activation bytes of the unit whose
forward (or recomputation) saved it, until that unit's backward ends. The engine keys the count by
(unit, micro-batch): a pipeline stage holds several micro-batches' activations of one unit at once.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class ParamRef:
    """A saved view of unit `unit`'s parameter buffer, kept by position instead of by storage."""

    unit: int
    size: torch.Size
    stride: tuple[int, ...]
    offset: int


class SavedTensors:
    """Counts activation bytes per unit; `param_unit(ptr)` says which unit's parameters a storage
    holds (or None); `fetch(unit)`, given in stage 3, returns that unit's gathered buffer."""

    def __init__(self, param_unit: Callable[[int], int | None],
                 fetch: Callable[[int], torch.Tensor] | None = None):
        self.current: Hashable | None = None  # whose forward or recomputation is running: (unit, micro-batch)
        self._param_unit = param_unit
        self._fetch = fetch
        self._owner: dict[int, Hashable] = {}  # storage pointer -> (unit, micro-batch)
        self._bytes: dict[Hashable, int] = {}  # (unit, micro-batch) -> activation bytes
        self.total = 0

    def hooks(self) -> torch.autograd.graph.saved_tensors_hooks:
        return torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def release(self, unit: Hashable) -> None:
        """The backward of `unit` (unit, micro-batch) is done: what it saved is freed."""
        self.total -= self._bytes.pop(unit, 0)
        self._owner = {ptr: u for ptr, u in self._owner.items() if u != unit}

    def _pack(self, tensor: torch.Tensor) -> Any:
        storage = tensor.untyped_storage()
        ptr = storage.data_ptr()
        if ptr == 0:  # empty tensor
            return tensor
        unit = self._param_unit(ptr)
        if unit is not None:
            if self._fetch is None:
                return tensor
            return ParamRef(unit, tensor.size(), tensor.stride(), tensor.storage_offset())
        if ptr not in self._owner and self.current is not None:
            self._owner[ptr] = self.current
            self._bytes[self.current] = self._bytes.get(self.current, 0) + storage.nbytes()
            self.total += storage.nbytes()
        return tensor

    def _unpack(self, packed: Any) -> torch.Tensor:
        if isinstance(packed, ParamRef):
            assert self._fetch is not None
            return self._fetch(packed.unit).as_strided(packed.size, packed.stride, packed.offset)
        return packed
