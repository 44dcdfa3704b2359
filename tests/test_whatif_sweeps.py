"""The shipped what-if sweeps (scenarios/whatif/): they validate, and their answers make physical sense.

The flagship IB sweep is judged by issue 11: step time never rises with bandwidth, flattens once
compute dominates, has a knee per stage, and stage 3 spends a larger share of its step communicating
than stage 2 at equal bandwidth (it moves 3Ψ per step against 2Ψ, ZeRO §7).
"""

from __future__ import annotations

import pytest
import yaml

from tests.conftest import ROOT
from zsim.config.schema import HardwareSection
from zsim.sweep.answers import KNEE_GAIN
from zsim.sweep.points import load_plan, plan_sweep
from zsim.sweep.runner import run_sweep
from zsim.sweep.spec import load_sweep_file
from zsim.config.struct import fields, replace

WHATIF = ROOT / "scenarios" / "whatif"
SWEEPS = sorted(p for p in WHATIF.glob("*.yaml") if "base" in yaml.safe_load(p.read_text()))
NEEDS_NIC = pytest.mark.skipif("nic_Gbps" not in fields(HardwareSection),
                               reason="needs the hardware.nic_Gbps override (issue 9, contract 2)")


def subset(path, zip=None, **axes):  # noqa: A002
    """The shipped sweep with some axes narrowed (same file, same base, fewer points)."""
    spec = load_sweep_file(path)
    spec = replace(spec, axes={**spec.axes, **axes}, zip=spec.zip if zip is None else zip)
    return plan_sweep(spec, str(path), path.parent)


def test_the_four_sweeps_are_shipped():
    assert {p.name for p in SWEEPS} >= {"ib-bandwidth-1T.yaml", "stage-vs-dp-7.5B.yaml", "layout-1T.yaml",
                                        "slow-nic.yaml"}


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.stem)
def test_every_point_of_every_shipped_sweep_validates(path):
    if "hardware.nic_Gbps" in path.read_text() and "nic_Gbps" not in fields(HardwareSection):
        pytest.skip("needs the hardware.nic_Gbps override (issue 9, contract 2)")
    plan = load_plan(path)
    assert len(plan.points) + sum(plan.skipped.values()) == plan.total > 1


@NEEDS_NIC
@pytest.mark.slow
def test_flagship_ib_sweep_answers():
    plan = subset(WHATIF / "ib-bandwidth-1T.yaml", **{"zero.stage": [2, 3]})
    sweep = run_sweep(plan, None, workers=2)
    for stage in (2, 3):
        rows = sorted(sweep.table.where(**{"zero.stage": stage}).rows, key=lambda r: r["hardware.nic_Gbps"])
        steps = [r["step_s"] for r in rows]
        assert len(rows) == 19 and rows[0]["hardware.nic_Gbps"] == 25 and rows[-1]["hardware.nic_Gbps"] == 12800
        # never rises with bandwidth
        assert all(b <= a * (1 + 1e-12) for a, b in zip(steps, steps[1:])), steps
        # network-bound at 25 Gb/s, compute-bound and flat at the top
        assert rows[0]["bottleneck_kind"] in ("network", "memory") and rows[0]["exposed_share"] > 0.9
        top = rows[-1]
        assert top["compute_s"] + top["mp_comm_s"] > 0.5 * top["step_s"]  # compute dominates at the top
        assert top["bottleneck_kind"] == ("compute" if stage == 3 else "memory")
        assert steps[-2] / steps[-1] < 1.05  # and the curve is flat there
        # a knee per stage, and beyond it a further 2× buys < 5%
        knee = next(k for k in sweep.knees if k.group == {"zero.stage": stage})
        assert knee.x is not None
        by_x = {r["hardware.nic_Gbps"]: r["step_s"] for r in rows}
        for x in by_x:
            if knee.x <= x and 2 * x in by_x:
                assert (by_x[x] - by_x[2 * x]) / by_x[x] < KNEE_GAIN
    s2 = {r["hardware.nic_Gbps"]: r for r in sweep.table.where(**{"zero.stage": 2})}
    s3 = {r["hardware.nic_Gbps"]: r for r in sweep.table.where(**{"zero.stage": 3})}
    for bw in s2:
        assert s3[bw]["comm_share"] > s2[bw]["comm_share"], bw
        assert s3[bw]["dp_comm_s"] > s2[bw]["dp_comm_s"], bw
    assert all(r["status"] == "oom" for r in s2.values()) and all(r["status"] == "fits" for r in s3.values())
    assert sweep.best["zero.stage"] == 3 and sweep.best["hardware.nic_Gbps"] == 12800


