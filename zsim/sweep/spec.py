"""The sweep file: a base scenario, the axes to vary, and what to answer. Validated once, at load.

```yaml
name: ib-bandwidth-1T
base: ../1T-1024gpu.yaml            # a scenario file, relative to this file
set: {model.global_batch: 64}       # fixed overrides for every point (dotted scenario keys)
axes:                               # the cartesian product of these
  hardware.nic_Gbps: {from: 25, to: 1600, factor: 2}
  zero.stage: [1, 2, 3]
zip:                                # keys that move together: one axis each
  - {parallel.dp: [16, 32, 64], hardware.nodes: [1, 2, 4]}
skip_invalid: true                  # skip layouts the scenario rejects, counting the reasons
metric: step_s
plot: {x: hardware.nic_Gbps, lines: zero.stage}
```

An axis is a list of values, or a range: `{from, to, step}` (inclusive), `{from, to, num}` (evenly
spaced), `{from, to, num, log: true}` (log-spaced) or `{from, to, factor}` (×factor until `to`).
Values are integers when `from`, `to` (and `step`) are; log-spaced integers are rounded.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any

from zsim.config.limits import limit, too_many
from zsim.config.struct import Meta, Section, field

from zsim.config.validation import validate
from zsim.config.yamlfile import read_yaml_mapping
from zsim.errors import ConfigError, short

Scalar = bool | int | float | str | None


def max_points() -> int:
    """Points one sweep may have (zsim.config.limits SWEEP_POINTS, $ZSIM_MAX_SWEEP_POINTS): more is a typo
    (a step of 0.001 instead of 1), and would take minutes and gigabytes only to plan."""
    return limit("SWEEP_POINTS")


class _Strict(Section, kw_only=True):
    """A sweep file or section (zsim.config.struct: no unknown keys, no coercion, frozen)."""


class Range(_Strict, kw_only=True):
    """A numeric range: exactly one of `step`, `num`, `factor`; `log` only with `num`."""

    start: Annotated[int | float, Meta(description="first value")] = field(name="from")
    stop: Annotated[int | float, Meta(description="last value (included when the spacing lands on it)")] = field(name="to")
    step: Annotated[int | float | None, Meta(description="linear spacing, > 0")] = None
    num: Annotated[int, Meta(ge=2, description="number of values, evenly (or log-) spaced")] | None = None
    factor: Annotated[int, Meta(gt=1, description="geometric: each value × factor")] | Annotated[
        float, Meta(gt=1, description="geometric: each value × factor")] | None = None
    log: Annotated[bool, Meta(description="with num: log-spaced")] = False

    def __post_init__(self) -> None:  # one spacing
        super().__post_init__()
        given = [k for k in ("step", "num", "factor") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of step, num, factor (got {', '.join(given) or 'none'})")
        if self.step is not None and self.step <= 0:
            raise ValueError(f"step must be > 0 (got {self.step!r})")
        if self.log and self.num is None:
            raise ValueError("log: true needs num")
        if (self.log or self.factor is not None) and (self.start <= 0 or self.stop <= 0):
            raise ValueError(f"log-spaced ranges need from and to > 0 (got {self.start!r}, {self.stop!r})")
        if self.stop < self.start:
            raise ValueError(f"to ({self.stop!r}) is below from ({self.start!r})")
        count = self.count()
        if count > max_points():  # before any value is made: `num: 1e8` was 3.7 GB
            raise ValueError(too_many("SWEEP_POINTS", count, "values"))

    def count(self) -> float:
        """How many values the range spans (before duplicates are dropped); inf when the arithmetic
        overflows (from -1e308 to 1e308, or integers past a double)."""
        try:
            if self.step is not None:
                span = (self.stop - self.start) / self.step
            elif self.factor is not None:
                span = (math.log(self.stop) - math.log(self.start)) / math.log(self.factor)
            else:
                return float(self.num)  # type: ignore[arg-type]
        except (OverflowError, ValueError):  # an integer too large for a double
            return math.inf
        if math.isnan(span):  # a NaN bound: zsim.config.validation refuses it, naming the key
            return 0
        return math.floor(span + 1e-9) + 1 if math.isfinite(span) else math.inf

    def values(self) -> list[int | float]:
        """The range's values, in order, without duplicates."""
        ints = isinstance(self.start, int) and isinstance(self.stop, int) and not isinstance(self.step, float)
        try:
            raw = self._raw(int(min(self.count(), max_points() + 1)))
        except OverflowError:  # integers whose quotient is past a double
            raw = [math.inf]
        if not all(isinstance(v, int) or math.isfinite(v) for v in raw):  # (to - from) past a double
            raise ConfigError(f"from {short(self.start)} to {short(self.stop)}: the values overflow a double; give a "
                              "smaller range")
        out: list[int | float] = []
        for v in raw:
            v = int(round(v)) if ints else float(f"{v:.12g}")  # 0.1 + 2 × 0.1 is 0.3, not 0.30000000000000004
            if not out or v != out[-1]:
                out.append(v)
        return out

    def _raw(self, count: int) -> list[int | float]:
        """The `count` values before rounding (OverflowError when integer arithmetic leaves a double)."""
        if self.step is not None:
            raw = [self.start + i * self.step for i in range(count)]
        elif self.factor is not None:  # multiplied step by step: exact for integers, never past `to`
            raw = [self.start]
            for _ in range(count - 1):
                raw.append(raw[-1] * self.factor)
        elif self.log:  # log(to) - log(from), not log(to / from): the ratio of 1e308 and 1e-320 overflows
            ratio = math.log(self.stop) - math.log(self.start)
            first = math.log(self.start)
            n = self.num or 2
            raw = [math.exp(first + ratio * i / (n - 1)) for i in range(n)]
        else:
            n = self.num or 2
            raw = [self.start + (self.stop - self.start) * i / (n - 1) for i in range(n)]
        return raw


