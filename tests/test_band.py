"""The error band (zsim.report.band): computed from the suites' held-out residuals, never hand-set;
printed by `zsim run` beside the step time in place of the memory-margin caution; carried by result.json;
'outside every validated regime' when no held-out run shares the run's topology."""

import pytest

from tests.conftest import ROOT, small_scenario
from zsim import api
from zsim.engine.simulation import simulate
from zsim.report.facts import _per_step, facts
from zsim.report.summary import summary
from zsim.report.band import Regime, band_for, build_table, outside_words, read_table, regime_of


# The modern suite's held-out points simulated again by the slow test (~6 s together; the whole half takes
# minutes): one node, DP across nodes, an interleaved pipeline of 4 and of 8 stages.
MODERN_SPOT = ("kor-22B-sel", "ptdp-t1-3.6B", "ptdp-t1-76.1B", "kor-175B-full")


def _res(point, regime, error, suite="scale"):
    return {"suite": suite, "point": point, "regime": regime, "error": error}


def test_the_band_is_the_median_and_range_of_its_regimes_residuals():
    key = "ZeRO-3 at scale (over 256 GPUs) | Ampere | shipped profile"
    table = build_table([_res("a", key, -0.6), _res("b", key, -0.2), _res("c", key, -0.4),
                         _res("d", "one node | Volta | shipped profile", 0.1), _res("e", key, None)])
    row = table["regimes"][key]
    assert (row["n"], row["error_median"], row["error_low"], row["error_high"]) == (3, -0.4, -0.6, -0.2)
    assert row["points"] == ["scale:a", "scale:b", "scale:c"] and table["unsimulated"] == ["scale:e"]
    # moving one residual moves the band: nothing in it is hand-set
    moved = build_table([_res("a", key, -0.9), _res("b", key, -0.2), _res("c", key, -0.4)])
    assert moved["regimes"][key]["error_low"] == -0.9


def test_the_docs_band_table_is_the_stored_one():
    """docs/validation.md's table of bands ("regime | runs | median | range") lists every regime of
    band_table.json with its count, median and range, and no other (a regime the suites no longer fill
    stayed there once: the MoE row after its one point moved to the calibration half)."""
    lines = (ROOT / "docs" / "validation.md").read_text(encoding="utf-8").splitlines()
    start = lines.index("| regime | runs | median | range | a real step is |") + 2
    rows = {}
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        name, runs, median, span = (c.strip() for c in line.strip("|").split("|")[:4])
        topology, generation = name.rsplit(", ", 1)
        rows[f"{topology} | {generation} | shipped profile"] = (int(runs), median, span)

    def pct(x: float) -> str:
        return f"{x:+.0%}".replace("-", "\u2212")

    stored = {k: (v["n"], pct(v["error_median"]),
                  pct(v["error_low"]) if v["n"] == 1 else f"{pct(v['error_low'])} to {pct(v['error_high'])}")
              for k, v in read_table()["regimes"].items()}
    assert rows == stored


def test_the_stored_table_is_the_one_its_residuals_give():
    table = read_table()
    rebuilt = build_table(table["residuals"])
    assert rebuilt["regimes"] == table["regimes"] and rebuilt["unsimulated"] == table["unsimulated"]
    assert all(r["suite"] in ("scale", "paper", "megatron", "modern") for r in table["residuals"])
    assert len(table["regimes"]) >= 4


@pytest.mark.slow
def test_the_stored_residuals_are_what_the_suites_give_now():
    """Simulates every held-out point but the modern suite's (~35 s): fails when the model moved and the
    table was not regenerated (`.venv/bin/python -m zsim.validate.band_table --write`)."""
    from zsim.validate.band_table import collect

    stored = [r for r in read_table()["residuals"] if r["suite"] != "modern"]
    assert collect(modern=False) == stored, "band table out of date: python -m zsim.validate.band_table --write"


@pytest.mark.slow
def test_the_stored_modern_residuals_are_what_the_suite_gives_now():
    """The modern suite's held-out pipelines take minutes together: four of them (MODERN_SPOT), from each
    regime they fill (one node, DP across nodes, pipeline parallelism), are simulated again and must be
    the stored rows."""
    from zsim.validate.band_table import modern_residuals

    ids = MODERN_SPOT
    stored = [r for r in read_table()["residuals"] if r["suite"] == "modern" and r["point"] in ids]
    assert len(stored) == len(ids)
    assert modern_residuals(ids) == stored, "band table out of date: python -m zsim.validate.band_table --write"


