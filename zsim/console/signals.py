"""Holding Ctrl-C while a command imports C extensions (zsim.cli, zsim.commands.run)."""

from __future__ import annotations

import contextlib
import signal
import sys


@contextlib.contextmanager
def sigint_held():
    """Hold Ctrl-C (SIGINT) while a command imports its libraries, and deliver it right after: a
    KeyboardInterrupt raised inside a C extension's initialisation (numpy's) surfaces as "ImportError:
    initialization failed" or aborts the interpreter, instead of the clean exit 130."""
    # Only the main thread takes signals. A process that never imported threading has no other
    # thread (and `zsim --help` need not import it).
    threading = sys.modules.get("threading")
    if threading is not None and threading.current_thread() is not threading.main_thread() \
            or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)  # a held SIGINT is delivered here