AxisValues = Any  # a list of values or a Range mapping: checked by `_values`, which names the key


class PlotSpec(_Strict, kw_only=True):
    """Which plot to draw: `metric` against axis `x`, one line per value of axis `lines`."""

    x: Annotated[str, Meta(description="the axis on the horizontal")]
    lines: Annotated[str | None, Meta(description="one line per value of this axis")] = None
    metric: Annotated[str | None, Meta(description="a table column; default: the sweep's metric")] = None
    log_x: Annotated[bool | None, Meta(description="log-scaled x (default: when x spans ≥ 8×)")] = None


class SweepFile(_Strict, kw_only=True):
    """A whole sweep file."""

    _STRIP = ("name", "description")  # echoed on the terminal and in the plot: no escape sequences

    name: Annotated[str | None, Meta(description="default: the file's stem")] = None
    description: str | None = None
    base: Annotated[str, Meta(description="the scenario file to vary, relative to the sweep file")]
    set: Annotated[dict[str, Scalar | list[Any] | dict[str, Any]], Meta(
        description="overrides applied to every point (dotted keys)")] = field(default_factory=dict)
    axes: Annotated[dict[str, AxisValues], Meta(description="dotted key -> values; all combinations")] = field(
        default_factory=dict)
    zip: Annotated[list[dict[str, AxisValues]], Meta(
        description="groups of keys whose values move together (equal lengths)")] = field(default_factory=list)
    skip_invalid: Annotated[bool, Meta(description="skip points whose layout the scenario rejects "
                                       "(dp × mp ≠ GPUs, MP neither within a node nor over whole nodes, ...), "
                                       "counting each reason")] = False
    metric: Annotated[str, Meta(description="the table column the answers are about")] = "step_s"
    plot: PlotSpec | None = None


class ListValue(tuple):
    """One value of a list-valued key on an axis (`[layernorm, moe]` for zero.recompute_modules): hashable, so
    the sweep can group and compare points by it, and printed as the sweep file writes it."""

    def __str__(self) -> str:
        return "[" + ", ".join(str(v) for v in self) + "]"

    __repr__ = __str__


def cell(value: Any) -> Any:
    """A swept value as the table and sweep.json hold it: a list-valued one as its text (`[layernorm, moe]`), so
    that a table read back groups its points the same way; scalars as they are."""
    return str(value) if isinstance(value, ListValue) else value


class Axis:
    """One dimension of the sweep: one key, or several zipped keys, and their values per position."""

    __slots__ = ("keys", "values")

    def __init__(self, keys: tuple[str, ...], values: list[tuple[Any, ...]]):
        self.keys, self.values = keys, values

    def __len__(self) -> int:
        return len(self.values)


