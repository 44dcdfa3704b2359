"""Measure this machine as a host profile (hwprofiles/hosts/<name>.yaml, zsim.config.host).

    python -m zsim.runtime.hostprobe --name dev-2core --ranks 2 --threads 1 -o hwprofiles/hosts/dev-2core.yaml

Launches `--ranks` real gloo processes with `--threads` intra-op threads each, all measuring at the
same time (so they share the cores as a traced run does):
  * matmul rate per dtype: torch.mm on the runtime's GEMM shapes, median of repeats (GFLOP/s = 2MNK/t);
  * streaming bandwidth: a 64 MiB copy (bytes read + written over the time);
  * per-op overhead: the runtime's own transformer layer (runtime/model.py's Block) at a width where its
    FLOPs and bytes are negligible, forward and backward with autograd, median time over the kernel
    launches zsim's plan counts for that layer (zsim.compute.kernels): what the host model's
    `op_overhead_us` prices per launch. (Until 2026-11-27 a 1-element add without autograd: 3.3 µs here,
    a fifth of what a layer's launch costs, so every calibration's overhead sat "far from the probe".)
  * each collective (all_reduce, reduce_scatter, all_gather, broadcast) from 1 KiB to 16 MiB, median
    of repeats after a warm-up, and a least-squares fit of t = latency + S / bandwidth weighted by 1/t
    (relative error), whose median and worst relative residuals go into the file.
Rank 0 writes the profile. Timings on a machine shared with other work are noisy: the residuals say
how much.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

SIZES = [2**k for k in range(10, 25, 2)]  # 1 KiB .. 16 MiB payloads
SHAPES = [(256, 1024, 1024), (512, 512, 2048), (1024, 1024, 1024)]  # (M, N, K)
OPS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast")


def _median_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _compute(torch) -> dict:
    rates = {}
    for dtype, name, repeats in ((torch.float32, "fp32", 5), (torch.bfloat16, "bf16", 1), (torch.float16, "fp16", 1)):
        best = 0.0
        for m, n, k in SHAPES if name == "fp32" else SHAPES[:1]:
            a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
            torch.mm(a, b)
            best = max(best, 2 * m * n * k / _median_seconds(lambda: torch.mm(a, b), repeats) / 1e9)
        rates[name] = round(best, 3)
    src = torch.empty(16 * 2**20, dtype=torch.float32)
    dst = torch.empty_like(src)
    dst.copy_(src)
    copy = _median_seconds(lambda: dst.copy_(src), 5)
    return {"matmul_GFLOPS": rates, "memory_GBps": round(2 * src.nbytes / copy / 1e9, 3),
            "op_overhead_us": round(layer_launch_seconds(torch) * 1e6, 3)}


# The layer the overhead is timed on: a GPT block 16 wide (2 heads, 4 tokens, micro-batch 1), whose matmuls
# are 16×48 and 16×64: its time is the framework's per op, not arithmetic.
TINY = {"hidden": 16, "heads": 2, "seq_len": 4, "micro_batch": 1, "vocab": 64}


def layer_launch_seconds(torch, repeats: int = 300) -> float:
    """Seconds per kernel launch of one transformer layer's forward and backward: the runtime's Block (no
    dropout, as the runtime runs it) at the TINY shape in fp32, autograd on, median over `repeats`, divided
    by the launches of zsim's kernel lists for that layer (block forward + backward, dropout off)."""
    from .model import Block, GPTConfig

    t = TINY
    block = Block(GPTConfig(layers=1, hidden=t["hidden"], heads=t["heads"], seq_len=t["seq_len"], vocab=t["vocab"]))
    x = torch.randn(t["micro_batch"], t["seq_len"], t["hidden"], requires_grad=True)

    def step():
        block(x).sum().backward()

    for _ in range(20):  # warm-up: autograd's first graphs, the allocator's first blocks
        step()
    return _median_seconds(step, repeats) / tiny_layer_launches()


def tiny_layer_launches() -> int:
    """Kernel launches of zsim's lists for one TINY layer's forward and backward (fp32, dropout off, as the
    runtime's model runs: zsim.calibrate.rebuild.runtime_model_options)."""
    from zsim.compute.kernel_shape import Shape
    from zsim.compute.kernels import module_kernels

    t = TINY
    shape = Shape(s=t["seq_len"], b=t["micro_batch"], h=t["hidden"], a=t["heads"], t=1, v=t["vocab"],
                  ffn=4 * t["hidden"], kv_heads=t["heads"], gated=False, linear_bias=True, qkv_bias=True, e=4,
                  dropout=False)
    return module_kernels("block", "fwd", shape).launches + module_kernels("block", "bwd", shape).launches


