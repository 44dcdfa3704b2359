"""Mixture-of-experts (issue 27 item 6): parameters exact against Mixtral's checkpoint, active FLOPs,
the all-to-all volume and the expert model states as closed forms, the load factor, layout checks."""

import pytest

from tests.conftest import ROOT, small_dict
from zsim.config.hf import read_hf_config
from zsim.scenario.scenario import build_scenario, load_scenario
from zsim.config.model_section import ModelSection, MoeSection
from zsim.engine.simulation import simulate
from zsim.errors import ConfigError
from zsim.report.facts import facts
from zsim.report.summary import summary
from zsim.workload.moe import Moe
from zsim.workload.parameters import active_params, total_params
from zsim.workload.transformer import build_workload

HF = ROOT / "scenarios" / "hf"
MIXTRAL = ROOT / "scenarios" / "mixtral-8x7b-ep8-dgx-h100.yaml"


def test_mixtral_imports_with_the_released_count_and_its_active_params():
    keys = read_hf_config(HF / "mixtral-8x7b.json")
    model = ModelSection(**(keys | {"micro_batch": 1, "moe": MoeSection(**keys["moe"])}))
    assert model.moe.experts == 8 and model.moe.top_k == 2
    assert total_params(model) == 46_702_792_704  # mistralai/Mixtral-8x7B-v0.1 safetensors
    # 6 idle experts of 3 · 4096 · 14336 in each of 32 layers: 12,879,925,248 active (Mixtral paper: "13B active")
    assert active_params(model) == 46_702_792_704 - 32 * 6 * 3 * 4096 * 14336 == 12_879_925_248


def _moe_dict(moe: dict, **sections) -> dict:
    model = {"layers": 2, "hidden": 256, "heads": 8, "seq_len": 128, "vocab": 1000, "micro_batch": 2,
             "gated_mlp": True, "linear_bias": False, "ffn_hidden": 512, "moe": moe}
    base = dict(model=model, parallel={"dp": 8, "mp": 1, "ep": 4}, zero={"stage": 1},
                hardware={"profile": "dgx-h100", "nodes": 1}, precision={"dtype": "bf16"})
    return small_dict(**{**base, **sections})


