"""Reading the files users give zsim (YAML, JSON, text tables) so that every read either decodes or
fails with a one-line ConfigError, and validating them against the config models (msgspec Structs,
zsim.config.struct) with errors that name the key path and the bad value.

YAML is read strictly (issue 13): a file larger than MAX_FILE_BYTES, nesting deeper than MAX_DEPTH,
more than MAX_NODES nodes once aliases are expanded (a "billion laughs" alias bomb is a few hundred
bytes), or a key given twice in one mapping is an error, not last-wins. Error messages quote at most a
short prefix of a bad value, with control characters escaped (`short`).

Files shipped with zsim (the built-in profiles and scenarios, package data) are parsed by libyaml
(PyYAML's CSafeLoader, ~9x faster than the pure-Python parser: 25 ms of the flagship's 5 files
become 3 ms), still with the duplicate-key check. The depth and alias limits guard against hostile
or runaway input; package data is as trusted as zsim's own code, and tests/test_fast_start.py checks
that every shipped file is within the limits and parses to the same data with the strict loader.
Every other file (yours, including --profiles folders) goes through the strict pure-Python loader.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import re
import stat
import typing
from pathlib import Path
from typing import Any

import msgspec
import yaml

from zsim.config.profiles import shipped_file
from zsim.errors import ConfigError, printable, short

MAX_FILE_BYTES = 1 << 20  # scenarios and profiles are a few KB; 1 MiB leaves room and bounds the work
MAX_DEPTH = 32  # nesting of mappings and sequences (a scenario needs 4)
MAX_NODES = 100_000  # YAML nodes after alias expansion
def read_text(path: Path, *, what: str = "file", max_bytes: int = MAX_FILE_BYTES) -> str:
    """The UTF-8 text of `path`, at most `max_bytes` long.

    Raises:
        ConfigError: missing, a folder, unreadable, too large, or not UTF-8 (naming the file).
    """
    source = str(path)
    try:
        mode = os.stat(path).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError
        if not stat.S_ISREG(mode):  # a FIFO would block, a device never ends
            raise ConfigError(f"not a regular file, expected a {what}", source=source)
        with open(path, "rb") as fh:
            data = fh.read(max_bytes + 1)
    except FileNotFoundError:
        raise ConfigError("no such file", source=source) from None
    except IsADirectoryError:
        raise ConfigError(f"is a folder, expected a {what}", source=source) from None
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror or exc}", source=source) from None
    if len(data) > max_bytes:
        raise ConfigError(f"larger than {max_bytes:,} bytes: not a {what}", source=source)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"not UTF-8 text (byte {exc.start}: {data[exc.start:exc.start + 1]!r}): not a {what}",
                          source=source) from None


def read_json(path: Path, *, what: str = "JSON file", max_bytes: int = 1 << 31) -> Any:
    """A parsed JSON document. Raises ConfigError (unreadable, not UTF-8, not JSON, too deep)."""
    text = read_text(path, what=what, max_bytes=max_bytes)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"not valid JSON (line {exc.lineno}, column {exc.colno}): {exc.msg}", source=str(path)) \
            from None
    except RecursionError:
        raise ConfigError("not valid JSON: nested too deeply", source=str(path)) from None


class _NoDuplicateKeys:
    """A loader mix-in: a key given twice in one mapping is an error (YAML 1.2 forbids it; PyYAML keeps
    the last)."""

    def construct_mapping(self, node, deep=False):  # type: ignore[no-untyped-def]
        seen: dict[Any, int] = {}
        if isinstance(node, yaml.MappingNode):
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)  # type: ignore[attr-defined]
                try:
                    hash(key)
                except TypeError:
                    raise yaml.constructor.ConstructorError(
                        None, None, "a key must be a plain value, not a list or mapping", key_node.start_mark) from None
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {short(key)} (first on line {seen[key] + 1})", key_node.start_mark)
                seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)  # type: ignore[misc]


class _StrictLoader(_NoDuplicateKeys, yaml.SafeLoader):
    """SafeLoader with limits: nesting depth, node count after alias expansion, no duplicate keys."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._weights: dict[int, int] = {}  # id(node) -> nodes it expands to (aliases share nodes)
        self._nodes = 0

    def compose_node(self, parent, index):  # type: ignore[override]
        if self.check_event(yaml.AliasEvent):
            node = super().compose_node(parent, index)
            self._count(self._weights.get(id(node), 1), node)
            return node
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise yaml.composer.ComposerError(None, None, f"nested more than {MAX_DEPTH} levels deep",
                                              self.peek_event().start_mark)
        before = self._nodes
        node = super().compose_node(parent, index)
        self._depth -= 1
        self._weights[id(node)] = self._nodes - before + 1
        self._count(1, node)
        return node

    def _count(self, n: int, node) -> None:
        self._nodes += n
        if self._nodes > MAX_NODES:
            raise yaml.composer.ComposerError(None, None, f"more than {MAX_NODES:,} values once aliases are expanded",
                                              node.start_mark)


