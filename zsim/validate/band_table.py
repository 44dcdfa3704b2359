"""Regenerating the error band's table (zsim.report.band): simulate every held-out point of the validation
suites and store the residuals in zsim/report/band_table.json. It lives here, not beside the lookup in
zsim.report.band, because it runs the suites, a layer above report (docs/architecture.md)."""

from __future__ import annotations

import json
import sys
from collections.abc import Collection
from pathlib import Path
from typing import Any

from zsim.report.band import TABLE, build_table, regime_of


def collect(progress: bool = False, modern: bool = True) -> list[dict[str, Any]]:
    """Simulate every held-out point of the suites (module docstring) and return its residual; without
    `modern`, all but the modern suite's (its pipelines take minutes: modern_residuals)."""
    from zsim.validate import megatron, paper, scale

    out: list[dict[str, Any]] = []
    points, res = scale.residuals(progress=progress)
    for p, r in zip(points, res):
        if p.half == "held_out":
            out.append(_row("scale", p.id, r.scenario, r.error))
    if modern:
        out += modern_residuals()
    declared = {Path(p.scenario_file).stem for p in points if p.scenario_file}
    chart = {**paper.CHART, **paper.CHART_MEGATRON}
    for name, published in chart.items():
        if name not in declared:
            out.append(_tflops_row("paper", name, paper.scenarios_dir() / f"{name}.yaml", published))
    for name, efficiency in [("1.2B-1gpu", 1.0)] + [(w[0], w[2]) for w in megatron.WEAK]:
        out.append(_tflops_row("megatron", name, megatron.scenarios_dir() / f"{name}.yaml",
                               efficiency * megatron.BASELINE_TFLOPS))
    return out


def modern_residuals(only: Collection[str] | None = None) -> list[dict[str, Any]]:
    """The residuals of `zsim validate modern`'s held-out points (those in `only`, by id, when given),
    in the suite file's order. Its calibration half is not simulated: it gives no band."""
    from zsim.validate import modern, scale

    suite = modern.default_suite()
    rows = []
    for p in scale.load_suite(suite)[0]:
        if p.half == "held_out" and (only is None or p.id in only):
            r = scale.residual(p, suite)
            rows.append(_row("modern", p.id, r.scenario, r.error))
    return rows


def _row(suite: str, point: str, scenario, error: float | None) -> dict[str, Any]:
    regime = regime_of(scenario).key if scenario is not None else "unknown"
    return {"suite": suite, "point": point, "regime": regime, "error": None if error is None else round(error, 4)}


def _tflops_row(suite: str, name: str, path: Path, published_tflops: float) -> dict[str, Any]:
    """A per-GPU TFLOPS point as a step-time residual: simulated/published step = published/simulated
    TFLOPS (the same FLOP count on both sides, zsim.validate.paper.paper_tflops)."""
    from zsim.validate.paper import paper_tflops
    from zsim.validate.scenario_set import simulate_file

    result, _ = simulate_file(path)
    if result is None or not result.fits:
        return _row(suite, name, None if result is None else result.scenario, None)
    return _row(suite, name, result.scenario, published_tflops / paper_tflops(result)[0] - 1)


def main(argv: list[str] | None = None) -> int:
    """`python -m zsim.validate.band_table [--write]`: print the table the suites give now; --write stores it."""
    args = sys.argv[1:] if argv is None else argv
    table = build_table(collect(progress=sys.stderr.isatty()))
    text = json.dumps(table, indent=1, ensure_ascii=False) + "\n"
    if "--write" in args:
        TABLE.write_text(text)
        print(f"wrote {TABLE}", file=sys.stderr)
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
