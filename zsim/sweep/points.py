"""A sweep's points: every combination of its axes, each resolved to a validated Scenario before any runs.

A point is one of three kinds:
- `run`: a valid scenario, simulated;
- `oom`: its model states alone exceed the GPU (ZeRO Table 1), so the scenario loader rejects it. It is
  still simulated, on a GPU with room (its step time says what the step would cost), and marked OOM;
- skipped: a layout the scenario rejects (dp × mp ≠ GPUs, MP neither within a node nor over whole nodes,
  ...), when the sweep file says `skip_invalid: true`; the reasons are counted. Otherwise such a point
  stops the sweep (exit 2). MP over whole nodes is a valid layout (docs/fabric.md), run like any other.
A bad key or value (unknown key, wrong type, missing profile) always stops the sweep, naming the point.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import itertools
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from zsim import __version__
from zsim.sweep.code_digest import code_digest
from zsim.scenario.scenario import Scenario, build_scenario
from zsim.config.schema import ScenarioFile
from zsim.config.struct import dump
from zsim.config.validation import validate
from zsim.config.hf import resolve_from_hf
from zsim.config.overrides import set_key
from zsim.config.yamlfile import read_yaml_mapping
from zsim.errors import ConfigError, ZsimError
from zsim.sweep.spec import Axis, ListValue, SweepFile, axes_of
from zsim.zero.cost import check_cost

# Keys of the scenario that do not change its result: left out of a point's hash.
UNHASHED = {"name", "description", "run.output"}
# A GPU big enough for any model's states (1 EB): how OOM points are timed as if they fit.
ROOMY_GPU_BYTES = 10**18
# Checks of zsim.scenario.scenario.build_scenario that are about memory (the model states alone do
# not fit), not about the layout: their points are kept as OOM.
MEMORY_CHECKS = {"zero.stage"}
# Checks whose failure is a bad value (a profile that does not exist), never a point to skip.
FATAL_CHECKS = {"hardware.profile", "hardware.gpu"}


@dataclass(frozen=True, slots=True)
class Point:
    """One resolved point: its index, the values of the swept keys, and the validated Scenario."""

    index: int
    values: dict[str, Any]
    scenario: Scenario
    key: str  # hash of the resolved scenario and the zsim version (the cache key)
    capacity_bytes: int  # the GPU's memory (the real one, also for OOM points simulated on a roomy GPU)
    oom_reason: str | None = None  # set when the model states alone exceed the GPU


@dataclass(slots=True)
class Plan:
    """All points of a sweep, validated, and the ones skipped (reason -> count)."""

    spec: SweepFile
    source: str
    base: Path
    axes: list[Axis]
    points: list[Point]
    skipped: dict[str, int] = field(default_factory=dict)
    skip_examples: dict[str, str] = field(default_factory=dict)  # reason -> its first point, with its numbers
    total: int = 0  # combinations before skipping

    @property
    def keys(self) -> list[str]:
        return [k for axis in self.axes for k in axis.keys]

    def companions(self, key: str) -> tuple[str, ...]:
        """The keys that move with `key` (its zip group, itself included)."""
        return next((axis.keys for axis in self.axes if key in axis.keys), (key,))


def describe(values: dict[str, Any]) -> str:
    """`hardware.nic_Gbps=25, zero.stage=2`"""
    return ", ".join(f"{k}={v}" for k, v in values.items())


def _message(exc: ConfigError) -> str:
    """The error's message without its `source: path: ` prefix."""
    prefix = ": ".join(p for p in (exc.source, exc.path) if p)
    return str(exc).removeprefix(f"{prefix}: ") if prefix else str(exc)


def _reason(message: str) -> str:
    """A skip reason without the numbers that differ between points (so reasons can be counted)."""
    return re.sub(r"(?<![\w.])-?\d[\d.,e+]*(?!\w)", "N", message)  # numbers, not bf16 or V100


