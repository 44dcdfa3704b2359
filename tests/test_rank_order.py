"""parallel.rank_order: Megatron-Core's two rank orders (zsim.parallel.layout). tp-cp-dp-pp (the default) makes a
pipeline stage dp × cp × mp consecutive ranks; tp-cp-pp-dp (--use-tp-pp-dp-mapping, megatron/training/initialize.py
order 'tp-cp-ep-pp-dp') makes one model replica's ranks consecutive, so on a node that holds a replica (a GB200 NVL72
rack) the pipeline's sends stay on NVLink and only data parallelism crosses nodes."""

from __future__ import annotations

import pytest

from tests.conftest import scenario_from
from zsim.engine.simulation import simulate
from zsim.errors import ConfigError
from zsim.fabric.p2p import p2p_phases
from zsim.parallel.layout import GroupShape, Layout

# 2 racks of 64 GB200 (16 trays each, as MLPerf's runs use them); a replica is mp 4 x pp 4 = 16 ranks
RACKS = {"model": {"layers": 8, "hidden": 1024, "heads": 16, "seq_len": 2048, "vocab": 32000, "micro_batch": 1,
                   "global_batch": 64},
         "parallel": {"dp": 8, "mp": 4, "pp": 4},
         "zero": {"stage": 1}, "precision": {"dtype": "bf16"},
         "hardware": {"profile": "gb200-nvl72", "nodes": 2, "gpus_per_node": 64, "nics_per_node": 64}}


def test_dp_last_groups_as_megatron_core_numbers_them():
    # MLPerf v5.0's 405B on 512 GB200: TP 4 x CP 2 x PP 8 = 64 ranks a replica, DP 8 (zsim's dp is dp x cp = 16)
    lay = Layout(dp=16, mp=4, gpus_per_node=64, nodes=8, pp=8, cp=2, dp_last=True)
    # rank = dp_index·64 + pp_index·8 + cp_index·4 + tp_index
    assert lay.dp_group(0) == [0, 4, 64, 68, 128, 132, 192, 196, 256, 260, 320, 324, 384, 388, 448, 452]
    assert lay.dp_group(13) == [k * 64 + 8 + c * 4 + 1 for k in range(8) for c in range(2)]  # stage 1, tp 1
    assert [lay.stage_of(r) for r in (0, 7, 8, 63, 64, 72)] == [0, 0, 1, 7, 0, 1]
    assert [lay.first_rank(s) for s in range(3)] == [0, 8, 16]
    assert {lay.stage_node(s) for s in range(8)} == {0}  # a replica's stages share its rack
    # the DP group: its cp pair in each of 8 racks; 32 such groups (8 stages x 4 TP ranks) in a rack
    assert lay.dp_shape == GroupShape(size=16, per_node=2, nodes=8, concurrent_per_node=32)
    assert lay.group_shape("pp") == GroupShape(size=8, per_node=8, nodes=1, concurrent_per_node=8)
    assert lay.group_shape("cp") == GroupShape(size=2, per_node=2, nodes=1, concurrent_per_node=32)
    assert lay.stage_ranks_per_node == 8  # one replica a rack: its stage's mp x cp ranks send at once
    assert lay.stage_rank_text(1) == "8-15 + k·64 (k < 8)"


def test_the_default_order_is_unchanged():
    lay = Layout(dp=16, mp=4, gpus_per_node=64, nodes=8, pp=8, cp=2)
    assert lay.dp_group(0) == range(0, 64, 4)
    assert [lay.stage_node(s) for s in range(3)] == [0, 1, 2]  # a stage fills a rack; the pipeline crosses them
    assert lay.dp_shape == GroupShape(size=16, per_node=16, nodes=1, concurrent_per_node=4)
    assert lay.group_shape("pp").nodes == 8
    assert lay.stage_ranks_per_node == 64 and lay.stage_rank_text(1) == "64-127"


def test_a_pipeline_send_stays_on_nvlink_only_when_the_replica_shares_a_node():
    default = scenario_from(RACKS, "default")
    dp_last = scenario_from(RACKS, "dp-last", parallel={"rank_order": "tp-cp-pp-dp"})
    # default: a stage is dp 8 x mp 4 = 32 ranks, two a rack, so stage 1 -> 2 crosses racks
    assert p2p_phases(1 << 20, default.cluster, default.layout, 1, 2)[0] == "p2p/net"
    assert p2p_phases(1 << 20, default.cluster, default.layout, 0, 1)[0] == "p2p/nvlink"
    for src in range(3):
        assert p2p_phases(1 << 20, dp_last.cluster, dp_last.layout, src, src + 1)[0] == "p2p/nvlink"
    assert default.layout.dp_shape.nodes == 1 and dp_last.layout.dp_shape.nodes == 2  # DP crosses racks instead
    a, b = simulate(default), simulate(dp_last)
    assert a.pipeline["p2p_sent_bytes_per_step"] == b.pipeline["p2p_sent_bytes_per_step"]
    assert b.pipeline["p2p_send_seconds_per_step"] < a.pipeline["p2p_send_seconds_per_step"] / 2
    assert b.pipeline["per_stage"][1]["ranks"] == "4-7 + k·16 (k < 8)"


def test_without_a_pipeline_the_two_orders_are_one():
    flat = {**RACKS, "parallel": {"dp": 32, "mp": 4}}
    a = simulate(scenario_from(flat, "a"))
    b = simulate(scenario_from(flat, "b", parallel={"rank_order": "tp-cp-pp-dp"}))
    assert a.step_seconds == b.step_seconds and a.algorithms == b.algorithms


@pytest.mark.parametrize("parallel, words", [
    ({"pp": 3, "dp": 8, "mp": 4, "rank_order": "tp-cp-pp-dp"}, "12 ranks straddle the 64-GPU nodes"),
])
def test_refusals_name_the_key(parallel, words):
    data = {**RACKS, "model": {**RACKS["model"], "layers": 12, "global_batch": 96},
            "hardware": {**RACKS["hardware"], "nodes": 3, "gpus_per_node": 32, "nics_per_node": 32}}
    with pytest.raises(ConfigError) as err:
        scenario_from(data, "bad", parallel=parallel)
    assert err.value.path == "parallel.rank_order" and words.replace("64", "32") in str(err.value)


def test_expert_parallelism_keeps_the_default_order():
    import yaml

    from tests.conftest import ROOT
    from zsim.scenario.scenario import build_scenario

    data = yaml.safe_load((ROOT / "scenarios/mixtral-8x7b-pp4-ep8-dgx-h100.yaml").read_text(encoding="utf-8"))
    data["parallel"]["rank_order"] = "tp-cp-pp-dp"
    with pytest.raises(ConfigError) as err:
        build_scenario(data, source=str(ROOT / "scenarios/x.yaml"), default_name="x", base_dir=ROOT / "scenarios")
    assert err.value.path == "parallel.rank_order" and "parallel.ep" in str(err.value)
