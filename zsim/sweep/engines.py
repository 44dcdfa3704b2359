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
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from zsim.errors import ZsimError, printable
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


# --address: [tcp://]host:port, host a name, an IPv4 address or a bracketed IPv6 one (the forms
# distributed.comm.tcp parses; tls:// needs certificates zsim does not take, ucx/ws/inproc other
# transports a sweep does not need).
_ADDRESS = re.compile(r"^(?:tcp://)?(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,252}))"
                      r":(?P<port>[0-9]{1,5})$")
CONNECT_S = 10.0  # to connect and hear the scheduler identify itself
WORKER_WAIT_S = 30.0  # how long a sweep waits with no live worker (at the start, or after the last one died)


def check_address(address: str) -> str:
    """`address` as `tcp://host:port`.

    Raises:
        ZsimError: not of the form [tcp://]host:port with a port 1 to 65535 (naming it).
    """
    match = _ADDRESS.match(address.strip())
    if match is None or not 1 <= int(match["port"]) <= 65535:
        raise ZsimError(f"--address {printable(address, 80)}: expected a Dask scheduler as tcp://HOST:PORT "
                        "(e.g. tcp://10.0.0.5:8786)")
    return f"tcp://{match['host']}:{int(match['port'])}"


def scheduler_identity(address: str, timeout: float = CONNECT_S) -> dict:
    """What the Dask scheduler at `address` says it is (its `identity`: type, n_workers, ...), asked
    over Dask's own protocol with an overall deadline (a Client waits forever on a service that accepts
    the connection but never answers, and reads another protocol's bytes as a frame length).

    Raises:
        ZsimError: nothing answers in time, or what answers is not a Dask scheduler.
    """
    import asyncio

    from distributed.comm import connect

    async def identity() -> object:
        comm = await connect(address, timeout=timeout)
        try:
            await comm.write({"op": "identity", "reply": True})
            return await comm.read()
        finally:
            comm.abort()

    try:
        info = asyncio.run(asyncio.wait_for(identity(), timeout))
    except (asyncio.TimeoutError, TimeoutError):
        raise ZsimError(f"--address {address}: cannot reach a Dask scheduler: none answered within {timeout:.0f} s "
                        "(nothing listens there, or something that is not Dask)") from None
    except Exception as exc:  # noqa: BLE001 - refused, reset, or bytes of another protocol
        raise ZsimError(f"--address {address}: cannot reach a Dask scheduler ({type(exc).__name__}: "
                        f"{printable(str(exc), 120)})") from None
    except MemoryError:  # another protocol's bytes read as a frame length
        raise ZsimError(f"--address {address}: what answers there is not a Dask scheduler") from None
    if not isinstance(info, dict) or info.get("type") != "Scheduler":
        raise ZsimError(f"--address {address}: what answers there is not a Dask scheduler")
    return info


def _wait_for_workers(address: str, wait_s: float) -> None:
    """Return once the scheduler at `address` has a worker. Raises ZsimError after `wait_s` without one."""
    deadline = time.monotonic() + wait_s
    while not scheduler_identity(address).get("n_workers"):
        if time.monotonic() > deadline:
            raise ZsimError(f"--address {address}: the Dask scheduler has no workers (waited {wait_s:.0f} s); start "
                            "some with `dask worker " + address + "` (zsim installed), then run the sweep again")
        time.sleep(1.0)


def run_dask(points: list[Point], workers: int, address: str | None, with_facts: bool, on_done: Done,
             worker_wait_s: float = WORKER_WAIT_S) -> None:
    """Run `points` on a Dask cluster at `address`, or on a LocalCluster of `workers` processes. A
    cluster left without a live worker for `worker_wait_s` stops the sweep (the finished points are
    cached by `on_done`).

    Raises:
        ZsimError: dask.distributed is not installed; a malformed address; no Dask scheduler there;
            no live worker.
    """
    try:
        from dask.distributed import Client, LocalCluster, wait as wait_futures
    except ImportError:
        raise ZsimError("--engine dask needs dask.distributed: pip install 'zsim[dask]'") from None
    cluster = None
    try:
        if address:
            address = check_address(address)
            _wait_for_workers(address, worker_wait_s)
            try:
                client = Client(address, timeout=f"{CONNECT_S:.0f}s")
            except Exception as exc:  # noqa: BLE001 - it answered the probe: say what went wrong after
                raise ZsimError(f"--address {address}: cannot connect a Dask client ({type(exc).__name__}: "
                                f"{printable(str(exc), 120)})") from None
        else:
            cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                   dashboard_address=None)
            client = Client(cluster)
        with client:
            n = len(client.scheduler_info().get("workers", {})) or workers
            pending = set(client.map(run_chunk, chunks(points, n), with_facts=with_facts, pure=False))
            alone_since: float | None = None
            try:
                while pending:
                    try:
                        done, pending = wait_futures(pending, timeout=2.0, return_when="FIRST_COMPLETED")
                    except TimeoutError:
                        done = set()
                    for future in done:
                        on_done(future.result())
                    if done or client.scheduler_info().get("workers"):
                        alone_since = None
                    elif alone_since is None:
                        alone_since = time.monotonic()
                    elif time.monotonic() - alone_since > worker_wait_s:
                        raise ZsimError(f"the Dask cluster{' at ' + address if address else ''} has had no live "
                                        f"worker for {worker_wait_s:.0f} s; the finished points are cached: start "
                                        "workers and run the sweep again")
            except BaseException:
                client.cancel(list(pending))
                raise
    finally:
        if cluster is not None:
            cluster.close()
