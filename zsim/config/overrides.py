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


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Return a copy of `data` with each `dotted.key=value` set; intermediate sections are created.

    Unknown keys are not rejected here: validation rejects them with the same message as in a file.

    Raises:
        ConfigError: a key goes through a value that is not a section.
    """
    result = copy.deepcopy(data)
    for text in overrides:
        keys, value = parse_override(text)
        node = result
        for i, key in enumerate(keys[:-1]):
            child = node.setdefault(key, {})
            if not isinstance(child, dict):
                raise ConfigError(f"--set {short(text)}: '{printable('.'.join(keys[: i + 1]), 60)}' is a value, "
                                  "not a section")
            node = child
        node[keys[-1]] = value
    return result
