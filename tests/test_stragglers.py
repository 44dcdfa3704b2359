"""The slowest rank's pace (zsim.calibrate.stragglers): measured per step as the slowest rank's compute
over the ranks' mean, fitted by `zsim calibrate` into a host profile, and applied by the simulator to
every compute op of a host run."""

from __future__ import annotations

import dataclasses
import json

import pytest
import yaml

from zsim import api
from zsim.calibrate.stragglers import MIN_STEPS, slowest_rank_factor, step_ratios
from zsim.cli import main
from zsim.scenario.scenario import load_scenario
from zsim.engine.compute import compute_seconds
from zsim.report.trace_writer import simulated_trace
from zsim.zero.ops import Op


def test_step_ratio_is_the_slowest_rank_over_the_mean():
    rank_steps = {(1, 0): 1.0, (1, 1): 1.5, (2, 0): 2.0, (2, 1): 2.0, (3, 0): 4.0}  # step 3: one rank
    assert step_ratios(rank_steps) == pytest.approx([1.5 / 1.25, 1.0])


def test_factor_is_the_median_ratio_and_needs_enough_steps():
    assert slowest_rank_factor([1.2, 1.05, 1.1]) == pytest.approx(1.1)
    assert slowest_rank_factor([1.2] * (MIN_STEPS - 1)) is None
    assert slowest_rank_factor([1.0, 1.0, 1.0]) == 1.0


def test_host_ops_run_at_the_slowest_ranks_pace():
    scenario = load_scenario("scenarios/calibrate/gpt-tiny-a.yaml")
    host, gpu = scenario.cluster.host, scenario.cluster.gpu
    slow = dataclasses.replace(host, slowest_rank_factor=1.25)
    for op in (Op(name="fwd/x", step=0, micro_batch=0, stream="compute", flops=1e9, hbm_bytes=1e6),
               Op(name="optimizer/step", step=0, micro_batch=0, stream="compute", hbm_bytes=1e6)):
        assert compute_seconds(op, gpu, "fp32", slow) == pytest.approx(1.25 * compute_seconds(op, gpu, "fp32", host))


def test_profile_key_is_validated(tmp_path, capsys):
    base = yaml.safe_load(open("hwprofiles/hosts/dev-2core.yaml"))
    base["compute"]["slowest_rank_factor"] = 0.9  # a rank faster than the mean of all: impossible
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(base))
    assert main(["run", "scenarios/calibrate/gpt-tiny-a.yaml", "--profile", str(bad), "--no-plot",
                 "-o", str(tmp_path / "out")]) == 2
    assert "slowest_rank_factor" in capsys.readouterr().err


def test_simulated_host_traces_calibrate_a_factor_of_one(tmp_path):
    """Simulated ranks are symmetric and already run at their profile's pace: the factor written is 1,
    the provenance says why, and the compute terms come back as the profile's."""
    runs = []
    for shape in ("a", "b"):
        run = tmp_path / f"{shape}.trace.json"
        run.write_text(json.dumps(simulated_trace(api.simulate(api.load(f"scenarios/calibrate/gpt-tiny-{shape}.yaml")))))
        runs.append(str(run))
    out = tmp_path / "host.yaml"
    assert main(["calibrate", *runs, "--profile", "dev-2core", "-o", str(out), "--fit", "compute"]) == 0
    written = yaml.safe_load(out.read_text())
    base = yaml.safe_load(open("hwprofiles/hosts/dev-2core.yaml"))
    assert written["compute"]["slowest_rank_factor"] == 1.0
    assert written["provenance"]["compute"]["slowest_rank_factor"]["how"].startswith("1: fewer than 3 steps")
    assert written["compute"]["matmul_GFLOPS"]["fp32"] == pytest.approx(base["compute"]["matmul_GFLOPS"]["fp32"], rel=1e-3)


@pytest.mark.slow
def test_real_ranks_give_a_measured_factor(tmp_path, this_host):
    """Two real gloo ranks, the calibration runs of `zsim validate replay` (two shapes, stages 0 and 3)
    with 4 steps: the factor is measured on the 12 steps after each run's warm-up."""
    import subprocess
    import sys

    runs = []
    for shape, stage in (("a", 0), ("b", 0), ("a", 3), ("b", 3)):
        run = tmp_path / f"{shape}{stage}"
        done = subprocess.run([sys.executable, "-m", "zsim.runtime", "--ranks", "2", "--stage", str(stage), "--steps", "4",
                               "--precision", "fp32", "--model", f"scenarios/calibrate/gpt-tiny-{shape}.yaml",
                               "-o", str(run)], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
        runs.append(str(run))
    out = tmp_path / "host.yaml"
    # the factor is what is tested; on a shared machine the compute fit may be poor (and say so): accept it
    assert main(["calibrate", *runs, "--profile", str(this_host), "-o", str(out), "--fit", "compute",
                 "--accept-poor-fit"]) == 0
    written = yaml.safe_load(out.read_text())
    how = written["provenance"]["compute"]["slowest_rank_factor"]
    assert how["steps"] == 12 and how["how"] == "median of max/mean rank compute per step"
    assert written["compute"]["slowest_rank_factor"] == how["value"] >= 1.0
