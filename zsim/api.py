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
from zsim.config.yamlfile import MAX_DEPTH, MAX_NODES
from zsim.errors import ConfigError, ZsimError, short
from zsim.sweep.table import SweepTable

__all__ = ["ConfigError", "Result", "Scenario", "SweepTable", "ZsimError", "facts", "load", "run", "simulate",
           "sweep", "sweep_run"]


# A mapping given in place of a file is held to the YAML reader's limits (zsim.config.yamlfile's MAX_DEPTH and
# MAX_NODES): nesting, and values once shared parts are expanded (validation walks each use of a shared container)
MODES = (None, "class", "per_rank")


def _check_source(source: object, what: str) -> None:
    """A path, a shipped name or a mapping, nested at most MAX_DEPTH levels and never inside itself (a
    cyclic mapping recursed without end in validation). Raises ConfigError naming the argument."""
    if isinstance(source, bool) or not isinstance(source, (str, Path, dict)):
        raise ConfigError(f"{what}: expected a file path, a shipped name or a mapping (got {short(source)})")
    if isinstance(source, str) and "\0" in source:
        raise ConfigError(f"{what}: {short(source)} holds a NUL character: not a file name")
    if _expanded_size(source, what, 1, frozenset(), {}) > MAX_NODES:
        raise ConfigError(f"{what}: more than {MAX_NODES:,} values once shared parts are expanded (a YAML file "
                          "is held to the same)")


def _expanded_size(value: object, what: str, depth: int, ancestors: frozenset[int], sizes: dict[int, int]) -> int:
    """How many values `value` holds with every shared container counted where it is used (what
    validation walks), memoized by identity so a shared "billion laughs" costs one visit a container.

    Raises:
        ConfigError: nesting deeper than MAX_DEPTH, or a container inside itself.
    """
    if not isinstance(value, (dict, list, tuple)):
        return 1
    if depth > MAX_DEPTH or id(value) in ancestors:
        raise ConfigError(f"{what}: nested more than {MAX_DEPTH} levels deep, or holds itself")
    if id(value) not in sizes:  # a shared container's size does not depend on where it is met
        inner = ancestors | {id(value)}
        items = value.values() if isinstance(value, dict) else value
        sizes[id(value)] = 1 + sum(_expanded_size(v, what, depth + 1, inner, sizes) for v in items)
    return sizes[id(value)]


def _check_set(set: object) -> None:  # noqa: A002
    """`set` is None or a mapping of dotted-key strings. Raises ConfigError."""
    if set is None:
        return
    if not isinstance(set, dict):
        raise ConfigError(f"set: expected a mapping of dotted keys to values (got {short(set)})")
    for key in set:
        if not isinstance(key, str) or not key:
            raise ConfigError(f"set: key {short(key)}: expected a dotted key such as 'zero.stage'")


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

    _check_source(source, "source")
    _check_set(set)
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
    A point that runs out of memory still returns its Result (`result.fits` is False).

    Raises:
        ConfigError: `scenario` is not a Scenario (api.load makes one), or `mode` is not one of MODES.
    """
    from zsim.engine.simulation import simulate as _simulate

    if not isinstance(scenario, Scenario):
        raise ConfigError(f"scenario: expected a Scenario from zsim.api.load (got {short(scenario)})")
    if mode not in MODES:
        raise ConfigError(f"mode: {short(mode)}: expected 'class', 'per_rank' or None (the scenario's fabric.mode)")

    return _simulate(scenario, mode)


def facts(result: Result) -> dict[str, Any]:
    """The facts of `result`: the JSON-ready dict `zsim run` writes as result.json
    (keys in docs/result-json.md; seconds, bytes, TFLOPS).

    Raises:
        ConfigError: `result` is not a Result (api.simulate makes one).
    """
    from zsim.report.facts import facts as _facts

    if not isinstance(result, Result):
        raise ConfigError(f"result: expected a Result from zsim.api.simulate (got {short(result)})")

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
        ConfigError: a bad sweep file, key or value (naming the point), before anything runs; an argument
            of the wrong type (`workers` not a whole number >= 1, `out` not a path, `address` not a string).
    """
    from zsim.sweep.points import load_plan, plan_sweep
    from zsim.sweep.runner import run_sweep
    from zsim.sweep.spec import sweep_from_mapping

    _check_source(source, "source")
    if out is not None and (isinstance(out, bool) or not isinstance(out, (str, Path)) or not str(out)):
        raise ConfigError(f"out: expected a folder path or None (got {short(out)})")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ConfigError(f"workers: expected a whole number >= 1 or None (got {short(workers)})")
    if address is not None and not isinstance(address, str):
        raise ConfigError(f"address: expected '[tcp://]HOST:PORT' or None (got {short(address)})")
    if not isinstance(per_point, bool):
        raise ConfigError(f"per_point: expected True or False (got {short(per_point)})")
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
