"""The merged trace of a measured run is one a viewer accepts (issue 26): a real stage-3 run on CPU
ranks, whose prefetched gathers overlap on the comm stream, merges into a trace where the events of
every thread nest (Perfetto, chrome://tracing), with a ProfilerStep#N span per step and rank, which
Holistic Trace Analysis loads and breaks down (when it is installed)."""

from __future__ import annotations

import json
import shutil
from collections import Counter

import pytest

from tests.runtime.conftest import tiny_model
from zsim.trace.tracks import partial_overlaps

pytestmark = pytest.mark.slow


def _stage3(traced):
    return traced("accum_s3_ckpt", stage=3, world_size=2, model=tiny_model(grad_accum=2), checkpointing=True)


def test_the_merged_trace_nests_on_every_thread_and_keeps_every_span(traced):
    run = _stage3(traced)
    merged = json.loads((run.out / "trace.json").read_text())["traceEvents"]
    assert partial_overlaps(merged) == []
    spans = [e for e in merged if e["ph"] == "X" and not e["name"].startswith("ProfilerStep#")]
    for rank in range(2):
        own = [e for e in run.trace(rank)["traceEvents"] if e["ph"] == "X"]
        mine = [e for e in spans if e["pid"] == rank]
        assert Counter(e["name"] for e in mine) == Counter(e["name"] for e in own)  # moved, none lost
        assert {e["tid"] for e in mine if e["name"].startswith("fwd/")} == {0}  # compute stays on its thread
        assert all(e["args"]["stream"] == e["tid"] for e in mine)
        named = {e["tid"] for e in merged if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == rank}
        assert {e["tid"] for e in mine} <= named  # every lane has a name


def test_every_rank_file_nests_on_every_thread_and_keeps_its_streams(traced):
    """The rank files too (issue 26): the prefetched gathers that overlap on the comm stream go to lanes
    of it (tid 1 + 10·j), the readers find every span's stream (zsim.trace.tracks.stream_of)."""
    from zsim.trace.run_reader import read_run
    from zsim.trace.run_samples import collective_samples, compute_samples
    from zsim.trace.tracks import stream_of

    run = _stage3(traced)
    laned = 0
    for rank in range(2):
        events = run.trace(rank)["traceEvents"]
        assert partial_overlaps(events) == []
        spans = [e for e in events if e["ph"] == "X"]
        laned += sum(e["tid"] >= 10 for e in spans)
        assert all(stream_of(e) == 1 for e in spans if e["name"].startswith(("all_gather/", "reduce_scatter/")))
        assert {e["tid"] for e in spans if e["name"].startswith(("fwd/", "bwd/", "optimizer/"))} == {0}
    assert laned > 0, "the stage-3 prefetch overlapped no gathers: the check above tested nothing"
    measured = read_run(run.out)
    assert len(compute_samples(measured)) == sum(
        1 for rank in range(2) for e in run.trace(rank)["traceEvents"]
        if e["ph"] == "X" and e["name"].split("/")[0] in ("fwd", "bwd", "recompute", "optimizer") and "op" not in e["args"])
    assert collective_samples(measured)


def test_every_step_of_every_rank_has_a_profiler_step_span_around_its_compute(traced):
    run = _stage3(traced)
    merged = json.loads((run.out / "trace.json").read_text())["traceEvents"]
    for rank in range(2):
        steps = sorted((e for e in merged if e["ph"] == "X" and e["pid"] == rank
                        and e["name"].startswith("ProfilerStep#")), key=lambda e: e["ts"])
        assert [e["name"] for e in steps] == [f"ProfilerStep#{s}" for s in range(10)]
        for a, b in zip(steps, steps[1:]):
            assert a["ts"] + a["dur"] <= b["ts"] + 1e-6
        for e in merged:
            if e["ph"] == "X" and e["pid"] == rank and e["tid"] == 0:
                step = steps[e["args"]["step"]]
                assert step["ts"] - 1e-6 <= e["ts"] <= step["ts"] + step["dur"] + 1e-6


@pytest.mark.filterwarnings("ignore:The inplace keyword")  # HTA 0.5 on pandas 3
def test_holistic_trace_analysis_loads_the_merged_trace_and_breaks_it_down(traced, tmp_path):
    pytest.importorskip("hta", reason="HolisticTraceAnalysis is not installed (pip install zsim[dev])")
    from hta.trace_analysis import TraceAnalysis

    run = _stage3(traced)
    shutil.copy(run.out / "trace.json", tmp_path / "trace.json")  # HTA reads every trace file of a folder
    analysis = TraceAnalysis(trace_dir=str(tmp_path))
    iterations = set(analysis.t.get_trace(0)["iteration"])
    assert set(range(9)) <= iterations  # found by the ProfilerStep#N spans (HTA drops the last step)
    temporal = analysis.get_temporal_breakdown(visualize=False)
    assert temporal["kernel_time(us)"].iloc[0] > 0 and temporal["idle_time(us)"].iloc[0] >= 0
    kernels = analysis.get_gpu_kernel_breakdown(visualize=False)[0]
    assert kernels["sum"].sum() > 0