def _collectives(torch, dist, world: int) -> dict:
    out = {}
    for op in OPS:
        points = []
        for nbytes in SIZES:
            n = nbytes // 4
            full = torch.zeros(n - n % world, dtype=torch.float32)
            part = torch.zeros(full.numel() // world, dtype=torch.float32)

            def run():
                if op == "all_reduce":
                    dist.all_reduce(full)
                elif op == "reduce_scatter":
                    dist.reduce_scatter_single(part, full)
                elif op == "all_gather":
                    dist.all_gather_single(full, part)
                else:
                    dist.broadcast(full, src=0)
            run()
            dist.barrier()
            times = []
            for _ in range(7):
                dist.barrier()
                start = time.perf_counter()
                run()
                times.append(time.perf_counter() - start)
            points.append((full.numel() * 4, statistics.median(times)))
        out[op] = points
    return out


def _lstsq(s: np.ndarray, t: np.ndarray) -> tuple[float, float]:
    """(a, b) of t = a + S·b by least squares weighted by 1/t (relative error), a ≥ 0, b > 0."""
    w = 1.0 / t
    (a, b), *_ = np.linalg.lstsq(np.stack([w, s * w], axis=1), np.ones_like(t), rcond=None)
    return max(float(a), 0.0), max(float(b), 1e-15)


def fit_latency_bandwidth(points: list[tuple[int, float]]) -> dict:
    """Least squares of t = a + S·b weighted by 1/t; returns latency_us, GBps and the residuals: in
    sample, and held out (fit on every other size, predict the rest, both ways)."""
    s = np.array([p[0] for p in points], dtype=float)
    t = np.array([p[1] for p in points], dtype=float)
    a, b = _lstsq(s, t)
    rel = np.abs((a + b * s) / t - 1.0)
    held = []
    for part in (0, 1):
        train = np.arange(len(s)) % 2 == part
        ha, hb = _lstsq(s[train], t[train])
        held += list(np.abs((ha + hb * s[~train]) / t[~train] - 1.0))
    return {"latency_us": round(a * 1e6, 3), "GBps": round(1.0 / b / 1e9, 4),
            "fit": {"median_rel_error": round(float(np.median(rel)), 4), "worst_rel_error": round(float(rel.max()), 4),
                    "held_out_median_rel_error": round(float(np.median(held)), 4),
                    "held_out_worst_rel_error": round(float(max(held)), 4), "points": len(points)}}


def rank_main(args: argparse.Namespace) -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    import torch
    import torch.distributed as dist

    from .host import keep_freed_memory, pin_to_cores

    pin_to_cores(rank, world)  # as the runtime's CPU ranks run (runtime/worker.py)
    torch.set_num_threads(args.threads)
    keep_freed_memory()
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        dist.barrier()
        compute = _compute(torch)
        collectives = _collectives(torch, dist, world)
        results = [None] * world
        dist.all_gather_object(results, compute)
        if rank == 0:
            Path(args.out).with_suffix(".json").write_text(json.dumps({"compute": results, "collectives": collectives}))
    finally:
        dist.destroy_process_group()


def write_profile(args: argparse.Namespace, raw: dict) -> str:
    import torch

    from .host import cpu_model, memory_bytes, usable_cores

    ranks = raw["compute"]
    compute = {  # the median rank: ranks measured at the same time, sharing the cores
        "matmul_GFLOPS": {d: round(statistics.median(r["matmul_GFLOPS"][d] for r in ranks), 3)
                          for d in ranks[0]["matmul_GFLOPS"]},
        "memory_GBps": round(statistics.median(r["memory_GBps"] for r in ranks), 3),
        "op_overhead_us": round(statistics.median(r["op_overhead_us"] for r in ranks), 3),
    }
    profile = {
        "name": args.name, "kind": "host", "cpu": cpu_model(), "cores": usable_cores(),
        "memory_GiB": round((memory_bytes() or 0) / 2**30, 1), "ranks": args.ranks, "threads_per_rank": args.threads,
        "backend": "gloo", "transport": "tcp-loopback", "torch": str(torch.__version__), "compute": compute,
        "collectives": {op: {args.ranks: fit_latency_bandwidth(points)} for op, points in raw["collectives"].items()},
        "measured": {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                     "command": " ".join(["python -m zsim.runtime.hostprobe", *sys.argv[1:]])},
    }
    import yaml

    header = (f"# Host profile of this machine, measured by `python -m zsim.runtime.hostprobe` ({profile['measured']['date']}).\n"
              "# Every number is a measurement on this host (docs/host-profiles.md): matmul and copy rates of one\n"
              "# rank while all ranks measure at once, and gloo collectives fitted as latency + bytes / bandwidth\n"
              "# (fit: relative residuals over 1 KiB - 16 MiB). Re-measure on another machine.\n")
    return header + yaml.safe_dump(profile, sort_keys=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zsim.runtime.hostprobe", description=__doc__.split("\n\n")[0])
    parser.add_argument("--name", required=True, help="profile name (the file's stem)")
    parser.add_argument("--ranks", type=int, default=2, help="ranks sharing the host (default 2)")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads per rank (default 1)")
    parser.add_argument("-o", "--out", required=True, help="the profile YAML to write")
    parser.add_argument("--rank-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rank_worker:
        rank_main(args)
        return 0
    if args.ranks < 1 or args.threads < 1:
        print("error: --ranks and --threads must be >= 1", file=sys.stderr)
        return 2
    from .launch import free_port

    Path(args.out).parent.mkdir(parents=True, exist_ok=True)

    env = dict(os.environ, WORLD_SIZE=str(args.ranks), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               OMP_NUM_THREADS=str(args.threads))
    procs = [subprocess.Popen([sys.executable, "-m", "zsim.runtime.hostprobe", *sys.argv[1:], "--rank-worker"]
                              if argv is None else [sys.executable, "-m", "zsim.runtime.hostprobe", *argv, "--rank-worker"],
                              env=dict(env, RANK=str(r))) for r in range(args.ranks)]
    try:
        codes = [p.wait(timeout=600) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    if any(codes):
        print(f"error: a probe rank failed (exit codes {codes})", file=sys.stderr)
        return 1
    raw_path = Path(args.out).with_suffix(".json")
    raw = json.loads(raw_path.read_text())
    Path(args.out).write_text(write_profile(args, raw))
    raw_path.unlink()
    print(f"host profile written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
