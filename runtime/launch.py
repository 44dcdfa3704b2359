"""Spawn the ranks of a traced run on this machine and tear them down, always.

Ranks are forked from a multiprocessing *forkserver* that has imported torch and the runtime once
(importing torch costs ~2 s of CPU per process: 8 ranks on 2 cores would spend 8 s just starting).
The forkserver never runs a torch op, so forking it is safe, also before CUDA is initialised. Each
rank gets the torchrun environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR=127.0.0.1, a free
MASTER_PORT) and writes its output to `<out>/rank<R>.log`; it runs the same `worker.main` that
`python -m zsim.runtime` runs under torchrun.

The launcher owns its ranks (issue 13), whatever ends it:
- SIGTERM, SIGHUP or Ctrl-C: a handler turns the signal into an exception, so the `finally` stops every
  rank (SIGTERM, then SIGKILL after GRACE_S) before the launcher exits.
- SIGKILL: nothing runs in the launcher; its forkserver exits when the launcher's end of their pipe
  closes (CPython's forkserver watches it), and every rank has PR_SET_PDEATHSIG = SIGKILL on its parent
  (the forkserver), so the ranks die with it; the resource tracker exits when its last user is gone.
When a rank fails the others are stopped, and the rank that failed *first* is named: a rank's own error
(from `rank<R>.error.json`) before one killed by a signal or exiting without a word, before the errors
its peers raise about a lost connection ("connection reset by peer"). The traces the healthy ranks
wrote are kept. An existing trace folder is replaced only with `force` (`--force`).
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import multiprocessing
import multiprocessing.connection
import os
import re
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from zsim.config.yamlfile import read_json
from zsim.errors import ConfigError, ZsimError, printable

from .config import RunConfig

GRACE_S = 5.0
# Errors a rank raises because a *peer* went away (gloo/NCCL transport), not its own failure.
PEER_LOST = re.compile(r"connection (reset|closed|refused)|by peer|broken pipe|DistBackendError|DistNetworkError|"
                       r"timed out|timeout|socket|NCCL communicator was aborted", re.IGNORECASE)
RUN_FILES = ("rank*.trace.json", "rank*.summary.json", "rank*.error.json", "rank*.kineto.json", "rank*.log",
             "rank*.params.pt",
             "summary.json", "config.json")


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
    """In the child: SIGKILL me when my parent (the forkserver) dies (Linux PR_SET_PDEATHSIG)."""
    from .forkserver_guard import die_with_parent

    die_with_parent()


def _stop_forkserver() -> None:
    """At the launcher's exit: SIGKILL the forkserver instead of letting it shut down a torch-laden
    interpreter for seconds after its launcher is gone (it has no work left; its ranks are stopped)."""
    from multiprocessing import forkserver

    pid = getattr(getattr(forkserver, "_forkserver", None), "_forkserver_pid", None)
    if pid:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


class Stopped(BaseException):
    """The launcher received SIGTERM or SIGHUP (raised in the main thread by `_stop_on_signals`)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def _stop_on_signals():
    """While the ranks run: SIGTERM and SIGHUP raise `Stopped`, so that teardown runs (only in the main
    thread, where Python delivers signals; elsewhere the parent-death signal still applies)."""
    def handler(signum, frame):
        raise Stopped(signum)

    previous = {}
    try:
        for sig in (signal.SIGTERM, signal.SIGHUP):
            previous[sig] = signal.signal(sig, handler)
    except ValueError:  # not the main thread
        pass
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def prepare_out_dir(out: Path, force: bool) -> None:
    """Make `out` ready for a run: a folder (created), holding no earlier run unless `force` (then the
    earlier run's files, and only those, are removed).

    Raises:
        ConfigError: `out` is a file or under one, not writable, or holds a run and `force` is false.
    """
    from zsim.report.outputs import check_dir

    try:
        check_dir(out)
    except ZsimError as exc:
        raise ConfigError(str(exc).removeprefix("-o "), path="output") from None
    old = sorted({p for pattern in RUN_FILES for p in out.glob(pattern)}) if out.is_dir() else []
    if old and not force:
        raise ConfigError(f"{printable(str(out))} already holds a traced run ({old[0].name}, {len(old)} files): "
                          "give --force to replace it, or another -o", path="output")
    try:
        out.mkdir(parents=True, exist_ok=True)
        for stale in old:
            stale.unlink(missing_ok=True)
    except OSError as exc:
        raise ConfigError(f"{printable(str(out))}: {exc.strerror or exc}", path="output") from None


