"""What keeps `zsim` fast to start (benchmarks/bench_start.py measures it; these are not timed tests):
`zsim --help` imports no command module and no heavy library; the flagship's own process imports
neither networkx (class mode needs no graph), nor matplotlib (the plot is drawn after the summary, by
another process), nor numpy (the outputs are written from plain lists), nor the host-profile models
(a GPU run needs none); its trace lists process groups once, not per event; and the files shipped
with zsim, which libyaml parses without the strict loader's depth and alias limits, are within
those limits and parse to the same data with the strict loader."""

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from zsim.config.profiles import builtin_folder, shipped_file
from zsim.config.yamlfile import _PackageDataLoader, _StrictLoader, parse_yaml, read_text
from zsim.errors import ConfigError

HEAVY = ("msgspec", "numpy", "simpy", "networkx", "matplotlib", "yaml", "torch")


def _imported_after(code: str) -> set[str]:
    probe = f"import sys; {code}; print(' '.join(sorted(sys.modules)), file=sys.__stdout__)"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    modules = set(proc.stdout.split())
    assert "zsim.cli" in modules  # the probe saw the process
    return modules


@pytest.mark.parametrize("argv", [["--help"], [], ["--version"], ["-h", "run"]])
def test_the_command_list_imports_no_command_module_and_no_heavy_library(argv):
    modules = _imported_after(f"import contextlib, io; from zsim.cli import main; "
                              f"contextlib.redirect_stdout(io.StringIO()).__enter__(); "
                              f"contextlib.redirect_stderr(io.StringIO()).__enter__(); main({argv!r})")
    assert not {m for m in modules if m.startswith("zsim.commands.")}, modules
    assert not {m.split(".")[0] for m in modules} & set(HEAVY)


def test_a_command_help_imports_only_that_command():
    modules = _imported_after("import contextlib, io; from zsim.cli import main; "
                              "contextlib.redirect_stdout(io.StringIO()).__enter__(); main(['run', '--help'])")
    assert {m for m in modules if m.startswith("zsim.commands.")} == {"zsim.commands.run", "zsim.commands.options"}
    assert not {m.split(".")[0] for m in modules} & set(HEAVY)


def test_flagship_process_imports_no_graph_plot_or_host_library(tmp_path):
    """Nor pydantic: the config models are msgspec Structs (its import alone was 0.15 s of every run)."""
    code = ("import sys; from zsim.cli import main; "
            f"code = main(['run', '1T-1024gpu', '-o', {str(tmp_path)!r}, '--json', {str(tmp_path / 'r.json')!r}]); "
            "print(code, *(m in sys.modules for m in ('networkx', 'matplotlib', 'numpy', 'zsim.config.host', "
            "'pydantic')), file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert proc.stderr.strip().splitlines()[-1] == "0 False False False False False", proc.stderr
    trace = json.loads((tmp_path / "trace.json").read_text())
    groups = [e["args"]["group"] for e in trace["traceEvents"] if e.get("ph") == "X" and "group" in e["args"]]
    assert groups and set(groups) == {"dp", "mp"}
    assert len(trace["metadata"]["groups"]["dp"]) == 64 and len(trace["metadata"]["groups"]["mp"]) == 16


def _shipped_yaml():
    return sorted(p for package in ("zsim.hwprofiles", "zsim.scenarios") for p in builtin_folder(package).rglob("*.yaml"))


def test_every_shipped_file_is_within_the_strict_limits_and_parses_the_same_with_libyaml():
    files = _shipped_yaml()
    assert len(files) > 20 and all(shipped_file(p) for p in files)
    for path in files:
        text = read_text(path)
        strict = parse_yaml(text, str(path))  # raises ConfigError beyond the depth or alias limits, or on a duplicate key
        assert parse_yaml(text, str(path), shipped=True) == strict, path


def test_shipped_files_are_parsed_by_libyaml_and_yours_strictly(tmp_path):
    import yaml

    mine = tmp_path / "dgx2.yaml"
    mine.write_text((builtin_folder() / "dgx2.yaml").read_text())
    assert shipped_file(builtin_folder() / "dgx2.yaml") and not shipped_file(mine)
    link = builtin_folder() / "gpus" / ".." / "dgx2.yaml"  # a path through '..' is still the shipped file
    assert shipped_file(link)
    if yaml.__with_libyaml__:
        assert issubclass(_PackageDataLoader, yaml.CSafeLoader)
    assert not issubclass(_StrictLoader, getattr(yaml, "CSafeLoader", ()))


def test_libyaml_keeps_the_duplicate_key_check():
    with pytest.raises(ConfigError, match="duplicate key 'stage' .first on line 1"):
        parse_yaml("stage: 1\ndp: 2\nstage: 3\n", "x.yaml", shipped=True)
