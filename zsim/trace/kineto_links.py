"""Which CPU span launched a GPU kernel in a Kineto trace: the kernel's `correlation` names its launch
(a `cuda_runtime` / `cuda_driver` event, e.g. `cudaLaunchKernel`, with the same `args.correlation`),
and the launch happened on one host thread inside the spans open there at that moment (torch.profiler
records `record_function` labels as `user_annotation` spans and ATen ops as `cpu_op` spans). The
innermost span of a wanted kind that holds the launch is the kernel's owner.

This is how the profiler itself links them (the `ac2g` flow events of a trace draw exactly these
arrows), and it does not depend on the order in which threads issued work: in the 8×V100 DLRM trace
the NCCL annotations come from two threads (forward on the main thread, backward on autograd's), so
issue order over the whole rank is not launch order.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Callable
from typing import Any

# Kineto categories of a host-side launch that carries the kernel's correlation id.
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")


class Launches:
    """The host launches of one Kineto trace's kernels, and the spans around them.

    `spans(e)` picks the candidate owners (e.g. `nccl:*` annotations, or zsim-labelled ones); each is
    a complete event with `tid`, `ts`, `dur` (checked by the trace's reader)."""

    def __init__(self, events: list[dict[str, Any]], spans: Callable[[dict[str, Any]], bool]) -> None:
        self._launch = {e["args"]["correlation"]: e for e in events
                        if e.get("cat") in LAUNCH_CATS and isinstance(e.get("args"), dict)
                        and "correlation" in e["args"]}
        by_tid: dict[Any, list[dict[str, Any]]] = defaultdict(list)
        for e in events:
            if spans(e):
                by_tid[e.get("tid")].append(e)
        self._spans = {tid: sorted(s, key=lambda e: (e["ts"], -e["dur"])) for tid, s in by_tid.items()}
        self._starts = {tid: [e["ts"] for e in s] for tid, s in self._spans.items()}
        self._longest = {tid: max(e["dur"] for e in s) for tid, s in self._spans.items()}

    @property
    def linked(self) -> bool:
        """Whether the trace records launches at all (a synthetic or CPU-only one may not)."""
        return bool(self._launch)

    def owner(self, kernel: dict[str, Any]) -> dict[str, Any] | None:
        """The innermost candidate span on the launching thread that holds the kernel's launch, or None
        (no launch recorded for its correlation, or no candidate span around it)."""
        launch = self._launch.get((kernel.get("args") or {}).get("correlation"))
        if launch is None:
            return None
        spans, starts = self._spans.get(launch.get("tid"), []), self._starts.get(launch.get("tid"), [])
        t, longest = launch["ts"], self._longest.get(launch.get("tid"), 0.0)
        # spans nest on one thread: the latest-starting span that still holds t is the innermost
        for i in range(bisect.bisect_right(starts, t) - 1, -1, -1):
            s = spans[i]
            if s["ts"] + longest < t:
                break  # no span that started this early is long enough to reach t
            if s["ts"] <= t <= s["ts"] + s["dur"]:
                return s
        return None
