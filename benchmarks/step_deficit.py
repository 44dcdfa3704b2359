"""What zsim misses on a published run, as time per step rather than a percentage: for each point of `zsim validate
modern` (or another suite) whose id matches a pattern, the published step, zsim's, their difference (ms a step), and
zsim's own time of the data- and context-parallel collectives a step (which run beside compute) and of what is
exposed, and the difference over the micro-batches a GPU runs a step (ms a micro-batch). A miss that is a fixed cost a
step stays the same in ms as the work per GPU changes; one that is a share of the collectives' time grows with it; one
that is a cost per micro-batch stays the same in the ms/micro-batch column (docs/validation.md, "What the 8B runs
across nodes miss"; "Qwen3 MoE on five GPU types": `benchmarks/step_deficit.py 'bridge2604-qwen3-30b-*'`). The last
column is a what-if, not a model: the error zsim's step would have if none of those side collectives were hidden
(zsim's step plus their time beyond what is already exposed, all of the exposed time taken as theirs), the reading of
docs/validation.md's "Hopper's 8B runs across nodes, as if the data-parallel collectives ran in line".

Run: `.venv/bin/python benchmarks/step_deficit.py [PATTERN ...] [--suite modern|scale]` (default: '*llama8b*',
'*llama3-8b*'; a few seconds in all).
"""

from __future__ import annotations

import argparse
import fnmatch

from zsim.engine.simulation import simulate
from zsim.validate import modern, scale

SIDE_GROUPS = ("dp", "cp", "dp_cp", "edp")  # the collectives that run beside compute on their own streams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("patterns", nargs="*", default=["*llama8b*", "*llama3-8b*"])
    parser.add_argument("--suite", choices=("modern", "scale"), default="modern")
    args = parser.parse_args()
    suite = modern.default_suite() if args.suite == "modern" else scale.default_suite()
    points, _ = scale.load_suite(suite)
    print(f"{'point':46s} {'half':5s} {'published':>9s} {'zsim':>8s} {'missing ms':>10s} {'side comm ms':>12s} "
          f"{'exposed ms':>10s} {'missing/side':>12s} {'ms/micro-batch':>14s} {'in line':>8s}")
    for p in points:
        if not any(fnmatch.fnmatch(p.id, pat) for pat in args.patterns):
            continue
        s = scale._scenario(p, suite)
        result = simulate(s)
        steps = len(result.step_seconds)
        step = result.total_seconds / steps
        published = scale.published_step(p, s)
        side = sum(st.seconds for (group, _), st in result.comm.items() if group in SIDE_GROUPS) / steps
        exposed = step - result.compute_seconds / steps
        missing = published - step
        in_line = step + max(side - exposed, 0.0)  # none of the side collectives hidden
        print(f"{p.id:46s} {p.half[:4]:5s} {published:9.4f} {step:8.4f} {1e3 * missing:10.1f} {1e3 * side:12.1f} "
              f"{1e3 * exposed:10.1f} {missing / side if side else float('nan'):12.2f} "
              f"{1e3 * missing / s.grad_accum:14.1f} {in_line / published - 1:+8.1%}")


if __name__ == "__main__":
    main()
