"""Published against zsim on pairs of MLPerf runs that differ in one thing (docs/validation.md, "NVFP4 and Blackwell
Ultra"): NVFP4 against FP8 on the same racks or GPUs, GB300 against GB200, B300 against B200, and one weak-scaling pair
(UF's 405B on 32 and 56 nodes). Each ratio is the
slower run's step over the faster one's per unit of work (a micro-batch of a replica where the batches differ), from
the published steps of `zsim validate modern`'s points and zsim's simulated ones. Nothing is fitted here.

Run: `.venv/bin/python benchmarks/blackwell_pairs.py` (about five minutes: it simulates the points it needs through
`zsim validate modern --point`).
"""

from __future__ import annotations

import json
import subprocess
import sys

# (what the pair compares, slower point, its micro-batches a replica per step, faster point, its micro-batches)
PAIRS = (
    ("NVFP4 vs FP8, Tyche's 512 GB200 (405B; v5.0 FP8, v5.1 NVFP4)", "mlperf50-llama405b-tyche-512", 112,
     "mlperf51-llama405b-tyche-512", 144),
    ("NVFP4 vs FP8, 8 B200 (8B; UF FP8, Oracle NVFP4 + FP8 attention)", "mlperf51-llama8b-b200-8", 1,
     "mlperf51-llama8b-oracle-8-nvfp4", 1),
    ("NVFP4 vs FP8, 8 B300 (8B; Dell FP8, Nebius NVFP4 + FP8 attention)", "mlperf51-llama8b-dell-b300-8", 1,
     "mlperf51-llama8b-nebius-b300-8-nvfp4", 1),
    ("GB300 vs GB200, 405B NVFP4 on 512", "mlperf51-llama405b-tyche-512", 1, "mlperf51-llama405b-theia-512", 1),
    ("GB300 vs GB200, 8B FP8 on one rack", "mlperf51-llama8b-gb200-72", 1, "mlperf51-llama8b-gb300-72", 1),
    ("B300 vs B200, 8B NVFP4 + FP8 attention on 8", "mlperf51-llama8b-oracle-8-nvfp4", 1,
     "mlperf51-llama8b-nebius-b300-8-nvfp4", 1),
    ("B300 vs B200, the same: one submitter, one config (Lenovo SR680aV3/V4)", "mlperf51-llama8b-lenovo-sr680av3-8-nvfp4",
     1, "mlperf51-llama8b-lenovo-b300-8-nvfp4", 1),
    ("56 vs 32 DGX B200 nodes, 405B FP8 weak scaling (UF, DP 7 vs 4)", "mlperf51-llama405b-uf-448", 144,
     "mlperf51-llama405b-uf-256", 144),
)


def steps(points: list[str]) -> dict[str, tuple[float, float]]:
    """point -> (published s, simulated s), from one `zsim validate modern --point ... --json -` run."""
    cmd = [sys.executable, "-m", "zsim", "validate", "modern", "--json", "-"]
    for p in points:
        cmd += ["--point", p]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode not in (0, 1):  # 1: the subset's own checks failed, which says nothing about the steps
        sys.exit(run.stderr)
    return {r["name"]: (r["published"], r["simulated"]) for r in json.loads(run.stdout)["points"]}


def main() -> None:
    got = steps(sorted({p for _, a, _, b, _ in PAIRS for p in (a, b)}))
    print(f"{'pair':68} {'published':>9} {'zsim':>6}")
    for what, slow, n_slow, fast, n_fast in PAIRS:
        (ps, ss), (pf, sf) = got[slow], got[fast]
        print(f"{what:68} {(ps / n_slow) / (pf / n_fast):8.2f}x {(ss / n_slow) / (sf / n_fast):5.2f}x")


if __name__ == "__main__":
    main()
