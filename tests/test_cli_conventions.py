"""One CLI: every command's flags follow the same conventions (README, "Command-line conventions").

The tests walk every subparser `zsim.cli.build_parser()` registers, so a command added later is
checked too.
"""

import argparse
import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from zsim.cli import COMMANDS, build_parser
from zsim.console.units import nccl_size_arg, size_arg

HEAVY = ("numpy", "simpy", "networkx", "msgspec", "yaml", "matplotlib", "torch", "scipy", "tqdm", "shtab")


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {flag: action for action in parser._actions for flag in action.option_strings}


def test_every_listed_command_is_registered():
    assert set(subcommands()) == set(COMMANDS)


@pytest.mark.parametrize("name", sorted(subcommands()))
def test_flags_mean_one_thing_everywhere(name):
    parser = subcommands()[name]
    opts = options(parser)
    for action in parser._actions:
        if action.option_strings and action.help != argparse.SUPPRESS and not isinstance(action, argparse._HelpAction):
            assert action.help, f"zsim {name} {action.option_strings[0]}: no help text"
    if "--json" in opts:  # --json PATH|- everywhere, never a switch
        assert opts["--json"].nargs is None and opts["--json"].metavar == "PATH|-", name
        assert not isinstance(opts["--json"], (argparse._StoreTrueAction, argparse._StoreConstAction)), name
    if "--profile" in opts:  # the hardware profile, by name or file; --hw a hidden alias; --profiles beside it
        profile = opts["--profile"]
        assert profile.dest == "profile" and profile.nargs is None and profile.metavar == "NAME|FILE", name
        assert opts["--hw"].dest == "profile" and opts["--hw"].help == argparse.SUPPRESS, name
        assert isinstance(opts["--profiles"], argparse._AppendAction), name
    if "--hw" in opts:
        assert "--profile" in opts, f"zsim {name}: --hw without --profile"
    for flag, action in opts.items():
        # sizes in bytes share one grammar: 32GB = 10^9, 32GiB = 32G = 2^30
        if action.metavar == "SIZE" or action.dest in ("minbytes", "maxbytes", "gpu_mem"):
            # one grammar; nccl_size_arg is size_arg capped at one collective's largest payload
            assert action.type in (size_arg, nccl_size_arg), f"zsim {name} {flag}: sizes must parse with units.size_arg"
        assert "profiler" not in flag or flag == "--torch-profiler", f"zsim {name} {flag}"


def test_the_pytorch_profiler_switch_is_torch_profiler():
    opts = options(subcommands()["trace"])
    assert "--torch-profiler" in opts and "--profile" not in opts


@pytest.mark.parametrize("args", [[name, "--no-such-flag"] for name in sorted(subcommands())] + [
    ["run", "1T-1024gpu", "--no-such-flag"], ["memory", "--params", "1B", "--dp", "x"], ["no-such-command"]])
def test_argparse_errors_are_two_lines_without_the_usage_block(args):
    proc = subprocess.run([sys.executable, "-m", "zsim", *args], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) <= 2 and "usage:" not in proc.stderr and lines[0].startswith("zsim"), proc.stderr
    assert "--help" in lines[-1]


@pytest.mark.parametrize("args, hint", [
    (["runn"], "invalid choice: 'runn'; did you mean 'run'? (choose from 'run', "),
    (["validate", "papr"], "invalid choice: 'papr'; did you mean 'paper'? (choose from "),
    (["memory", "--params", "1B", "--dp", "8", "--dtype", "fp61"], "'fp61'; did you mean 'fp16'?"),
    (["validate", "zzzz"], "invalid choice: 'zzzz' (choose from 'megatron', 'modern', 'paper', 'replay', 'scale')"),  # none close
    (["run", "1T-1024gpu", "--no-plott"], "unrecognized arguments: --no-plott; did you mean '--no-plot'?"),
    (["run", "1T-1024gpu", "--sett", "x=1"], "unrecognized arguments: --sett x=1; did you mean '--set'?"),
    (["run", "1T-1024gpu", "--zzzzz"], "unrecognized arguments: --zzzzz\n"),
    # before the command: was "the following arguments are required: COMMAND"
    (["--verion"], "zsim: unrecognized option '--verion'; did you mean '--version'?\n"),
    (["--json", "-", "run", "1T-1024gpu"], "zsim: '--json' comes before the command; a command's options follow "
                                          "it (zsim run --json ...)\n"),
])
def test_a_misspelt_choice_or_option_gets_a_suggestion(args, hint, capsys):
    from zsim.cli import main

    assert main(args) == 2
    assert hint in capsys.readouterr().err


def test_building_every_parser_imports_no_heavy_library():
    """`zsim --help` stays fast only while command modules import heavy libraries lazily."""
    code = ("import sys, zsim.cli; zsim.cli.build_parser(); "
            f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", f"imported when building the parser: {proc.stdout}"


def test_choices_spelled_out_for_lazy_imports_agree_with_their_sources():
    from zsim.commands import collective
    from zsim.fabric.collective import ALGORITHMS
    from zsim.fabric.perf import DTYPE_BYTES
    from zsim.runtime import cli as runtime_cli
    from zsim.runtime.config import PRECISIONS

    assert collective.ALGORITHMS == ALGORITHMS and collective.DTYPES == tuple(sorted(DTYPE_BYTES))
    assert runtime_cli.PRECISIONS == PRECISIONS


def test_python_dash_m_zsim_and_version():
    proc = subprocess.run([sys.executable, "-m", "zsim", "--version"], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0
    for name in ("zsim 0.", "python 3.", "simpy ", "numpy ", "msgspec "):
        assert name in proc.stdout, proc.stdout
    assert "torch" in proc.stdout


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_completion_is_generated_from_the_parser(shell):
    proc = subprocess.run([sys.executable, "-m", "zsim", "completion", shell], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    for name in COMMANDS:
        assert name in proc.stdout
    assert "--torch-profiler" in proc.stdout and "--gpu-mem" in proc.stdout


def test_json_dash_puts_json_on_stdout_and_text_on_stderr(tmp_path):
    def run(*args):
        return subprocess.run([sys.executable, "-m", "zsim", *args], capture_output=True, text=True, cwd=ROOT)

    for args in (["memory", "--params", "1B", "--dp", "8"], ["maxsize", "--dp", "8", "--gpu-mem", "32G"],
                 ["collective", "--profile", "dgx2", "--gpus", "16", "--op", "all_reduce", "-b", "1M", "-e", "1M"],
                 ["profiles"]):
        proc = run(*args, "--json", "-")
        assert proc.returncode == 0, proc.stderr
        json.loads(proc.stdout)
        assert proc.stderr.strip(), f"{args}: the text belongs on stderr"
        path = tmp_path / f"{args[0]}.json"
        proc = run(*args, "--json", str(path))
        assert proc.returncode == 0 and proc.stdout.strip() and json.loads(path.read_text())


def test_trace_without_torch_says_how_to_get_it(monkeypatch, capsys, tmp_path):
    import importlib.util

    from zsim.cli import main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    code = main(["trace", "--model", "scenarios/1T-1024gpu.yaml", "-o", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and "pip install 'zsim[runtime]'" in err and "Traceback" not in err


@pytest.mark.parametrize("name", sorted(subcommands()))
def test_a_parser_of_one_command_is_that_command_of_the_whole_parser(name):
    """`zsim NAME ...` builds only NAME's parser (faster start); it must be the same parser."""
    def sub(parser):
        (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        return action.choices[name]

    assert sub(build_parser(only=name)).format_help() == sub(build_parser()).format_help()
