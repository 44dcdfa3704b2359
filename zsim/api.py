"""zsim's Python API: load a scenario, override keys, simulate, read the facts; run sweeps.

    >>> from zsim import api
    >>> scenario = api.load("scenarios/paper/7.5B-64gpu-stage3.yaml", set={"model.micro_batch": 2})
    >>> result = api.simulate(scenario)
    >>> facts = api.facts(result)                 # the dict of result.json (docs/result-json.md)
    >>> table = api.sweep("scenarios/whatif/stage-vs-dp-7.5B.yaml", workers=2)
    >>> table.where(**{"zero.stage": 3})["step_s"]   # a column as a list; table.to_pandas() with pandas

docs/api.md walks through it with real output. Everything here raises `zsim.errors.ConfigError`
(a `ZsimError`) for bad input, naming the file, the dotted key and the value; nothing prints.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from zsim.scenario.scenario import Scenario, build_scenario
from zsim.engine.result import Result
from zsim.errors import ConfigError, ZsimError
from zsim.sweep.table import SweepTable

__all__ = ["ConfigError", "Result", "Scenario", "SweepTable", "ZsimError", "facts", "load", "run", "simulate",
           "sweep", "sweep_run"]


def load(source: str | Path | dict[str, Any], set: dict[str, Any] | None = None) -> Scenario:  # noqa: A002
    """A validated Scenario from a scenario file, a shipped scenario's name (`"1T-1024gpu"`) or a mapping
    shaped like one, with `set` applied: dotted keys to values, as `zsim run --set`
    (`{"zero.stage": 2, "hardware.nodes": 8}`).

    Raises:
        ConfigError: a missing file, an unknown key, a bad value or an impossible layout; one that `set`
        wrote names that entry (`set['zero.stage'] (on FILE): ...`).
    """
    from zsim.config.overrides import set_key
    from zsim.scenario.scenario import blame_override, find_scenario

    if isinstance(source, dict):
        data, path, where = copy.deepcopy(source), None, "<api>"
    else:  # a file, or a shipped scenario's name as `zsim run` takes it
        from zsim.config.yamlfile import read_yaml_mapping

        path = find_scenario(source)
        data, where = read_yaml_mapping(path), str(path)
    for key, value in (set or {}).items():
        set_key(data, key, value, f"set.{key}")
    try:
        if path is None:
            return build_scenario(data, source=where, default_name=str(data.get("name") or "scenario"))
        return build_scenario(data, source=where, default_name=path.stem, base_dir=path.parent)
    except ConfigError as exc:  # a bad value `set` wrote is the caller's, not the file's
        raise blame_override(exc, [(key, f"set[{key!r}] (on {where})") for key in (set or {})]) from None


def simulate(scenario: Scenario, mode: str | None = None) -> Result:
    """Simulate `scenario.run.steps` steps. `mode` ('class' or 'per_rank') overrides fabric.mode.
    A point that runs out of memory still returns its Result (`result.fits` is False)."""
    from zsim.engine.simulation import simulate as _simulate

    return _simulate(scenario, mode)


def facts(result: Result) -> dict[str, Any]:
    """The facts of `result`: the JSON-ready dict `zsim run` writes as result.json
    (keys in docs/result-json.md; seconds, bytes, TFLOPS)."""
    from zsim.report.facts import facts as _facts

    return _facts(result)


def run(source: str | Path | dict[str, Any], set: dict[str, Any] | None = None) -> dict[str, Any]:  # noqa: A002
    """load → simulate → facts in one call."""
    return facts(simulate(load(source, set)))


def sweep_run(source: str | Path | dict[str, Any], *, out: str | Path | None = None, workers: int | None = None,
              engine: str = "local", address: str | None = None, per_point: bool = False):
    """Run a sweep (a sweep file, a shipped sweep's name such as "whatif/ib-bandwidth-1T", or a mapping
    shaped like one whose `base` is relative to the current folder) and return the whole zsim.sweep.runner.SweepRun: `.table`, `.best`, `.knees`, `.ran`,
    `.cached`. With `out`, results are cached there and the files written (as `zsim sweep -o out`);
    without it nothing is written.

    Raises:
        ConfigError: a bad sweep file, key or value (naming the point), before anything runs.
    """
    from zsim.sweep.points import load_plan, plan_sweep
    from zsim.sweep.runner import run_sweep
    from zsim.sweep.spec import sweep_from_mapping

    if isinstance(source, dict):
        plan = plan_sweep(sweep_from_mapping(source), "<api>", Path.cwd())
    else:
        plan = load_plan(source)
    return run_sweep(plan, Path(out) if out is not None else None, engine=engine, workers=workers,
                     address=address, per_point=per_point)


def sweep(source: str | Path | dict[str, Any], *, out: str | Path | None = None, workers: int | None = None,
          engine: str = "local", address: str | None = None) -> SweepTable:
    """Run a sweep and return its table (one row per point: the swept keys, then the result columns
    of docs/sweep.md). See `sweep_run` for the arguments and the knees and fastest point."""
    return sweep_run(source, out=out, workers=workers, engine=engine, address=address).table
