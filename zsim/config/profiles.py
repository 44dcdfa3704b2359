"""Where hardware profiles come from: user folders first, then the ones shipped with zsim.

One resolver for every kind of profile (docs/profiles.md). A kind is a subfolder of a profile folder:

    <folder>/<name>.yaml             system profiles (kind "system")
    <folder>/gpus/<name>.yaml        GPUs            (kind "gpu")
    <folder>/networks/<name>.yaml    networks        (kind "network")
    <folder>/links/<name>.yaml       host links      (kind "link")
    <folder>/hosts/<name>.yaml       host CPUs       (kind "host")

Folders are searched in this order, the first match wins:
  1. the folders given with `--profiles DIR` (repeatable), in the order given;
  2. the folders in $ZSIM_PROFILE_PATH (separated by os.pathsep, ':' on Linux);
  3. the built-in profiles, package data `zsim.hwprofiles` (its import spec's folder).
So a user system may name built-in GPUs, networks and links, and a user file of the same name
shadows a built-in one. Profile names are names, never paths: a scenario file cannot point zsim at
an arbitrary file. Only the command line can (`--profile path/to/x.yaml`), through `pinned`.
"""

from __future__ import annotations

import difflib
import functools
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
import importlib.util
from pathlib import Path

from zsim.errors import ConfigError

ENV_VAR = "ZSIM_PROFILE_PATH"

# kind -> subfolder of a profile folder. Add a kind here and every command finds and lists it.
KINDS: dict[str, str] = {"system": "", "gpu": "gpus", "network": "networks", "link": "links", "host": "hosts"}

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")


def builtin_folder(package: str = "zsim.hwprofiles") -> Path:
    """The folder of a data package shipped with zsim (`zsim.hwprofiles`, `zsim.scenarios`).

    Wheels install unzipped, so the package is a real folder: its import spec's one search location,
    which is what importlib.resources.files() returns for such a package (importing
    importlib.resources costs a flagship run 18 ms by `python -X importtime`: tempfile, random, zipfile). Anything else is an
    installation zsim does not support (an AssertionError, not a user mistake)."""
    spec = importlib.util.find_spec(package)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    assert len(locations) == 1, f"{package} is not installed as one folder: {locations!r}"
    return Path(locations[0])


@functools.lru_cache(maxsize=1)
def _shipped_roots() -> tuple[Path, ...]:
    return tuple(builtin_folder(package).resolve() for package in ("zsim.hwprofiles", "zsim.scenarios"))


def shipped_file(path: Path) -> bool:
    """Whether `path` is a file shipped with zsim: inside the built-in profiles or scenarios (package
    data), symbolic links resolved (a link from there to elsewhere is not shipped)."""
    try:
        resolved = path.resolve()
    except (OSError, RuntimeError):  # a loop of links, a vanished folder: not ours
        return False
    return any(resolved.is_relative_to(root) for root in _shipped_roots())


def check_name(kind: str, name: str) -> None:
    """A profile name is a name: letters, digits, '.', '_', '+', '-', no folder and no '.yaml'.

    Raises:
        ConfigError: `name` looks like a path.
    """
    if not _NAME.fullmatch(name) or name.endswith((".yaml", ".yml")):
        raise ConfigError(f"{name!r} is not a {kind} profile name (a name such as 'dgx2', not a path; "
                          f"add folders with --profiles DIR or ${ENV_VAR})")


