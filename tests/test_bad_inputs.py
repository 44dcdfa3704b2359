"""Bad input never gets a traceback (issue 13): every case of the corpus in tests/bad_inputs.py, run
through the real `zsim` entry point, ends with exit 2 (or 3 for a simulated OOM) within seconds, in
at most two short lines on stderr, with no traceback and nothing written outside its scratch folder."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time

import pytest

from tests.bad_inputs import BASE_TEXT, CASES
from zsim import cli

MAX_SECONDS = 20.0  # per case, in-process, on the 2-core shared machine (most take milliseconds)
MAX_LINE = 320


def check_stderr(err: str) -> None:
    lines = err.strip().splitlines()
    assert 1 <= len(lines) <= 2, err[:2000]
    assert "Traceback" not in err and all(len(line) <= MAX_LINE for line in lines), err[:2000]
    assert all(c.isprintable() for line in lines for c in line), repr(err[:500])  # no ANSI escapes echoed


def run_case(name: str, tmp_path, monkeypatch, capsys) -> tuple[int, str, float]:
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)  # a default output folder (out/<name>) lands here
    argv = CASES[name](tmp_path)
    if name.startswith("profile/"):
        monkeypatch.setenv("ZSIM_PROFILE_PATH", str(tmp_path / "hwprofiles"))
    started = time.perf_counter()
    code = cli.main(argv)
    return code, capsys.readouterr().err, time.perf_counter() - started


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input_is_exit_2_in_two_lines(name, tmp_path, monkeypatch, capsys):
    code, err, seconds = run_case(name, tmp_path, monkeypatch, capsys)
    assert code in (2, 3), (code, err[:1000])
    check_stderr(err)
    assert seconds < MAX_SECONDS
    assert not (tmp_path.parent / "esc").exists() and not (tmp_path / "esc").exists()


SUBPROCESS_CASES = ["scenario/alias_bomb", "scenario/brackets", "scenario/latin1", "set/bomb", "memory/params_overflow",
                    "collective/b_half", "output/json_folder", "trace/lr_nan", "profile/nested", "nccl/binary"]


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))  # a leak or a bomb dies here, not the machine


@pytest.mark.parametrize("name", SUBPROCESS_CASES)
def test_bad_input_as_a_real_process(name, tmp_path):
    argv = CASES[name](tmp_path)
    env = {**os.environ, "ZSIM_PROFILE_PATH": str(tmp_path / "hwprofiles")} if name.startswith("profile/") else None
    proc = subprocess.run([sys.executable, "-m", "zsim.cli", *argv], capture_output=True, text=True, timeout=60,
                          cwd=tmp_path, env=env, preexec_fn=_limits)
    assert proc.returncode == 2, proc.stderr[:1000]
    check_stderr(proc.stderr)


def test_a_closed_pipe_ends_quietly(tmp_path):
    """`zsim collective ... | head -1`: the reader goes away; no BrokenPipeError, exit 0."""
    proc = subprocess.Popen([sys.executable, "-m", "zsim.cli", "collective", "--hw", "dgx2", "--gpus", "8", "--op",
                             "all_reduce", "-b", "8", "-e", "1G"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.readline()
    proc.stdout.close()  # as `head -1` does
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0 and err == "", err


def test_control_characters_never_reach_the_terminal(tmp_path, monkeypatch, capsys):
    """A description or name with ANSI escapes is accepted, but echoed without its control characters,
    and a name with '../' writes under out/ only."""
    monkeypatch.chdir(tmp_path)
    scenario = tmp_path / "s.yaml"
    scenario.write_text(BASE_TEXT.replace("name: tiny", 'name: "../../\\e[2Jx"') + 'description: "\\e[31mred\\e[0m"\n')
    assert cli.main(["run", str(scenario), "--no-plot"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "red" in out
    written = [p for p in tmp_path.rglob("result.json")]
    assert len(written) == 1 and written[0].parent.parent == tmp_path / "out"
