"""zero.overlap_comm: with it (the default) the DP gradient reductions overlap backward on their own
stream; without it (DeepSpeed's 2020 default for stages 1-2, the paper's runs) they run on the compute
stream, which waits for each."""

import pytest

from tests.conftest import small_scenario
from zsim.scenario.scenario import load_scenario
from zsim.engine.simulation import simulate

MODEL = {"layers": 8, "hidden": 1024, "heads": 16, "seq_len": 512, "micro_batch": 4}


def _run(stage: int, overlap: bool):
    return simulate(small_scenario(zero={"stage": stage, "overlap_comm": overlap, "reduce_bucket_elements": 5_000_000},
                                   parallel={"dp": 32, "mp": 1}, model=MODEL))


def _spans(r, prefix):
    return [(e["ts"], e["ts"] + e["dur"]) for e in r.events if e["name"].startswith(prefix)]


@pytest.mark.parametrize("stage", [0, 2])
def test_blocking_reductions_serialize_with_backward(stage):
    op = "all_reduce/grads" if stage == 0 else "reduce_scatter/grads"
    overlapped, blocking = _run(stage, True), _run(stage, False)
    reductions = [e for e in blocking.events if e["name"].startswith(op)]
    assert len(reductions) > 2 and all(e["cat"] == "compute" for e in reductions)
    assert all(e["cat"] == "comm" for e in overlapped.events if e["name"].startswith(op))
    # Without overlap no backward kernel runs while a reduction does ...
    for a, b in _spans(blocking, op):
        assert all(not (s < b - 1e-6 and e > a + 1e-6) for s, e in _spans(blocking, "bwd/"))
    # ... with it some reduction overlaps backward, and the step is shorter by what was hidden.
    assert any(s < b and e > a for a, b in _spans(overlapped, op) for s, e in _spans(overlapped, "bwd/"))
    assert blocking.total_seconds > overlapped.total_seconds
    assert blocking.compute_seconds == pytest.approx(overlapped.compute_seconds, rel=1e-9)


def test_default_overlaps_and_paper_scenarios_do_not():
    assert small_scenario().zero.overlap_comm is True
    for name in ("fig2-zero-100B", "fig3-60B-128gpu", "C1-100B-400gpu", "fig2-megatron-8B"):
        assert load_scenario(f"scenarios/paper/{name}.yaml").zero.overlap_comm is False
