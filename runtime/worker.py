"""One rank of a traced run: set up torch.distributed, train for `steps` steps with the chosen ZeRO
stage, and write `rank<R>.trace.json` (after every step) and `rank<R>.summary.json`.

Run by the launcher (`zsim trace`, `python -m zsim.runtime`), or by torchrun (`python -m zsim.runtime` reads
RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT). NCCL and `cuda:<LOCAL_RANK>` when GPUs
exist (or --device cuda), gloo and CPU otherwise. The process group is destroyed in `finally`;
on an error the rank writes `rank<R>.error.json` (its error in one line, with a timestamp) so the
launcher can say which rank failed first.
"""

from __future__ import annotations

import gc
import json
import os
import platform
import socket
import sys
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import zsim
from .clock import clock_for
from .comm import Collectives
from . import memory_history
from .device_facts import cuda_memory_stats, device_facts
from .config import RunConfig
from .data import global_batch, micro_batch
from .host import host_facts, keep_freed_memory, pin_to_cores
from .ledger import MemoryLedger
from .model import GPT, gpt_config
from .tensor_parallel import shard_block, shard_embedding, shard_head
from .tracer import Tracer
from .zero import ENGINES
from .zero.engine import EngineOptions, ZeroEngine
from .p2p import Links, PointToPoint
from .pipeline import PipelineSchedule, StagePlace, stage_model, tie_on_last_stage
from zsim.parallel.pipeline import pipeline_rank, split_layers
from zsim.config.struct import dump
from zsim.errors import ConfigError


class InjectedFailure(RuntimeError):
    """Raised by --fail-rank / --fail-at-step (a testing aid for the launcher's teardown)."""