def test_stage_vs_dp_reproduces_figure_1_memory_and_times_it():
    sweep = run_sweep(load_plan(WHATIF / "stage-vs-dp-7.5B.yaml"), None, workers=2)
    at64 = {r["zero.stage"]: r for r in sweep.table.where(**{"parallel.dp": 64})}
    # ZeRO Figure 1 (Ψ = 7.5B, Nd = 64): 120, 31.4, 16.6, 1.9 GB; this shape has Ψ = 7.46B
    for stage, paper_gb in ((0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)):
        assert at64[stage]["model_states_bytes"] / 1e9 == pytest.approx(paper_gb * 7.46 / 7.5, rel=0.02)
    assert at64[0]["status"] == "oom" and "model states alone" in at64[0]["bottleneck"]
    assert at64[2]["status"] == at64[3]["status"] == "fits"
    assert all(r["step_s"] > r["compute_s"] > 0 for r in sweep.table)


@pytest.mark.slow
def test_slow_nic_costs_more_the_slower_it_is():
    plan = subset(WHATIF / "slow-nic.yaml", **{"fabric.degrade.0.factor": [0.1, 0.4, 1.0], "model.micro_batch": [1]})
    sweep = run_sweep(plan, None, workers=2)
    rows = sorted(sweep.table.rows, key=lambda r: r["fabric.degrade.0.factor"])
    assert all(r["mode"] == "per_rank" for r in rows)
    assert rows[0]["step_s"] > rows[1]["step_s"] > rows[2]["step_s"]
    assert rows[0]["dp_comm_s"] > 2 * rows[2]["dp_comm_s"]


def test_layout_sweep_finds_a_layout_that_fits():
    plan = subset(WHATIF / "layout-1T.yaml", zip=[{"parallel.mp": [8, 16], "parallel.dp": [128, 64]}],
                  **{"model.micro_batch": [1, 2], "zero.stage": [2, 3]})
    sweep = run_sweep(plan, None, workers=2)
    assert sweep.best is not None and sweep.best["zero.stage"] == 3
    assert all(r["status"] == "oom" for r in sweep.table.where(**{"zero.stage": 2}))


def test_without_gpudirect_a_faster_nic_stops_helping_at_the_pcie_bound():
    """gpudirect-1T: with GPUDirect RDMA the NIC-bound step halves from 100 to 200 Gb/s; staged through host
    memory it is the same at both, each NIC held at half its PCIe switch's uplink (zsim.fabric.gpudirect)."""
    plan = subset(WHATIF / "gpudirect-1T.yaml", **{"hardware.nic_Gbps": [100, 200]})
    rows = {(r["hardware.nic_Gbps"], r["hardware.gpudirect_rdma"]): r for r in run_sweep(plan, None, workers=2).table.rows}
    assert rows[(200, True)]["step_s"] < 0.6 * rows[(100, True)]["step_s"]
    assert rows[(200, False)]["step_s"] == pytest.approx(rows[(100, False)]["step_s"], rel=1e-9)
    assert rows[(100, False)]["step_s"] > 1.5 * rows[(100, True)]["step_s"]
    assert "staged through host memory (no GPUDirect RDMA)" in rows[(100, False)]["bottleneck"]
    assert "staged" not in rows[(100, True)]["bottleneck"]


