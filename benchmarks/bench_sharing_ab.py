"""The fabric's sharing module against an earlier revision of it, in alternating processes on one machine:
CPU seconds, simpy events and the step of per-rank mode on the flagship's shape at `--nodes` DGX-2 nodes
(16 GPUs each). Equal events and steps mean equal results; the CPU ratio is the speed-up (docs/fabric.md,
"Speed": 16,384 GPUs 31.2-31.5 s with a781f1f~1's module, 26.1-26.6 s with a781f1f's).

Run: .venv/bin/python benchmarks/bench_sharing_ab.py [--rev a781f1f~1] [--nodes 1024] [--rounds 2]
(1024 nodes: ~1 min of CPU a round.)
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODULE = "zsim/fabric/sharing.py"
# One process: load the sharing module from argv[1] (or the checkout's with "-"), simulate, print a row.
CHILD = """
import importlib.util, sys, time
if sys.argv[1] != "-":
    spec = importlib.util.spec_from_file_location("zsim.fabric.sharing", sys.argv[1])
    module = importlib.util.module_from_spec(spec)
    sys.modules["zsim.fabric.sharing"] = module
    spec.loader.exec_module(module)
from zsim.engine.simulation import simulate
from zsim.scenario.scenario import load_scenario
n = int(sys.argv[2])
s = load_scenario("scenarios/1T-1024gpu.yaml", [f"hardware.nodes={n}", f"parallel.dp={n}", f"model.global_batch={n}"])
start = time.process_time()
r = simulate(s, mode="per_rank", trace=False)
print(f"{time.process_time() - start:.2f} {r.sim_events} {r.step_seconds[0]!r}")
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rev", default="a781f1f~1", help="the git revision of the module to compare with")
    ap.add_argument("--nodes", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    old = subprocess.run(["git", "show", f"{args.rev}:{MODULE}"], cwd=ROOT, capture_output=True, text=True, check=True)
    with tempfile.NamedTemporaryFile("w", suffix=".py") as f:
        f.write(old.stdout)
        f.flush()
        print(f"{'module':<20}{'CPU s':>8}{'events':>12}  step s")
        for _ in range(args.rounds):
            for name, path in ((args.rev, f.name), ("checkout", "-")):
                out = subprocess.run([sys.executable, "-c", CHILD, path, str(args.nodes)], cwd=ROOT, check=True,
                                     capture_output=True, text=True).stdout.split()
                print(f"{name:<20}{out[0]:>8}{int(out[1]):>12,}  {out[2]}")


if __name__ == "__main__":
    main()
