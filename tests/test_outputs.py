"""Outputs are never corrupt (issue 13): checked before simulating, written to temporary names and
renamed into place together under a folder lock. Real processes: two runs into one folder at once,
and Ctrl-C (SIGINT) at random moments, leave only complete, parseable files of one run."""

from __future__ import annotations

import csv
import json
import os
import random
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.bad_inputs import BASE_TEXT
from zsim.errors import ZsimError
from zsim.report.outputs import OutputSet, check_dir, check_file, write_atomic


def test_write_atomic_keeps_the_old_file_when_the_writer_fails(tmp_path):
    target = tmp_path / "result.json"
    target.write_text("old")

    def broken(path: Path) -> None:
        path.write_text("half")
        raise KeyboardInterrupt  # Ctrl-C in the middle of writing

    with pytest.raises(KeyboardInterrupt):
        write_atomic(target, broken)
    assert target.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["result.json"]
    write_atomic(target, "new")
    assert target.read_text() == "new" and len(list(tmp_path.iterdir())) == 1


def test_output_set_commits_all_or_nothing(tmp_path):
    with OutputSet(tmp_path / "run") as files:
        files.text("a.json", "1")
        files.text("b.json", "2")
    assert not (tmp_path / "run" / "a.json").exists() and list((tmp_path / "run").iterdir()) == []  # discarded
    with OutputSet(tmp_path / "run") as files:
        files.text("a.json", "1")
        files.text("b.json", "2")
        files.commit()
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["a.json", "b.json"]


def test_outputs_are_checked_before_anything_runs(tmp_path):
    (tmp_path / "f").write_text("x")
    for bad in (tmp_path / "f", tmp_path / "f" / "sub"):
        with pytest.raises(ZsimError, match="file"):
            check_dir(bad)
    assert check_dir(tmp_path / "new" / "deeper") == tmp_path / "new" / "deeper"
    with pytest.raises(ZsimError, match="is a folder"):
        check_file(tmp_path)
    with pytest.raises(ZsimError, match="no folder"):
        check_file(tmp_path / "missing" / "x.json")
    if os.geteuid() != 0:  # root writes anywhere
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o555)
        with pytest.raises(ZsimError, match="not writable"):
            check_dir(ro / "out")


def test_a_full_disk_is_a_clear_error_and_the_old_outputs_stay(tmp_path):
    """RLIMIT_FSIZE stands in for a full disk: writes past it fail (EFBIG) like ENOSPC does."""
    scenario, out = _scenario(tmp_path), tmp_path / "out"
    assert _zsim(scenario, out).returncode == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def small_files() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (10_000, 10_000))  # trace.json is ~12 kB

    proc = _zsim(scenario, out, "--set", "zero.stage=3", preexec_fn=small_files)
    assert proc.returncode == 2 and "no space" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def _scenario(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(BASE_TEXT)
    return path


def _zsim(scenario: Path, out: Path, *extra: str, wait: bool = True, **kw):
    argv = [sys.executable, "-m", "zsim.cli", "run", str(scenario), "-o", str(out), "--plot", "wait", *extra]
    if not wait:
        return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, **kw)
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, **kw)


def complete_run(out: Path) -> int:
    """Assert every file in `out` is complete and that they all belong to one run; return its stage."""
    names = sorted(p.name for p in out.iterdir())
    assert names == ["memory.csv", "memory.png", "result.json", "timeline.png", "trace.json"], names  # no temporary left
    result = json.loads((out / "result.json").read_text())
    trace = json.loads((out / "trace.json").read_text())
    with (out / "memory.csv").open() as fh:
        rows = list(csv.reader(fh))
    assert rows[0][0] == "time_s" and all(len(r) == len(rows[0]) for r in rows)
    assert (out / "memory.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and (out / "memory.png").read_bytes()[-8:] \
        == b"IEND\xaeB`\x82"
    stage = trace["metadata"]["zero"]["stage"]
    assert json.dumps(result).count(f'"stage": {stage}') >= 1  # result and trace of the same run
    return stage


@pytest.mark.slow
def test_two_runs_into_one_folder_leave_one_complete_run(tmp_path):
    scenario, out = _scenario(tmp_path), tmp_path / "out"
    runs = [_zsim(scenario, out, "--set", f"zero.stage={stage}", wait=False) for stage in (2, 3)]
    for proc in runs:
        assert proc.wait(timeout=300) == 0, proc.stderr.read()
        proc.stderr.close()
    assert complete_run(out) in (2, 3)


def _ctrl_c_as_at_a_terminal() -> None:
    """In the child before exec: SIGINT unblocked and at its default, as a shell at a terminal starts a
    command. A test process may run with SIGINT ignored or blocked (a background or CI launcher, an in-process
    command's mask), which children inherit, and then Python installs no KeyboardInterrupt handler at all:
    every run of this test exited 0 in a fresh clone's `make test` that way."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow
def test_ctrl_c_at_random_moments_leaves_old_or_new_complete_outputs(tmp_path):
    scenario, out = _scenario(tmp_path), tmp_path / "out"
    lengths = []
    for stage in (1, 2, 3):  # each stage's run once (the first also warms caches), start-up included
        started = time.perf_counter()
        assert _zsim(scenario, out, "--set", f"zero.stage={stage}").returncode == 0
        lengths.append(time.perf_counter() - started)
    # the shortest run's length: interrupting at 0.1-1.1 of it lands inside most runs of every stage
    # (one stage-3 run's length let every faster stage-1/2 run finish first once gradient-accumulation
    # splicing made them quicker)
    whole = min(lengths)
    rng = random.Random(13)
    seen, codes = set(), []
    for i in range(8):
        proc = _zsim(scenario, out, "--set", f"zero.stage={1 + i % 3}", wait=False, preexec_fn=_ctrl_c_as_at_a_terminal)
        time.sleep(rng.uniform(0.1, 1.1) * whole)
        proc.send_signal(signal.SIGINT)
        codes.append(proc.wait(timeout=120))
        err = proc.stderr.read()
        proc.stderr.close()
        assert codes[-1] in (0, 130, -signal.SIGINT), err  # finished, or interrupted (during start-up: -2)
        seen.add(complete_run(out))
    assert any(code != 0 for code in codes), codes  # some runs really were interrupted



def test_json_into_a_link_or_a_pipe_writes_through_it(tmp_path):
    """--json onto a symlink writes the file it points at and keeps the link; onto a FIFO (or a device
    such as /dev/stdout) it writes into it: a rename over either would replace it with a regular file."""
    from zsim.report.outputs import write_atomic

    target = tmp_path / "target.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    write_atomic(link, '{"a": 1}\n')
    assert link.is_symlink() and json.loads(target.read_text()) == {"a": 1}
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    reader = subprocess.Popen(["cat", str(fifo)], stdout=subprocess.PIPE)
    write_atomic(fifo, '{"b": 2}\n')
    assert json.loads(reader.communicate(timeout=10)[0]) == {"b": 2}
    assert fifo.is_fifo()


@pytest.mark.parametrize("command", [["schema"], ["collective", "--profile", "dgx2", "--gpus", "8", "--op", "all_reduce"],
                                     ["profiles"]])
def test_every_command_checks_json_before_any_work(tmp_path, command):
    """`--json` is checked as the command line is read, in every command: a missing folder is exit 2
    naming --json, and nothing is created (schema used to make the folder)."""
    proc = subprocess.run([sys.executable, "-m", "zsim.cli", *command, "--json", str(tmp_path / "nodir" / "x.json")],
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 2 and "argument --json: no folder" in proc.stderr
    assert not (tmp_path / "nodir").exists()