if yaml.__with_libyaml__:
    class _PackageDataLoader(_NoDuplicateKeys, yaml.CSafeLoader):  # type: ignore[misc]
        """libyaml's parser with SafeLoader's constructor and the duplicate-key check: for files
        shipped with zsim only (the module's docstring says why)."""
else:  # a PyYAML built without libyaml: the strict loader for everything
    _PackageDataLoader = _StrictLoader  # type: ignore[misc]


def parse_yaml(text: str, source: str, *, shipped: bool = False) -> Any:
    """Parse one YAML document strictly (limits above); `shipped`: the text is a file shipped with
    zsim, parsed by libyaml with the duplicate-key check only (see the module's docstring).

    Raises:
        ConfigError: not valid YAML, a duplicate key, too deep or too large; with the line.
    """
    loader = None
    try:
        # the strict reader rejects control characters here already
        loader = _PackageDataLoader(text) if shipped else _StrictLoader(text)
        return loader.get_single_data()
    except yaml.reader.ReaderError as exc:
        raise ConfigError(f"not valid YAML: control character {_codepoint(exc.character)} at character {exc.position} "
                          "(YAML allows only printable text)", source=source) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"not valid YAML{where}: {printable(problem, 120)}", source=source) from None
    except RecursionError:  # a guard of last resort: MAX_DEPTH stops nesting long before this
        raise ConfigError("not valid YAML: nested too deeply", source=source) from None
    except (ValueError, OverflowError, TypeError) as exc:  # a constructor on an odd scalar (dates, ...)
        raise ConfigError(f"not valid YAML: {printable(str(exc), 120)}", source=source) from None
    finally:
        if loader is not None:
            loader.dispose()


def read_yaml_mapping(path: Path, *, what: str = "YAML file") -> dict[str, Any]:
    """Load a YAML file whose top level is a mapping.

    Raises:
        ConfigError: the file is missing, unreadable, not UTF-8, too large, not valid (strict) YAML, or not
            a mapping.
    """
    data = parse_yaml(read_text(Path(path), what=what), str(path), shipped=shipped_file(Path(path)))
    if not isinstance(data, dict):
        raise ConfigError(f"expected a mapping of keys at the top level, got {type(data).__name__}", source=str(path))
    return data


def _unwrap(t: Any) -> Any:
    """`t` without Annotated and Optional (the first non-None member of a union)."""
    while True:
        origin = typing.get_origin(t)
        if origin is typing.Annotated:
            t = typing.get_args(t)[0]
        elif origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
            members = [a for a in typing.get_args(t) if a is not type(None)]
            structs = [a for a in members if isinstance(a, type) and issubclass(a, msgspec.Struct)]
            t = (structs or members or [Any])[0]
        else:
            return t


def _type_at(model: type, path: list[Any]) -> Any:
    """The type of the value at `path` (field names, dict keys, list indices) in `model`, or Any."""
    current: Any = model
    for part in path:
        current = _unwrap(current)
        if isinstance(current, type) and issubclass(current, msgspec.Struct):
            names = {f.name: f.type for f in msgspec.structs.fields(current)}
            current = names.get(part, Any) if isinstance(part, str) else Any
        elif typing.get_origin(current) is dict:
            current = typing.get_args(current)[1]
        elif typing.get_origin(current) is list:
            current = typing.get_args(current)[0]
        else:
            return Any
    return _unwrap(current)


def _owner(model: type, path: list[Any]) -> type | None:
    """The model class whose fields the mapping at `path` holds, or None."""
    t = _type_at(model, path)
    return t if isinstance(t, type) and issubclass(t, msgspec.Struct) else None


def _literal_options(model: type, path: list[Any]) -> list[Any]:
    """The values a Literal field (or Literal dict key) at `path` allows, or []."""
    t = _type_at(model, path)
    return list(typing.get_args(t)) if typing.get_origin(t) is typing.Literal else []


def _resolve(model: type, data: Any, path: list[Any]) -> list[Any]:
    """`path` with each elided dict key (msgspec writes `[...]`) replaced by the first key whose
    value does not validate against the dict's value type."""
    out: list[Any] = []
    for part in path:
        if part == "..." and isinstance(_value_at(data, out), dict):
            value_type = typing.get_args(_type_at(model, out))[1:2]
            for key, value in _value_at(data, out).items():
                try:
                    if value_type:
                        msgspec.convert(value, value_type[0], strict=True)
                except msgspec.ValidationError:
                    part = key
                    break
        out.append(part)
    return out


def _value_at(data: Any, path: list[Any]) -> Any:
    for part in path:
        try:
            data = data[part]
        except (KeyError, IndexError, TypeError):
            return None
    return data


_AT = re.compile(r"^(?P<msg>.*?)(?: - at `(?P<key>key)` in `\$(?P<keypath>.*)`| - at `\$(?P<path>.*)`)?$", re.S)
_STEP = re.compile(r"\.([^.\[]+)|\[(\d+)\]|\[(.*?)\]")
_TYPES = {"int": "an integer", "float": "a number", "str": "a string", "bool": "true or false", "array": "a list",
          "object": "a mapping", "null": "nothing (null)"}
