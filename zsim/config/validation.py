"""Validating data read from a file against a config model (a msgspec Struct, zsim.config.struct),
with errors that name the file, the dotted key path and a short prefix of the bad value.

msgspec stops at the first error and words it for programmers (`Expected `int` >= 1, got `0` - at
`$.hardware.gpus_per_node``); `validate` translates that message into the user's terms: the key as
written in the file, "did you mean" for a misspelt key, the allowed values of a Literal, and the
bad value itself.
"""

from __future__ import annotations

import difflib
import math
import re
import types
import typing
from typing import Any

import msgspec

from zsim.errors import ConfigError, printable, short


def _unwrap(t: Any) -> Any:
    """`t` without Annotated and Optional (the first non-None member of a union)."""
    while True:
        origin = typing.get_origin(t)
        if origin is typing.Annotated:
            t = typing.get_args(t)[0]
        elif origin in (typing.Union, types.UnionType):
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
            fields = msgspec.structs.fields(current)
            names = {f.name: f.type for f in fields} | {f.encode_name: f.type for f in fields}
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


def _dotted(path: list[Any]) -> str:
    """`path` as the user writes it: `hardware.gpus_per_node`, `sweep.0.value` (each part at most 40
    characters); a key that is empty or holds a dot is quoted in brackets: `nccl['a.b']`."""
    text = ""
    for k in path:
        part = printable(str(k), 40)
        quoted = isinstance(k, str) and (not k or "." in k)
        text += f"[{part!r}]" if quoted else f".{part}" if text else part
    return text


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
        return _dotted(path), f"key {short(bad)} must be {choices}"
    unknown = re.match(r"Object contains unknown field `(.*)`$", text, re.S)
    if unknown:
        path.append(unknown.group(1))
        owner = _owner(model, path[:-1])
        # the keys as written in the file (`from`, `to` of a sweep range), not the attribute names
        known = sorted(f for f in owner.__struct_encode_fields__ if not f.startswith("_")) if owner else []
        close = difflib.get_close_matches(str(path[-1])[:100], known, n=1, cutoff=0.6)
        hint = f"; did you mean '{close[0]}'?" if close else (f"; known keys: {', '.join(known)}" if known else "")
        return _dotted(path), f"unknown key{hint}"
    missing = re.match(r"Object missing required field `(.*)`$", text, re.S)
    if missing:
        return _dotted(path + [missing.group(1)]), "required key is missing"
    value = _value_at(data, path)
    wrong = re.match(r"Expected `([\w |]+)`, got `(\w+)`$", text)
    if wrong:
        want = " or ".join(_TYPES.get(w, w) for w in wrong.group(1).split(" | ") if w != "null")
        hint = (f"; write {int(value)} or {value:.0e}".replace("e+0", "e").replace("e+", "e")
                if want == "an integer" and isinstance(value, float) and math.isfinite(value) and value.is_integer()
                and abs(value) >= 1e4 else "")
        return _dotted(path), f"must be {want} (got {short(value)}{hint})"
    bound = re.match(r"Expected `(\w+)` ([<>]=?) (\S+)$", text)
    if bound:
        want, op, limit = bound.groups()
        return _dotted(path), f"must be {_TYPES.get(want, want)} {op} {limit} (got {short(value)})"
    if text.startswith("Expected `str` matching regex"):
        if PROFILE_NAME_PATTERN in text.encode().decode("unicode_escape"):
            return _dotted(path), f"{PROFILE_NAME_RULE} (got {short(value)})"
        pattern = text.split("regex", 1)[1].strip()
        return _dotted(path), f"must match {printable(pattern, 80)} (got {short(value)})"
    length = re.match(r"Expected `(\w+)` of length ([<>]=?) (\d+)$", text)
    if length:
        want, op, limit = length.groups()
        noun = "characters" if want == "str" else "items" if want == "array" else "keys"
        return _dotted(path), f"must have {op} {limit} {noun} (got {short(value)})"
    if text.startswith("Invalid enum value") and path:
        options = _literal_options(model, path)
        choices = f"one of {', '.join(repr(o) for o in options)}" if options else "one of the allowed values"
        return _dotted(path), f"must be {choices} (got {short(value)})"
    return _dotted(path), printable(text, 160)


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


# A number in scientific notation as people write bucket sizes and parameter counts: `5e7`. PyYAML
# (YAML 1.1) reads it as a string, not a number; an integer key takes it when it is whole. A float
# (`2.0`, `5.0e+7`) is still not an integer: values are not coerced (docs/reliability.md).
_SCIENTIFIC = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+$")


def _whole(value: Any) -> int | None:
    """`value` as an int when it is a whole number written in scientific notation (`5e7`), else None."""
    if isinstance(value, str) and _SCIENTIFIC.match(value.strip()):
        number = float(value)
        if math.isfinite(number) and number.is_integer():
            return int(number)
    return None


def _integers(model: type, data: Any, path: list[Any]) -> Any:
    """`data` with every whole number that an integer key holds in scientific notation (`5e7`) made an
    int; other values are left for validation to judge."""
    if isinstance(data, dict):
        return {k: _integers(model, v, path + [k]) for k, v in data.items()}
    if isinstance(data, list):
        return [_integers(model, v, path + [i]) for i, v in enumerate(data)]
    whole = _whole(data)  # first: looking up a key's type costs ~0.1 ms (msgspec re-evaluates annotations)
    return whole if whole is not None and _type_at(model, path) is int else data


def validate(model: type, data: dict[str, Any], source: str) -> Any:
    """Validate `data` against `model` (a Struct class, zsim.config.struct). An integer key also takes a
    whole number in scientific notation (`reduce_bucket_elements: 5e7`), not a float (`5.0e+7`).

    Raises:
        ConfigError: naming the file, the dotted key of the first error and the bad value.
    """
    data = _integers(model, data, [])
    try:
        value = msgspec.convert(data, model, strict=True)
    except msgspec.ValidationError as exc:  # first: a .nan inside a value of the wrong type is the type's error
        path, message = _describe(str(exc), model, data)
        raise ConfigError(message, source=source, path=path) from None
    bad = _non_finite(data, [])
    if bad is not None:
        raise ConfigError(f"must be a finite number (got {_value_at(data, bad)})", source=source,
                          path=_dotted(bad))
    return value