@dataclass(frozen=True)
class RankEnv:
    """Where this process sits, from the torchrun-style environment."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int

    @classmethod
    def from_environ(cls) -> RankEnv:
        world = int(os.environ["WORLD_SIZE"])
        return cls(int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", 0)),
                   int(os.environ.get("LOCAL_WORLD_SIZE", world)))


def trace_path(out_dir: Path, rank: int) -> Path:
    return out_dir / f"rank{rank}.trace.json"


def summary_path(out_dir: Path, rank: int) -> Path:
    return out_dir / f"rank{rank}.summary.json"


def error_path(out_dir: Path, rank: int) -> Path:
    return out_dir / f"rank{rank}.error.json"


def main(cfg: RunConfig, env: RankEnv) -> int:
    """Train and trace on this rank; returns the exit code (1 after an error, which is recorded)."""
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    error_path(out, env.rank).unlink(missing_ok=True)
    try:
        _train(cfg, env, out)
        return 0
    except BaseException as exc:  # noqa: BLE001 - recorded for the launcher, then re-signalled by exit code
        error_path(out, env.rank).write_text(json.dumps({
            "rank": env.rank, "time_ns": time.time_ns(), "error": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc()}))
        traceback.print_exc()
        return 1
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _device(cfg: RunConfig, env: RankEnv) -> tuple[torch.device, str, list[int] | None]:
    """(device, backend, the cores this rank is bound to: None on a GPU or where it cannot be bound)."""
    use_cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    if use_cuda:
        torch.cuda.set_device(env.local_rank)
        return torch.device("cuda", env.local_rank), "nccl", None
    # Share the cores among the ranks on this host, or 8 processes x all cores thrash: each rank bound
    # to its own block of cores, with as many intra-op threads as the block has.
    cores = pin_to_cores(env.local_rank, env.local_world_size)
    torch.set_num_threads(len(cores) if cores else max(1, (os.cpu_count() or 1) // env.local_world_size))
    keep_freed_memory()  # a caching allocator, as on a GPU: no page faults on each step's temporaries
    return torch.device("cpu"), "gloo", cores


def _clock_offset_us(tracer: Tracer, device: torch.device) -> float:
    """Microseconds to add to this rank's timestamps to put them on rank 0's clock: after a
    barrier every rank reads its clock at (nearly) the same instant; the readings are all-gathered
    (error: the barrier's exit skew, microseconds on one host)."""
    dist.barrier()
    now = torch.tensor([tracer.now_us()], dtype=torch.float64, device=device)
    readings = [torch.zeros_like(now) for _ in range(dist.get_world_size())]
    dist.all_gather(readings, now)
    return float(readings[0].item() - now.item())


def _train(cfg: RunConfig, env: RankEnv, out: Path) -> None:
    device, backend, bound = _device(cfg, env)
    dist.init_process_group(backend, rank=env.rank, world_size=env.world_size, timeout=timedelta(minutes=10),
                            device_id=device if device.type == "cuda" else None)
    on_cuda = device.type == "cuda"
    if on_cuda and cfg.cuda_memory_fraction is not None:
        torch.cuda.set_per_process_memory_fraction(cfg.cuda_memory_fraction, device)
    history = [] if on_cuda and cfg.cuda_memory_history else None  # step marks (runtime/memory_history.py)
    if history is not None:
        memory_history.start(torch, device)
    tracer = Tracer(env.rank, clock=lambda now_us: clock_for(device.type, now_us),
                    cuda_memory=_cuda_memory if on_cuda else None, label=_label if cfg.profile else None)
    offset = _clock_offset_us(tracer, device)
    ledger = MemoryLedger(on_change=tracer.memory)
    m = cfg.model
    torch.manual_seed(cfg.seed)
    model = GPT(gpt_config(m, cfg.mp))
    total_params = sum(p.numel() for p in model.parameters())  # Ψ of the whole model (a tied weight once)
    groups = _groups(cfg, env, tracer, on_cuda)
    comm, mp_comm = groups.dp, groups.mp
    if cfg.pp > 1 and model.cfg.tied_head:
        tie_on_last_stage(model)  # before MP splits the head: its copy is split by vocabulary as the embedding
    if mp_comm is not None:
        _split_model(model, mp_comm)
    split = split_layers(m.layers, cfg.pp, cfg.virtual_stages, cfg.pp_layers)
    stage = pipeline_rank(env.rank, cfg.mp, cfg.dp)
    part = stage_model(model, split, stage) if cfg.pp > 1 else model
    engine = ENGINES[cfg.stage](part, options=EngineOptions(
        precision=cfg.precision, checkpointing=cfg.checkpointing, bucket_elements=cfg.bucket_elements,
        allgather_bucket_elements=cfg.allgather_bucket_elements,
        prefetch_layers=cfg.prefetch_layers, lr=cfg.lr, micro_batch=m.micro_batch, mp=cfg.mp,
        chunks=tuple(tuple(ids) for ids in part.chunks) if cfg.pp > 1 else ()),
        comm=comm, tracer=tracer, ledger=ledger, device=device, mp_comm=mp_comm, pp_comm=groups.pp)
    pipeline = None
    if cfg.pp > 1:
        place = StagePlace(stage, cfg.pp, cfg.virtual_stages, prev=groups.pp.ranks[(stage - 1) % cfg.pp],
                           next=groups.pp.ranks[(stage + 1) % cfg.pp], schedule=cfg.pipeline_schedule)
        pipeline = PipelineSchedule(engine, PointToPoint(tracer, groups.links, on_cuda=on_cuda), place, part.chunks,
                                    embed_comm=groups.embed)
    metadata = _metadata(cfg, env, engine, backend, device, offset, total_params, bound)
    if cfg.pp > 1:
        metadata["pipeline"] = {"pp": cfg.pp, "stage": stage, "schedule": cfg.pipeline_schedule,
                                "virtual_stages": cfg.virtual_stages,
                                "layers": [[[r.start, r.stop] for r in chunks] for chunks in split.layers]}
    if on_cuda:  # what setup left allocated (the model states) beside the ledger's count; peaks from here on
        torch.cuda.synchronize()
        metadata["cuda_setup"] = {"allocated": torch.cuda.memory_allocated(),
                                  "reserved": torch.cuda.memory_reserved(),
                                  "ledger": dict(ledger.bytes), "ledger_total": sum(ledger.bytes.values())}
        torch.cuda.reset_peak_memory_stats()
    summary: dict[str, Any] = {"rank": env.rank, "dp_rank": engine.rank, "pp_rank": stage, "losses": [],
                               "memory_history": (memory_history.path(out, env.rank).name if history is not None else
                                                  "not recorded: no caching allocator on CPU"
                                                  if cfg.cuda_memory_history else None),
                               "model_states": engine.model_state_bytes(), "params": total_params,
                               "params_per_mp_rank": engine.params,
                               "params_padded": engine.params_padded, "step_seconds": []}
    profiler = _profiler(cfg, out, env.rank)
    progress = _progress(cfg, env)
    # A full (generation-2) collection scans every object the collector tracks, torch's and the
    # model's included: 130-160 ms on the development machine, inside one step of every stage-3 run
    # with 4 micro-batches (a straggler the other rank waits for). The long-lived objects are frozen
    # once, after setup (gc.freeze: "ignore them in all the future collections"), as Megatron-LM's
    # --manual-gc keeps collections out of its iterations; objects made later are still collected.
    gc.collect()
    gc.freeze()
    try:
        for step in range(cfg.steps):
            tracer.begin_step(step)  # on CUDA: resolves the last step's events, synchronises, re-anchors
            if history is not None:
                memory_history.mark(torch, device, history, step)
            if cfg.fail_rank == env.rank and cfg.fail_at_step == step:
                raise InjectedFailure(f"injected failure at step {step} (--fail-rank {env.rank})")
            tokens = global_batch(seed=cfg.seed, step=step, sequences=cfg.global_batch, seq_len=m.seq_len,
                                  vocab=m.vocab)
            batches = [micro_batch(tokens, micro=i, dp_rank=engine.rank, dp=engine.dp, size=m.micro_batch)
                       for i in range(cfg.accum)]
            start = time.perf_counter()
            if pipeline is None:
                loss = engine.train_step(batches, reduce_every_micro_batch=cfg.stage >= 2)
                summary["step_seconds"].append(time.perf_counter() - start)
            else:
                loss = pipeline.train_step(batches)
                summary["step_seconds"].append(time.perf_counter() - start)
                loss = _last_stage_loss(loss, groups.pp, device)
            summary["losses"].append(loss)
            summary["skipped_steps"] = engine.skipped_steps
            summary.setdefault("grad_norms", []).append(engine.grad_norm)
            summary["peak_bytes"] = dict(ledger.peak, total=ledger.peak_total)
            if on_cuda:  # the caching allocator's own account of this step, peaks reset for the next
                torch.cuda.synchronize()
                summary.setdefault("cuda_memory_stats", []).append(cuda_memory_stats(torch.cuda.memory_stats()))
                torch.cuda.reset_peak_memory_stats()
            if profiler is not None:
                profiler.step()
            tracer.write(trace_path(out, env.rank), metadata)
            summary_path(out, env.rank).write_text(json.dumps(summary, indent=1))
            if progress is not None:
                progress.update(1)
                progress.set_postfix(loss=f"{loss:.4f}")
        if cfg.save_params:
            _save_params(engine, out / f"rank{env.rank}.params.pt")
    finally:
        if progress is not None:
            progress.close()
        if profiler is not None:
            profiler.stop()
        tracer.write(trace_path(out, env.rank), metadata)
        if history is not None:  # kept when a step failed: the history up to the failure
            torch.cuda.synchronize()
            memory_history.mark(torch, device, history, "end")
            memory_history.stop_and_write(torch, device, history, memory_history.path(out, env.rank))


@dataclass(frozen=True)
class Groups:
    """This rank's process groups: DP (what ZeRO partitions across), MP (None without tensor
    parallelism), PP (None without pipeline parallelism: its members in stage order, traced in line),
    the embedding group of a tied head (first and last stage; None elsewhere)."""

    dp: Collectives
    mp: Collectives | None = None
    pp: Collectives | None = None
    embed: Collectives | None = None
    links: Links | None = None  # the pipeline's point-to-point links (runtime/p2p.py)


def _groups(cfg: RunConfig, env: RankEnv, tracer: Tracer, on_cuda: bool) -> Groups:
    """Ranks are laid out Megatron-style, as in zsim/parallel/layout.py and
    zsim.parallel.pipeline.pipeline_rank: rank = pp_rank·(dp·mp) + dp_rank·mp + mp_rank, so an MP group
    is `mp` consecutive ranks (one node), a DP group the ranks of one stage with the same mp_rank, a PP
    group the ranks with the same dp and mp rank. Every rank creates every group, in the same order,
    as torch.distributed.new_group requires."""
    if cfg.mp == 1 and cfg.pp == 1:
        return Groups(Collectives(tracer, None, on_cuda=on_cuda))
    if cfg.mp > 1 and env.local_world_size % cfg.mp:
        raise ConfigError(f"{cfg.mp} does not divide the {env.local_world_size} ranks per node: an MP group "
                          "must stay inside a node", path="mp")
    mp, dp, pp = cfg.mp, cfg.dp, cfg.pp

    def rank(s: int, d: int, t: int) -> int:
        return s * dp * mp + d * mp + t
    me = env.rank
    s_me, d_me, t_me = me // (dp * mp), me // mp % dp, me % mp
    mine: dict[str, dist.ProcessGroup] = {}
    for s in range(pp):
        for t in range(mp):
            group = dist.new_group([rank(s, d, t) for d in range(dp)])
            if (s, t) == (s_me, t_me):
                mine["dp"] = group
        for d in range(dp):
            group = dist.new_group([rank(s, d, t) for t in range(mp)])
            if (s, d) == (s_me, d_me):
                mine["mp"] = group
    tied = pp > 1 and cfg.model.tied_head
    for d in range(dp):
        for t in range(mp):
            if pp > 1:
                group = dist.new_group([rank(s, d, t) for s in range(pp)])
                if (d, t) == (d_me, t_me):
                    mine["pp"] = group
            if tied:
                group = dist.new_group([rank(0, d, t), rank(pp - 1, d, t)])
                if (d, t) == (d_me, t_me) and s_me in (0, pp - 1):
                    mine["embed"] = group

    links = Links.make([[rank(s, d, t) for s in range(pp)] for d in range(dp) for t in range(mp)], me) \
        if pp > 1 else None

    def inline(name: str) -> Collectives | None:
        return Collectives(tracer, mine[name], on_cuda=on_cuda, stream="compute") if name in mine else None
    return Groups(Collectives(tracer, mine["dp"], on_cuda=on_cuda), inline("mp") if mp > 1 else None,
                  inline("pp"), inline("embed"), links)


def _save_params(engine: ZeroEngine, path: Path) -> None:
    """--save-params (a testing aid): this rank's parameters, `<unit>.<parameter>` -> tensor on the CPU
    (the working dtype; a pipeline stage's units only, an MP rank's slices only)."""
    torch.save({f"{u.name}.{name}": t.detach().cpu().clone() for u in engine.units
                for name, t in u.layout.views(u.param).items()}, path)


def _last_stage_loss(loss: float | None, pp: Collectives, device: torch.device) -> float:
    """The step's loss on every stage: the last stage's, broadcast over the pipeline group after the
    step's time is taken (for the summaries only; untraced, outside the step's events)."""
    value = torch.tensor([loss if loss is not None else 0.0], dtype=torch.float64, device=device)
    dist.broadcast(value, src=pp.ranks[-1], group=pp.group)
    return float(value.item())


def _split_model(model: GPT, mp_comm: Collectives) -> None:
    """Replace every unit by this MP rank's part (same initial weights, sliced): the blocks
    Megatron-style, the embedding and the head by vocabulary (runtime/tensor_parallel.py)."""
    mp_rank, mp = mp_comm.ranks.index(dist.get_rank()), mp_comm.size
    count = len(model.units)

    def traced(what: str):
        def all_reduce(t: torch.Tensor, op: dist.ReduceOp = dist.ReduceOp.SUM) -> None:
            mp_comm.all_reduce(t, what, op=op).wait()
        return all_reduce
    model.units[0] = shard_embedding(model.units[0], mp_rank=mp_rank, mp=mp, all_reduce=traced("mp.embed"))
    for i in range(1, count - 1):
        model.units[i] = shard_block(model.units[i], mp_rank=mp_rank, mp=mp,
                                     all_reduce=traced(f"mp.layer.{i - 1}"))
    model.units[count - 1] = shard_head(model.units[count - 1], cfg=model.cfg, mp_rank=mp_rank, mp=mp,
                                        all_reduce=traced("mp.head"))


def _metadata(cfg: RunConfig, env: RankEnv, engine: ZeroEngine, backend: str, device: torch.device, offset: float,
              total_params: int, bound: list[int] | None = None) -> dict[str, Any]:
    return {
        "source": "measured",
        "model": dump(cfg.model),
        "params": total_params,
        "params_per_mp_rank": engine.params,
        "params_padded": engine.params_padded,
        "zero": {"stage": cfg.stage, "activation_checkpointing": cfg.checkpointing,
                 "reduce_bucket_elements": cfg.bucket_elements,
                 "allgather_bucket_elements": cfg.allgather_bucket_elements, "prefetch_layers": cfg.prefetch_layers},
        "precision": cfg.precision,
        "grad_accum": cfg.accum,
        "global_batch": cfg.global_batch,
        "steps": cfg.steps,
        "seed": cfg.seed,
        "run_id": os.environ.get("ZSIM_RUN_ID"),  # one per launch (runtime/launch.py): replay refuses mixed runs
        "world_size": env.world_size, "dp": cfg.dp, "mp": cfg.mp, "pp": cfg.pp,
        "rank": env.rank,
        "backend": backend,
        "device": str(device),
        "host": socket.gethostname(),
        "host_facts": {**host_facts(env.local_world_size, device, bound),
                       "python_gc": "long-lived objects frozen after setup (gc.freeze)"},
        "versions": {"zsim": zsim.__version__, "torch": torch.__version__, "python": platform.python_version()},
        "device_facts": device_facts(device),
        "cuda_memory_fraction": cfg.cuda_memory_fraction,
        "clock_offset_us": offset,
        "model_states": engine.model_state_bytes(),
    }


def _cuda_memory() -> dict[str, int]:
    return {"allocated": torch.cuda.memory_allocated(), "max_allocated": torch.cuda.max_memory_allocated(),
            "reserved": torch.cuda.memory_reserved()}


def _label(name: str):
    """--torch-profiler: a span's name as a profiler range, so that Kineto's kernels fall under zsim's ops."""
    return torch.profiler.record_function(name)


def _profiler(cfg: RunConfig, out: Path, rank: int):
    """--torch-profiler: a PyTorch profiler (Kineto) trace per rank, written next to ours."""
    if not cfg.profile:
        return None
    from torch.profiler import ProfilerActivity, profile, schedule

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])

    def write(prof) -> None:
        prof.export_chrome_trace(str(out / f"rank{rank}.kineto.json"))
    # A schedule, even one that records every step, is what makes torch write a `ProfilerStep#N` span per
    # step (torch.profiler.profile: record_steps only with a schedule); N is the training step, which
    # `zsim calibrate` and Holistic Trace Analysis line kernels up by.
    prof = profile(activities=activities, on_trace_ready=write, record_shapes=True,
                   schedule=schedule(wait=0, warmup=0, active=cfg.steps, repeat=1))
    prof.start()
    return prof


def _progress(cfg: RunConfig, env: RankEnv):
    """A progress bar over steps on rank 0's stderr when it is a terminal (or ZSIM_PROGRESS=1)."""
    if env.rank != 0 or not (sys.stderr.isatty() or os.environ.get("ZSIM_PROGRESS") == "1"):
        return None
    from tqdm import tqdm
    return tqdm(total=cfg.steps, desc=f"stage {cfg.stage} x{env.world_size}", unit="step", file=sys.stderr)
