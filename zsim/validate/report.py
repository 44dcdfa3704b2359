"""What a validation suite reports: points (simulated against published, error, pass/fail against a
tolerance) and checks (a claim that holds or not), printed as a table or written as JSON."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from zsim.report.table import format_table


@dataclass(frozen=True, slots=True)
class Point:
    """One simulated number against its published value.

    Attributes:
        group: the figure or table ('Figure 2', 'Table 1', ...).
        name: the point within it.
        simulated, published: values in `unit`; `simulated` is None when the run could not give one.
        tolerance: the largest |simulated/published − 1| that passes (relative), or, when `absolute`,
            the largest |simulated − published| (for numbers printed to a fixed precision).
        fits: whether the simulated run fits in GPU memory (None: not a simulated run).
        note: what the comparison means (conventions, sources).
        judged: False for a point printed but not held to its tolerance (a suite's calibration half):
            its result reads 'miss'/'ok' and does not fail the report.
    """

    group: str
    name: str
    simulated: float | None
    published: float
    unit: str
    tolerance: float
    absolute: bool = False
    fits: bool | None = None
    note: str = ""
    judged: bool = True

    @property
    def error(self) -> float | None:
        """Relative error (simulated/published − 1), None without a simulated value."""
        if self.simulated is None:
            return None
        return self.simulated / self.published - 1 if self.published else None

    @property
    def passed(self) -> bool:
        if self.simulated is None or self.fits is False:
            return False
        if self.absolute:
            return abs(self.simulated - self.published) <= self.tolerance
        return abs(self.error) <= self.tolerance


@dataclass(frozen=True, slots=True)
class Check:
    """A claim about several points (an order, a trend, a ratio) and whether the simulation bears it out."""

    group: str
    claim: str
    passed: bool
    detail: str
    judged: bool = True  # False: printed, not held to (a suite's calibration half)


@dataclass
class Report:
    """A suite's points and checks."""

    suite: str
    points: list[Point] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    overrides: tuple[str, ...] = ()  # `zsim validate --set`: every scenario ran with these
    only: tuple[str, ...] = ()  # `zsim validate --point`: the id patterns of the points that ran (a subset)

    @property
    def title(self) -> str:
        """The command that made the report, overrides included."""
        return (f"zsim validate {self.suite}" + "".join(f" --set {o}" for o in self.overrides)
                + "".join(f" --point {o}" for o in self.only))

    @property
    def passed(self) -> bool:
        return all(p.passed for p in self.points if p.judged) and all(c.passed for c in self.checks if c.judged)

    def as_dict(self) -> dict[str, Any]:
        points = [{**asdict(p), "error": p.error, "passed": p.passed} for p in self.points]
        return {"suite": self.suite, "overrides": list(self.overrides), "only": list(self.only),
                "passed": self.passed, "points": points,
                "checks": [asdict(c) for c in self.checks], "notes": self.notes}

    def table(self) -> str:
        """The report as fixed-width text (what `zsim validate` prints)."""
        lines = [self.title]
        header = [["point", "simulated", "published", "unit", "error", "fits", "tolerance", "result"]]
        groups: dict[str, list[list[str]]] = {}
        for p in self.points:
            sim = "—" if p.simulated is None else f"{p.simulated:,.4g}"
            err = "—" if p.error is None else f"{p.error:+.1%}"
            fits = "" if p.fits is None else ("yes" if p.fits else "OOM")
            tol = f"±{p.tolerance:g}" if p.absolute else f"±{p.tolerance:.0%}"
            groups.setdefault(p.group, []).append([p.name, sim, f"{p.published:,.4g}", p.unit, err, fits, tol,
                                                   _verdict(p.passed, p.judged)])
        for group, rows in groups.items():  # in the order of their first point
            lines += [f"\n{group}", *format_table(rows, header=header, align="<>><>>><")]
        if self.checks:
            lines.append("\nChecks")
            for c in self.checks:
                lines.append(f"  [{_verdict(c.passed, c.judged)}] {c.group}: {c.claim}")
                lines += [f"         {part}" for part in c.detail.split("; ")]
        for n in self.notes:
            lines.append(f"\nnote: {n}")
        judged = [p.passed for p in self.points if p.judged] + [c.passed for c in self.checks if c.judged]
        failed = judged.count(False)
        unjudged = len(self.points) + len(self.checks) - len(judged)
        lines.append(f"\n{len(judged) - failed} of {len(judged)} pass" + ("" if not failed else f"; {failed} FAIL")
                     + (f" ({unjudged} more printed, not judged: calibration)" if unjudged else ""))
        return "\n".join(lines)


def _verdict(passed: bool, judged: bool) -> str:
    """'pass'/'FAIL' for a judged point or check, 'ok'/'miss' for one only printed."""
    if judged:
        return "pass" if passed else "FAIL"
    return "ok" if passed else "miss"