@dataclass(frozen=True)
class Profiles:
    """The profile search path: `folders` (user folders, in order) before the built-in folder, and
    `pinned` files the user named on the command line ({(kind, name): path}).

    Build it with `Profiles.from_environment(...)`; a plain `Profiles()` ignores $ZSIM_PROFILE_PATH."""

    folders: tuple[Path, ...] = ()
    pinned: Mapping[tuple[str, str], Path] = field(default_factory=dict)

    @classmethod
    def from_environment(cls, folders: Iterable[str | Path] = (), environ: Mapping[str, str] | None = None
                         ) -> Profiles:
        """`folders` (from --profiles) then $ZSIM_PROFILE_PATH's. Raises ConfigError for a folder that
        does not exist (a typo would otherwise silently fall back to the built-in profiles)."""
        environ = os.environ if environ is None else environ
        given = [(Path(f), "--profiles") for f in folders]
        given += [(Path(f), f"${ENV_VAR}") for f in environ.get(ENV_VAR, "").split(os.pathsep) if f]
        for folder, origin in given:
            if not folder.is_dir():
                raise ConfigError(f"{origin} {folder}: no such folder")
        return cls(folders=tuple(f for f, _ in given))

    def with_system_file(self, path: str | Path) -> tuple[Profiles, str]:
        """Pin a system profile file the user typed (`--profile x/y.yaml`): returns the new search
        path and the name that now refers to it (the file's stem). The file's own folder is searched
        first for the GPUs, networks and links it names.

        Raises:
            ConfigError: the file does not exist.
        """
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"--profile {path}: no such file")
        pinned = {**self.pinned, ("system", path.stem): path}
        return Profiles(folders=(path.parent, *self.folders), pinned=pinned), path.stem

    def resolve_system(self, text: str) -> tuple[Profiles, str]:
        """A `--profile` argument: a name, or a path to a .yaml file. Returns (profiles, name)."""
        if text.endswith((".yaml", ".yml")) or os.sep in text or "/" in text:
            return self.with_system_file(text)
        check_name("system", text)
        return self, text

    @property
    def roots(self) -> tuple[Path, ...]:
        """Folders in search order, the built-in one last."""
        return (*self.folders, builtin_folder())

    def path(self, kind: str, name: str) -> Path:
        """The file of profile `name` of `kind`.

        Raises:
            ConfigError: `name` is not a name, or no folder has it (with the close names, or all).
        """
        if (kind, name) in self.pinned:
            return self.pinned[(kind, name)]
        check_name(kind, name)
        for root in self.roots:
            candidate = root / KINDS[kind] / f"{name}.yaml"
            if candidate.is_file() and _inside(candidate, root):
                return candidate
        known = sorted(self.names(kind))
        close = difflib.get_close_matches(name, known, n=3) or [k for k in known if name.lower() in k.lower()][:3]
        hint = f"did you mean {', '.join(repr(c) for c in close)}?" if close else \
            f"known: {', '.join(known) or 'none'}"
        searched = ", ".join(str(r / KINDS[kind]) for r in self.roots)
        raise ConfigError(f"no {kind} profile '{name}' ({hint}); searched {searched}")

    def names(self, kind: str) -> dict[str, Path]:
        """Every profile of `kind`: {name: file}, the first folder in search order winning."""
        found: dict[str, Path] = {}
        for (k, name), p in self.pinned.items():
            if k == kind:
                found[name] = p
        for root in self.roots:
            folder = root / KINDS[kind]
            if folder.is_dir():
                for p in sorted(folder.glob("*.yaml")):
                    if _inside(p, root):
                        found.setdefault(p.stem, p)
        return found

    def shadowed(self, kind: str, name: str) -> list[Path]:
        """Files of `kind`/`name` hidden behind the one `path` returns (later in the search path)."""
        files = [r / KINDS[kind] / f"{name}.yaml" for r in self.roots]
        files = [f for f, r in zip(files, self.roots) if f.is_file() and _inside(f, r)]
        return files[1:] if (kind, name) not in self.pinned else files


def _inside(path: Path, root: Path) -> bool:
    """Whether `path`, its symlinks followed, lies in `root` (also followed): a link in a profile folder
    to a file outside it is not a profile of that folder (issue 28), as a profile name is never a path."""
    try:
        return path.resolve().is_relative_to(root.resolve())
    except (OSError, RuntimeError):  # a link loop
        return False