def point_key(scenario: Scenario, spec: ScenarioFile, capacity_bytes: int) -> str:
    """sha256 of the resolved scenario (every section as validated, the cluster in SI units, the
    derived grad_accum), the zsim version and the digest of zsim's source (zsim.sweep.code_digest): equal
    keys give equal results."""
    sections = dump(spec)
    for dotted in UNHASHED:
        node = sections
        *parents, last = dotted.split(".")
        for p in parents:
            node = node.get(p) or {}
        node.pop(last, None)
    blob = {"zsim": __version__, "code": code_digest(), "scenario": sections, "grad_accum": scenario.grad_accum, "capacity": capacity_bytes,
            "cluster": dataclasses.asdict(scenario.cluster)}
    text = json.dumps(blob, sort_keys=True, default=repr, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def _resolve(data: dict[str, Any], spec: ScenarioFile, source: str, name: str,
             base_dir: Path | None = None) -> tuple[Scenario, int, str | None]:
    """Build one point's Scenario from its (schema-valid) mapping. Returns (scenario, GPU memory in
    bytes, OOM reason or None): a point whose model states alone exceed the GPU is built on a roomy GPU
    instead, so that it can still be timed.

    Raises:
        ConfigError: a layout or profile error (path not in MEMORY_CHECKS).
    """
    try:
        scenario = build_scenario(data, source=source, default_name=name, base_dir=base_dir)
        return scenario, scenario.cluster.gpu.memory_bytes, None
    except ConfigError as exc:
        if exc.path not in MEMORY_CHECKS:
            raise
        reason = _message(exc).removeprefix(f"{spec.zero.stage}: ")
    scenario = build_scenario(data, source=source, default_name=name, gpu_memory_bytes=ROOMY_GPU_BYTES,
                              base_dir=base_dir)
    return scenario, _capacity(spec), reason


def _capacity(spec: ScenarioFile) -> int:
    """The GPU memory of the point's cluster, in bytes (its profile with the hardware.* overrides)."""
    from zsim.fabric.cluster import load_cluster

    hw = spec.hardware
    overrides = hw.overrides() if hasattr(hw, "overrides") else {}  # contract 2 (issue 9)
    return load_cluster(hw.profile, hw.nodes, **overrides).gpu.memory_bytes


def plan_sweep(spec: SweepFile, source: str, base_dir: Path, *,
               progress: Callable[[int, int], None] | None = None) -> Plan:
    """Expand and validate every point of `spec` (relative paths from `base_dir`). `progress(done, total)`
    is called after each point (a million-point sweep takes minutes to plan).

    Raises:
        ConfigError: a bad sweep key, base file, key or value (naming the point), a layout error when
            skip_invalid is false, or a sweep whose every point is skipped.
    """
    base = (base_dir / spec.base) if not Path(spec.base).is_absolute() else Path(spec.base)
    try:
        base_data = read_yaml_mapping(base)
    except ConfigError as exc:
        raise ConfigError(str(exc), source=source, path="base") from None
    axes = axes_of(spec, source)
    _check_answers(spec, [k for axis in axes for k in axis.keys], source)
    fixed = copy.deepcopy(base_data)
    for key, value in spec.set.items():
        set_key(fixed, key, value, f"{source}: set.{key}")
    if "model.from_hf" in (k for axis in axes for k in axis.keys):
        raise ConfigError("a sweep imports one Hugging Face config (the base's, or set.model.from_hf); to compare "
                          "models, sweep their keys (model.layers, model.hidden, ...)", source=source,
                          path="axes.model.from_hf")
    # model.from_hf's keys filled in once, from the base's folder, so every point validates as a whole
    # scenario; keys the sweep sets or sweeps are written over them, as a scenario's own keys are
    fixed = resolve_from_hf(fixed, source=f"{source}: base {base}", base_dir=base.parent)
    name = spec.name or Path(source).stem
    plan = Plan(spec=spec, source=source, base=base, axes=axes, points=[])
    total = math.prod(len(axis.values) for axis in axes)
    for combo in itertools.product(*(axis.values for axis in axes)):
        if progress and plan.total:
            progress(plan.total, total)
        plan.total += 1
        values = {k: v for axis, vals in zip(axes, combo) for k, v in zip(axis.keys, vals)}
        data = copy.deepcopy(fixed)
        for key, value in values.items():
            set_key(data, key, list(value) if isinstance(value, ListValue) else value, f"{source}: axes.{key}")
        data["name"] = f"{name}-{plan.total - 1:04d}"
        where = f"{source}: point {plan.total - 1} ({describe(values)}) of {base}"
        validated: ScenarioFile = validate(ScenarioFile, data, where)  # type: ignore[assignment]
        try:
            scenario, capacity, oom = _resolve(data, validated, where, data["name"], base.parent)
        except ConfigError as exc:
            if not spec.skip_invalid or exc.path is None or exc.path in FATAL_CHECKS:
                raise
            reason = f"{exc.path}: {_reason(_message(exc))}"
            plan.skipped[reason] = plan.skipped.get(reason, 0) + 1
            plan.skip_examples.setdefault(reason, f"point {plan.total - 1} ({describe(values)}): {_message(exc)}")
            continue
        try:  # what `zsim run` refuses (too long or too large to simulate here) a sweep refuses too
            check_cost(scenario, trace=False)  # a sweep's worker builds no trace events
        except ZsimError as exc:
            raise ConfigError(str(exc), source=where) from None
        plan.points.append(Point(index=plan.total - 1, values=values, scenario=scenario,
                                 key=point_key(scenario, validated, capacity), capacity_bytes=capacity, oom_reason=oom))
    if progress:
        progress(plan.total, total)
    if not plan.points:
        reasons = "; ".join(f"{n}× {r}" for r, n in plan.skipped.items())
        raise ConfigError(f"every one of the {plan.total} points is invalid ({reasons})", source=source)
    return plan


def _check_answers(spec: SweepFile, keys: list[str], source: str) -> None:
    """`metric` and `plot.metric` name result columns; `plot.x` and `plot.lines` name swept keys."""
    from zsim.sweep.row import COLUMNS

    numeric = [c for c in COLUMNS if c not in ("status", "band_match", "band_regime", "oom", "bottleneck_kind", "bottleneck",
                                               "dp_algorithm", "mode", "key")]
    metrics = [("metric", spec.metric)] + ([("plot.metric", spec.plot.metric)] if spec.plot and spec.plot.metric else [])
    for where, metric in metrics:
        if metric not in numeric:
            raise ConfigError(f"{metric!r} is not a numeric result column ({', '.join(numeric)})",
                              source=source, path=where)
    if spec.plot:
        for where, key in (("plot.x", spec.plot.x), ("plot.lines", spec.plot.lines)):
            if key is not None and key not in keys:
                raise ConfigError(f"{key!r} is not a swept key ({', '.join(keys)})", source=source, path=where)


def load_plan(path: str | Path, *, progress: Callable[[int, int], None] | None = None) -> Plan:
    """Read a sweep file (a path, or a shipped sweep's name) and plan it (`progress` as in plan_sweep).
    Raises ConfigError."""
    from zsim.sweep.spec import find_sweep, load_sweep_file

    path = find_sweep(path)
    return plan_sweep(load_sweep_file(path), str(path), path.parent, progress=progress)
