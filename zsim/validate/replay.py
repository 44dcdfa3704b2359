"""Held-out validation of the twin loop (`zsim validate replay`): record real runs with the runtime,
calibrate a profile on some of them, replay the others, and judge the errors.

A suite (zsim/validate/suites/replay-cpu.yaml) names the base profile, the ranks, the steps, the
configurations to calibrate on and the held-out ones to replay (scenario, ZeRO stage, gradient
accumulation), and the criteria: zsim.validate.replay_suite reads it, zsim.validate.replay_result holds the
verdict. Recording and judging happen in one run, so the timings the fit sees and the ones it is judged
against come from the same machine state. Runs with more ranks than the machine has cores time-slice
(DESIGN.md: 10-30x variation) and are reported, not judged.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from zsim.errors import ConfigError, ZsimError
from zsim.validate.replay_result import STEAL_WARNING, Outcome, SuiteResult, table
from zsim.validate.replay_suite import (DEFAULT_SUITE, Criteria, Entry, SuiteFile, SuitePlan, check_entry, load_suite,
                                        machine_mismatch, plan_suite, scenario_path)

# The suite's API in one place (its schema and verdict live in the two modules above).
__all__ = ["DEFAULT_SUITE", "STEAL_WARNING", "Criteria", "Entry", "Outcome", "SuiteFile", "SuitePlan", "SuiteResult",
           "check_entry", "cpu_times", "interleaved", "load_suite", "plan_suite", "record", "run", "run_suite",
           "scenario_path", "steal_share", "table"]


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
        ConfigError: a bad suite file, or a base profile measured on another CPU than this machine's (before
            anything is recorded). ZsimError: a run failed, or calibration refused.
    """
    from zsim.commands.calibrate import calibrate
    from zsim.commands.replay import replay

    import importlib.util

    started, counters = time.perf_counter(), cpu_times()
    suite = load_suite(suite_path)
    if importlib.util.find_spec("torch") is None:  # before the first recording fails on `import torch`
        raise ZsimError("zsim validate replay records real runs with the runtime, which needs torch: "
                        "pip install 'zsim[runtime]' (README, Installing; --dry-run checks the suite without it)")
    mismatch = machine_mismatch(suite)  # before minutes of recording that the calibration would refuse
    if mismatch:
        raise ConfigError(mismatch, source=str(suite_path), path="base_profile")
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


def run(progress: bool = False, suite_file: Path | None = None, output: Path | None = None,
        dry_run: bool = False) -> SuiteResult | SuitePlan:
    """The suite entry point of `zsim validate replay` (zsim.validate.SUITES); `dry_run` checks the suite
    and says what it would record (plan_suite) instead of running it."""
    if dry_run:
        return plan_suite(suite_file or DEFAULT_SUITE)
    say = (lambda message: print(f"  {message}", file=sys.stderr, flush=True)) if progress else None
    return run_suite(suite_file or DEFAULT_SUITE, output or Path("out/validate-replay"), progress=say)
