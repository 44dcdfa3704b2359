"""A replay suite file (`zsim validate replay`): its schema, loading it with every entry checked as the
runtime would check it, and the dry run that says what it would record (zsim.validate.replay runs it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from zsim.config.struct import Meta, Section
from zsim.config.validation import validate
from zsim.config.yamlfile import read_yaml_mapping
from zsim.errors import ConfigError

DEFAULT_SUITE = Path(__file__).resolve().parent / "suites" / "replay-cpu.yaml"


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


@dataclass(slots=True)
class SuitePlan:
    """What a replay suite would do (`zsim validate replay --dry-run`): the suite checked (its file, base
    profile and every entry's model, as the runtime reads it) and the recordings listed, nothing run."""

    suite: Path
    spec: SuiteFile
    models: dict[str, Path]  # entry label -> the scenario file the runtime would train
    torch: str | None  # torch's version, None when it is not installed
    machine: str | None = None  # why this machine's runs would be refused by the calibration (machine_mismatch)

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
        if self.machine:
            lines.append(f"  refused here: {self.machine}")
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        return {"suite": str(self.suite), "dry_run": True, "recordings": self.recordings, "ranks": self.spec.ranks,
                "steps": self.spec.steps, "base_profile": self.spec.base_profile,
                "calibrate": [e.label for e in self.spec.calibrate], "replay": [e.label for e in self.spec.replay],
                "models": {k: str(v) for k, v in self.models.items()}, "torch": self.torch,
                "refused_here": self.machine}


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
    return SuitePlan(suite_path, suite, models, torch, machine_mismatch(suite))


def machine_mismatch(suite: SuiteFile) -> str | None:
    """Why `zsim calibrate` would refuse this machine's recordings for the suite's base profile (a host profile
    measured on another CPU model: zsim.calibrate.machines), with what to do instead; None when they match or
    the profile states no CPU."""
    from zsim.calibrate.machines import cpu_part, profile_parts, this_cpu
    from zsim.fabric.cluster import load_cluster

    _, cpu = profile_parts(load_cluster(suite.base_profile, 1))
    here = this_cpu()
    if not cpu or cpu_part(cpu) == cpu_part(here):
        return None
    return (f"this machine's CPU is {here}, but the base profile '{suite.base_profile}' was measured on {cpu}, so "
            "the calibration would refuse its runs: measure a host profile of this machine (python -m "
            "zsim.runtime.hostprobe --name NAME --ranks R --threads T -o hwprofiles/hosts/NAME.yaml; "
            "docs/host-profiles.md) and name it as base_profile in a copy of the suite (--suite-file)")
