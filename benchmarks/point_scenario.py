"""Write a suite point's scenario as a scenario file, so that `zsim run` prints its whole summary (where its time and
memory go) beside the one figure `zsim validate` reports: the breakdowns docs/validation.md quotes per point
("DeepSeek-V3 on 256 Blackwell GPUs", "Llama 3.1 405B and DeepSeek-V3 26.06") come from these files.

Run: `.venv/bin/python benchmarks/point_scenario.py POINT_ID OUT.yaml [--suite modern|scale]`, then
`.venv/bin/zsim run OUT.yaml`. A `from_hf` path is written absolute (the suite's are relative to scenarios/).
Exit 2, naming the id, when the suite has no such point.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import yaml

from zsim.validate import modern, scale


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("point")
    parser.add_argument("out", type=Path)
    parser.add_argument("--suite", choices=("modern", "scale"), default="modern")
    args = parser.parse_args()
    suite = modern.default_suite() if args.suite == "modern" else scale.default_suite()
    points, _ = scale.load_suite(suite)
    point = next((p for p in points if p.id == args.point), None)
    if point is None:
        print(f"error: {suite.name} has no point {args.point!r}", file=sys.stderr)
        return 2
    scale._scenario(point, suite)  # refuses a point whose scenario does not load, as the suite would
    data = copy.deepcopy(point.scenario)
    if "from_hf" in data.get("model", {}):
        data["model"]["from_hf"] = str(_scenarios_root() / data["model"]["from_hf"])
    args.out.write_text(yaml.safe_dump({"name": point.id, **data}, sort_keys=False))
    print(f"wrote {args.out}: .venv/bin/zsim run {args.out}")
    return 0


def _scenarios_root() -> Path:
    from zsim.config.profiles import builtin_folder

    return builtin_folder("zsim.scenarios").resolve()


if __name__ == "__main__":
    sys.exit(main())
