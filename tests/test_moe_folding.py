"""Experts whole beside tensor parallelism (parallel.expert_mp 1, Megatron-Core's
--expert-tensor-parallel-size 1, "MoE parallel folding"): the folded EP and EDP groups, the loader's
checks, the experts' states, GEMM shapes and collectives as closed forms, and class against per-rank mode."""

import pytest

from tests.conftest import small_dict
from zsim.compute.kernel_shape import Shape as KShape
from zsim.compute.kernels import moe_block_forward
from zsim.engine.simulation import simulate
from zsim.errors import ConfigError
from zsim.parallel.layout import Layout
from zsim.report.facts import facts
from zsim.report.summary import summary
from zsim.scenario.scenario import build_scenario
from zsim.workload.transformer import build_workload

E, K, H, F = 16, 2, 256, 512  # experts, top_k, hidden, expert width


def _dict(parallel: dict, moe: dict | None = None, **sections) -> dict:
    model = {"layers": 2, "hidden": H, "heads": 8, "seq_len": 128, "vocab": 1000, "micro_batch": 2,
             "gated_mlp": True, "linear_bias": False, "ffn_hidden": F, "moe": {"experts": E, "top_k": K, **(moe or {})}}
    base = dict(model=model, parallel={"sequence_parallel": True, **parallel}, zero={"stage": 1},
                hardware={"profile": "dgx-h100", "nodes": max(1, parallel["dp"] * parallel["mp"] // 8)},
                precision={"dtype": "bf16"})
    return small_dict(**{**base, **sections})


def test_folded_groups_follow_megatron_core_expert_rank_order():
    """parallel_state.py's expert RankGenerator, order 'tp-ep-dp-pp' with tp = the experts' TP size: a stage's
    ranks etp fastest, then ep, then edp. With etp 1 an EP group is ep consecutive ranks across MP and DP."""
    lay = Layout(dp=8, mp=2, gpus_per_node=8, nodes=2, ep=4, etp=1)
    assert lay.group_members("ep", 0) == [0, 1, 2, 3] and lay.group_members("ep", 3) == [12, 13, 14, 15]
    assert lay.group_size("edp") == 4 and lay.group_members("edp", 1) == [1, 5, 9, 13]
    assert lay.group_shape("ep").per_node == 4 and lay.group_shape("edp").nodes == 2
    for rank in range(16):
        for kind in ("ep", "edp"):
            assert rank in lay.group_members(kind, lay.group_index(kind, rank))


def test_default_expert_mp_keeps_the_groups_carved_out_of_dp():
    """etp = mp (unset) gives the groups zsim always had: EP ep consecutive DP ranks of one MP rank."""
    for dp, mp, ep in ((16, 2, 4), (8, 4, 2), (8, 1, 8)):
        unset, explicit = Layout(dp=dp, mp=mp, gpus_per_node=8, nodes=dp * mp // 8, ep=ep), \
            Layout(dp=dp, mp=mp, gpus_per_node=8, nodes=dp * mp // 8, ep=ep, etp=mp)
        for rank in range(dp * mp):
            d, m = unset.dp_rank(rank), unset.mp_rank(rank)
            assert unset.group_index("ep", rank) == explicit.group_index("ep", rank) == (d // ep) * mp + m
            assert unset.group_index("edp", rank) == (d % ep) * mp + m
        assert unset.group_size("edp") == dp // ep


@pytest.mark.parametrize("parallel, key, words", [
    ({"dp": 2, "mp": 4, "ep": 2, "expert_mp": 2}, "parallel.expert_mp", "1 (each expert whole"),
    ({"dp": 4, "mp": 2, "ep": 8}, "parallel.ep", "divide dp 4"),  # experts split over MP: carved out of DP
    ({"dp": 4, "mp": 2, "ep": 16, "expert_mp": 1}, "parallel.ep", "divide dp × mp = 8"),
])
def test_expert_layouts_that_do_not_work_are_refused(parallel, key, words):
    with pytest.raises(ConfigError) as err:
        build_scenario(_dict(parallel), source="<t>")
    assert err.value.path == key and words in str(err.value)


def test_expert_mp_needs_experts():
    data = _dict({"dp": 8, "mp": 1, "expert_mp": 1})
    del data["model"]["moe"]
    with pytest.raises(ConfigError) as err:
        build_scenario(data, source="<t>")
    assert err.value.path == "parallel.expert_mp"


def test_whole_experts_hold_their_full_width_and_edp_partitions_them():
    """dp 4 × mp 2, ep 8 folded: each rank holds E/8 = 2 experts whole (3·h·f each, gated), and ZeRO-1
    partitions their states over the dp·mp/(ep·etp) = 1-rank EDP group (no partition)."""
    sc = build_scenario(_dict({"dp": 4, "mp": 2, "ep": 8, "expert_mp": 1}), source="<t>")
    w = build_workload(sc.model, 2, "bf16", sequence_parallel=True, ep=8, etp=1)
    assert w.expert_params_per_rank == 2 * (E // 8) * 3 * H * F  # 2 layers × 2 whole experts
    split = build_workload(sc.model, 2, "bf16", sequence_parallel=True, ep=4)  # etp = mp: 4 experts at half width
    assert split.expert_params_per_rank == w.expert_params_per_rank
    assert sc.layout.group_size("edp") == 1
    r = simulate(sc, mode="class")
    experts_optimizer = 12 * w.expert_params_per_rank  # K = 12 over one rank
    assert r.model_states.optimizer - experts_optimizer == pytest.approx(12 * w.params_per_mp_rank / 4, rel=1e-3)
    assert facts(r)["layout"]["expert_mp"] == 1
    assert "DP 4 × MP 2 (EP 8 over MP × DP, experts whole)" in summary(facts(r))


def test_folding_moves_gemm_shapes_not_flops():
    """Routed FLOPs per rank are load·T·k·f/mp either way (Moe.expert_tokens); with the experts whole each
    GEMM has the full width f and the tokens of its EP group's sequence shares, and the router and the
    dispatch handle this rank's T/mp tokens."""
    def shape(ep, etp):
        sc = build_scenario(_dict({"dp": 8, "mp": 2, "ep": ep, **({"expert_mp": etp} if etp else {})}), source="<t>")
        return KShape.of(sc.model, 2, 1024, "bf16", sp=True, ep=ep, etp=etp)

    split, whole = shape(4, None), shape(8, 1)
    E_, local, m, f, _, k, tm = whole.moe
    assert (local, f, tm) == (E // 8, F, 128 * 2 // 2)  # 2 whole experts, T/mp = 128 tokens routed here
    assert m == 8 * tm * K // E  # load 1: the EP group's ep·T/mp tokens × top_k over E experts
    assert split.moe[3] == F // 2 and split.moe[6] == 128 * 2

    def expert_flops(x):
        return sum(2 * kk.m * kk.n * kk.k * kk.batch for kk in moe_block_forward(x) if kk.name.startswith("moe.experts"))
    assert expert_flops(whole) == expert_flops(split) == 3 * 2 * (128 * 2) * K * H * F / 2


def test_a_moe_block_without_shared_experts_drops_the_mlp_sequence_parallel_collectives():
    """[MC] token_dispatcher.py: with expert TP 1 each MP rank routes its own sequence share, so a MoE block's
    MLP has no all-gather before it nor reduce-scatter after it; the attention's pair stays. Shared experts
    run on the gathered sequence, so a block with them keeps the MLP's pair."""
    sc = build_scenario(_dict({"dp": 4, "mp": 2, "ep": 8, "expert_mp": 1}), source="<t>")
    whole = build_workload(sc.model, 2, "bf16", sequence_parallel=True, ep=8, etp=1).blocks[0]
    split = build_workload(sc.model, 2, "bf16", sequence_parallel=True, ep=4).blocks[0]
    assert [op for op, _ in whole.mp_collectives_fwd] == ["all_gather", "reduce_scatter"]
    assert len(whole.mp_collectives_bwd) == 2 and len(split.mp_collectives_fwd) == len(split.mp_collectives_bwd) == 4
    # the router runs on the tokens the rank routes: T/mp with whole experts, T when they split (its fp32 logits)
    assert whole.saved_tensors != split.saved_tensors
    from zsim.workload.moe import Moe
    moe = Moe.of(sc.model)
    assert moe.saved_tensors(256, H, 2, 2, 8, 1)[:2] == (4 * 128 * E, 8 * 128 * K)
    assert moe.saved_tensors(256, H, 2, 2, 4)[:2] == (4 * 256 * E, 8 * 256 * K)
    shared = build_scenario(_dict({"dp": 4, "mp": 2, "ep": 8, "expert_mp": 1}, {"shared_experts": 1}), source="<t>")
    assert len(build_workload(shared.model, 2, "bf16", sequence_parallel=True, ep=8, etp=1).blocks[0]
               .mp_collectives_fwd) == 4


def test_split_experts_gather_the_routed_copies_over_mp():
    """[MC] MoEAlltoAllTokenDispatcher with the experts split over TP: after the EP all-to-all the routed token
    copies are all-gathered over the TP group and the experts' output reduce-scattered before the combine: e·R·h
    for R = top_k·T × load copies (here 2 × 256 tokens), not the dense MLP's e·T·h; the attention's pair stays,
    and shared experts add the dense pair (they gather the sequence as the dense MLP)."""
    e, tokens = 2, 128 * 2  # bf16; seq 128 × micro-batch 2
    for load in (1.0, 1.5):
        sc = build_scenario(_dict({"dp": 4, "mp": 2, "ep": 4}, {"imbalance": load}), source="<t>")
        block = build_workload(sc.model, 2, "bf16", sequence_parallel=True, ep=4).blocks[0]
        routed = e * round(load * 4 * tokens * K / E) * (E // 4) * H  # tokens_per_expert × local experts × h
        want = [("all_gather", e * tokens * H), ("reduce_scatter", e * tokens * H),
                ("all_gather", routed), ("reduce_scatter", routed)]
        assert list(block.mp_collectives_fwd) == want and list(block.mp_collectives_bwd) == want
    shared = build_scenario(_dict({"dp": 4, "mp": 2, "ep": 4}, {"shared_experts": 1}), source="<t>")
    ops = build_workload(shared.model, 2, "bf16", sequence_parallel=True, ep=4).blocks[0].mp_collectives_fwd
    assert [n for _, n in ops] == [e * tokens * H] * 2 + [e * K * tokens * H] * 2 + [e * tokens * H] * 2


def test_deepep_with_experts_split_over_mp_dispatches_over_tp_times_ep():
    """Megatron-Core's flex (DeepEP) dispatcher with the experts split over TP: one group of the EP ranks with their
    TP ranks (ep·mp consecutive ranks), the routing map replicated over TP, so a rank's T/mp tokens reach all mp TP
    ranks of each EP rank hit (mp × DeepEP's copies: mp times the bytes) and cross to another node once (1/mp of
    the NIC share); no TP gather of the routed copies (the attention's pair alone). With EP 1 it is refused."""
    from zsim.workload.moe import Moe
    from zsim.zero.rank_states import ep_dispatch

    e, tokens = 2, 128 * 2
    lay = Layout(dp=8, mp=4, gpus_per_node=8, nodes=4, ep=4)
    assert lay.group_size("tpep") == 16 and lay.group_members("tpep", 1) == list(range(16, 32))
    assert set(lay.group_members("tpep", 0)) == {r for m in range(4) for r in lay.group_members("ep", m)}
    assert lay.group_shape("tpep").per_node == 8
    data = _dict({"dp": 8, "mp": 4, "ep": 4}, {"dispatcher": "deepep"}, hardware={"profile": "dgx-h100", "nodes": 4})
    flex = build_scenario(data, source="<t>")
    split = build_scenario(_dict({"dp": 8, "mp": 4, "ep": 4}, hardware={"profile": "dgx-h100", "nodes": 4}),
                           source="<t>")
    moe = Moe.of(flex.model)
    w = build_workload(flex.model, 4, "bf16", sequence_parallel=True, ep=4, etp=4).blocks[0]
    assert w.ep_all_to_all_bytes == round(moe.load * tokens * moe.copies_per_token(4) * H * e / 4) * 4
    assert list(w.mp_collectives_fwd) == [("all_gather", e * tokens * H), ("reduce_scatter", e * tokens * H)]
    group, factor, share = ep_dispatch(flex)
    assert (group, factor) == ("tpep", 4)
    assert share == pytest.approx(moe.nic_share(4, flex.layout.group_shape("ep").per_node) / 4)
    assert ep_dispatch(split) == ("ep", 1, 1.0)
    runs = {mode: simulate(flex, mode=mode) for mode in ("class", "per_rank")}
    assert runs["per_rank"].step_seconds == pytest.approx(runs["class"].step_seconds, rel=1e-9)
    f = facts(runs["class"])
    assert f["comm"]["ep_group"] == "tpep" and f["time"]["ep_comm_seconds_per_step"] > 0
    assert "EP all-to-all" in summary(f) and f["comm"]["ep_copies_per_token"] == pytest.approx(4 * moe.copies_per_token(4))
    with pytest.raises(ConfigError) as err:
        build_scenario(_dict({"dp": 8, "mp": 2}, {"dispatcher": "deepep"}, hardware={"profile": "dgx-h100", "nodes": 2}),
                       source="<t>")
    assert err.value.path == "model.moe.dispatcher" and "parallel.ep above 1" in str(err.value)


def test_folded_all_to_all_runs_across_mp_ranks_and_modes_agree():
    """The EP all-to-all runs in the folded group (4 ranks: 2 DP replicas × 2 MP ranks, inside a node), each
    rank sending its T/mp tokens × top_k; class and per-rank mode give the same step and peak."""
    sc = build_scenario(_dict({"dp": 8, "mp": 2, "ep": 4, "expert_mp": 1}), source="<t>")
    a, b = simulate(sc, mode="class"), simulate(sc, mode="per_rank")
    assert a.step_seconds == pytest.approx(b.step_seconds, rel=1e-9) and a.ledger.peak == b.ledger.peak
    a2a = [x for x in facts(a)["comm"]["collectives"] if x["group"] == "ep"]
    assert [x["op"] for x in a2a] == ["all_to_all"]
    per = 1.0 * (128 * 2) * K * H * 2 / 2  # load · T · top_k rows of h bf16 elements, T/mp of them per rank
    assert a2a[0]["count_per_step"] == 2 * 6  # 2 blocks: dispatch and combine in forward, recompute, backward
    assert a2a[0]["payload_bytes_per_step"] == 12 * per
    assert a2a[0]["sent_bytes_per_step"] == 12 * per * 3 / 4  # (n − 1)/n of it leaves a rank: a group of 4
