"""The scenario files a validation suite runs, with `zsim validate --set` overrides applied to each, so
that an assumption (a bucket size, `overlap_comm`, the MD mode) can be tried against the published
numbers without editing the files. The overrides are those of `zsim run --set` (dotted.key=value)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class ScenarioSet:
    """The scenarios of `folder`, each read with `overrides` applied."""

    folder: Path
    overrides: tuple[str, ...] = ()

    @classmethod
    def checked(cls, folder: Path, overrides, probe: str) -> "ScenarioSet":
        """The set, its overrides (if any) first validated against scenario `probe`.

        Raises:
            ConfigError: naming the key or value an override gets wrong.
        """
        scenarios = cls(folder, tuple(overrides))
        if scenarios.overrides:
            scenarios.check(probe)
        return scenarios

    def path(self, name: str) -> Path:
        """The file of scenario `name` (without .yaml); a glob pattern picks the first match.

        Raises:
            ConfigError: no file matches the pattern (a suite's scenarios missing from the install).
        """
        if any(ch in name for ch in "*?["):
            matches = sorted(self.folder.glob(f"{name}.yaml"))
            if not matches:
                from zsim.errors import ConfigError

                raise ConfigError(f"no scenario matches {name}.yaml (the suite's scenarios are missing)",
                                  source=str(self.folder))
            return matches[0]
        return self.folder / f"{name}.yaml"

    def mapping(self, name: str) -> dict[str, Any]:
        """The scenario as a mapping with the overrides set (for searches that vary it further).

        Raises:
            ConfigError: an unreadable file or an override through a value that is not a section.
        """
        from zsim.config.overrides import apply_overrides
        from zsim.config.yamlfile import read_yaml_mapping

        return apply_overrides(read_yaml_mapping(self.path(name)), list(self.overrides))

    def check(self, name: str) -> None:
        """Validate the overrides against scenario `name` once, before a suite runs.

        Raises:
            ConfigError: naming the key or value an override gets wrong, or runs past SUITE_STEPS or the
            cost `zsim run` accepts (zsim.zero.cost.check_cost).
        """
        from zsim.config.limits import limit, lift
        from zsim.scenario.scenario import load_scenario
        from zsim.errors import ConfigError, ZsimError

        from zsim.zero.cost import check_cost

        scenario = load_scenario(self.path(name), list(self.overrides))
        steps = scenario.run.steps
        most = limit("SUITE_STEPS")
        if steps > most:  # every run of the suite would simulate them all: minutes per step on the largest
            raise ConfigError(f"run.steps={steps}: a suite judges the step time, and runs at most {most} steps per "
                              f"scenario ({lift('SUITE_STEPS')})", path="--set")
        try:  # what `zsim run` refuses (--set model.grad_accum=1000000 ran on for minutes: issue 28)
            check_cost(scenario, trace=False)
        except ZsimError as exc:
            raise ConfigError(f"{' '.join(self.overrides)[:120]}: on {name}, {exc}", path="--set") from None

    def simulate(self, name: str):
        """(Result or None, error message) of scenario `name`: a suite reports a run that cannot be made
        (a ZsimError, e.g. a scenario the model refuses) as a failed point, not a crash."""
        return simulate_file(self.path(name), self.overrides)


def simulate_file(path: Path, overrides: tuple[str, ...] = ()):
    """(Result or None, error message) of the scenario file `path` with `overrides` (see ScenarioSet.simulate)."""
    from zsim.scenario.scenario import load_scenario
    from zsim.engine.simulation import simulate
    from zsim.errors import ZsimError

    from zsim.zero.cost import check_cost

    try:
        scenario = load_scenario(path, list(overrides))
        check_cost(scenario, trace=False)  # a point `zsim run` would refuse as too costly fails, at once
        return simulate(scenario), ""
    except ZsimError as exc:
        return None, str(exc)
