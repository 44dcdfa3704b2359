"""`--json` to a path that names an open stream (`/dev/stdout >> log`, a pipe, /dev/fd/N) is written
into, never renamed over (issue 28): the shell's file keeps what it held and the text summary."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, SHARED_DATA, SMALL
from zsim.report.outputs import own_descriptor, write_atomic

ZSIM = f"{sys.executable} -m zsim.cli"


def _shell(command: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", command], capture_output=True, text=True, cwd=cwd)


def _last_json(text: str) -> dict:
    start = text.index("\n{") + 1  # the JSON follows the text summary
    return json.loads(text[start:])


def test_own_descriptor_follows_links_to_this_processes_descriptors(tmp_path):
    assert own_descriptor(Path("/dev/stdout")) == 1 and own_descriptor(Path("/dev/fd/2")) == 2
    assert own_descriptor(Path(f"/proc/{os.getpid()}/fd/7")) == 7 and own_descriptor(Path("/proc/self/fd/3")) == 3
    link = tmp_path / "out.json"
    link.symlink_to("/dev/stderr")
    assert own_descriptor(link) == 2
    assert own_descriptor(tmp_path / "plain.json") is None and own_descriptor(Path("/proc/1/fd/1")) in (None, 1)


def test_write_atomic_appends_to_the_descriptor(tmp_path):
    log = tmp_path / "log"
    log.write_text("before\n")
    with open(log, "a") as fh:
        write_atomic(Path(f"/dev/fd/{fh.fileno()}"), "json\n")
        write_atomic(Path(f"/proc/self/fd/{fh.fileno()}"), lambda p: p.write_text("written by a writer\n"))
    assert log.read_text() == "before\njson\nwritten by a writer\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log"]


@pytest.fixture
def scenario(tmp_path) -> Path:
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(SMALL))
    return path


def test_run_json_to_dev_stdout_appends_to_the_log(tmp_path, scenario):
    (tmp_path / "log").write_text("earlier line\n")
    done = _shell(f"{ZSIM} run {scenario} -o out --json /dev/stdout >> log", tmp_path)
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "log").read_text()
    assert text.startswith("earlier line\nzsim") and _last_json(text)["schema"] == "zsim-result/1"
    assert not (tmp_path / "log").is_symlink()


def test_sweep_json_to_dev_stdout_and_a_pipe(tmp_path, scenario):
    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump({"base": str(scenario), "axes": {"zero.stage": [2, 3]}}))
    (tmp_path / "log").write_text("earlier line\n")
    done = _shell(f"{ZSIM} sweep {sweep} -o o --no-plot --workers 1 --json /dev/stdout >> log", tmp_path)
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "log").read_text()
    assert text.startswith("earlier line\nzsim sweep") and _last_json(text)["points"]["valid"] == 2
    piped = _shell(f"{ZSIM} sweep {sweep} -o o --no-plot --workers 1 --json /dev/stdout | cat > piped", tmp_path)
    assert piped.returncode == 0 and _last_json((tmp_path / "piped").read_text())["points"]["cached"] == 2


def test_calibrate_json_to_dev_stdout_appends(tmp_path):
    tables = SHARED_DATA / "nccl-tests" / "dgx2-v100-12gpu"
    if not tables.is_dir():
        pytest.skip("no ../shared/data")
    (tmp_path / "log").write_text("earlier line\n")
    done = _shell(f"{ZSIM} calibrate {tables} --profile dgx2 -o p.yaml --json /dev/stdout >> log", tmp_path)
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "log").read_text()
    assert text.startswith("earlier line\n") and "profile" in _last_json(text)
