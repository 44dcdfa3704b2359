"""Imported first in the launcher's multiprocessing forkserver (`set_forkserver_preload`): makes the
forkserver die with the launcher (Linux PR_SET_PDEATHSIG = SIGKILL), whatever kills the launcher.

Why (issue 13): the ranks are children of the forkserver, not of the launcher, and their own
parent-death signal fires when the *forkserver* dies. Left alone, a forkserver notices its launcher
is gone only when their pipe closes and then shuts down a torch-laden interpreter (~2.5 s measured on
the development machine); with this guard it is killed at once, and the ranks with it.
Importing this module anywhere else has no effect beyond that process's own parent-death signal,
so only the forkserver imports it.
"""

from __future__ import annotations

import ctypes
import os
import signal


def die_with_parent() -> None:
    """SIGKILL this process when its parent dies; exit now if the parent is already gone."""
    parent = os.getppid()
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return  # not Linux: the launcher's own teardown still applies
    if os.getppid() != parent:
        os._exit(1)


die_with_parent()
