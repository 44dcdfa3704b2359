"""Spawn the ranks of a traced run on this machine and tear them down, always.

Ranks are forked from a multiprocessing *forkserver* that has imported torch and the runtime once
(importing torch costs ~2 s of CPU per process: 8 ranks on 2 cores would spend 8 s just starting).
The forkserver never runs a torch op, so forking it is safe, also before CUDA is initialised. Each
rank gets the torchrun environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR=127.0.0.1, a free
MASTER_PORT) and writes its output to `<out>/rank<R>.log`; it runs the same `worker.main` that
`python -m zsim.runtime` runs under torchrun. On Linux each rank also gets PR_SET_PDEATHSIG, so it dies
with its parent even if the launcher is killed. When a rank exits with an error, the others are terminated
(SIGTERM, then SIGKILL after a grace period), the rank that failed first is named (from the
`rank<R>.error.json` files), and the trace files the healthy ranks wrote are kept.
"""

from __future__ import annotations

import ctypes
import glob
import json
import multiprocessing
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .config import RunConfig
from zsim.errors import ConfigError

GRACE_S = 5.0


@dataclass(frozen=True)
class RankFailure:
    rank: int
    error: str  # one line: "ExceptionType: message", or how the process ended
    log: Path

    def __str__(self) -> str:
        return f"rank {self.rank} failed: {self.error} (log: {self.log})"


@dataclass
class LaunchResult:
    out_dir: Path
    pids: list[int]
    failure: RankFailure | None = None
    summary: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.failure is None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In the child: SIGKILL me when my parent dies (Linux prctl PR_SET_PDEATHSIG)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except OSError:
        pass  # not Linux: the launcher's own teardown still applies


def _gpu_device_nodes() -> bool:
    """Could torch see a GPU here? Without an NVIDIA or ROCm device node it cannot, and the
    launcher then skips importing torch (about 2 s) just to ask."""
    return bool(glob.glob("/dev/nvidia[0-9]*") or os.path.exists("/dev/kfd")) or sys.platform != "linux"


def _check_devices(cfg: RunConfig) -> None:
    if cfg.device == "cpu" or (cfg.device == "auto" and not _gpu_device_nodes()):
        return
    import torch

    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda, but torch sees no GPU", path="device")
    if cfg.device != "cpu" and torch.cuda.is_available() and cfg.world_size > torch.cuda.device_count():
        raise ConfigError(f"{cfg.world_size} ranks, but this machine has {torch.cuda.device_count()} GPUs "
                          "(one rank per GPU; use torchrun for several nodes, or --device cpu)", path="ranks")


def launch(cfg: RunConfig, *, progress: bool = False, poll_s: float = 0.05) -> LaunchResult:
    """Run all ranks to completion or to the first failure; merge the traces on success.

    Raises:
        ConfigError: more ranks than GPUs, or --device cuda without GPUs.
    """
    from .merge import merge

    _check_devices(cfg)
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for stale in [*out.glob("rank*.json"), *out.glob("rank*.log"), out / "summary.json"]:
        stale.unlink(missing_ok=True)  # a previous run's files would mix with this one's
    config_json = cfg.to_json()
    (out / "config.json").write_text(config_json)
    port = free_port()
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["zsim.runtime.worker"])
    procs: list[multiprocessing.process.BaseProcess] = []
    try:
        for rank in range(cfg.world_size):
            env = {"RANK": str(rank), "WORLD_SIZE": str(cfg.world_size), "LOCAL_RANK": str(rank),
                   "LOCAL_WORLD_SIZE": str(cfg.world_size), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                   "ZSIM_PROGRESS": "1" if progress and rank == 0 else "0"}
            proc = ctx.Process(target=_rank_main, name=f"rank{rank}", daemon=False,
                               args=(config_json, env, str(out / f"rank{rank}.log"), progress and rank == 0))
            proc.start()
            procs.append(proc)
        result = LaunchResult(out, [p.pid for p in procs])
        failed = _wait(procs, poll_s)
        if failed is not None:
            _terminate(procs)
            result.failure = _first_failure(out, procs, failed)
        else:
            result.summary = merge(out)
        return result
    finally:
        _terminate(procs)


def _rank_main(config_json: str, env: dict[str, str], log_path: str, keep_stderr: bool) -> None:
    """A rank, in the forked child: its environment, its log, then the worker."""
    _die_with_parent()
    os.environ.update(env)
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    sys.stdout.flush()
    os.dup2(log, 1)
    if not keep_stderr:
        sys.stderr.flush()
        os.dup2(log, 2)
    from . import worker

    sys.exit(worker.main(RunConfig.from_json(config_json), worker.RankEnv.from_environ()))


def _wait(procs: list, poll_s: float) -> int | None:
    """Block until all ranks exit 0 (None) or one exits non-zero (its rank)."""
    while True:
        codes = [p.exitcode for p in procs]
        for rank, code in enumerate(codes):
            if code not in (None, 0):
                return rank
        if all(code == 0 for code in codes):
            return None
        time.sleep(poll_s)


def _terminate(procs: list) -> None:
    """SIGTERM every live rank, SIGKILL what is left after GRACE_S, and reap them all."""
    for p in procs:
        if p.exitcode is None:
            p.terminate()
    deadline = time.monotonic() + GRACE_S
    for p in procs:
        p.join(timeout=max(0.0, deadline - time.monotonic()))
        if p.exitcode is None:
            p.kill()
            p.join()


def _first_failure(out: Path, procs: list, detected: int) -> RankFailure:
    """The rank whose error came first (peers of a dead rank fail later, with connection errors)."""
    errors = []
    for rank in range(len(procs)):
        path = out / f"rank{rank}.error.json"
        if path.exists():
            try:
                data = json.loads(path.read_text())
                errors.append((data["time_ns"], rank, data["error"]))
            except (json.JSONDecodeError, KeyError):
                continue
    if errors:
        _, rank, error = min(errors)
        return RankFailure(rank, error, out / f"rank{rank}.log")
    code = procs[detected].exitcode
    how = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
    return RankFailure(detected, how, out / f"rank{detected}.log")
