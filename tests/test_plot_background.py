"""memory.png drawn after the summary by a detached process, from the run's own files."""

import subprocess
import sys
import time

import numpy as np

from tests.conftest import ROOT
from zsim.scenario.scenario import load_scenario
from zsim.engine.simulation import simulate
from zsim.memory.timeline import write_csv
from zsim.report.facts import facts
from zsim.report.plots import series_from_files, series_from_result


def test_the_files_hold_the_same_series_as_the_result(tmp_path):
    import json

    result = simulate(load_scenario("paper/7.5B-64gpu-stage1"))  # an OOM run: the OOM mark too
    write_csv(result.ledger, tmp_path / "memory.csv")
    (tmp_path / "result.json").write_text(json.dumps(facts(result)))
    a, b = series_from_result(result), series_from_files(tmp_path)
    assert np.array_equal(a.times, b.times) and np.array_equal(a.layers, b.layers)
    assert (a.end_s, a.capacity, a.peak, a.reserved_peak, a.oom, a.title) == \
        (b.end_s, b.capacity, b.peak, b.reserved_peak, b.oom, b.title)
    assert a.oom is not None


def test_run_returns_then_the_plot_appears_whole(tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    (out / "memory.png").write_bytes(b"a stale plot of an earlier run")
    proc = subprocess.run([sys.executable, "-m", "zsim", "run", "paper/7.5B-64gpu-stage3", "-o", str(out)],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "memory.png" in proc.stdout
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # the detached process ends with timeline.png drawn, or with its error log
        png = out / "memory.png"
        drawn = png.exists() and png.read_bytes() != b"a stale plot of an earlier run"
        if drawn and ((out / "timeline.png").exists() or (out / "memory.png.log").exists()):
            break
        time.sleep(0.1)
    data = (out / "memory.png").read_bytes()
    assert data.startswith(b"\x89PNG") and len(data) > 10_000
    assert not (out / "memory.png.log").exists()
    assert not list(out.glob(".memory.png.*.partial"))
