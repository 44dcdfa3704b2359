"""The scenario and sweep files shipped with zsim (package data `zsim.scenarios`, found through the
package, so an installed wheel finds them as a checkout does), and the names users type for them.

A shipped file's name is its path below scenarios/ without '.yaml' ('1T-1024gpu',
'paper/7.5B-64gpu-stage3', 'whatif/ib-bandwidth-1T'); its last part alone also names it when no other
file has that last part. A sweep file is told from a scenario by its top-level `base:` key (the
scenario it varies, docs/sweep.md), which no scenario has.
"""

from __future__ import annotations

import re
from pathlib import Path

from zsim.config.profiles import builtin_folder
from zsim.errors import ConfigError

_BASE_KEY = re.compile(r"^base\s*:", re.MULTILINE)  # a sweep file's top-level key, in block-style YAML


def shipped_files() -> dict[str, Path]:
    """Every shipped scenario and sweep file: {name: file}, sorted by name."""
    root = builtin_folder("zsim.scenarios")
    return {p.relative_to(root).with_suffix("").as_posix(): p for p in sorted(root.rglob("*.yaml"))}


def is_sweep_text(text: str) -> bool:
    """Whether a YAML text is a sweep file: a top-level `base:` key (the shipped files are block style)."""
    return _BASE_KEY.search(text) is not None


def is_sweep_mapping(data: object) -> bool:
    """Whether a parsed YAML document is shaped like a sweep file (a top-level `base`)."""
    return isinstance(data, dict) and "base" in data


def shipped_sweeps() -> dict[str, Path]:
    """The shipped sweep files (`zsim sweep NAME`): {name: file}."""
    return {n: p for n, p in shipped_files().items() if is_sweep_text(p.read_text(encoding="utf-8"))}


def shipped_scenarios() -> dict[str, Path]:
    """The shipped scenarios (`zsim run NAME`), sweep files left out: {name: file}."""
    sweeps = shipped_sweeps()
    return {n: p for n, p in shipped_files().items() if n not in sweeps}


def shipped_name(path: Path) -> str | None:
    """The name of a shipped file (`path` resolved), or None when `path` is not one."""
    root = builtin_folder("zsim.scenarios").resolve()
    try:
        relative = Path(path).resolve().relative_to(root)
    except (ValueError, OSError, RuntimeError):
        return None
    return relative.with_suffix("").as_posix() if relative.suffix == ".yaml" else None


def command_name(path: Path) -> str:
    """How a command line names `path`: its shipped name, else the path as given."""
    return shipped_name(path) or str(path)


def find_file(text: str | Path, what: str = "scenario") -> Path:
    """A file the user named: an existing file, else a shipped file's name, with or without
    'scenarios/' and '.yaml' (so `scenarios/whatif/ib-bandwidth-1T.yaml` works from any folder).
    Scenarios and sweeps share one name space: a command given the other kind says so when it reads it.

    Raises:
        ConfigError: a folder or a non-regular file, or neither a file nor a shipped name (with the
        close names of `what`, 'scenario' or 'sweep').
    """
    path = Path(text)
    if path.is_file():
        return path
    key = path.as_posix().removeprefix("scenarios/").removesuffix(".yaml")
    shipped = shipped_files()
    short: dict[str, Path] = {}
    for name, file in shipped.items():
        short.setdefault(name.rsplit("/", 1)[-1], file)
    if key in shipped or key in short:
        return shipped.get(key) or short[key]
    if path.is_dir():
        raise ConfigError(f"is a folder, expected a {what} file (.yaml)", source=str(text))
    if path.exists():  # a FIFO, a device: read_text would say so, but only after the shipped names
        raise ConfigError(f"not a regular file, expected a {what} file (.yaml)", source=str(text))
    import difflib  # only on this error path: a flagship run does not pay for its import

    names = shipped_sweeps() if what == "sweep" else shipped_scenarios()
    candidates = list(dict.fromkeys([*names, *(n.rsplit("/", 1)[-1] for n in names)]))
    close = difflib.get_close_matches(key, candidates, n=3)
    hint = f"did you mean {', '.join(repr(c) for c in close)}?" if close else "`zsim profiles` lists them"
    raise ConfigError(f"no such file, and not a shipped {what} ({hint})", source=str(text))
