"""Held-out validation of the twin loop (`zsim validate replay`): record real runs with the runtime,
calibrate a profile on some of them, replay the others, and judge the errors.

A suite (zsim/validate/suites/replay-cpu.yaml) names the base profile, the ranks, the steps, the
configurations to calibrate on and the held-out ones to replay (scenario, ZeRO stage, gradient
accumulation), and the criteria. Recording and judging happen in one run, so the timings the fit
sees and the ones it is judged against come from the same machine state. Runs with more ranks than
the machine has cores time-slice (DESIGN.md: 10-30x variation) and are reported, not judged.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import numpy as np

from zsim.config.struct import Meta, Section
from zsim.config.validation import validate
from zsim.config.yamlfile import read_yaml_mapping
from zsim.errors import ConfigError, ZsimError
from zsim.report.table import format_table

DEFAULT_SUITE = Path(__file__).resolve().parent / "suites" / "replay-cpu.yaml"
# Stolen CPU time above which the table warns: on the development VM, runs with 0-5% stolen passed and
# the one with 25% was the noisiest recorded (one run's recordings 111% apart).
STEAL_WARNING = 0.10


class _Strict(Section, kw_only=True):
    """A suite file or section (zsim.config.struct: no unknown keys, no coercion, frozen)."""


class Entry(_Strict, kw_only=True):
    scenario: Annotated[str, Meta(description="scenario file: relative to the suite file, else to scenarios/")]
    stage: Annotated[int, Meta(ge=0, le=3)]
    grad_accum: Annotated[int, Meta(gt=0, le=1_000_000)] = 1  # runtime.config.RunConfig's bound

    @property
    def label(self) -> str:
        return f"{Path(self.scenario).stem}-s{self.stage}-ga{self.grad_accum}"


class Criteria(_Strict, kw_only=True):
    median_step_error: Annotated[float, Meta(gt=0, description="median |step time error| over the held-out runs")]
    max_step_error: Annotated[float, Meta(gt=0, description="largest |step time error| of any held-out run")]


class SuiteFile(_Strict, kw_only=True):
    base_profile: str
    ranks: Annotated[int, Meta(gt=0, le=1024)]  # runtime/config.py MAX_RANKS
    steps: Annotated[int, Meta(ge=2, le=1000, description=(
        "optimizer steps per run; the first (warm-up) is not judged (at most 1000: every entry records them all)"))]
    repeats: Annotated[int, Meta(ge=1, le=9, description=(
        "recordings of every entry (in rounds, each round in the interleaved order); a held-out run's measured "
        "step is the median of its recordings, and all recordings of the calibration entries are fitted"))] = 1
    precision: Annotated[str, Meta(pattern="^(fp32|fp16|bf16)$")] = "fp32"
    fit: Annotated[str, Meta(pattern="^(all|collectives|compute)$")] = "all"
    calibrate: Annotated[list[Entry], Meta(min_length=1)]
    replay: Annotated[list[Entry], Meta(min_length=1)]
    criteria: Criteria


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


def load_suite(path: Path) -> SuiteFile:
    """The validated suite file, its base profile found and every entry's model and run checked as the
    runtime checks them (check_entry), before any run is recorded (minutes). Raises ConfigError naming
    the key."""
    from zsim.fabric.cluster import load_cluster

    suite: SuiteFile = validate(SuiteFile, read_yaml_mapping(path), str(path))  # type: ignore[assignment]
    try:
        load_cluster(suite.base_profile, 1)
    except ConfigError as exc:
        raise ConfigError(str(exc).split(": ", 1)[-1], source=str(path), path="base_profile") from None
    for entry in (*suite.calibrate, *suite.replay):
        check_entry(suite, path, entry)
    return suite


def check_entry(suite: SuiteFile, suite_path: Path, entry: Entry) -> Path:
    """The scenario file of `entry`, read as the runtime reads it and its run validated as the runtime
    validates it (ranks, stage, MP and pipeline rules, the batch arithmetic), so that a suite is refused
    before its first recording rather than after minutes of them (issue 28).

    Raises:
        ConfigError: naming the suite file, the entry and what the runtime would refuse.
    """
    from zsim.runtime.config import RunConfig, read_model_file

    model = scenario_path(suite_path, entry.scenario)
    found = read_model_file(model)
    try:
        RunConfig(model=found.model, stage=entry.stage, precision=suite.precision, world_size=suite.ranks,
                  out_dir=entry.label, steps=suite.steps, grad_accum=entry.grad_accum)
    except ConfigError as exc:
        raise ConfigError(f"{entry.label} ({model}): {exc}", source=str(suite_path)) from None
    return model


def scenario_path(suite_path: Path, name: str) -> Path:
    """A suite entry's scenario: beside the suite file if it is there, else among the shipped scenarios
    (package data zsim.scenarios, so an installed wheel finds them).

    Raises:
        ConfigError: neither exists.
    """
    from zsim.config.profiles import builtin_folder

    shipped = builtin_folder("zsim.scenarios")
    for candidate in (suite_path.parent / name, shipped / name):
        if candidate.is_file():
            return candidate
    raise ConfigError(f"scenario '{name}' is neither beside the suite nor in {shipped}", source=str(suite_path))


def record(suite: SuiteFile, suite_path: Path, entry: Entry, out: Path, label: str | None = None) -> Path:
    """Run the real runtime for one entry (a subprocess launching `suite.ranks` processes) into
    out/<label> (default: the entry's label).

    Raises:
        ZsimError: the run failed (its log is named).
    """
    folder = out / (label or entry.label)
    command = [sys.executable, "-m", "zsim.runtime", "--ranks", str(suite.ranks), "--stage", str(entry.stage),
               "--grad-accum", str(entry.grad_accum), "--steps", str(suite.steps), "--precision", suite.precision,
               "--model", str(scenario_path(suite_path, entry.scenario)), "-o", str(folder),
               "--force"]  # the suite owns its output folder: a rerun replaces the earlier recording
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise ZsimError(f"recording {entry.label} failed (exit {done.returncode}): {' | '.join(tail)}")
    return folder


def cpu_times() -> list[int] | None:
    """The machine's CPU time counters since boot (/proc/stat's first line: user, nice, system, idle,
    iowait, irq, softirq, steal, ...; Linux `man 5 proc`), or None where there is no /proc/stat."""
    try:
        with open("/proc/stat") as f:
            return [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None


def steal_share(before: list[int] | None, after: list[int] | None) -> float | None:
    """The share of all CPU time between two `cpu_times` readings that was stolen (field 8: time a
    virtual CPU waited while the hypervisor ran something else), or None without both readings."""
    if not before or not after or len(before) < 8 or len(after) < 8:
        return None
    spent = [b - a for a, b in zip(before, after)]
    total = sum(spent[:8])  # guest time is counted inside user time (man 5 proc)
    return spent[7] / total if total > 0 else None


def interleaved(first: list[Entry], second: list[Entry]) -> list[Entry]:
    """The recording order: one of `first`, one of `second`, and so on (the rest of the longer list
    at the end). A shared machine's speed drifts (other jobs come and go): recording every run to
    fit before every run to judge would let a drift between the two halves pass for model error;
    alternating them exposes both to the same conditions (blocking against drift)."""
    out: list[Entry] = []
    for i in range(max(len(first), len(second))):
        out += first[i:i + 1] + second[i:i + 1]
    return out


def run_suite(suite_path: Path = DEFAULT_SUITE, out: Path = Path("out/validate-replay"),
              progress=None) -> SuiteResult:
    """Record every entry, calibrate on the `calibrate` ones, replay the `replay` ones.

    Raises:
        ConfigError: a bad suite file. ZsimError: a run failed, or calibration refused.
    """
    from zsim.commands.calibrate import calibrate
    from zsim.commands.replay import replay

    import importlib.util

    started, counters = time.perf_counter(), cpu_times()
    suite = load_suite(suite_path)
    if importlib.util.find_spec("torch") is None:  # before the first recording fails on `import torch`
        raise ZsimError("zsim validate replay records real runs with the runtime, which needs torch: "
                        "pip install 'zsim[runtime]' (README, Installing; --dry-run checks the suite without it)")
    cores = os.cpu_count() or 1
    say = progress or (lambda message: None)
    out.mkdir(parents=True, exist_ok=True)
    recorded: dict[str, list[Path]] = {}
    order = [(r, e) for r in range(suite.repeats) for e in interleaved(suite.calibrate, suite.replay)]
    for i, (r, entry) in enumerate(order):
        say(f"[{i + 1}/{len(order)}] recording {entry.label} ({suite.ranks} ranks, {suite.steps} steps)")
        label = entry.label if r == 0 else f"{entry.label}-r{r + 1}"
        recorded.setdefault(entry.label, []).append(record(suite, suite_path, entry, out, label=label))
    profile = out / "calibrated.yaml"
    say(f"calibrating {suite.base_profile} on {', '.join(e.label for e in suite.calibrate)}")
    # A poor fit is written, not refused: the held-out replays are the judgement, and the fit's causes
    # (zsim.calibrate.fit_quality) are printed beside the verdict as evidence of a busy machine.
    report = calibrate([f for e in suite.calibrate for f in recorded[e.label]], suite.base_profile, profile,
                       fit=suite.fit, accept_poor_fit=True)
    outcomes = []
    for entry in suite.replay:
        say(f"replaying {entry.label}")
        reps = [replay(folder, str(profile))[0] for folder in recorded[entry.label]]
        rep, a = reps[0], reps[0]["alignment"]
        measured = [x["step_seconds"]["measured"] for x in reps]
        outcomes.append(Outcome(entry.label, float(np.median(measured)),
                                float(np.median([x["step_seconds"]["simulated"] for x in reps])),
                                all(v["exact"] for x in reps for v in x["model_states_bytes"].values()), a["lined_up"],
                                max(len(x["alignment"]["measured_only"]) + len(x["alignment"]["simulated_only"])
                                    for x in reps),
                                judged=suite.ranks <= cores or rep["run"]["backend"] != "gloo",
                                recordings_s=tuple(measured) if len(measured) > 1 else ()))
    repeat = None
    if suite.repeats == 1:
        # The same run once more, last: the two measurements differ by what the machine alone does to a
        # step (other jobs, caches, the scheduler), the floor under any model's error here.
        first = suite.replay[0]
        say(f"recording {first.label} again (the measurement's own noise)")
        again, _ = replay(record(suite, suite_path, first, out, label=f"{first.label}-again"), str(profile))
        repeat = (first.label, outcomes[0].measured_s, again["step_seconds"]["measured"])
    return SuiteResult(suite_path, profile, outcomes, suite.criteria, os.getloadavg(), cores,
                       {k: report.get(k) for k in ("collectives", "compute", "warning")}, time.perf_counter() - started,
                       repeat, steal_share(counters, cpu_times()))


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


@dataclass(slots=True)
class SuitePlan:
    """What a replay suite would do (`zsim validate replay --dry-run`): the suite checked (its file, base
    profile and every entry's model, as the runtime reads it) and the recordings listed, nothing run."""

    suite: Path
    spec: SuiteFile
    models: dict[str, Path]  # entry label -> the scenario file the runtime would train
    torch: str | None  # torch's version, None when it is not installed

    @property
    def passed(self) -> bool:
        """Always True: a suite that does not check out raises ConfigError instead."""
        return True

    @property
    def recordings(self) -> int:
        """Runtime runs a full suite records: every entry `repeats` times, and one more when repeats is 1."""
        entries = len(self.spec.calibrate) + len(self.spec.replay)
        return entries * self.spec.repeats + (1 if self.spec.repeats == 1 else 0)

    def table(self) -> str:
        s = self.spec
        lines = [f"zsim validate replay --dry-run · {self.suite}: the suite checks out; nothing recorded",
                 f"  would record {self.recordings} runs of {s.ranks} ranks × {s.steps} steps ({s.precision}), "
                 f"calibrate {s.base_profile} ({s.fit}) on {len(s.calibrate)} and replay {len(s.replay)}, judged "
                 f"by median |step error| <= {s.criteria.median_step_error:.0%}, worst <= "
                 f"{s.criteria.max_step_error:.0%}"]
        for role, entries in (("calibrate", s.calibrate), ("replay", s.replay)):
            lines += [f"  {role:<9}  {e.label:<26} {self.models[e.label]}" for e in entries]
        lines.append(f"  torch {self.torch}" if self.torch else
                     "  torch not installed: recording needs it (pip install 'zsim[runtime]'; README, Installing)")
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        return {"suite": str(self.suite), "dry_run": True, "recordings": self.recordings, "ranks": self.spec.ranks,
                "steps": self.spec.steps, "base_profile": self.spec.base_profile,
                "calibrate": [e.label for e in self.spec.calibrate], "replay": [e.label for e in self.spec.replay],
                "models": {k: str(v) for k, v in self.models.items()}, "torch": self.torch}


def plan_suite(suite_path: Path = DEFAULT_SUITE) -> SuitePlan:
    """Check a suite without recording (seconds, no torch needed): the file, its base profile and each
    entry's model as the runtime would read it.

    Raises:
        ConfigError: a bad suite file, a missing scenario, or a model the runtime would refuse.
    """
    import importlib.metadata

    suite = load_suite(suite_path)  # every entry's model read and its run checked (check_entry)
    models = {entry.label: scenario_path(suite_path, entry.scenario) for entry in (*suite.calibrate, *suite.replay)}
    try:
        torch = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch = None
    return SuitePlan(suite_path, suite, models, torch)


def run(progress: bool = False, suite_file: Path | None = None, output: Path | None = None,
        dry_run: bool = False) -> SuiteResult | SuitePlan:
    """The suite entry point of `zsim validate replay` (zsim.validate.SUITES); `dry_run` checks the suite
    and says what it would record (plan_suite) instead of running it."""
    if dry_run:
        return plan_suite(suite_file or DEFAULT_SUITE)
    say = (lambda message: print(f"  {message}", file=sys.stderr, flush=True)) if progress else None
    return run_suite(suite_file or DEFAULT_SUITE, output or Path("out/validate-replay"), progress=say)
