"""Writing a calibrated profile: the base profile with its fitted sections replaced, and a
`provenance` block (inputs, date, fitted and kept terms, residuals) that says where every number
came from. The result is a normal profile: `zsim run --profile OUT.yaml` loads it."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import yaml

from zsim import __version__
from zsim.config.profiles import Profiles
from zsim.config.yamlfile import read_yaml_mapping
from zsim.errors import ConfigError
from zsim.fabric.nccl import LL128_COLLECTIVES, PROTOCOLS


class _NoAliases(yaml.SafeDumper):
    """Writes a value twice rather than as a YAML anchor and alias (people read these files)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def base_file(profile: str, profiles: Profiles | None = None) -> Path:
    """The YAML file of a system or host profile: a name found by `profiles` (default: $ZSIM_PROFILE_PATH,
    then the built-in profiles), or a .yaml path.

    Raises:
        ConfigError: no such profile.
    """
    profiles, name = (Profiles.from_environment() if profiles is None else profiles).resolve_system(profile)
    try:
        return profiles.path("system", name)
    except ConfigError:
        if name in profiles.names("host"):
            return profiles.path("host", name)
        raise ConfigError(f"no system or host profile '{profile}' (zsim profiles lists them)") from None


def nccl_section(values: dict[str, float], tuner: str) -> dict[str, Any]:
    """The `nccl:` mapping of a system profile from fitted values (profile units, 4 significant digits)
    and the tuner release they were fitted under (the base profile's: the fit depends on it)."""
    r = lambda v: float(f"{v:.4g}")  # noqa: E731
    return {
        "tuner": tuner,
        "launch_us": r(values["launch_us"]),
        "efficiency": {"LL": r(values["efficiency.LL"]),
                       "LL128": {fn: r(values[f"efficiency.LL128.{fn}"]) for fn in LL128_COLLECTIVES},
                       "Simple": r(values["efficiency.Simple"])},
        "latency_us": {p: r(values[f"latency_us.{p}"]) for p in PROTOCOLS},
        "step_latency_us": {p: r(values[f"step_latency_us.{p}"]) for p in PROTOCOLS},
        "unaligned_copy_GBps": r(values["unaligned_copy_GBps"]),
        "unaligned_reduce_GBps": r(values["unaligned_reduce_GBps"]),
    }


def provenance(base: str, sources: list[dict[str, Any]], sections: dict[str, Any]) -> dict[str, Any]:
    """The provenance block: tool, version, UTC date, base profile, inputs, and per fitted section
    what was fitted, kept and how well it fits."""
    return {"tool": "zsim calibrate", "zsim": __version__,
            "date": dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat(),
            "base": base, "inputs": sources, **sections}


def write_profile(base: str, replace: dict[str, Any], prov: dict[str, Any], out: Path,
                  profiles: Profiles | None = None) -> Path:
    """Write the base profile with `replace`d top-level sections and `provenance` to `out`
    atomically (temporary name, then rename).

    Raises:
        ConfigError: the base cannot be read or the output cannot be written.
    """
    data = read_yaml_mapping(base_file(base, profiles))
    data.pop("provenance", None)
    data.update(replace)
    data["provenance"] = prov
    header = (f"# Calibrated by `zsim calibrate` from profile '{base}' on {prov['date']}.\n"
              "# Fitted sections replace the base's; `provenance` lists the inputs, the fitted and kept terms\n"
              "# and the residuals. Load it with --profile " + str(out) + "\n")
    if prov.get("warning"):  # a poor fit written with --accept-poor-fit (zsim.calibrate.fit_quality)
        header += "# WARNING: a poor fit, written with --accept-poor-fit; the causes are in provenance.warning\n"
    text = header + yaml.dump(data, Dumper=_NoAliases, sort_keys=False, default_flow_style=None, width=110,
                              allow_unicode=True)
    from zsim.report.outputs import write_atomic

    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot write the profile: {exc.strerror}", source=str(out)) from None
    return write_atomic(out, text)  # whole or absent (zsim.report.outputs)