def activation_bytes(cfg: RunConfig, stage: int = -1) -> int:
    """Activations one rank of pipeline stage `stage` (-1: the last; any stage when pp is 1) holds at
    its peak, in bytes, on one of `cfg.mp` MP ranks. A block's saved tensors for one micro-batch are
    layer_saved_tensors with e-byte activations [K22 eq. 2], or with checkpointing its input (s·b·h·e)
    plus one block's saved tensors while it recomputes [K22 §4.4]. The stage holds them for every
    micro-batch chunk whose forward has run and backward has not, at the schedule's peak
    (zsim.parallel.pipeline.peak_in_flight over stage_schedule: 1F1B p - s, GPipe m, interleaved
    Megatron's warm-up count; Narayanan et al. SC'21 §2.2.1-2.2.2); without pipelining one micro-batch
    (micro-batches run one after another). The last stage adds the loss's logits and their fp32
    copies, 4·s·b·V/t [K22 §4.3, loss_work_tensors], plus the fp32 softmax it saves per live
    micro-batch."""
    from zsim.parallel.pipeline import split_layers, stage_schedule
    from zsim.workload.activations import layer_saved_tensors, loss_work_tensors
    from zsim.workload.shape import Shape

    m = cfg.model
    e = 4 if cfg.precision == "fp32" else 2
    s, b, t = m.seq_len, m.micro_batch, cfg.mp
    block = sum(layer_saved_tensors(Shape.of(m), s, b, t, e))
    per_layer = s * b * m.hidden * e if cfg.checkpointing else block
    transient = block if cfg.checkpointing else 0
    p, v = cfg.pp, cfg.virtual_stages if cfg.pipeline_schedule == "interleaved" else 1
    stage = stage % p
    chunks = split_layers(m.layers, p, v, tuple(cfg.pp_layers)).layers[stage]
    items = stage_schedule(cfg.pipeline_schedule, p, stage, cfg.accum if p > 1 else 1, v)
    last = stage == p - 1
    live = peak = softmax_live = 0
    for w in items:  # peak_in_flight, weighted by each chunk's layers
        sign = 1 if w.kind == "fwd" else -1
        live += sign * len(chunks[w.chunk])
        softmax_live += sign * (last and w.chunk == v - 1)
        peak = max(peak, live * per_layer + softmax_live * 4 * s * b * m.vocab // t)
    loss = sum(loss_work_tensors(s * b, m.vocab, t, e)) if last else 0
    return peak + transient + loss


# What one CPU rank holds before its model: the torch interpreter forked from the forkserver, gloo and
# the tracer. Measured here (torch 2.13 CPU, 2 ranks of a 4-layer, 32-wide model): 57 MB Private_Dirty
# per rank in /proc/PID/smaps_rollup (209 MB RSS, the rest shared with the forkserver). Without it, 1024
# ranks of a tiny model passed the guard and began forking 1024 interpreters (issue 28).
RANK_PROCESS_BYTES = 50e6


def _check_memory(cfg: RunConfig) -> None:
    """Refuse a run whose ranks would not fit this machine's memory (CPU ranks): each rank is a process
    of RANK_PROCESS_BYTES, builds the full fp32 model once and keeps fp32 Adam states, ~20 bytes per
    parameter (4 params + 4 grads + 8 Adam + 4 master or temporaries), and its activations
    (activation_bytes of its pipeline stage, at the schedule's peak in-flight micro-batches).

    Raises:
        ConfigError: the schedules are too long to walk (SCHEDULE_ITEMS), or the ranks need more than 80%
            of the memory available."""
    from zsim.workload.parameters import total_params
    from zsim.zero.cost import available_bytes

    if cfg.device == "cuda":
        return
    if cfg.pp > 1:  # the stages' schedules are walked below: bounded first (issue 28)
        from zsim.parallel.pipeline import check_schedule_size

        v = cfg.virtual_stages if cfg.pipeline_schedule == "interleaved" else 1
        try:
            check_schedule_size(cfg.pp, cfg.accum, v)
        except ConfigError as exc:
            raise ConfigError(exc.message, path="pp") from None
    states = 20.0 * total_params(cfg.model)
    per_stage = [activation_bytes(cfg, s) for s in range(cfg.pp)]
    activations = max(per_stage)
    need = (states * cfg.pp + sum(per_stage)) * (cfg.world_size // cfg.pp) + RANK_PROCESS_BYTES * cfg.world_size
    have = available_bytes()
    if need > 0.8 * have:
        raise ConfigError(f"{cfg.world_size} ranks of a {total_params(cfg.model) / 1e6:,.0f}M-parameter model need "
                          f"~{need / 1e9:,.1f} GB of memory (~{RANK_PROCESS_BYTES / 1e9:.2f} GB of process, "
                          f"~{states / 1e9:,.1f} GB of model states and "
                          f"~{activations / 1e9:,.1f} GB of activations per rank), this machine has "
                          f"{have / 1e9:.1f} GB available: trace a smaller model, micro-batch or sequence, or fewer "
                          "ranks", path="model")


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


def launch(cfg: RunConfig, *, progress: bool = False, force: bool = False) -> LaunchResult:
    """Run all ranks to completion or to the first failure; merge the traces on success. An output
    folder that holds an earlier run is replaced only with `force`.

    Raises:
        ConfigError: more ranks than GPUs, --device cuda without GPUs, a model too large for this
            machine, or an output folder that is not usable (or holds a run, without `force`).
        Stopped: the launcher got SIGTERM/SIGHUP (the ranks are stopped first).
    """
    from zsim.report.outputs import write_atomic

    from .merge import merge

    _check_devices(cfg)
    _check_memory(cfg)
    out = Path(cfg.out_dir)
    prepare_out_dir(out, force)
    config_json = cfg.to_json()
    write_atomic(out / "config.json", config_json)
    port = free_port()
    ctx = multiprocessing.get_context("forkserver")
    # The guard first: the forkserver dies with this process whatever kills it (forkserver_guard.py).
    ctx.set_forkserver_preload(["zsim.runtime.forkserver_guard", "zsim.runtime.worker"])
    atexit.unregister(_stop_forkserver)  # once per process, however many launches
    atexit.register(_stop_forkserver)
    procs: list[multiprocessing.process.BaseProcess] = []
    with _stop_on_signals():
        try:
            return _run_ranks(cfg, ctx, procs, config_json, port, out, progress, merge)
        finally:
            _terminate(procs)


def _run_ranks(cfg, ctx, procs, config_json, port, out, progress, merge) -> LaunchResult:
    """Start the ranks, wait for them, name the first failure or merge the traces."""
    run_id = os.urandom(8).hex()  # in every rank's metadata: the ranks of one launch (zsim.trace.run_reader)
    for rank in range(cfg.world_size):
        env = {"RANK": str(rank), "WORLD_SIZE": str(cfg.world_size), "LOCAL_RANK": str(rank), "ZSIM_RUN_ID": run_id,
               "LOCAL_WORLD_SIZE": str(cfg.world_size), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "ZSIM_PROGRESS": "1" if progress and rank == 0 else "0"}
        proc = ctx.Process(target=_rank_main, name=f"rank{rank}", daemon=False,
                           args=(config_json, env, str(out / f"rank{rank}.log"), progress and rank == 0))
        proc.start()
        procs.append(proc)
    result = LaunchResult(out, [p.pid for p in procs])
    exits = _wait(procs)
    if any(code != 0 for _, _, code in exits):
        _terminate(procs)
        result.failure = _first_failure(out, exits)
    else:
        result.summary = merge(out)
    return result


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


def _wait(procs: list) -> list[tuple[int, int, int]]:
    """Block until every rank has exited or one exits non-zero; returns (time_ns, rank, exit code) of
    the ranks that exited, in the order they were seen (woken by each process's sentinel, not polled)."""
    exits: list[tuple[int, int, int]] = []
    running = {p.sentinel: rank for rank, p in enumerate(procs)}
    while running:
        ready = multiprocessing.connection.wait(list(running))
        now = time.time_ns()
        for sentinel in ready:
            rank = running.pop(sentinel)
            procs[rank].join()
            exits.append((now, rank, procs[rank].exitcode))
        if any(code != 0 for _, _, code in exits):
            break
    return exits


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


def _how(code: int | None) -> str:
    if code is None:
        return "did not exit"
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name} ({-code})"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code} without recording an error"


def _first_failure(out: Path, exits: list[tuple[int, int, int]]) -> RankFailure:
    """The rank that failed first. In order of preference: the earliest error a rank recorded about
    itself (`rank<R>.error.json`); else the first rank seen dying by a signal or a non-zero exit
    without a record (a killed rank records nothing; its peers then record lost connections); else
    the earliest lost-connection error."""
    own, lost = [], []
    for path in out.glob("rank*.error.json"):
        try:
            data = read_json(path)
            entry = (int(data["time_ns"]), int(data["rank"]), str(data["error"]))
        except (ZsimError, KeyError, TypeError, ValueError):
            continue  # a file cut short by the teardown
        (lost if PEER_LOST.search(entry[2]) else own).append(entry)
    if own:
        _, rank, error = min(own)
        return RankFailure(rank, printable(error, 300), out / f"rank{rank}.log")
    recorded = {rank for _, rank, _ in lost}
    silent = [(t, rank, code) for t, rank, code in exits if code != 0 and rank not in recorded]
    if silent:
        _, rank, code = min(silent)
        return RankFailure(rank, _how(code), out / f"rank{rank}.log")
    if lost:
        _, rank, error = min(lost)
        return RankFailure(rank, printable(error, 300), out / f"rank{rank}.log")
    _, rank, code = min((t, r, c) for t, r, c in exits if c != 0)
    return RankFailure(rank, _how(code), out / f"rank{rank}.log")
