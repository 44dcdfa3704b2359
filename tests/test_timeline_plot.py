"""timeline.png and the time breakdown of a step (zsim/report/timeline_plot.py)."""

import pytest

from tests.conftest import small_scenario
from zsim.engine.simulation import simulate
from zsim.report.timeline_plot import _subtract, _union, time_breakdown, timeline_png


def test_interval_arithmetic():
    assert _union([(3, 4), (0, 1), (0.5, 2)]) == [(0, 2), (3, 4)]
    assert _subtract([(0, 10)], [(1, 2), (5, 12)]) == [(0, 1), (2, 5)]
    assert _subtract([(0, 1), (2, 3)], []) == [(0, 1), (2, 3)]


@pytest.mark.parametrize("sections", [
    {"zero": {"stage": 3}},
    {"zero": {"stage": 2}, "run": {"steps": 2}},
    {"zero": {"stage": 3, "partition_activations": True, "cpu_offload_activations": True}},
    {"zero": {"stage": 3, "partition_activations": True, "cpu_offload_activations": True, "cpu_offload_overlap": True}},
    # copy launches on the 'host' lane (not compute), zero-fills named fetch/params (not Pa+cpu's offload)
    {"zero": {"stage": 3, "implementation": "deepspeed-0.5"}},
])
def test_breakdown_adds_up_to_the_step(sections):
    result = simulate(small_scenario(**sections))
    parts = time_breakdown(result)
    assert set(parts) == {"compute", "MP comm", "EP all-to-all", "PP send/recv", "exposed DP comm", "exposed offload",
                          "other waits"}
    assert parts["EP all-to-all"] == parts["PP send/recv"] == 0  # a dense model without a pipeline
    assert all(v >= 0 for v in parts.values())
    assert sum(parts.values()) == pytest.approx(result.step_seconds[-1], rel=1e-9)
    steps = len(result.step_seconds)
    if steps == 1:  # the compute and MP parts are the Result's own totals
        assert parts["compute"] == pytest.approx(result.compute_seconds)
        assert parts["MP comm"] == pytest.approx(result.mp_comm_seconds)
    if not sections["zero"].get("cpu_offload_activations"):
        assert parts["exposed offload"] == 0
    if sections["zero"].get("cpu_offload_activations"):
        assert result.offload_seconds > 0
        if not sections["zero"].get("cpu_offload_overlap"):  # DeepSpeed's copies in line: all of them exposed
            assert parts["exposed offload"] == pytest.approx(result.offload_seconds, rel=1e-9)


@pytest.mark.parametrize("overlap", [False, True])
def test_ep_all_to_alls_are_their_own_part_in_line_or_beside_the_other_pass(overlap, tmp_path):
    """A MoE run's all-to-alls are not MP comm nor exposed DP comm: in line they are their own part; beside the other
    pass (parallel.ep_overlap at pp 1) what the compute stream waits for them is. The parts still add up."""
    from tests.test_ep_overlap import _flat

    result = simulate(_flat(overlap))
    parts = time_breakdown(result)
    assert sum(parts.values()) == pytest.approx(result.step_seconds[-1], rel=1e-9)
    assert 0 < parts["EP all-to-all"] <= result.ep_comm_seconds * (1 + 1e-9)
    if not overlap:
        assert parts["EP all-to-all"] == pytest.approx(result.ep_comm_seconds, rel=1e-9)
    assert parts["MP comm"] == pytest.approx(result.mp_comm_seconds, rel=1e-9)
    assert timeline_png(result, tmp_path / "t.png").stat().st_size > 20_000


def test_a_pipeline_stage_s_sends_and_receives_are_their_own_part():
    from tests.test_pipeline_engine import pipe

    result = simulate(pipe())
    parts = time_breakdown(result)
    assert parts["PP send/recv"] > 0
    assert sum(parts.values()) == pytest.approx(result.step_seconds[-1], rel=1e-9)


def test_network_bound_step_is_mostly_exposed_dp_comm(tmp_path):
    # 2 DGX-2 nodes at 1/100 of EDR: the DP all-gathers of stage 3 dominate the step.
    result = simulate(small_scenario(zero={"stage": 3}, fabric={"degrade": [
        {"link": "nic", "node": n, "index": i, "factor": 0.01} for n in (0, 1) for i in range(8)]}))
    parts = time_breakdown(result)
    assert parts["exposed DP comm"] > parts["compute"]
    path = timeline_png(result, tmp_path / "timeline.png")
    assert path.stat().st_size > 20_000


def test_zsim_run_writes_timeline_png_unless_no_plot(tmp_path):
    import subprocess
    import sys

    import yaml

    from tests.conftest import ROOT, SMALL

    scenario = tmp_path / "small.yaml"
    scenario.write_text(yaml.safe_dump(SMALL))
    for flags, expected in ((("--plot", "wait"), True), (("--no-plot",), False)):
        out = tmp_path / f"out{len(flags)}"
        proc = subprocess.run([sys.executable, "-m", "zsim.cli", "run", str(scenario), "-o", str(out), *flags],
                              capture_output=True, text=True, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr
        assert (out / "timeline.png").is_file() is expected
        assert ("timeline.png" in proc.stdout) is expected
