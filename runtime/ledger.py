"""The memory ledger of one rank: exact bytes by category, from the tensors the engine allocates.

Categories (zsim.trace.schema.CATEGORIES): `params` (working fp16/bf16/fp32 parameters, including
stage-3 layers while gathered), `grads` (gradients the engine keeps), `optimizer` (fp32 master
weights when mixed, Adam's exp_avg and exp_avg_sq), `activations` (saved for backward, measured by
saved-tensor hooks), `buffers` (communication buckets and gradients waiting in them). Every change
calls `on_change`, which the tracer turns into a `memory` counter event.
"""

from __future__ import annotations

from collections.abc import Callable

CATEGORIES = ("params", "grads", "optimizer", "activations", "buffers")


class MemoryLedger:
    """Bytes held per category, and the peak of each category and of their sum."""

    def __init__(self, on_change: Callable[[dict[str, int]], None] | None = None):
        self.bytes = dict.fromkeys(CATEGORIES, 0)
        self.peak = dict.fromkeys(CATEGORIES, 0)
        self.peak_total = 0
        self._on_change = on_change

    def add(self, category: str, nbytes: int) -> None:
        """Account `nbytes` (may be negative, a release) to `category`."""
        self.set(category, self.bytes[category] + nbytes)

    def set(self, category: str, nbytes: int) -> None:
        assert nbytes >= 0, f"{category} would go negative ({nbytes} bytes)"
        if nbytes == self.bytes[category]:
            return
        self.bytes[category] = nbytes
        self.peak[category] = max(self.peak[category], nbytes)
        self.peak_total = max(self.peak_total, sum(self.bytes.values()))
        if self._on_change is not None:
            self._on_change(dict(self.bytes))