@NEEDS_NIC
def test_the_collectives_sms_cost_nothing_where_the_network_is_the_step_and_most_where_compute_is():
    """sm-contention-llama-3-70b: at 100 Gb/s the compute, slowed or not, hides behind the collectives (the same
    step); at 800 Gb/s it is the critical path and the SMs NCCL holds beside it lengthen the step, by no more than
    their share (18 of 132) of the compute."""
    plan = subset(WHATIF / "sm-contention-llama-3-70b.yaml", **{"hardware.nic_Gbps": [100, 800]})
    rows = {(r["fabric.sm_contention"], r["hardware.nic_Gbps"]): r for r in run_sweep(plan, None, workers=2).table.rows}
    assert rows[(True, 100)]["step_s"] == pytest.approx(rows[(False, 100)]["step_s"], rel=1e-3)
    slow, fast = rows[(True, 800)]["step_s"], rows[(False, 800)]["step_s"]
    assert fast < slow <= fast * (1 + 18 / (132 - 18))


@pytest.mark.slow
def test_recomputing_the_moe_layer_is_what_fits_qwen3_at_16k():
    """whatif/recompute-qwen3-235b-16k: the norms and the experts' activation (the 4k runs' "norm, act") are not
    enough at 16k tokens; only the points that recompute the whole MoE layer fit, and the attention core's recompute
    (FlashAttention's kernel run again) costs time and frees almost nothing."""
    sweep = run_sweep(load_plan(WHATIF / "recompute-qwen3-235b-16k.yaml"), None, workers=2)
    rows = {r["zero.recompute_modules"]: r for r in sweep.table}
    assert {k for k, r in rows.items() if r["status"] == "fits"} == {"[moe]", "[layernorm, moe]"}
    assert rows["[core_attn]"]["step_s"] > rows["[]"]["step_s"] and rows["[core_attn]"]["status"] == "oom"
    assert sweep.best["zero.recompute_modules"] in ("[moe]", "[layernorm, moe]")


@pytest.mark.slow
@NEEDS_NIC
def test_ep_overlap_pays_most_on_a_slow_network_and_never_more_than_was_exposed():
    """whatif/ep-overlap-qwen3-235b: at every NIC rate the overlapped run is faster, by less than the run in line
    leaves exposed (step − compute); the saving grows as the network slows until there is no more compute to hide behind;
    on the slowest network the bottleneck names the all-to-alls, not DP traffic."""
    sweep = run_sweep(load_plan(WHATIF / "ep-overlap-qwen3-235b.yaml"), None, workers=2)
    rows = {(r["hardware.nic_Gbps"], r["parallel.ep_overlap"]): r for r in sweep.table}
    rates = (100, 200, 400, 800)
    assert all(r["status"] == "fits" for r in rows.values())
    saved = [rows[(g, False)]["step_s"] - rows[(g, True)]["step_s"] for g in rates]
    assert all(s > 0 for s in saved)
    for g, s in zip(rates, saved):
        assert s < rows[(g, False)]["step_s"] * rows[(g, False)]["exposed_share"]  # only exposed time can go
    assert saved[0] > saved[-1]
    assert "EP all-to-alls" in rows[(100, False)]["bottleneck"]
    assert "DP communication" not in rows[(100, False)]["bottleneck"]


def test_fp8_is_faster_at_every_nic_rate_and_gains_most_where_the_network_is_fastest():
    """fp8-llama-3-70b-3d: FP8's linear layers shorten the step at 100 and 800 Gb/s alike, by less than the 2x of
    their GEMMs' peak (attention, the quantize passes, the bubble and the network stay), and a faster network leaves
    FP8 the larger share of the step to shorten."""
    plan = subset(WHATIF / "fp8-llama-3-70b-3d.yaml", **{"hardware.nic_Gbps": [100, 800]})
    rows = {(r["precision.fp8"], r["hardware.nic_Gbps"]): r for r in run_sweep(plan, None, workers=2).table.rows}
    gain = {nic: rows[("none", nic)]["step_s"] / rows[("current", nic)]["step_s"] for nic in (100, 800)}
    assert 1.0 < gain[100] < gain[800] < 2.0