# One pattern for Python's re (msgspec) and an editor's ECMA regex (the JSON Schema); `(?!\n)` because
# Python's `$` also matches before a final line break ("dgx2\n" is not a name).
PROFILE_NAME_PATTERN = r"^(?!.*\.\.)[A-Za-z0-9][A-Za-z0-9._+-]{0,99}$(?!\n)"
PROFILE_NAME_RULE = "a profile name (letters, digits, '.', '_', '+', '-'), not a path"


def _path(text: str | None) -> list[Any]:
    out: list[Any] = []
    for key, index, other in _STEP.findall(text or ""):
        out.append(int(index) if index else (key or other.strip("'\"")))
    return out


def _describe(message: str, model: type, data: Any) -> tuple[str, str]:
    """(dotted path, message) for a msgspec validation error, with a short prefix of the bad value."""
    found = _AT.match(message)
    text = found.group("msg")
    path = _resolve(model, data, _path(found.group("path") if found.group("key") is None else found.group("keypath")))
    if found.group("key") is not None:  # a bad key of a mapping: the message is about the key
        key_type = typing.get_args(_type_at(model, path))[:1]
        bad = next((k for k in (_value_at(data, path) or {}) if key_type and not _valid(k, key_type[0])), None)
        options = list(typing.get_args(_unwrap(key_type[0]))) if key_type else []
        choices = f"one of {', '.join(repr(o) for o in options)}" if options else "a valid key"
        return ".".join(printable(str(k), 40) for k in path), f"key {short(bad)} must be {choices}"
    dotted = lambda p: ".".join(printable(str(k), 40) for k in p)  # noqa: E731
    unknown = re.match(r"Object contains unknown field `(.*)`$", text, re.S)
    if unknown:
        path.append(unknown.group(1))
        owner = _owner(model, path[:-1])
        # the keys as written in the file (`from`, `to` of a sweep range), not the attribute names
        known = sorted(f for f in owner.__struct_encode_fields__ if not f.startswith("_")) if owner else []
        close = difflib.get_close_matches(str(path[-1])[:100], known, n=1, cutoff=0.6)
        hint = f"; did you mean '{close[0]}'?" if close else (f"; known keys: {', '.join(known)}" if known else "")
        return dotted(path), f"unknown key{hint}"
    missing = re.match(r"Object missing required field `(.*)`$", text, re.S)
    if missing:
        return dotted(path + [missing.group(1)]), "required key is missing"
    value = _value_at(data, path)
    wrong = re.match(r"Expected `([\w |]+)`, got `(\w+)`$", text)
    if wrong:
        want = " or ".join(_TYPES.get(w, w) for w in wrong.group(1).split(" | ") if w != "null")
        return dotted(path), f"must be {want} (got {short(value)})"
    bound = re.match(r"Expected `(\w+)` ([<>]=?) (\S+)$", text)
    if bound:
        want, op, limit = bound.groups()
        return dotted(path), f"must be {_TYPES.get(want, want)} {op} {limit} (got {short(value)})"
    if text.startswith("Expected `str` matching regex"):
        if PROFILE_NAME_PATTERN in text.encode().decode("unicode_escape"):
            return dotted(path), f"{PROFILE_NAME_RULE} (got {short(value)})"
        pattern = text.split("regex", 1)[1].strip()
        return dotted(path), f"must match {printable(pattern, 80)} (got {short(value)})"
    length = re.match(r"Expected `(\w+)` of length ([<>]=?) (\d+)$", text)
    if length:
        want, op, limit = length.groups()
        noun = "characters" if want == "str" else "items" if want == "array" else "keys"
        return dotted(path), f"must have {op} {limit} {noun} (got {short(value)})"
    if text.startswith("Invalid enum value") and path:
        options = _literal_options(model, path)
        choices = f"one of {', '.join(repr(o) for o in options)}" if options else "one of the allowed values"
        return dotted(path), f"must be {choices} (got {short(value)})"
    return dotted(path), printable(text, 160)


def _valid(value: Any, t: Any) -> bool:
    try:
        msgspec.convert(value, t, strict=True)
        return True
    except msgspec.ValidationError:
        return False


def _non_finite(data: Any, path: list[Any]) -> list[Any] | None:
    """The path of the first .inf or .nan in `data`, or None."""
    if isinstance(data, float) and not math.isfinite(data):
        return path
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    for key, value in items:
        found = _non_finite(value, path + [key])
        if found is not None:
            return found
    return None


def validate(model: type, data: dict[str, Any], source: str) -> Any:
    """Validate `data` against `model` (a Struct class, zsim.config.struct).

    Raises:
        ConfigError: naming the file, the dotted key of the first error and the bad value.
    """
    bad = _non_finite(data, [])
    if bad is not None:
        raise ConfigError(f"must be a finite number (got {_value_at(data, bad)})", source=source,
                          path=".".join(printable(str(k), 40) for k in bad))
    try:
        return msgspec.convert(data, model, strict=True)
    except msgspec.ValidationError as exc:
        path, message = _describe(str(exc), model, data)
        raise ConfigError(message, source=source, path=path) from None


def _codepoint(character: object) -> str:
    return f"U+{character:04X}" if isinstance(character, int) else repr(character)