def _values(spec: AxisValues, where: str, source: str) -> list[Any]:
    """The values of one axis: a list of scalars, or a Range mapping. Raises ConfigError at `where`."""
    if isinstance(spec, dict):
        try:
            values = validate(Range, spec, source).values()  # type: ignore[attr-defined]
        except ConfigError as exc:
            prefix = ": ".join(p for p in (exc.source, exc.path) if p)
            message = str(exc).removeprefix(f"{prefix}: ")
            raise ConfigError(message, source=source, path=f"{where}.{exc.path}" if exc.path else where) from None
    elif isinstance(spec, list):
        bad = [v for v in spec if isinstance(v, dict) or (isinstance(v, list) and any(
            isinstance(x, (list, dict)) for x in v))]
        if bad:
            raise ConfigError(f"values must be scalars (a number, a string, true/false, null) or lists of them "
                              f"(a list-valued key: zero.recompute_modules), got {bad[0]!r}", source=source, path=where)
        values = [ListValue(v) if isinstance(v, list) else v for v in spec]
    else:
        raise ConfigError(f"expected a list of values or a range {{from, to, step|num|factor}}, got {spec!r}",
                          source=source, path=where)
    if not values:
        raise ConfigError("an axis needs at least one value", source=source, path=where)
    if len(values) > max_points():
        raise ConfigError(too_many("SWEEP_POINTS", len(values), "values"), source=source, path=where)
    return values


def _check_key(key: str, where: str, source: str) -> None:
    parts = key.split(".")
    if len(parts) < 2 or not all(parts):
        raise ConfigError(f"{key!r} is not a dotted scenario key (e.g. zero.stage, hardware.nodes)",
                          source=source, path=where)


def axes_of(spec: SweepFile, source: str) -> list[Axis]:
    """The sweep's axes, zipped groups after the plain ones. Raises ConfigError naming the key."""
    axes: list[Axis] = []
    seen: set[str] = set(spec.set)
    for key, values in spec.axes.items():
        _check_key(key, f"axes.{key}", source)
        if key in seen:
            raise ConfigError("is both set and swept", source=source, path=f"axes.{key}")
        seen.add(key)
        axes.append(Axis((key,), [(v,) for v in _values(values, f"axes.{key}", source)]))
    for i, group in enumerate(spec.zip):
        if not group:
            raise ConfigError("an empty group", source=source, path=f"zip[{i}]")
        columns = []
        for key, values in group.items():
            _check_key(key, f"zip[{i}].{key}", source)
            if key in seen:
                raise ConfigError("is set or swept twice", source=source, path=f"zip[{i}].{key}")
            seen.add(key)
            columns.append(_values(values, f"zip[{i}].{key}", source))
        lengths = {len(c) for c in columns}
        if len(lengths) > 1:
            sizes = ", ".join(f"{k}: {len(c)}" for k, c in zip(group, columns))
            raise ConfigError(f"zipped keys need as many values each ({sizes})", source=source, path=f"zip[{i}]")
        axes.append(Axis(tuple(group), list(zip(*columns))))
    for key in spec.set:
        _check_key(key, f"set.{key}", source)
    total = math.prod(len(axis) for axis in axes)
    if total > max_points():
        sizes = " × ".join(str(len(axis)) for axis in axes)
        raise ConfigError(f"{sizes} = {too_many('SWEEP_POINTS', total, 'points')}", source=source, path="axes")
    return axes


def find_sweep(text: str | Path) -> Path:
    """The sweep file the user named: an existing file, else a shipped sweep's name
    ('whatif/ib-bandwidth-1T', with or without 'scenarios/' and '.yaml'), from any folder.

    Raises:
        ConfigError: neither a file nor a shipped name (with the close sweep names).
    """
    from zsim.config.shipped import find_file

    return find_file(text, "sweep")


def load_sweep_file(path: str | Path) -> SweepFile:
    """Read and validate a sweep file (a path, or a shipped sweep's name: find_sweep).

    Raises:
        ConfigError: naming the file and key; a scenario file says to use `zsim run` (it has no `base:`).
    """
    from zsim.config.shipped import command_name, is_sweep_mapping

    path = find_sweep(path)
    data = read_yaml_mapping(path)
    if not is_sweep_mapping(data) and "model" in data:
        raise ConfigError(f"a scenario file, not a sweep (no `base:`): run it with `zsim run {command_name(path)}`, "
                          "or sweep it from a sweep file whose `base:` names it (docs/sweep.md)", source=str(path))
    spec: SweepFile = validate(SweepFile, data, str(path))  # type: ignore[assignment]
    return spec


def sweep_from_mapping(data: dict[str, Any], source: str = "<sweep>") -> SweepFile:
    """Validate a sweep given as a mapping (the Python API). Raises ConfigError."""
    return validate(SweepFile, data, source)  # type: ignore[return-value]

