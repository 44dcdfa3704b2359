"""What a replay suite found (`zsim validate replay`): each held-out run's outcome, the verdict against the
suite's criteria, the noise floor of the machine it ran on, and the table that says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from zsim.report.table import format_table
from zsim.validate.replay_suite import Criteria

# Stolen CPU time above which the table warns: on the development VM, runs with 0-5% stolen passed and
# the one with 25% was the noisiest recorded (one run's recordings 111% apart).
STEAL_WARNING = 0.10


@dataclass(slots=True)
class Outcome:
    """One held-out run replayed: step times, error, model states, alignment."""

    label: str
    measured_s: float
    simulated_s: float
    states_exact: bool
    lined_up: int
    unmatched: int
    judged: bool
    recordings_s: tuple[float, ...] = ()  # each recording's measured step (repeats > 1); measured_s is their median

    @property
    def error(self) -> float:
        return self.simulated_s / self.measured_s - 1.0

    @property
    def spread(self) -> float | None:
        """max / min − 1 of the recordings' steps: what the machine alone does to this measurement."""
        return max(self.recordings_s) / min(self.recordings_s) - 1.0 if len(self.recordings_s) > 1 else None


@dataclass(slots=True)
class SuiteResult:
    suite: Path
    profile: Path
    outcomes: list[Outcome]
    criteria: Criteria
    load: tuple[float, float, float]
    cores: int
    calibration: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    # The noise floor: the first held-out run recorded again at the end, (label, first, again) step seconds
    repeat: tuple[str, float, float] | None = None
    steal: float | None = None  # share of the CPU time the hypervisor gave to other machines while it ran

    @property
    def noise(self) -> float | None:
        """How far the machine alone moves a measured step: |again / first − 1| of the recording made
        again at the end (one recording per entry), else the largest spread of a held-out run's recordings."""
        if self.repeat is not None:
            return abs(self.repeat[2] / self.repeat[1] - 1.0)
        spreads = [o.spread for o in self.judged if o.spread is not None]
        return max(spreads) if spreads else None

    @property
    def judged(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.judged]

    @property
    def median_error(self) -> float:
        return float(np.median([abs(o.error) for o in self.judged])) if self.judged else float("nan")

    @property
    def max_error(self) -> float:
        return float(max(abs(o.error) for o in self.judged)) if self.judged else float("nan")

    @property
    def passed(self) -> bool:
        return (bool(self.judged) and self.median_error <= self.criteria.median_step_error
                and self.max_error <= self.criteria.max_step_error and all(o.states_exact for o in self.judged))

    def table(self) -> str:
        return table(self)

    def as_dict(self) -> dict[str, Any]:
        return {"suite": str(self.suite), "profile": str(self.profile), "passed": self.passed,
                "median_error": self.median_error, "max_error": self.max_error, "cores": self.cores,
                "load_average": list(self.load), "steal": self.steal, "seconds": self.seconds,
                "calibration": self.calibration,
                "noise_floor": {"largest_spread": self.noise} if self.repeat is None else {
                    "run": self.repeat[0], "measured_s": self.repeat[1], "measured_again_s": self.repeat[2],
                    "difference": self.noise},
                "runs": [{"label": o.label, "measured_s": o.measured_s, "simulated_s": o.simulated_s, "error": o.error,
                          "recordings_s": list(o.recordings_s),
                          "model_states_exact": o.states_exact, "ops_lined_up": o.lined_up,
                          "ops_unmatched": o.unmatched, "judged": o.judged} for o in self.outcomes]}


def table(result: SuiteResult) -> str:
    """The error table, the verdict, and the machine's load while it ran."""
    repeated = any(o.recordings_s for o in result.outcomes)
    lines = [f"zsim validate replay · {result.suite} (calibrated profile {result.profile})"]
    rows = []
    for o in result.outcomes:
        note = "(reported, not judged: more ranks than cores)" if not o.judged else ""
        each = (" / ".join(f"{s * 1e3:.1f}" for s in o.recordings_s) + f" ms ({o.spread:.0%} apart)"
                if o.recordings_s else "")
        rows.append([o.label, f"{o.measured_s * 1e3:.2f}ms", f"{o.simulated_s * 1e3:.2f}ms", f"{o.error:+.1%}",
                     "exact" if o.states_exact else "DIFFER", f"{o.lined_up} ({o.unmatched} unmatched)", note, each])
    header = ["held-out run", "measured", "simulated", "error", "model states", "ops lined up", "",
              "recordings (median is measured)" if repeated else ""]
    lines += format_table(rows, header=[header], align="<>>><<<<", gap="  ")
    c = result.criteria
    lines.append(f"  step time |error|: median {result.median_error:.1%} (<= {c.median_step_error:.0%}), worst "
                 f"{result.max_error:.1%} (<= {c.max_step_error:.0%}); model states "
                 f"{'exact' if all(o.states_exact for o in result.judged) else 'DIFFER'}")
    if result.repeat is not None:
        label, first, again = result.repeat
        lines.append(f"  noise floor: {label} measured again at the end: {first * 1e3:.2f}ms, then "
                     f"{again * 1e3:.2f}ms ({result.noise:.1%} apart)")
    elif result.noise is not None:
        lines.append(f"  noise floor: the recordings of one held-out run are up to {result.noise:.1%} apart")
    steal = "" if result.steal is None else f", {result.steal:.0%} of the CPU time stolen by the hypervisor"
    lines.append(f"  {'PASS' if result.passed else 'FAIL'} · {result.cores} cores, load average "
                 f"{result.load[0]:.1f} / {result.load[1]:.1f} / {result.load[2]:.1f} at the end{steal}, "
                 f"{result.seconds:.0f} s in all")
    noisy = [f"one run's recordings are {result.noise:.0%} apart"] if (result.noise or 0) > c.max_step_error else []
    noisy += [f"the hypervisor took {result.steal:.0%} of the CPU time"] if (result.steal or 0) > STEAL_WARNING else []
    poor = (result.calibration.get("warning") or {}).get("poor_fit") or []
    if poor:  # the calibration runs were recorded on a busy machine, or the model does not fit them
        lines.append(f"  calibration: a poor fit ({len(poor)} cause{'s' if len(poor) > 1 else ''}): " + "; ".join(poor))
        noisy.append("the calibration was a poor fit")
    if noisy:
        lines.append(f"  warning: the machine moved more than the criterion ({'; '.join(noisy)}): this verdict says "
                     "more about the machine than the model; judge on an idle one")
    return "\n".join(lines)
