"""Benchmark: wall time of an 8-rank, 5-step `zsim trace` of a small model on this machine.

Target (issue 5): under 60 s on the 2-core development machine (CPU, gloo). Measures the whole
launch, as a user waits for it: starting the ranks, training, writing and merging the traces.

    .venv/bin/python benchmarks/bench_trace.py [--stage 3] [--ranks 8] [--steps 5] [--precision fp32]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from zsim.runtime.config import RunConfig
from zsim.runtime.launch import launch
from zsim.config.model_section import ModelSection

# A small GPT: 4 layers, hidden 256, 4 heads, 128 tokens, vocab 1024: Ψ = 3,716,608 parameters.
SMALL = ModelSection(layers=4, hidden=256, heads=4, seq_len=128, vocab=1024, micro_batch=2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stage", type=int, default=3)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--checkpointing", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = RunConfig(model=SMALL, stage=args.stage, precision=args.precision, world_size=args.ranks,
                        steps=args.steps, checkpointing=args.checkpointing, out_dir=str(Path(tmp) / "trace"))
        start = time.perf_counter()
        result = launch(cfg)
        wall = time.perf_counter() - start
        if result.failure is not None:
            raise SystemExit(f"bench_trace: {result.failure}")
        s = result.summary
        steps = s["step_seconds"]
        size = sum(p.stat().st_size for p in Path(cfg.out_dir).glob("rank*.trace.json"))
    print(f"bench_trace: {args.ranks} ranks, stage {args.stage}, {args.precision}, {args.steps} steps, "
          f"Ψ = {s['metadata']['params']:,} parameters")
    print(f"  wall time          {wall:6.1f} s   (target < 60 s)")
    print(f"  training steps     {sum(steps):6.1f} s   (slowest rank per step: "
          f"{', '.join(f'{x:.2f}' for x in steps)})")
    print(f"  start-up + merge   {wall - sum(steps):6.1f} s")
    print(f"  trace files        {size / 1e6:6.1f} MB")


if __name__ == "__main__":
    main()