def test_regimes_follow_the_layout_and_the_gpu():
    flagship = api.load(ROOT / "scenarios" / "1T-1024gpu.yaml")
    assert regime_of(flagship) == Regime("ZeRO-3 at scale (over 256 GPUs)", "Volta", "shipped")
    one = api.load(ROOT / "scenarios" / "megatron" / "8.3B-mp8.yaml")
    assert regime_of(one).topology == "one node"
    tp = api.load(ROOT / "scenarios" / "paper" / "fig2-megatron-40B.yaml")
    assert regime_of(tp).topology == "tensor parallelism across nodes"
    # a pipeline is its own topology (its bubble and p2p sends), not the DP band its ZeRO-1 stage would give
    pp = api.load(ROOT / "scenarios" / "llama-3-70b-3d-dgx-h100.yaml")
    assert regime_of(pp) == Regime("pipeline parallelism", "Hopper", "shipped")
    # experts are their own schedule, with or without a pipeline
    for name in ("mixtral-8x7b-pp4-ep8-dgx-h100.yaml", "mixtral-8x7b-ep8-dgx-h100.yaml"):
        assert regime_of(api.load(ROOT / "scenarios" / name)).topology == "mixture-of-experts"


def test_a_run_outside_every_regime_borrows_the_nearest_and_says_so():
    """No held-out ZeRO-3 run on V100 at scale: the flagship under DeepSpeed's 2021 stage 3 gets the A100
    band of that version, marked as the nearest."""
    flagship = api.load(ROOT / "scenarios" / "1T-1024gpu.yaml", set={"zero.implementation": "deepspeed-0.5"})
    band = band_for(flagship)
    assert band is not None and band.match == "nearest" and "Ampere" in band.regime
    assert band.words(80.0).count("outside every validated regime; nearest") == 1
    lo, mid, hi = band.step_range(80.0)
    assert lo <= mid <= hi and lo == pytest.approx(80.0 / (1 + band.high))


def test_a_nearest_band_of_another_generation_comes_with_the_runs_own_generation():
    """A Blackwell ZeRO-3 run across 16 nodes (no held-out Blackwell ZeRO-3 run: the LLaMA-3-70B ZeRO-3 scenario on 16
    DGX B200s; until the fourteenth session's Qwen3 runs gave Blackwell a MoE row this was a Blackwell MoE run) borrows
    the nearest ZeRO-3 band of another generation and says what Blackwell's held-out runs of other layouts took,
    pooled; an exact band adds nothing (the GB200 405B scenario: a Blackwell pipeline, a validated regime since the
    eleventh session's NVFP4 runs)."""
    from zsim.report.error_band import band_facts

    table = read_table()
    zero3 = api.load(ROOT / "scenarios" / "llama-3-70b-dgx-h100.yaml",
                     set={"hardware.profile": "dgx-b200", "hardware.nodes": 16, "parallel.dp": 16})
    f = band_facts(zero3, 14.0)
    own = f["own_generation"]
    blackwell = [r["error"] for r in table["residuals"] if r["regime"].endswith(" | Blackwell | shipped profile")]
    assert (f["match"], own["match"], own["n"]) == ("nearest", "generation", len(blackwell)) and len(blackwell) == 38
    assert f["regime"].startswith("ZeRO-3 across nodes (up to 256 GPUs) | ")
    assert not f["regime"].endswith(" | Blackwell | shipped profile")
    assert (own["error_low"], own["error_high"]) == (min(blackwell), max(blackwell))
    assert own["step_high_s"] == pytest.approx(14.0 / (1 + min(blackwell)))
    assert f"{len(blackwell)} held-out Blackwell runs of other layouts took" in f["words"]
    three_d = band_facts(api.load(ROOT / "scenarios" / "llama-3-70b-3d-dgx-h100.yaml"), 10.0)
    assert three_d["match"] == "exact" and "own_generation" not in three_d
    gb200 = band_facts(api.load(ROOT / "scenarios" / "llama-3.1-405b-mlperf50-gb200-nvl72.yaml"), 14.0)
    assert gb200["match"] == "exact" and "own_generation" not in gb200


