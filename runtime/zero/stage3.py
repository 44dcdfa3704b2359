"""Stage 3, Pos+g+p (ZeRO paper §5.3): parameters partitioned too.

Each rank keeps only its shards of the parameters, gradients and optimizer state: 16Ψ/Nd bytes
mixed (Table 1). A unit's parameters are all-gathered just before its forward and released right
after; gathered again before its backward and released when its gradient is complete (the next
unit's gather is issued ahead, `prefetch_layers` = 1, so it overlaps the current unit's compute).
Autograd's saved views of the parameters are kept as positions (activations.ParamRef), so the
released buffer is really freed. Gradients are reduce-scattered in buckets as in stage 2, and the
optimizer updates the parameter shards in place: no all-gather after the step.
Communication per step: all-gather Ψ (forward) + Ψ (backward) + reduce-scatter Ψ = 3Ψ (§7.2.2).
"""

from __future__ import annotations

import torch

from ..comm import Pending
from .activations import SavedTensors
from .engine import Unit, unit_what
from .optimizer import FlatAdam
from .stage2 import Stage2


class Stage3(Stage2):
    stage = 3
    partitioned = frozenset({"optimizer", "grads", "params"})

    def setup(self, init32: list[torch.Tensor]) -> FlatAdam:
        self.param_shards = []
        for u, values in zip(self.units, init32):
            self.param_shards.append(self.shard_of(values, u).to(self.dtype))
            self.ledger.add("params", self.param_shards[-1].nbytes)
            u.param = torch.empty(0, dtype=self.dtype, device=self.device).requires_grad_(True)
        self._gathering: dict[int, Pending] = {}
        return self._partitioned_grads_and_optimizer(init32, self.param_shards)

    def _saved_tensors(self) -> SavedTensors:
        def param_unit(ptr: int) -> int | None:
            return next((u.index for u in self.units if u.param.numel()
                         and u.param.untyped_storage().data_ptr() == ptr), None)
        return SavedTensors(param_unit, fetch=self._gathered)

    # --- gather and release ----------------------------------------------------------------------
    def _issue_gather(self, u: Unit) -> None:
        if u.index in self._gathering or u.param.numel():
            return
        full = torch.empty(u.layout.padded, dtype=self.dtype, device=self.device)
        self.ledger.add("params", full.nbytes)
        self._gathering[u.index] = self.comm.all_gather(full, self.param_shards[u.index], f"params.{unit_what(u)}")
        u.param.data = full  # in place now, so saved-tensor hooks recognise its storage; read only after wait

    def _gathered(self, index: int) -> torch.Tensor:
        """Unit `index`'s whole parameter buffer, gathering it first if needed."""
        u = self.units[index]
        self._issue_gather(u)
        pending = self._gathering.pop(index, None)
        if pending is not None:
            pending.wait()
        return u.param.data

    def _release(self, u: Unit) -> None:
        assert u.index not in self._gathering, "releasing a unit whose gather is still in flight"
        self.ledger.add("params", -u.param.nbytes)
        u.param.data = torch.empty(0, dtype=self.dtype, device=self.device)

    def _prefetch(self, index: int) -> None:
        if self.options.prefetch_layers and 0 <= index < len(self.units):
            self._issue_gather(self.units[index])

    def before_forward(self, unit: Unit) -> None:
        self._gathered(unit.index)
        self._prefetch(unit.index + 1)

    def after_forward(self, unit: Unit) -> None:
        self._release(unit)

    def before_backward(self, unit: Unit) -> None:
        self._gathered(unit.index)
        self._prefetch(unit.index - 1)

    def after_backward(self, unit: Unit) -> None:
        self._release(unit)

    def after_step(self) -> None:
        """The optimizer wrote the parameter shards in place; the next forward gathers them."""
