"""The base of every config model (scenario sections, profile files, host files, sweep and suite
files): msgspec Structs, validated once at load by `zsim.config.validation.validate`.

Why msgspec and not pydantic: start-up. Every `zsim run` defines the models and validates a few small
files; with pydantic that cost 0.15 s to import and 0.12 s to build the models' validators, more than
half of the flagship's whole process (README, Speed). msgspec's import is ~23 ms (`python -X importtime`;
most of it the uuid and platform modules its core imports) and a Struct class costs microseconds; its `convert(..., strict=True)` checks types and bounds
(`Meta(gt=..., le=...)`) in C, and `msgspec.json.schema` writes the JSON Schema editors use.

The rules every model keeps (issue 13): unknown keys are errors (forbid_unknown_fields); no coercion
(strict: the string "12" is not 12, `true` is not 1, 2.0 is not 2); objects are frozen; numbers are
finite (msgspec has no allow_inf_nan, so `validation.validate` refuses .inf/.nan first, naming the key).
Checks across fields live in `__post_init__`, raising ValueError (msgspec reports it with the path).
`Name`/`Text` fields listed in a class's `_STRIP` lose control characters (their text is echoed).
"""

from __future__ import annotations

from typing import Any, ClassVar

import msgspec
from msgspec import Meta, field

__all__ = ["Meta", "Section", "dump", "field", "fields", "replace", "strip_control"]


def strip_control(value: str) -> str:
    """Control characters removed (ANSI escapes, NUL), line breaks and tabs made spaces: the text is echoed."""
    return "".join(c if c.isprintable() else " " for c in value if c.isprintable() or c in "\t\n\r")


class Section(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """A YAML section or file: unknown keys are errors, values are not coerced, objects are frozen."""

    _STRIP: ClassVar[tuple[str, ...]] = ()  # str fields whose control characters are removed

    def __post_init__(self) -> None:
        for name in self._STRIP:
            value = getattr(self, name)
            if isinstance(value, str):
                msgspec.structs.force_setattr(self, name, strip_control(value))


def fields(model: type[msgspec.Struct]) -> tuple[str, ...]:
    """The field names of a model class."""
    return model.__struct_fields__


def dump(obj: Any) -> Any:
    """A model as plain data (dicts, lists, scalars), nested models included."""
    return msgspec.to_builtins(obj)


def replace(obj: msgspec.Struct, **changes: Any) -> Any:
    """A copy of a model with `changes`. msgspec runs the model's `__post_init__` again (its cross-field
    checks), but not the type and bound checks of `validate`: the caller's values are trusted."""
    return msgspec.structs.replace(obj, **changes)
