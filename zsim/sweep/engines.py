"""Where a sweep's points run: local processes (default) or a Dask cluster (optional extra).

Both call the same worker function (zsim.sweep.worker.run_chunk) on the same chunks of validated
points, and hand each finished chunk to `on_done` in the calling process, which caches it at once:
a sweep stopped at any moment keeps every finished point.

Local: a `concurrent.futures.ProcessPoolExecutor` (fork where the platform has it and this process
has no other thread: the workers start with zsim already imported), one process per core by default. Points go in chunks, so the per-point
overhead (pickling a Scenario, a future, a cache write) stays in the milliseconds.

Dask (`pip install zsim[dask]`): `dask.distributed`, either a cluster at `address`
(`tcp://scheduler:8786`, workers with zsim installed) or, without an address, a LocalCluster of
`workers` processes started for the sweep. Why Dask and not Ray: docs/sweep.md.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import threading
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from zsim.errors import ZsimError
from zsim.sweep.points import Point
from zsim.sweep.worker import Finished, run_chunk

Done = Callable[[list[Finished]], None]
ENGINES = ("local", "dask")


def default_workers() -> int:
    """All the cores this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def start_method() -> str:
    """`fork` (workers start with zsim imported, in milliseconds) when this process has no other
    thread: forking a process with threads (a Dask client, a progress monitor) can copy a lock one of
    them holds, and deadlock the child. Otherwise `forkserver`, else `spawn`."""
    methods = multiprocessing.get_all_start_methods()
    if "fork" in methods and threading.active_count() == 1:
        return "fork"
    return "forkserver" if "forkserver" in methods else "spawn"


def die_with_parent() -> None:
    """In a worker: ask Linux to send SIGTERM when the sweep's process dies (prctl PR_SET_PDEATHSIG = 1,
    man 2 prctl), so a sweep killed by SIGTERM or SIGKILL leaves no workers behind. Elsewhere nothing."""
    import ctypes
    import signal
    import sys

    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):  # no libc symbol: keep the default
        return
    if os.getppid() == 1:  # the parent died before the request took effect
        os._exit(1)


def chunks(points: list[Point], workers: int, most: int = 8) -> list[list[Point]]:
    """Split `points` into chunks: about 4 per worker (so the last ones balance), at most `most`
    points each (so progress and caching stay fine-grained)."""
    size = max(1, min(most, math.ceil(len(points) / (4 * max(1, workers)))))
    return [points[i:i + size] for i in range(0, len(points), size)]


def run_local(points: list[Point], workers: int, with_facts: bool, on_done: Done) -> None:
    """Run `points` in `workers` local processes (in this process when workers is 1)."""
    if workers <= 1 or len(points) <= 1:
        for chunk in chunks(points, 1, most=1):
            on_done(run_chunk(chunk, with_facts))
        return
    context = multiprocessing.get_context(start_method())
    with ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=die_with_parent) as pool:
        pending = {pool.submit(run_chunk, c, with_facts) for c in chunks(points, workers)}
        try:
            while pending:
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in finished:
                    on_done(future.result())
        except BaseException:
            for future in pending:
                future.cancel()
            raise


def run_dask(points: list[Point], workers: int, address: str | None, with_facts: bool, on_done: Done) -> None:
    """Run `points` on a Dask cluster at `address`, or on a LocalCluster of `workers` processes.

    Raises:
        ZsimError: dask.distributed is not installed, or the scheduler cannot be reached.
    """
    try:
        from dask.distributed import Client, LocalCluster, as_completed
    except ImportError:
        raise ZsimError("--engine dask needs dask.distributed: pip install 'zsim[dask]'") from None
    cluster = None
    try:
        if address:
            try:
                client = Client(address, timeout="10s")
            except (OSError, TimeoutError) as exc:
                raise ZsimError(f"--address {address}: cannot reach a Dask scheduler ({exc})") from None
        else:
            cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                   dashboard_address=None)
            client = Client(cluster)
        with client:
            n = len(client.scheduler_info().get("workers", {})) or workers
            futures = client.map(run_chunk, chunks(points, n), with_facts=with_facts, pure=False)
            try:
                for future in as_completed(futures):
                    on_done(future.result())
            except BaseException:
                client.cancel(futures)
                raise
    finally:
        if cluster is not None:
            cluster.close()
