"""The summary's cautions: allocator cache flushes (counted per step in result.json) and a reserved margin
as small as that of the ZeRO paper's runs zsim overestimates most (docs/validation.md, "Per run")."""

from tests.conftest import ROOT, small_scenario
from zsim import api
from zsim.engine.simulation import simulate
from zsim.report.facts import _per_step, facts
from zsim.report.cautions import NEAR_CAPACITY
from zsim.report.summary import summary


def test_flushes_are_binned_into_the_steps_they_happen_in():
    # steps of 2, 3 and 1 s end at 2, 5 and 6 s; the set-up at t = 0 counts with step 1
    assert _per_step([0.0, 1.0, 2.0, 2.5, 5.9], [2.0, 3.0, 1.0]) == [3, 1, 1]
    assert _per_step([], [1.0, 1.0]) == [0, 0]


def _run(gpu_memory_gib: float) -> tuple[dict, str]:
    result = simulate(small_scenario(hardware={"profile": "dgx2", "gpu_memory_GiB": gpu_memory_gib}))
    f = facts(result)
    return f, summary(f)


def test_a_run_near_capacity_is_flagged_and_one_with_room_is_not():
    near, text = _run(1.6)  # the small scenario reserves 1.38 GiB at its peak: a 13.5% margin
    assert near["fits"] and near["memory"]["reserved_margin_bytes"] < NEAR_CAPACITY * near["memory"]["capacity_bytes"]
    assert "caution   reserved margin 14% of capacity" in text and "9-128% slower" in text
    roomy, text = _run(4.0)
    assert roomy["memory"]["allocator_flushes"] == 0 and "caution" not in text


def test_a_run_that_flushes_the_cache_says_when():
    """The paper's 170B at batch 12 without Pa+cpu fills 34.2 of 34.4 GB: the allocator releases its
    cache once, in the first step, and the summary names it."""
    result = api.simulate(api.load(ROOT / "scenarios" / "paper" / "fig8-170B-400gpu-C4.yaml"))
    f = facts(result)
    per_step = f["memory"]["allocator_flushes_per_step"]
    assert f["memory"]["allocator_flushes"] == sum(per_step) == len(result.ledger.flush_times) >= 1
    assert len(per_step) == len(result.step_seconds) and per_step[0] >= 1
    assert f"caution   {sum(per_step)} allocator cache flush" in summary(f)


def test_the_caution_quotes_what_the_chart_runs_give():
    """The figures the near-capacity caution quotes are those of the authors' 22 chart runs as zsim
    simulates them now (benchmarks/chart_errors.py): if the model moves them, this fails until the
    summary's NEAR_CAPACITY_SLOWER (and docs/validation.md) follow."""
    from benchmarks.chart_errors import chart_rows, split
    from zsim.report.cautions import NEAR_CAPACITY_SLOWER

    n, low, high, median = split(chart_rows())[True]
    assert n >= 11  # most of the chart's runs are this close in zsim
    assert tuple(round(x, 2) for x in (low, high, median)) == NEAR_CAPACITY_SLOWER


def test_a_cpu_host_near_its_memory_gets_no_gpu_caution():
    """The caution describes GPU runs under PyTorch's CUDA caching allocator: a CPU host's summary does
    not carry it at the same margin that a GPU run's does (the margins are set on real runs' facts, as
    the tiny host scenario cannot fill the machine's memory)."""
    host = facts(api.simulate(api.load(ROOT / "scenarios" / "host" / "tiny-2rank-stage3.yaml")))
    gpu, _ = _run(4.0)
    for f in (host, gpu):
        capacity = f["memory"]["capacity_bytes"]
        f["memory"]["reserved_margin_bytes"] = int(0.05 * capacity)
        f["memory"]["reserved_peak_bytes"] = capacity - f["memory"]["reserved_margin_bytes"]
    assert "reserved margin 5% of capacity" in summary(gpu)
    assert "reserved margin" not in summary(host)
