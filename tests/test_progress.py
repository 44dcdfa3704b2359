"""Progress bars on long work: shown on a terminal, silent otherwise, and never changing a result."""

import subprocess
import sys

from tests.conftest import ROOT
from zsim.commands.maxsize import max_layers
from zsim.scenario.scenario import load_scenario
from zsim.engine.simulation import simulate


def test_per_rank_progress_bar_does_not_change_the_simulation(capsys):
    scenario = load_scenario("whatif/7.5B-64gpu-slow-nic")  # degraded NIC: per-rank mode
    quiet = simulate(scenario)
    shown = simulate(scenario, progress=True)
    assert quiet.mode == shown.mode == "per_rank"
    assert quiet.step_seconds == shown.step_seconds and quiet.sim_events == shown.sim_events
    assert "simulating 64 ranks" in capsys.readouterr().err


def test_maxsize_search_bar_counts_trials(capsys):
    data = {"model": {"layers": 1, "hidden": 1024, "heads": 16, "seq_len": 512, "vocab": 1000, "micro_batch": 1},
            "parallel": {"dp": 16, "mp": 1}, "zero": {"stage": 3}, "hardware": {"profile": "dgx2", "nodes": 1}}
    assert max_layers(data, 2 * 2**30, limit=64, progress=True).layers >= 1
    assert "maxsize: simulated trials" in capsys.readouterr().err


def test_no_bar_when_stderr_is_not_a_terminal(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "zsim", "run", "whatif/7.5B-64gpu-slow-nic", "--no-plot", "-o",
                           str(tmp_path)], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