def test_a_zero3_regime_names_its_deepspeed_version_and_no_other_version_borrows_it():
    """The Selene ZeRO-3 points run `deepspeed-0.5`: their band is that version's; the same run under the
    paper plan or v0.14 is outside every validated regime (it does not borrow another version's errors)
    and says which implementation has held-out runs."""
    row = {"n": 3, "error_median": 0.01, "error_low": 0.0, "error_high": 0.2, "points": ["a", "b", "c"]}
    table = {"regimes": {"ZeRO-3 at scale (over 256 GPUs) under deepspeed-0.5 | Ampere | shipped profile": row}}
    layout = {"model": {"layers": 2, "hidden": 1024, "heads": 16, "seq_len": 256, "vocab": 5000, "micro_batch": 1},
              "parallel": {"dp": 512, "mp": 1}, "hardware": {"profile": "dgx-a100", "nodes": 64}}
    ds = small_scenario(zero={"stage": 3, "implementation": "deepspeed-0.5"}, **layout)
    paper = small_scenario(zero={"stage": 3}, **layout)
    assert regime_of(ds).topology == "ZeRO-3 at scale (over 256 GPUs) under deepspeed-0.5"
    assert band_for(ds, table).match == "exact"
    v014 = small_scenario(zero={"stage": 3, "implementation": "deepspeed-0.14"}, **layout)
    for other in (paper, v014):
        assert band_for(other, table) is None
        assert outside_words(other, table).endswith(
            "held-out runs exist as ZeRO-3 at scale (over 256 GPUs) under deepspeed-0.5 (zero.implementation)")


def test_a_run_with_no_validated_topology_has_no_band():
    host = api.load(ROOT / "scenarios" / "host" / "tiny-2rank-stage3.yaml")
    assert band_for(host) is None
    assert band_for(small_scenario(), table={"regimes": {}}) is None
    f = facts(simulate(host))
    assert f["band"]["match"] == "outside" and "outside every validated regime" in f["band"]["words"]
    assert "band      outside every validated regime" in summary(f)


def _run(gpu_memory_gib: float) -> tuple[dict, str]:
    result = simulate(small_scenario(hardware={"profile": "dgx2", "gpu_memory_GiB": gpu_memory_gib}))
    f = facts(result)
    return f, summary(f)


def test_the_summary_prints_the_band_and_no_memory_margin_caution():
    """The small scenario (ZeRO-3 on two nodes) reserves 1.38 GiB at its peak: with a 13.5% margin the old
    summary cautioned that the step was optimistic; the band replaces it, the same at any margin (memory is
    not a regime)."""
    near, text = _run(1.6)
    assert near["fits"] and near["memory"]["reserved_margin_bytes"] < 0.16 * near["memory"]["capacity_bytes"]
    assert "reserved margin" not in text and "read the step as optimistic" not in text
    band = near["band"]
    assert band["match"] != "outside" and band["step_low_s"] <= band["step_median_s"] <= band["step_high_s"]
    assert f"  band      {band['words']}" in text
    roomy, text2 = _run(4.0)
    assert roomy["band"] == band and "caution" not in text2


def test_flushes_are_binned_into_the_steps_they_happen_in():
    # steps of 2, 3 and 1 s end at 2, 5 and 6 s; the set-up at t = 0 counts with step 1
    assert _per_step([0.0, 1.0, 2.0, 2.5, 5.9], [2.0, 3.0, 1.0]) == [3, 1, 1]
    assert _per_step([], [1.0, 1.0]) == [0, 0]


def test_a_run_that_flushes_the_cache_says_when():
    """The paper's 170B at batch 12 without Pa+cpu fills 34.2 of 34.4 GB: the allocator releases its
    cache once, in the first step, and the summary names it (time the step leaves out)."""
    result = api.simulate(api.load(ROOT / "scenarios" / "paper" / "fig8-170B-400gpu-C4.yaml"))
    f = facts(result)
    per_step = f["memory"]["allocator_flushes_per_step"]
    assert f["memory"]["allocator_flushes"] == sum(per_step) == len(result.ledger.flush_times) >= 1
    assert len(per_step) == len(result.step_seconds) and per_step[0] >= 1
    assert f"caution   {sum(per_step)} allocator cache flush" in summary(f)


