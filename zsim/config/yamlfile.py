"""Reading YAML files and turning pydantic validation errors into one-line, path-naming messages."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from zsim.errors import ConfigError


def read_yaml_mapping(path: Path) -> dict[str, Any]:
    """Load a YAML file whose top level is a mapping.

    Raises:
        ConfigError: the file is missing, is not valid YAML, or is not a mapping.
    """
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError("no such file", source=str(path)) from None
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror}", source=str(path)) from None
    try:
        # libyaml's C loader when PyYAML has it: ~40x faster than the pure-Python SafeLoader
        data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"not valid YAML{where}: {problem}", source=str(path)) from None
    if not isinstance(data, dict):
        raise ConfigError(f"expected a mapping of sections at the top level, got {type(data).__name__}", source=str(path))
    return data


def _model_at(model: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The pydantic model class that holds the field at `loc[:-1]` (for 'did you mean')."""
    current: type[BaseModel] | None = model
    for part in loc[:-1]:
        if current is None or not isinstance(part, str) or part not in current.model_fields:
            return None
        annotation = current.model_fields[part].annotation
        current = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
    return current


def _describe(error: dict[str, Any], model: type[BaseModel]) -> tuple[str, str]:
    """(dotted path, message) for one pydantic error, with the bad value quoted."""
    loc = tuple(p for p in error["loc"] if p not in ("function-after",))
    path = ".".join(str(p) for p in loc)
    kind = error["type"]
    value = error.get("input")
    if kind == "extra_forbidden":
        owner = _model_at(model, loc)
        known = sorted(owner.model_fields) if owner else []
        close = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.6)
        hint = f"; did you mean '{close[0]}'?" if close else (f"; known keys: {', '.join(known)}" if known else "")
        return path, f"unknown key{hint}"
    if kind == "missing":
        return path, "required key is missing"
    message = error["msg"]
    if message.startswith("Value error, "):
        message = message[len("Value error, "):]
    if kind.endswith("_type") or kind in ("literal_error", "greater_than", "greater_than_equal", "less_than_equal"):
        message = f"{message} (got {value!r})"
    return path, message


def validate(model: type[BaseModel], data: dict[str, Any], source: str) -> BaseModel:
    """Validate `data` against `model`.

    Raises:
        ConfigError: naming the file, the dotted key of the first error and the bad value; when there
            are several errors, the message says how many more.
    """
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
        path, message = _describe(errors[0], model)
        more = f" (and {len(errors) - 1} more error{'s' if len(errors) > 2 else ''})" if len(errors) > 1 else ""
        raise ConfigError(message + more, source=source, path=path) from None