def test_routed_experts_split_over_ep_and_their_states_over_expert_data_parallel():
    sc = build_scenario(_moe_dict({"experts": 8, "top_k": 2}), source="<t>")
    w = build_workload(sc.model, 1, "bf16", ep=4)
    per_expert = 3 * 256 * 512
    assert w.expert_params_per_rank == 2 * (8 // 4) * per_expert  # 2 layers × 2 local experts
    r = simulate(sc, mode="class")
    # ZeRO-1 (K = 12): the dense part over DP 8 (flat buffer, padded), the experts over dp / ep = 2 ranks
    experts_optimizer = 12 * w.expert_params_per_rank / 2
    assert r.model_states.optimizer - experts_optimizer == pytest.approx(12 * w.params_per_mp_rank / 8, rel=1e-3)
    f = facts(r)
    edp = {x["op"]: x for x in f["comm"]["collectives"] if x["group"] == "edp"}
    assert edp["reduce_scatter"]["payload_bytes_per_step"] == 2 * w.expert_params_per_rank  # bf16 gradients, once
    assert f["model"]["expert_params_per_rank"] == w.expert_params_per_rank


def test_all_to_all_volume_is_the_closed_form():
    sc = build_scenario(_moe_dict({"experts": 8, "top_k": 2, "imbalance": 1.25}), source="<t>")
    f = facts(simulate(sc, mode="class"))
    a2a = [x for x in f["comm"]["collectives"] if x["group"] == "ep"]
    assert [x["op"] for x in a2a] == ["all_to_all"]
    tokens, h, k, e = 128 * 2, 256, 2, 2
    per = 1.25 * tokens * k * h * e  # load × T·top_k token copies of h bf16 elements
    # per layer and micro-batch: dispatch + combine forward, again in the recompute, and backward's two
    assert a2a[0]["count_per_step"] == 2 * 6 * sc.grad_accum
    assert a2a[0]["payload_bytes_per_step"] == pytest.approx(2 * 6 * sc.grad_accum * per)
    assert f["time"]["ep_comm_seconds_per_step"] > 0 and "EP all-to-all" in summary(f)


def test_deepep_sends_a_token_once_per_rank_its_experts_are_on():
    """moe.dispatcher deepep: the closed form ep · (1 − C(E − E/ep, k)/C(E, k)) of the ranks a token's k
    experts fall on, against a count over uniform draws; one expert per rank leaves k; the step's EP bytes
    scale by it."""
    import numpy as np

    rng = np.random.default_rng(0)
    for experts, k, ep in ((128, 8, 8), (64, 6, 8), (16, 4, 4), (8, 2, 8), (8, 2, 2)):
        moe = Moe(experts=experts, top_k=k, ffn=1, shared=0, shared_ffn=1, load=1.0, dense_layers=0, gated=True,
                  bias=False, dispatcher="deepep")
        picks = np.argsort(rng.random((100_000, experts)), axis=1)[:, :k] // (experts // ep)  # rank of each pick
        counted = np.mean([len(set(row)) for row in picks])
        assert moe.copies_per_token(ep) == pytest.approx(counted, rel=0.01), (experts, k, ep)
    one_each = Moe(experts=8, top_k=2, ffn=1, shared=0, shared_ffn=1, load=1.0, dense_layers=0, gated=True,
                   bias=False, dispatcher="deepep")
    assert one_each.copies_per_token(8) == pytest.approx(2.0)  # k distinct experts on k distinct ranks
    bytes_of = {}
    for dispatcher in ("alltoall", "deepep"):
        sc = build_scenario(_moe_dict({"experts": 16, "top_k": 4, "dispatcher": dispatcher}), source="<t>")
        a2a = [x for x in facts(simulate(sc, mode="class"))["comm"]["collectives"] if x["group"] == "ep"]
        bytes_of[dispatcher] = a2a[0]["payload_bytes_per_step"]
    ranks = 4 * (1 - (12 * 11 * 10 * 9) / (16 * 15 * 14 * 13))  # C(12, 4) / C(16, 4)
    assert bytes_of["deepep"] == pytest.approx(bytes_of["alltoall"] * ranks / 4, rel=1e-6)
    sc = build_scenario(_moe_dict({"experts": 16, "top_k": 4, "dispatcher": "deepep"}), source="<t>")
    f = facts(simulate(sc, mode="class"))
    assert f["comm"]["ep_dispatcher"] == "deepep" and f["comm"]["ep_copies_per_token"] == pytest.approx(ranks)
    assert f"(deepep dispatch: {ranks:.2f} copies a token)" in summary(f)


def test_deepep_crosses_to_each_node_once():
    """Across nodes DeepEP sends a token once to each other node holding any of its experts (Moe.nic_share):
    the closed form against counted random draws (with one EP rank a node it is the rank count: 1), and the
    simulated EP all-to-all of a run whose EP group spans 4 nodes, 2 ranks on each: NIC-bound, it takes
    nic_share × the alltoall dispatch's time for the same bytes; class and per-rank mode agree."""
    import numpy as np

    rng = np.random.default_rng(1)
    for experts, k, ep, per_node in ((128, 8, 32, 8), (64, 4, 16, 4), (8, 2, 8, 2), (16, 4, 4, 1)):
        moe = Moe(experts=experts, top_k=k, ffn=1, shared=0, shared_ffn=1, load=1.0, dense_layers=0, gated=True,
                  bias=False, dispatcher="deepep")
        picks = np.argsort(rng.random((50_000, experts)), axis=1)[:, :k] // (experts // ep)  # each pick's rank
        home = rng.integers(0, ep, 50_000)  # the sender's rank
        remote_nodes = np.mean([len({r // per_node for r in row} - {h // per_node}) for row, h in zip(picks, home)])
        even = moe.copies_per_token(ep) * (ep - per_node) / ep
        assert moe.nic_share(ep, per_node) == pytest.approx(remote_nodes / even, rel=0.02), (experts, k, ep)
        assert Moe(**{**{f: getattr(moe, f) for f in moe.__dataclass_fields__}, "dispatcher": "alltoall"}
                   ).nic_share(ep, per_node) == 1.0
    assert moe.nic_share(4, 4) == 1.0  # one node: nothing crosses
    # the fabric: an all-to-all across 4 nodes, 2 members each, NIC-bound: its bandwidth phase takes nic_share
    # of the time for the same bytes (zsim.fabric.collective: the NIC weight scaled)
    from zsim.fabric.cluster import load_cluster
    from zsim.fabric.collective import plan_collective, uncontended_time
    from zsim.fabric.topology import aggregate_capacities, build_topology
    from zsim.parallel.layout import GroupShape

    cluster = load_cluster("dgx-h100", nodes=4)
    shape = GroupShape(size=8, per_node=2, nodes=4, concurrent_per_node=4)
    capacity = aggregate_capacities(build_topology(cluster), cluster)
    share = Moe(experts=16, top_k=4, ffn=1, shared=0, shared_ffn=1, load=1.0, dense_layers=0, gated=True, bias=False,
                dispatcher="deepep").nic_share(8, 2)
    _, even = plan_collective("all_to_all", 1 << 30, shape, cluster)
    _, deepep = plan_collective("all_to_all", 1 << 30, shape, cluster, nic_share=share)
    moving = [uncontended_time(p, capacity) - sum(x.latency_s for x in p) for p in (even, deepep)]
    assert 0 < share < 1 and moving[1] == pytest.approx(share * moving[0], rel=1e-9)
    # a run whose EP groups span 4 nodes, 8 ranks on each (experts whole beside MP 4: DeepEP with experts split
    # over MP dispatches over MP × EP, which zsim refuses): less EP time with DeepEP; class = per-rank mode
    runs = {}
    for dispatcher in ("alltoall", "deepep"):
        data = _moe_dict({"experts": 32, "top_k": 4, "dispatcher": dispatcher}, hardware={"profile": "dgx-h100", "nodes": 4},
                         parallel={"dp": 8, "mp": 4, "ep": 32, "expert_mp": 1, "sequence_parallel": True})
        sc = build_scenario(data, source="<t>")
        runs[dispatcher] = simulate(sc, mode="class")
    per_rank = simulate(sc, mode="per_rank")
    assert per_rank.step_seconds == pytest.approx(runs["deepep"].step_seconds, rel=1e-9)
    assert runs["deepep"].ep_comm_seconds < runs["alltoall"].ep_comm_seconds


def test_model_flops_count_active_experts_and_the_load_factor_is_hardware_work():
    balanced = simulate(build_scenario(_moe_dict({"experts": 8, "top_k": 2}), source="<t>"), mode="class")
    skewed = simulate(build_scenario(_moe_dict({"experts": 8, "top_k": 2, "imbalance": 1.5}), source="<t>"), mode="class")
    assert balanced.model_flops == skewed.model_flops  # active parameters per token, whatever the routing
    moe = Moe.of(skewed.scenario.model)
    routed = moe.routed_flops(128 * 2, 256, 1)
    # forward, recompute and backward (2×) of the routed experts, × (load − 1), per layer and micro-batch
    extra = (1.5 - 1) * routed * (1 + 1 + 2) * 2 * skewed.scenario.grad_accum
    assert skewed.hardware_flops - balanced.hardware_flops == pytest.approx(extra)
    assert skewed.step_seconds[0] > balanced.step_seconds[0]
    capped = Moe.of(ModelSection(layers=1, hidden=8, heads=1, seq_len=4, vocab=8, micro_batch=1,
                                 moe=MoeSection(experts=4, top_k=1, capacity_factor=1.25, imbalance=3.0)))
    assert capped.load == 1.25  # padded to capacity: the capacity factor, not the imbalance, sets the work


def test_dense_layers_and_shared_experts_count():
    model = ModelSection(layers=3, hidden=16, heads=2, seq_len=8, vocab=32, micro_batch=1, gated_mlp=True,
                         linear_bias=False, norm="rmsnorm", position="rotary", tied_head=False, ffn_hidden=64,
                         moe=MoeSection(experts=4, top_k=2, expert_ffn_hidden=8, shared_experts=2, dense_layers=1))
    attention = 4 * 16 * 16 + 2 * 16  # q, k, v, o; two RMSNorm weights
    dense_block = attention + 3 * 16 * 64
    moe_block = attention + 16 * 4 + (4 + 2) * 3 * 16 * 8  # router, 4 routed + 2 shared experts of width 8
    assert total_params(model) == dense_block + 2 * moe_block + 2 * 32 * 16 + 16
    assert active_params(model) == total_params(model) - 2 * (4 - 2) * 3 * 16 * 8


def test_shipped_mixtral_scenario_runs_and_says_active_params():
    f = facts(simulate(load_scenario(MIXTRAL), mode="class"))
    assert f["fits"] and f["layout"]["ep"] == 8 and f["model"]["params"] == 46_702_792_704
    text = summary(f)
    assert "MoE 8 experts top 2 (12.9B active per token: model FLOPs count these)" in text and "EP 8 within DP" in text


def test_class_and_per_rank_modes_agree_with_experts():
    sc = build_scenario(_moe_dict({"experts": 8, "top_k": 2, "imbalance": 1.2}), source="<t>")
    a, b = simulate(sc, mode="class"), simulate(sc, mode="per_rank")
    assert a.step_seconds == pytest.approx(b.step_seconds, rel=1e-9) and a.ledger.peak == b.ledger.peak


@pytest.mark.parametrize("moe, sections, key, words", [
    ({"experts": 8, "top_k": 2}, dict(parallel={"dp": 8, "mp": 1, "ep": 3}), "parallel.ep", "divide dp"),
    ({"experts": 6, "top_k": 2}, dict(parallel={"dp": 8, "mp": 1, "ep": 4}), "parallel.ep", "experts"),
    ({"experts": 8, "top_k": 2}, dict(zero={"stage": 3, "implementation": "deepspeed-0.5"}), "zero.implementation",
     "MoE not supported with Stage 3"),
    ({"experts": 8, "top_k": 2}, dict(parallel={"dp": 4, "mp": 2, "ep": 4}), "parallel.sequence_parallel",
     "Megatron-LM requires sequence parallelism"),
    (None, dict(parallel={"dp": 8, "mp": 1, "ep": 2}), "parallel.ep", "no"),
])
def test_layouts_that_do_not_work_are_refused(moe, sections, key, words):
    data = _moe_dict(moe, **sections)
    if moe is None:
        del data["model"]["moe"]
    with pytest.raises(ConfigError) as err:
        build_scenario(data, source="<t>")
    assert err.value.path == key and words in str(err.value)


def test_top_k_above_the_experts_is_refused():
    with pytest.raises(ConfigError, match="top_k 3 is more than the 2 experts"):
        build_scenario(_moe_dict({"experts": 2, "top_k": 3}), source="<t>")


def test_expert_groups_are_evenly_spaced_ranks_and_invert_group_index():
    """EP groups are ep consecutive DP ranks of one MP rank, EDP groups the DP ranks ep apart (Megatron-Core);
    Layout.group_ranks gives them as ranges, and every rank is in the group group_index names."""
    from zsim.parallel.layout import Layout

    lay = Layout(dp=16, mp=2, gpus_per_node=8, nodes=4, ep=4)
    assert lay.group_members("ep", 3) == [9, 11, 13, 15]  # block 1 of DP ranks 4-7, MP rank 1
    assert lay.group_members("edp", 3) == [3, 11, 19, 27]  # DP ranks 1, 5, 9, 13 of MP rank 1
    for rank in range(32):
        for kind in ("dp", "mp", "ep", "edp"):
            members = lay.group_members(kind, lay.group_index(kind, rank))
            assert rank in members and len(members) == lay.group_size(kind)