def test_a_pipeline_gets_the_pipeline_band_and_experts_theirs():
    """A pipeline's band is the modern suite's held-out pipelines', exact on Ampere (Selene's A100s) and on Hopper
    (Megatron-Core r0.8.0's two held-out pipeline rows and its strong-scaling series' two ends, since 2026-11-28,
    Megatron-Bridge's FP8 Llama-3.1-405B of 25.11 and 26.04.01 and the held-out MLPerf Training runs),
    Ampere's the nearest where a table has no
    Hopper row; never the data-parallel band its ZeRO-1 stage fell into before. A MoE run gets the MoE
    row of its generation: on Hopper the held-out Megatron-Core runs of Qwen3-235B-A22B and Mixtral-8x22B and
    Megatron-Bridge's Qwen3-30B-A3B on 16 H100 (NeMo AutoModel's Qwen3-30B-A3B is in the calibration half: it guided
    the DeepEP dispatcher); a table without that row says it is outside every validated regime."""
    table = read_table()
    row = table["regimes"]["pipeline parallelism | Ampere | shipped profile"]
    assert row["n"] >= 5 and all(p.startswith("modern:") for p in row["points"])
    three_d = api.load(ROOT / "scenarios" / "llama-3-70b-3d-dgx-h100.yaml")
    hopper = band_for(three_d, table)
    assert hopper is not None and hopper.match == "exact"
    assert hopper.regime == "pipeline parallelism | Hopper | shipped profile"
    assert sorted(p for p in hopper.points if not p.startswith("modern:mlperf")) == [
        "modern:bridge-llama31-405b-h100-1024", "modern:bridge2604-llama31-405b-h100-1024", "modern:mcore08-119B",
        "modern:mcore08-177B-4608",
        "modern:mcore08-177B-96", "modern:mcore08-314B"]
    # and the 16 held-out MLPerf Training runs on Hopper (GPT-3 175B of v3.0-v4.1, Llama 3.1 405B of v5.0, H100 and
    # H200). Blackwell's held-out runs are the four v5.1 B200 8B runs and a GB200 8B declared after its attention fit
    # (every earlier Blackwell point is calibration since: docs/validation.md) and the eleventh session's v5.1 runs:
    # HSG's two NVFP4 405B pipelines, so a Blackwell pipeline run (the GB200 405B scenario) has its own band again;
    # the twelfth session's: UF's 8B on 2 and 16 nodes and 405B on 56, Dell's and Lenovo's 1-node NVFP4 runs
    assert sum(p.startswith("modern:mlperf") for p in hopper.points) == 16
    # and the fourteenth session's Megatron-Bridge Qwen3 runs (26.04.01's 235B on 256 GB200 and B200, 26.06's five):
    # a MoE row; the fifteenth session's held-out DeepSeek-V3 runs (26.04.01 on 256 GB300 and B300, 26.06's three) join
    # it, and its held-out Llama 3.1 405B runs (GB300 FP8 and NVFP4, GB200 MXFP8) the pipeline row
    blackwell = {k: sorted(v["points"]) for k, v in table["regimes"].items() if "| Blackwell |" in k}
    assert blackwell == {
        "mixture-of-experts | Blackwell | shipped profile": [
            "modern:bridge2604-deepseek-v3-b300-256", "modern:bridge2604-deepseek-v3-gb300-256",
            "modern:bridge2604-qwen3-235b-b200-256", "modern:bridge2604-qwen3-235b-gb200-256",
            "modern:bridge2606-deepseek-v3-b300-256", "modern:bridge2606-deepseek-v3-gb200-256",
            "modern:bridge2606-deepseek-v3-gb300-256", "modern:bridge2606-qwen3-235b-gb200-256",
            "modern:bridge2606-qwen3-235b-gb300-256",
            "modern:bridge2606-qwen3-30b-b300-8", "modern:bridge2606-qwen3-30b-gb200-8",
            "modern:bridge2606-qwen3-30b-gb300-8"],
        "data parallel across nodes (ZeRO 0-2) | Blackwell | shipped profile": [
            "modern:mlperf51-llama8b-b200-128", "modern:mlperf51-llama8b-b200-16",
            "modern:mlperf51-llama8b-dell-xe9680l-16", "modern:mlperf51-llama8b-dell-xe9685l-16",
            "modern:mlperf51-llama8b-nebius-b200-32-nvfp4", "modern:mlperf51-llama8b-oracle-64",
            "modern:mlperf51-llama8b-verda-64"],
        "one node | Blackwell | shipped profile": [
            "modern:bridge-llama3-8b-gb200-8", "modern:mlperf51-llama8b-dell-b300-8",
            "modern:mlperf51-llama8b-dell-xe9680l-8-nvfp4", "modern:mlperf51-llama8b-gb300-72",
            "modern:mlperf51-llama8b-gb300-8-nvfp4", "modern:mlperf51-llama8b-lambda-gb300-72",
            "modern:mlperf51-llama8b-lenovo-b300-8-nvfp4", "modern:mlperf51-llama8b-lenovo-sr780av3-8-nvfp4",
            "modern:mlperf51-llama8b-nebius-b300-8-nvfp4", "modern:mlperf51-llama8b-oracle-8-nvfp4",
            "modern:mlperf51-llama8b-supermicro-422-nvfp4"],
        "pipeline parallelism | Blackwell | shipped profile": [
            "modern:bridge2604-llama3-70b-gb200-mxfp8", "modern:bridge2604-llama3-70b-gb300-mxfp8",
            "modern:bridge2604-llama31-405b-gb200-mxfp8", "modern:bridge2604-llama31-405b-gb300-fp8",
            "modern:bridge2604-llama31-405b-gb300-nvfp4", "modern:mlperf51-llama405b-hsg-2560",
            "modern:mlperf51-llama405b-hsg-5120",
            "modern:mlperf51-llama405b-uf-448"]}
    for shipped in ("llama-3.1-405b-mlperf50-gb200-nvl72.yaml", "llama-3.1-405b-mlperf51-gb300-nvl72-nvfp4.yaml"):
        bw = band_for(api.load(ROOT / "scenarios" / shipped), table)
        assert bw is not None and (bw.match, bw.regime) == ("exact", "pipeline parallelism | Blackwell | shipped profile")
    no_hopper = {**table, "regimes": {k: v for k, v in table["regimes"].items()
                                      if k != "pipeline parallelism | Hopper | shipped profile"}}
    nearest = band_for(three_d, no_hopper)
    assert nearest is not None and nearest.match == "nearest"
    assert nearest.regime == "pipeline parallelism | Ampere | shipped profile"
    moe = api.load(ROOT / "scenarios" / "mixtral-8x7b-ep8-dgx-h100.yaml")
    row = table["regimes"]["mixture-of-experts | Hopper | shipped profile"]
    assert sorted(row["points"]) == ["modern:bridge2604-qwen3-30b-h100-16",
                                     "modern:modelzoo-mixtral-8x22b-forced", "modern:modelzoo-mixtral-8x22b-fp8",
                                     "modern:modelzoo-qwen3-235b-ep32-pp8", "modern:modelzoo-qwen3-235b-ep32-pp8-overlap",
                                     "modern:modelzoo-qwen3-235b-ep8-fsdp", "modern:modelzoo-qwen3-235b-tp4-ep8-pp8"]
    band = band_for(moe, table)
    assert band is not None and band.match == "exact" and set(band.points) == set(row["points"])
    without = {**table, "regimes": {k: v for k, v in table["regimes"].items() if "mixture-of-experts" not in k}}
    assert band_for(moe, without) is None
    assert outside_words(moe, without).startswith("outside every validated regime: no held-out published run of "
                                                  "mixture-of-experts")


def test_a_band_of_one_run_says_one_figure():
    from zsim.report.band import Band

    one = Band("mixture-of-experts | Hopper | shipped profile", 1, 0.25, 0.25, 0.25, ("modern:x",))
    assert one.words(25.0) == ("20 s: 1 held-out published run of mixture-of-experts | Hopper | shipped profile "
                               "took 0.80x zsim's step")
    two = Band("r", 2, 0.0, -0.2, 0.25, ("a", "b"))
    assert two.words(25.0).startswith("20-31.2 s (median 25 s): 2 held-out published runs of r took 0.80x to 1.25x")
