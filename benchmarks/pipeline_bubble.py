"""Measure the pipeline bubble of a traced run: the share of each step a stage does not compute,
against the closed form (p - 1)/(m + p - 1) for GPipe and 1F1B (Narayanan et al. 2021 §2.2.1;
zsim.parallel.pipeline.bubble_fraction).

Runs `zsim trace` with --pp on this machine (CPU, gloo, one rank per stage), then reads the merged
trace (every rank on rank 0's clock): per step, the window from the first forward on any stage to the
last backward on any stage; a stage's idle share is 1 - (its fwd + bwd span time) / window. Step 0
(warm-up: allocator, first gloo connections) is left out.

    .venv/bin/python benchmarks/pipeline_bubble.py [--schedule 1f1b] [--micro-batches 4] [--steps 4]

The closed form assumes equal stages and free transfers; on a shared CPU the ranks time-slice, so
read the median over steps and stages, not one step.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from zsim.config.model_section import ModelSection
from zsim.parallel.pipeline import bubble_fraction
from zsim.runtime.config import RunConfig
from zsim.runtime.launch import launch


def idle_shares(trace: dict, stages: list[int], steps: range) -> list[float]:
    """Per step and stage (rank), the share of the step's compute window that rank is not in a
    fwd/ or bwd/ span."""
    shares = []
    for step in steps:
        spans = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("args", {}).get("step") == step
                 and e["name"].split("/")[0] in ("fwd", "bwd")]
        start, end = min(e["ts"] for e in spans), max(e["ts"] + e["dur"] for e in spans)
        shares += [1 - sum(e["dur"] for e in spans if e["pid"] == rank) / (end - start) for rank in stages]
    return shares


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedule", choices=("1f1b", "gpipe"), default="1f1b")
    parser.add_argument("--micro-batches", type=int, default=4)
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    # 4 layers, h 256, 4 heads, s 128, V 512, b 4: big enough that compute, not the host, sets the pace
    model = ModelSection(layers=4, hidden=256, heads=4, seq_len=128, vocab=512, micro_batch=4,
                         grad_accum=args.micro_batches)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = RunConfig(model=model, stage=0, precision="fp32", world_size=args.stages, pp=args.stages,
                        pipeline_schedule=args.schedule, steps=args.steps, device="cpu",
                        out_dir=str(Path(tmp) / "trace"))
        result = launch(cfg)
        if result.failure is not None:
            raise SystemExit(f"pipeline_bubble: {result.failure}")
        trace = json.loads((Path(tmp) / "trace" / "trace.json").read_text())
    shares = idle_shares(trace, list(range(args.stages)), range(1, args.steps))
    closed = bubble_fraction(args.schedule, args.stages, args.micro_batches)
    print(f"{args.schedule}, p {args.stages}, m {args.micro_batches}: idle share per step and stage "
          f"{', '.join(f'{s:.3f}' for s in shares)}")
    print(f"median {statistics.median(shares):.3f}, closed form (p-1)/(m+p-1) = {closed:.3f}")


if __name__ == "__main__":
    main()
