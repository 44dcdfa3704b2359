"""`zsim schema`: the JSON Schema of scenario files, generated from the models (msgspec Structs) that validate
them (zsim/config/schema.py), so an editor can complete keys, show each key's documentation and flag
mistakes while the file is written. docs/models.md shows the editor settings."""

from __future__ import annotations

import argparse
import json
import sys

from zsim.commands import HELP
from zsim.commands.options import add_json_option

HINT = ("Use it in VS Code (Red Hat YAML extension) with the first line of a scenario\n"
        "  # yaml-language-server: $schema={path}\n"
        "or in settings.json: \"yaml.schemas\": {{\"{path}\": [\"scenarios/**/*.yaml\"]}}\n")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "schema", help=HELP["schema"],
        description="Print the JSON Schema (draft-07) of scenario files, generated from the models that "
                    "validate them. With --json PATH it is written to PATH and the editor settings that use it "
                    "are printed instead.")
    add_json_option(p, "the schema")
    p.set_defaults(func=schema_command)


def schema_command(args: argparse.Namespace) -> int:
    from zsim.config.schema import scenario_json_schema

    text = json.dumps(scenario_json_schema(), indent=2, ensure_ascii=False) + "\n"
    if args.json in (None, "-"):
        sys.stdout.write(text)
        if args.json == "-":
            sys.stderr.write(HINT.format(path="scenario.schema.json"))
        return 0
    from pathlib import Path

    from zsim.report.outputs import write_atomic

    path = Path(args.json)  # checked as the command line was read (a missing folder is exit 2, as everywhere)
    write_atomic(path, text)
    print(f"wrote the scenario schema to {path}\n" + HINT.format(path=path.resolve().as_posix()), end="")
    return 0
