"""Facts about the machine a rank runs on, for the trace metadata (`host_facts`) and for host
profiles (hwprofiles/hosts/, docs/host-profiles.md): a CPU run can only be simulated honestly when
the simulator knows how many cores the ranks shared and with how many threads each computed."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
from pathlib import Path
from typing import Any

import torch


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux, else platform.processor()): zsim.calibrate.machines.this_cpu,
    which `zsim calibrate` and `zsim validate replay` compare with a host profile's `cpu`."""
    from zsim.calibrate.machines import this_cpu

    return this_cpu()


def memory_bytes() -> int | None:
    """Total host memory in bytes (/proc/meminfo), or None where unknown."""
    info = Path("/proc/meminfo")
    if info.is_file():
        for line in info.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    return None


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity; os.cpu_count() where that is unknown)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


# glibc mallopt(3) parameters (malloc.h): M_TRIM_THRESHOLD -1, M_MMAP_MAX -4.
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4


def keep_freed_memory() -> str:
    """Make this process's allocator keep the memory it frees, as PyTorch's CUDA caching allocator
    does on a GPU, and return how it was set up (for the trace metadata).

    By default glibc serves every allocation above its mmap threshold (128 KiB, adapting up to
    32 MiB) with a fresh mmap and unmaps it on free, so each step's temporaries of that size (the
    optimizer's fp64 norm copy, Adam's denominators, activations) are first-touched again: a page
    fault per 4 KiB. Measured on the 2-core development host (zsim docs/host-profiles.md): the norm
    pass costs 9.6-14.7 ns per element with fresh pages and 3.6-4.7 ns with reused ones, depending on
    what glibc's threshold happened to adapt to; no byte-count model can price that. With mmap off
    (M_MMAP_MAX 0: every block comes from the heap) and no trimming of the heap top, freed blocks are
    reused and a step streams memory it has touched before, which is what the simulator's allocator
    model (zsim.memory.allocator, a caching allocator) assumes. Only glibc has mallopt: elsewhere
    nothing changes and the answer says so."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        mallopt = getattr(libc, "mallopt", None)
    except OSError:
        mallopt = None
    if mallopt is None or platform.libc_ver()[0] != "glibc":
        return "system default (not glibc: freed memory may be returned to the OS)"
    if mallopt(_M_MMAP_MAX, 0) != 1 or mallopt(_M_TRIM_THRESHOLD, 2**31 - 1) != 1:
        return "system default (mallopt refused)"
    return "glibc, caching (mmap off, no trim: freed memory is reused, not returned to the OS)"


def pin_to_cores(local_rank: int, local_world: int) -> list[int] | None:
    """Bind this rank (all its threads, gloo's included) to its own share of the cores this process
    may use: local rank r gets the r-th of `local_world` equal, contiguous blocks, as a GPU rank owns
    its GPU (and as Intel's and torchrun's CPU launchers bind ranks to cores). Unbound, the OS moves
    threads across cores, so one rank's gloo thread can run on the core of another rank's compute:
    a slowdown of that other rank that no per-rank model (zsim.engine.cores gives each rank
    cores / ranks) can know of. Returns the cores, or None where binding is impossible (not Linux,
    fewer cores than ranks: the ranks then time-slice whatever we do)."""
    try:
        cores = sorted(os.sched_getaffinity(0))
    except AttributeError:
        return None
    if len(cores) < local_world:
        return None
    per = len(cores) // local_world
    mine = cores[local_rank * per:(local_rank + 1) * per]
    os.sched_setaffinity(0, mine)
    return mine


def host_facts(ranks_on_host: int, device: torch.device | None = None,
               bound: list[int] | None = None) -> dict[str, Any]:
    """What a host profile needs to know about this run: CPU model, logical cores (all and usable),
    ranks on this host, intra-op threads per rank, whether ranks × threads exceed the cores (then
    they time-slice: DESIGN.md, measured facts), memory, the torch version and its BLAS, and, for a
    CPU run, the allocator setting (keep_freed_memory; idempotent, so it is read by setting it) and
    the cores the rank is `bound` to (pin_to_cores: then the ranks' blocks are the usable cores)."""
    cores = len(bound) * ranks_on_host if bound else usable_cores()
    threads = torch.get_num_threads()
    return {
        "cpu_model": cpu_model(),
        "logical_cores": os.cpu_count(),
        "usable_cores": cores,
        "ranks_on_host": ranks_on_host,
        "threads_per_rank": threads,
        "ranks_share_cores": ranks_on_host * threads > cores,
        "memory_bytes": memory_bytes(),
        "torch": torch.__version__,
        "blas": "mkl" if torch.backends.mkl.is_available() else "openblas-or-other",
        "machine": platform.machine(),
        **({"allocator": keep_freed_memory(), "bound_cores": bound} if device is not None and device.type == "cpu"
           else {}),
    }
