"""Facts about the machine a rank runs on, for the trace metadata (`host_facts`) and for host
profiles (hwprofiles/hosts/, docs/host-profiles.md): a CPU run can only be simulated honestly when
the simulator knows how many cores the ranks shared and with how many threads each computed."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

import torch


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux, else platform.processor())."""
    info = Path("/proc/cpuinfo")
    if info.is_file():
        for line in info.read_text(errors="replace").splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


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


def host_facts(ranks_on_host: int) -> dict[str, Any]:
    """What a host profile needs to know about this run: CPU model, logical cores (all and usable),
    ranks on this host, intra-op threads per rank, whether ranks × threads exceed the cores (then
    they time-slice: DESIGN.md, measured facts), memory, and the torch version and its BLAS."""
    cores = usable_cores()
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
    }
