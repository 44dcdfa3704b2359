"""Dynamic loss scaling for fp16 (Micikevicius et al., "Mixed Precision Training", ICLR'18, §3.2):
multiply the loss by S so small gradients survive fp16; skip the step and halve S when a gradient
overflows; double S after `window` clean steps."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DynamicLossScaler:
    scale: float = 2.0 ** 16
    factor: float = 2.0
    window: int = 1000  # clean steps before the scale grows (DeepSpeed's loss_scale_window)
    min_scale: float = 1.0
    _clean: int = 0

    def update(self, overflow: bool) -> None:
        """After a step: shrink on overflow, grow after `window` clean steps."""
        if overflow:
            self.scale = max(self.scale / self.factor, self.min_scale)
            self._clean = 0
            return
        self._clean += 1
        if self._clean == self.window:
            self.scale *= self.factor
            self._clean = 0
