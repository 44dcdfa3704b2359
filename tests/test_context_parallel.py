"""Context parallelism (parallel.cp, Megatron-Core's --context-parallel-size): the CP groups in Megatron-Core's rank
order, each rank's share of the work and memory against the whole sequence's closed forms, the keys' and values' ring
in the plan, gradients over dp × cp, what the reports count, and the refusals."""

from __future__ import annotations

import pytest

from tests.conftest import scenario_from
from zsim.engine.simulation import simulate, workload_and_plan
from zsim.errors import ConfigError
from zsim.parallel.layout import Layout
from zsim.report.facts import facts
from zsim.report.summary import summary
from zsim.zero.rank_states import rank_model_states, scenario_workload

# LLaMA-shaped, FlashAttention on H100, sequence parallelism over MP 2
BASE = {
    "model": {"layers": 4, "hidden": 2048, "heads": 16, "kv_heads": 4, "ffn_hidden": 5632, "gated_mlp": True,
              "norm": "rmsnorm", "position": "rotary", "linear_bias": False, "tied_head": False, "dropout": False,
              "vocab": 32000, "seq_len": 8192, "micro_batch": 1, "grad_accum": 2, "attention": "flash2"},
    "parallel": {"dp": 2, "mp": 2, "cp": 2, "sequence_parallel": True},
    "zero": {"stage": 1, "activation_checkpointing": False},
    "precision": {"dtype": "bf16"},
    "hardware": {"profile": "dgx-h100", "nodes": 1},
}


def scenario(**sections):
    return scenario_from(BASE, "cp", **sections)


def test_cp_groups_are_megatron_cores_order():
    """parallel_state.py orders ranks tp-cp-dp-pp: a CP group is cp ranks mp apart, consecutive members of one DP
    (dp × cp) group; the groups cover every rank once and group_index inverts group_ranks."""
    lay = Layout(dp=8, mp=2, gpus_per_node=8, nodes=4, pp=2, cp=4)  # dp 2 × cp 4 × mp 2 × pp 2
    assert lay.group_size("cp") == 4 and lay.group_shape("cp").per_node == 4
    assert list(lay.group_ranks("cp", 0)) == [0, 2, 4, 6] and list(lay.group_ranks("cp", 1)) == [1, 3, 5, 7]
    assert list(lay.group_ranks("cp", 2)) == [8, 10, 12, 14]
    stage = range(lay.stage_ranks)
    groups = {lay.group_index("cp", r) for r in stage}
    assert sorted(r for g in groups for r in lay.group_ranks("cp", g)) == list(stage)
    for r in stage:
        members = lay.group_ranks("cp", lay.group_index("cp", r))
        assert r in members and set(members) <= set(lay.dp_group(r))


def test_a_rank_does_one_cp_th_of_the_sequences_work():
    """Summed over a CP group, the blocks' forward FLOPs are the whole sequence's (dense work ∝ tokens, the causal
    core ∝ tokens², each rank's zig-zag share 1/cp of it); activations are those of s/cp tokens."""
    whole = scenario_workload(scenario(parallel={"cp": 1, "dp": 4}))
    half = scenario_workload(scenario())
    for a, b in zip(whole.blocks, half.blocks, strict=True):
        assert 2 * b.fwd_flops == pytest.approx(a.fwd_flops, rel=1e-12)
        assert 2 * b.hw_fwd_flops == pytest.approx(a.hw_fwd_flops, rel=1e-12)
    short = scenario_workload(scenario(parallel={"cp": 1, "dp": 4}, model={"seq_len": 4096}))
    assert [b.saved_bytes for b in half.blocks] == [b.saved_bytes for b in short.blocks]
    assert half.tokens_per_micro_batch == 4096


def test_each_block_rings_its_keys_and_values():
    """Forward: an all-gather of the whole sequence's K and V on one MP rank over the CP group, e·s·b·2·kv_dim/t
    bytes; backward: the same again and the reduce-scatter of their gradients. None without CP."""
    sc = scenario()
    _, plan = workload_and_plan(sc)
    kv = 2 * 8192 * 1 * 2 * (4 * 128) // 2  # e · s · b · (K and V of 4 KV heads of 128) / t
    cp_ops = [op for op in plan.ops if op.group == "cp"]
    per_pass = {(op.name.split("/")[0], op.collective) for op in cp_ops}
    assert per_pass == {("all_gather", "all_gather"), ("reduce_scatter", "reduce_scatter")}
    assert {op.nbytes for op in cp_ops} == {kv}
    assert len(cp_ops) == 3 * 4 * sc.grad_accum  # 4 blocks, 2 micro-batches, 1 + 2 a block
    _, plain = workload_and_plan(scenario(parallel={"cp": 1, "dp": 4}))
    assert not any(op.group == "cp" for op in plain.ops)


def test_gradients_and_states_span_dp_times_cp():
    """Megatron-Core's distributed optimizer shards over the dp × cp group: the states of dp 2 × cp 2 are those of
    dp 4, and the DP reductions run over 4 ranks."""
    cp, flat = scenario(), scenario(parallel={"cp": 1, "dp": 4})
    assert rank_model_states(cp, scenario_workload(cp)) == rank_model_states(flat, scenario_workload(flat))
    assert cp.layout.group_size("dp") == 4 and cp.layout.dp_group(0) == flat.layout.dp_group(0)


def test_reports_count_sequences_over_dp_not_dp_times_cp():
    sc = scenario()
    r = simulate(sc, trace=False)
    f = facts(r)
    assert f["model"]["global_batch"] == 1 * 2 * 2 and f["layout"]["dp"] == 2 and f["layout"]["cp"] == 2
    assert f["throughput"]["tokens_per_second"] == pytest.approx(4 * 8192 / r.total_seconds)
    assert "DP 2 × CP 2 × MP 2" in summary(f)
    # dp 1 × cp 2: gradients are still reduced over the dp × cp group, and the comm line says so
    one = facts(simulate(scenario(parallel={"dp": 1, "mp": 2, "cp": 4}), trace=False))
    assert one["layout"]["dp"] == 1 and "no DP group" not in summary(one) and "reduce_scatter" in summary(one)
    assert r.comm[("cp", "all_gather")].count > 0


@pytest.mark.parametrize(("sections", "key", "words"), [
    ({"model": {"seq_len": 8196}}, "model.seq_len", "2 × cp 2 × mp 2 = 8"),
    ({"model": {"attention": "standard"}}, "model.attention", "context parallelism"),
    ({"parallel": {"dp": 4}}, "parallel.dp", "× cp 2"),
])
def test_layouts_that_do_not_run_are_refused_naming_the_key(sections, key, words):
    with pytest.raises(ConfigError, match=words) as err:
        scenario(**sections)
    assert err.value.path == key


def test_class_and_per_rank_modes_agree():
    """Every rank of a CP run is alike: the per-rank simulation (every rank's CP ring and DP group) gives the class
    mode's step."""
    per_rank = simulate(scenario(fabric={"mode": "per_rank"}), trace=False)
    cls = simulate(scenario(fabric={"mode": "class"}), trace=False)
    assert (cls.mode, per_rank.mode) == ("class", "per_rank")
    assert per_rank.step_seconds == pytest.approx(cls.step_seconds, rel=1e-9)
