"""A progress line for long work on a terminal (quiet when stderr is not one): elapsed time against an
estimate, redrawn in place, erased at the end. Used by `zsim run` around the simulation, whose length
`zsim.zero.cost.estimate` predicts before it starts."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from typing import TextIO

SHOW_AFTER_S = 2.0  # work estimated shorter than this gets no line


@contextlib.contextmanager
def ticker(label: str, estimate_s: float, stream: TextIO | None = None, every_s: float = 0.5) -> Iterator[None]:
    """While the block runs, redraw `label: 12 s of ~40 s estimated` on `stream` (stderr) every `every_s`
    seconds, if it is a terminal and the estimate is at least SHOW_AFTER_S."""
    stream = stream or sys.stderr
    try:
        interactive = stream.isatty()
    except (AttributeError, ValueError):
        interactive = False
    if not interactive or estimate_s < SHOW_AFTER_S:
        yield
        return
    done = threading.Event()
    started = time.monotonic()

    def draw() -> None:
        while not done.wait(every_s):
            with contextlib.suppress(OSError, ValueError):
                stream.write(f"\r  {label}: {time.monotonic() - started:.0f} s of ~{estimate_s:.0f} s estimated ")
                stream.flush()

    thread = threading.Thread(target=draw, name="zsim-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        with contextlib.suppress(OSError, ValueError):
            stream.write("\r\033[K")
            stream.flush()
