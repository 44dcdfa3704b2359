"""Reading the files users give zsim (YAML, JSON, text tables) so that every read either decodes or
fails with a one-line ConfigError. Validating the data read against the config models is
zsim.config.validation's job.

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

import json
import os
import stat
from pathlib import Path
from typing import Any

import yaml

from zsim.config.profiles import shipped_file
from zsim.errors import ConfigError, printable, short

MAX_FILE_BYTES = 1 << 20  # scenarios and profiles are a few KB; 1 MiB leaves room and bounds the work
MAX_DEPTH = 32  # nesting of mappings and sequences (a scenario needs 4)
MAX_NODES = 100_000  # YAML nodes after alias expansion
def read_text(path: Path, *, what: str = "file", max_bytes: int = MAX_FILE_BYTES, lift: str | None = None) -> str:
    """The UTF-8 text of `path`, at most `max_bytes` long (`lift`: how to raise that limit, for the message).

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
        raise ConfigError(f"larger than {max_bytes:,} bytes: not a {what}" + (f" ({lift})" if lift else ""),
                          source=source)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"not UTF-8 text (byte {exc.start}: {data[exc.start:exc.start + 1]!r}): not a {what}",
                          source=source) from None


def read_json(path: Path, *, what: str = "JSON file", max_bytes: int | None = None) -> Any:
    """A parsed JSON document of at most `max_bytes` (default: the JSON_BYTES limit, zsim.config.limits)
    and JSON_VALUES values, both checked before it is parsed.

    Raises:
        ConfigError: unreadable, not UTF-8, too large, too many values, not JSON, too deep.
    """
    from zsim.config.limits import json_values_bound, limit, lift, too_many

    cap = limit("JSON_BYTES") if max_bytes is None else max_bytes
    text = read_text(path, what=what, max_bytes=cap, lift=lift("JSON_BYTES") if max_bytes is None else None)
    values = json_values_bound(text.encode("utf-8", "surrogatepass")) if len(text) > 1 << 16 else 0
    if values > limit("JSON_VALUES"):  # a small file of tiny values parses to many times its size
        raise ConfigError(too_many("JSON_VALUES", values, "JSON values (at most)"), source=str(path))
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"not valid JSON (line {exc.lineno}, column {exc.colno}): {exc.msg}", source=str(path)) \
            from None
    except ValueError as exc:  # an integer of more than 4300 digits (sys.set_int_max_str_digits)
        raise ConfigError(f"not valid JSON: {str(exc).split(';')[0][:120]}", source=str(path)) from None
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


def _codepoint(character: object) -> str:
    return f"U+{character:04X}" if isinstance(character, int) else repr(character)
