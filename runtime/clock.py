"""The clocks a rank's tracer times spans with: the host's, or CUDA events on the device.

On a CPU rank the work is done when the host call returns, so a span is two host timestamps. On a
GPU the host only enqueues kernels: a host timestamp after a launch says when the launch returned,
not when the kernels ran, and synchronising to make it say more serialises the GPU behind the host
and changes what is measured (issue 26). So on CUDA a span is two `torch.cuda.Event`s recorded on the
stream the work runs on, resolved after the step, once, against an anchor: an event recorded on an
idle device right after a synchronize, read together with the host clock (CUDA Runtime API,
cudaEventElapsedTime: "the elapsed time in milliseconds between two events", resolution about 0.5 µs).

`clock_for(device, now_us)` picks one; both share the interface `stamp()`, `settle()`, `anchor()`,
`resolve(stamp)`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class HostClock:
    """Host timestamps in microseconds (the tracer's `now_us`); nothing to settle or resolve."""

    device_timed = False
    name = "host"

    def __init__(self, now_us: Callable[[], float]):
        self._now = now_us

    def stamp(self) -> float:
        return self._now()

    def settle(self) -> None:
        """Nothing is in flight on a host clock."""

    def anchor(self) -> None:
        """Nothing to anchor: host stamps are already microseconds."""

    def resolve(self, stamp: float) -> float:
        return stamp


class CudaEventClock:
    """CUDA events recorded on the current stream, resolved to the host timeline (µs) after `settle`.

    `anchor()` synchronises the device (call it between steps, never inside one) and records the
    reference event; every stamp of the step is resolved against the latest anchor."""

    device_timed = True
    name = "cuda_event"

    def __init__(self, now_us: Callable[[], float], cuda: Any = None):
        """`cuda`: the `torch.cuda` module (a stand-in in tests)."""
        if cuda is None:
            import torch
            cuda = torch.cuda
        self._cuda = cuda
        self._now = now_us
        self._ref: Any = None
        self._ref_us = 0.0

    def stamp(self) -> Any:
        event = self._cuda.Event(enable_timing=True)
        event.record()
        return event

    def settle(self) -> None:
        """Wait for every recorded event (one synchronize, after the step)."""
        self._cuda.synchronize()

    def anchor(self) -> None:
        self._cuda.synchronize()
        ref = self._cuda.Event(enable_timing=True)
        ref.record()
        self._ref_us = self._now()
        ref.synchronize()
        self._ref = ref

    def resolve(self, stamp: Any) -> float:
        assert self._ref is not None, "CudaEventClock.resolve before anchor()"
        return self._ref_us + self._ref.elapsed_time(stamp) * 1000.0  # elapsed_time is in ms


def clock_for(device_type: str, now_us: Callable[[], float], cuda: Any = None) -> HostClock | CudaEventClock:
    """CUDA events for a `cuda` device, the host clock for anything else (cpu)."""
    if device_type == "cuda":
        return CudaEventClock(now_us, cuda)
    return HostClock(now_us)
