"""Sweeps never report a damaged point (issue 28, part 3): every cache entry is checked before reuse,
the outputs are published as one set, one sweep at a time per folder, and a plot cannot lose the
tables."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, SMALL
from zsim.errors import ZsimError
from zsim.sweep.cache import entry_text, read_entry
from zsim.sweep.files import sweep_lock
from zsim.sweep.points import plan_sweep
from zsim.sweep.runner import run_sweep
from zsim.sweep.spec import sweep_from_mapping

AXES = {"axes": {"zero.stage": [2, 3]}}


@pytest.fixture
def base(tmp_path) -> Path:
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(SMALL))
    return path


def plan_of(mapping: dict, base: Path):
    return plan_sweep(sweep_from_mapping({"base": str(base), **mapping}), "<test>", base.parent)


def _entry(out: Path, sweep, i: int) -> Path:
    return out / "cache" / f"{sweep.table.rows[i]['key']}.json"


def _damage_value(column, value):
    def damage(doc):
        doc["row"][column] = value
    return damage


def _other_row(doc, other):
    doc["row"] = other["row"]


DAMAGES = {
    "a string step": _damage_value("step_s", "fast"),
    "NaN": lambda doc: doc["row"].__setitem__("step_s", float("nan")),
    "a negative step": _damage_value("step_s", -1.0),
    "a bad status": _damage_value("status", "great"),
    "a missing column": lambda doc: doc["row"].pop("tflops_per_gpu"),
    "a changed number": _damage_value("step_s", 1e-9),  # plausible, but the hash says it was edited
    "another schema": lambda doc: doc.__setitem__("schema", "zsim-sweep-point/0"),
}


@pytest.mark.parametrize("damage", DAMAGES, ids=list(DAMAGES))
def test_a_damaged_entry_is_rerun_and_reported(base, tmp_path, damage):
    out = tmp_path / "o"
    first = run_sweep(plan_of(AXES, base), out, workers=1)
    path = _entry(out, first, 0)
    doc = json.loads(path.read_text())
    DAMAGES[damage](doc)
    path.write_text(json.dumps(doc))  # NaN written as NaN: not JSON, refused as such
    again = run_sweep(plan_of(AXES, base), out, workers=1)
    assert (again.ran, again.cached, again.rerun) == (1, 1, 1)
    assert again.table.rows == first.table.rows  # the rerun point is the real one, not the damaged value
    facts = json.loads((out / "sweep.json").read_text())
    assert facts["points"]["rerun"] == 1 and sum(facts["damaged"].values()) == 1
    row = first.table.rows[0]
    assert read_entry(path, row["key"])[0] == {k: v for k, v in row.items() if k not in ("point", "zero.stage")}


def test_another_points_row_is_not_reused(base, tmp_path):
    out = tmp_path / "o"
    first = run_sweep(plan_of(AXES, base), out, workers=1)
    a, b = _entry(out, first, 0), _entry(out, first, 1)
    a.write_text(b.read_text())  # point 0's file now holds point 1's entry
    again = run_sweep(plan_of(AXES, base), out, workers=1)
    assert again.rerun == 1 and again.damaged == {"another point's entry": 1}
    assert again.table.rows == first.table.rows
    doc = json.loads(b.read_text())
    doc["key"] = first.table.rows[0]["key"]  # relabelled, but the row is still point 1's
    a.write_text(json.dumps(doc))
    assert run_sweep(plan_of(AXES, base), out, workers=1).damaged == {"the row is another point's": 1}


def test_a_fifo_or_a_link_in_the_cache_is_refused_without_hanging(base, tmp_path):
    out = tmp_path / "o"
    first = run_sweep(plan_of(AXES, base), out, workers=1)
    fifo, link = _entry(out, first, 0), _entry(out, first, 1)
    fifo.unlink()
    os.mkfifo(fifo)
    (tmp_path / "elsewhere.json").write_text(link.read_text())
    link.unlink()
    link.symlink_to(tmp_path / "elsewhere.json")
    started = time.monotonic()
    again = run_sweep(plan_of(AXES, base), out, workers=1)
    assert time.monotonic() - started < 30 and again.rerun == 2 and again.table.rows == first.table.rows
    assert stat.S_ISREG(fifo.lstat().st_mode) and stat.S_ISREG(link.lstat().st_mode)  # replaced by real entries


def test_entries_round_trip_and_old_entries_without_a_hash_are_rerun(base, tmp_path):
    out = tmp_path / "o"
    first = run_sweep(plan_of(AXES, base), out, workers=1)
    row = first.table.rows[0]
    path = _entry(out, first, 0)
    cached = {k: row[k] for k in json.loads(path.read_text())["row"]}
    assert json.loads(entry_text(cached)) == json.loads(path.read_text())
    path.write_text(json.dumps({"key": row["key"], "row": cached}))  # the format before issue 28
    assert run_sweep(plan_of(AXES, base), out, workers=1).damaged == {"not a cache entry": 1}


def test_per_point_results_follow_their_point_when_an_axis_grows(base, tmp_path):
    out = tmp_path / "o"
    small = run_sweep(plan_of({"axes": {"zero.stage": [3]}}, base), out, workers=1, per_point=True)
    grown = run_sweep(plan_of({"axes": {"zero.stage": [1, 2, 3]}}, base), out, workers=1, per_point=True)
    assert grown.cached == 1 and small.table.rows[0]["key"] == grown.table.rows[2]["key"]
    for row in grown.table.rows:
        facts = json.loads((out / "points" / row["key"] / "result.json").read_text())
        assert facts["zero"]["stage"] == row["zero.stage"]  # never another point's result
    (out / "points" / grown.table.rows[0]["key"] / "result.json").write_text("{")
    assert run_sweep(plan_of({"axes": {"zero.stage": [1, 2, 3]}}, base), out, workers=1, per_point=True).rerun == 1


def test_a_plot_that_cannot_be_drawn_keeps_the_tables(base, tmp_path, monkeypatch):
    import zsim.sweep.plot as plot

    def broken(*args, **kw):
        raise ValueError("Unknown symbol: \\frac")

    monkeypatch.setattr(plot, "plot_sweep", broken)
    out = tmp_path / "o"
    sweep = run_sweep(plan_of(AXES, base), out, workers=1)
    facts = json.loads((out / "sweep.json").read_text())
    assert "frac" in facts["plot_error"] and (out / "sweep.csv").is_file() and "png" not in facts["files"]
    assert len((out / "sweep.csv").read_text().splitlines()) == 3 and sweep.plot_error


def test_mathtext_in_names_is_drawn_as_text(base, tmp_path, monkeypatch):
    import zsim.sweep.plot as plot

    mapping = {"name": r"a $\frac{1}{$ sweep", "axes": {"model.micro_batch": [1, 2], "zero.stage": [2, 3]}}
    sweep = run_sweep(plan_of(mapping, base), tmp_path / "o", workers=1)
    assert sweep.plot_error is None and Path(sweep.files["png"]).stat().st_size > 1000
    monkeypatch.setattr(plot, "safe_label", str)  # unescaped, the same name is a mathtext error
    assert "ValueError" in run_sweep(plan_of(mapping, base), tmp_path / "p", workers=1).plot_error


def test_outputs_are_one_set_and_files_are_0644(base, tmp_path):
    out = tmp_path / "o"
    run_sweep(plan_of(AXES, base), out, workers=1)
    names = {"sweep.csv", "sweep.jsonl", "sweep.json"}
    assert names <= {p.name for p in out.iterdir()}
    targets = {os.path.realpath(out / n) for n in names}
    assert {Path(t).parent for t in targets} == {Path(os.path.realpath(out / ".current"))}
    for path in [*(out / n for n in names), *(out / "cache").iterdir()]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o644 & ~_umask(), path
    run_sweep(plan_of({"axes": {"zero.stage": [1, 2, 3]}}, base), out, workers=1)
    assert len(list((out / ".sets").iterdir())) == 1  # the old set is gone once the new one is current
    assert len((out / "sweep.csv").read_text().splitlines()) == 4


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_failed_write_leaves_the_old_set(base, tmp_path, monkeypatch):
    out = tmp_path / "o"
    run_sweep(plan_of(AXES, base), out, workers=1)
    before = {n: (out / n).read_text() for n in ("sweep.csv", "sweep.json")}
    import zsim.sweep.runner as runner

    monkeypatch.setattr(runner, "summary_facts", lambda sweep: (_ for _ in ()).throw(OSError(28, "No space")))
    with pytest.raises(OSError):
        run_sweep(plan_of({"axes": {"zero.stage": [1, 2, 3]}}, base), out, workers=1)
    assert {n: (out / n).read_text() for n in before} == before
    assert len(list((out / ".sets").iterdir())) == 1


def test_a_second_sweep_into_a_held_folder_is_refused(base, tmp_path):
    out = tmp_path / "o"
    with sweep_lock(out):
        with pytest.raises(ZsimError, match="another zsim sweep is writing"):
            run_sweep(plan_of(AXES, base), out, workers=1)
    run_sweep(plan_of(AXES, base), out, workers=1)  # free again


def _sweep_file(tmp_path: Path, base: Path, stages: list[int]) -> Path:
    path = tmp_path / f"sweep-{len(stages)}.yaml"
    path.write_text(yaml.safe_dump({"base": str(base), "axes": {"zero.stage": stages,
                                                                 "model.micro_batch": [1, 2, 4]}}))
    return path


def _consistent(out: Path) -> None:
    """sweep.csv, sweep.jsonl and sweep.json of one folder belong to one sweep."""
    if not (out / "sweep.json").exists():
        assert not (out / "sweep.csv").exists()
        return
    facts = json.loads((out / "sweep.json").read_text())
    rows = (out / "sweep.csv").read_text().splitlines()
    assert len(rows) - 1 == facts["points"]["valid"] == len((out / "sweep.jsonl").read_text().splitlines())


@pytest.mark.slow
def test_sigkill_at_any_moment_leaves_one_complete_set(base, tmp_path):
    out = tmp_path / "o"
    small, big = _sweep_file(tmp_path, base, [3]), _sweep_file(tmp_path, base, [1, 2, 3])
    cmd = [sys.executable, "-m", "zsim.cli", "sweep", "-o", str(out), "--workers", "1"]
    assert subprocess.run([*cmd, str(small)], capture_output=True, cwd=ROOT).returncode == 0
    for i, delay in enumerate((0.3, 0.6, 0.9, 1.2, 1.5, 1.8, 2.1, 2.4)):
        proc = subprocess.Popen([*cmd, "--no-plot" if i % 2 else "--per-point", str(big if i % 2 == 0 else small)],
                                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL if i % 3 else signal.SIGTERM)
        proc.wait()
        _consistent(out)
    assert subprocess.run([*cmd, str(big)], capture_output=True, cwd=ROOT).returncode == 0
    _consistent(out)


@pytest.mark.parametrize("fsize, plot", [(900, False), (4_000, False), (20_000, True)],
                         ids=["cache entry", "sweep.json", "plot"])
def test_a_full_disk_names_the_file_and_keeps_the_old_set(base, tmp_path, fsize, plot):
    """RLIMIT_FSIZE stands in for a full disk (EFBIG, like ENOSPC)."""
    import resource

    out = tmp_path / "o"
    first = _sweep_file(tmp_path, base, [3])
    cmd = [sys.executable, "-m", "zsim.cli", "sweep", "-o", str(out), "--workers", "1"]
    assert subprocess.run([*cmd, "--no-plot", str(first)], capture_output=True, cwd=ROOT).returncode == 0
    before = {n: (out / n).read_text() for n in ("sweep.csv", "sweep.json")}

    def small_files() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    bigger = _sweep_file(tmp_path, base, [1, 2, 3])
    done = subprocess.run([*cmd, *([] if plot else ["--no-plot"]), str(bigger)], capture_output=True, text=True,
                          cwd=ROOT, preexec_fn=small_files)
    assert done.returncode == 2 and "no space left on the device" in done.stderr, done.stderr
    assert str(out) in done.stderr and "Traceback" not in done.stderr
    assert {n: (out / n).read_text() for n in before} == before
