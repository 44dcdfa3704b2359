"""`--set dotted.key=value` overrides, applied to the raw YAML mapping before validation."""

from __future__ import annotations

import copy
from typing import Any

from zsim.errors import ConfigError, printable, short


def parse_override(text: str) -> tuple[list[str], Any]:
    """Split `a.b.c=value` into (['a', 'b', 'c'], value), the value parsed as YAML (`8` is an int).

    Raises:
        ConfigError: no '=' or an empty key.
    """
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {short(text)}: expected dotted.key=value, e.g. --set zero.stage=2")
    from zsim.config.yamlfile import parse_yaml

    try:  # strict and bounded, as a file is (issue 13): depth, alias expansion, duplicate keys
        value = parse_yaml(raw, f"--set {key.strip()[:60]}") if raw.strip() else None
    except ConfigError:
        value = raw  # not YAML: the text itself (validation then says what the key expects)
    return [p for p in key.strip().split(".")], value


def set_key(data: dict[str, Any], key: str, value: Any, where: str) -> None:
    """Set dotted `key` in the nested mapping `data`; sections are created, and a number selects an
    item of a list (`fabric.degrade.0.factor`). Raises ConfigError naming `where`: an empty key part, a
    path through a value, an index past a list's end or into a list the scenario does not have."""
    parts = key.split(".")
    if not all(parts):
        raise ConfigError(f"'{printable(key, 60)}': a key part is empty (two dots in a row, or a dot at an end)",
                          path=where)
    node: Any = data
    for i, part in enumerate(parts):
        here = ".".join(parts[: i + 1])
        last = i == len(parts) - 1
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise ConfigError(f"'{printable(here, 60)}': the list at '{printable('.'.join(parts[:i]), 60)}' has "
                                  f"{len(node)} items (index 0 to {len(node) - 1})", path=where)
            part = int(part)  # type: ignore[assignment]
        elif not isinstance(node, dict):
            raise ConfigError(f"'{printable('.'.join(parts[:i]), 60)}' is a value in the scenario, not a section",
                              path=where)
        if last:
            node[part] = copy.deepcopy(value)
        else:
            if isinstance(node, dict) and part not in node:
                if parts[i + 1].isdigit():  # an item of a list the scenario does not have: not a section '0'
                    raise ConfigError(f"'{printable(here, 60)}' is not in the scenario, so it has no item "
                                      f"{printable(parts[i + 1], 20)}; set the whole list "
                                      f"('{printable(here, 60)}=[...]')", path=where)
                node[part] = {}
            node = node[part]


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Return a copy of `data` with each `dotted.key=value` set (set_key: intermediate sections are
    created, a number selects a list item, `fabric.degrade.0.factor=0.5`).

    Unknown keys are not rejected here: validation rejects them with the same message as in a file.

    Raises:
        ConfigError: a key goes through a value that is not a section, or past the end of a list.
    """
    result = copy.deepcopy(data)
    for text in overrides:
        keys, value = parse_override(text)
        set_key(result, ".".join(keys), value, f"--set {short(text)}")
    return result
