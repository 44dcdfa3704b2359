"""Spawn the ranks of a traced run on this machine and tear them down, always.

Each rank is `python -m runtime --config <out>/config.json` with the torchrun environment
(RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR=127.0.0.1, a free MASTER_PORT), its output in
`<out>/rank<R>.log`. On Linux each child also gets PR_SET_PDEATHSIG, so it dies with the launcher
even if the launcher is killed. When a rank exits with an error, the others are terminated
(SIGTERM, then SIGKILL after a grace period), the rank that failed first is named (from the
`rank<R>.error.json` files), and the trace files the healthy ranks wrote are kept.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from runtime.config import RunConfig
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
    """In the child, before exec: SIGKILL me when my parent dies (Linux prctl PR_SET_PDEATHSIG)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except OSError:
        pass  # not Linux: the launcher's own teardown still applies


def _check_devices(cfg: RunConfig) -> None:
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
    from runtime.merge import merge

    _check_devices(cfg)
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for stale in [*out.glob("rank*.json"), *out.glob("rank*.log"), out / "summary.json"]:
        stale.unlink(missing_ok=True)  # a previous run's files would mix with this one's
    config_path = out / "config.json"
    config_path.write_text(cfg.to_json())
    port = free_port()
    package_root = str(Path(__file__).resolve().parent.parent)
    procs: list[subprocess.Popen] = []
    logs = []
    try:
        for rank in range(cfg.world_size):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(cfg.world_size), LOCAL_RANK=str(rank),
                       LOCAL_WORLD_SIZE=str(cfg.world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                       PYTHONPATH=os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")])),
                       ZSIM_PROGRESS="1" if progress and rank == 0 else "0")
            log = open(out / f"rank{rank}.log", "wb")  # noqa: SIM115 - closed in finally
            logs.append(log)
            stderr = None if progress and rank == 0 else subprocess.STDOUT
            procs.append(subprocess.Popen([sys.executable, "-m", "runtime", "--config", str(config_path)],
                                          env=env, stdout=log, stderr=stderr, preexec_fn=_die_with_parent))
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
        for log in logs:
            log.close()


def _wait(procs: list[subprocess.Popen], poll_s: float) -> int | None:
    """Block until all ranks exit 0 (None) or one exits non-zero (its rank)."""
    while True:
        codes = [p.poll() for p in procs]
        for rank, code in enumerate(codes):
            if code not in (None, 0):
                return rank
        if all(code == 0 for code in codes):
            return None
        time.sleep(poll_s)


def _terminate(procs: list[subprocess.Popen]) -> None:
    """SIGTERM every live rank, SIGKILL what is left after GRACE_S, and reap them all."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + GRACE_S
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _first_failure(out: Path, procs: list[subprocess.Popen], detected: int) -> RankFailure:
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
    code = procs[detected].returncode
    how = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
    return RankFailure(detected, how, out / f"rank{detected}.log")
