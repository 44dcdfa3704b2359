"""Held-out fits of the inter-node terms (zsim.validate.network): one line per split.

    .venv/bin/python benchmarks/net_holdout.py [DATA]   (default ../shared/data/nccl-tests)
"""

import sys
import time
from pathlib import Path

from zsim.validate.network import SPLITS, run_split

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    data = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT.parent / "shared" / "data" / "nccl-tests"
    print(f"| split | kind | fitted terms | held-out rows >= 1 MiB | median abs err | worst | trend (measured / simulated slope) |")
    print("|---|---|---|---|---|---|---|")
    for split in SPLITS:
        t = time.perf_counter()
        r = run_split(split, data)
        terms = ", ".join(f"{k} {v:.3g}" for k, v in r.values.items())
        trend = "n/a" if r.trend_measured != r.trend_measured else (
            f"{r.trend_measured:+.2f} / {r.trend_simulated:+.2f} {'right' if r.trend_right else 'WRONG'}")
        print(f"| {split.name} | {split.kind} | {terms} | {r.rows} | {r.median:.1%} | {r.worst:.1%} | {trend} |"
              f"  <!-- {time.perf_counter() - t:.1f} s -->")


if __name__ == "__main__":
    main()
