"""`zsim replay` on traces it must refuse or echo safely (issue 28): ranks of different runs, timestamps
shifted past a double's resolution, escape sequences in event names."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.test_calibrate import measured_run
from zsim.cli import main
from zsim.errors import ConfigError
from zsim.trace.run_reader import read_run


def _record(out: Path, seed: int) -> Path:
    done = subprocess.run([sys.executable, "-m", "zsim.runtime", "--ranks", "2", "--stage", "2", "--steps", "2",
                           "--precision", "fp32", "--seed", str(seed), "--model",
                           str(ROOT / "scenarios" / "calibrate" / "gpt-tiny-a.yaml"), "-o", str(out)],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[Path, Path]:
    """Two real 2-rank runs of one configuration, seeds 1 and 2."""
    pytest.importorskip("torch")
    root = tmp_path_factory.mktemp("runs")
    return _record(root / "a", 1), _record(root / "b", 2)


def _edit(folder: Path, edit) -> None:
    for path in folder.glob("rank*.trace.json"):
        doc = json.loads(path.read_text())
        edit(doc)
        path.write_text(json.dumps(doc))


def test_each_launch_writes_one_run_id(runs):
    a, b = runs
    ids = {json.loads((a / f"rank{r}.trace.json").read_text())["metadata"]["run_id"] for r in (0, 1)}
    other = json.loads((b / "rank0.trace.json").read_text())["metadata"]["run_id"]
    assert len(ids) == 1 and None not in ids and other not in ids


def test_replay_refuses_ranks_of_two_runs(runs, tmp_path, capsys):
    a, b = runs
    mixed = tmp_path / "mixed"
    shutil.copytree(a, mixed)
    shutil.copy(b / "rank1.trace.json", mixed / "rank1.trace.json")
    assert main(["replay", str(mixed), "--profile", "dev-2core", "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "rank1.trace.json: metadata.run_id" in err and "files of different runs" in err
    assert not (tmp_path / "out").exists()


def test_runs_recorded_without_a_run_id_are_told_apart_by_seed(tmp_path):
    a = measured_run(tmp_path / "a", seed=1)
    measured_run(tmp_path / "b", seed=2)
    shutil.copy(tmp_path / "b" / "rank1.trace.json", a / "rank1.trace.json")
    with pytest.raises(ConfigError, match=r"metadata.seed is 2 here but 1 in rank0.trace.json: files of different"):
        read_run(a)


@pytest.mark.parametrize("shift", [1e300, 1e13])
def test_timestamps_shifted_past_a_doubles_resolution_are_refused(tmp_path, shift, capsys):
    folder = measured_run(tmp_path / "run")

    def shifted(doc):
        for event in doc["traceEvents"]:
            event["ts"] += shift

    _edit(folder, shifted)
    assert main(["replay", str(folder), "--profile", "dgx2", "-o", str(tmp_path / "out")]) == 2
    assert "is not a time 0 to 4.5e+12 µs" in capsys.readouterr().err


def test_a_clock_offset_of_1e300_is_refused(tmp_path):
    folder = measured_run(tmp_path / "run", clock_offset_us=1e300)
    with pytest.raises(ConfigError, match="clock_offset_us 1e\\+300 is not a time"):
        read_run(folder)


def test_escape_sequences_in_event_names_never_reach_the_terminal(runs, tmp_path, capsys):
    folder = tmp_path / "esc"
    shutil.copytree(runs[0], folder)

    def rename(doc):
        for event in doc["traceEvents"]:
            if event.get("ph") == "X" and event["name"].startswith("fwd/"):
                event["name"] = "fwd/\x1b[31mlayer\x1b]0;title\x07"

    _edit(folder, rename)
    assert main(["replay", str(folder), "--profile", "dev-2core", "-o", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "measured only: fwd/?[31mlayer?]0;title?" in out
    assert not any(not c.isprintable() and c != "\n" for c in out)
