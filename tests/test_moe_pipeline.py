"""Mixture-of-experts with pipeline parallelism (issue 27): each stage carries its layers' experts, their
all-to-alls in every micro-batch, and their states partitioned over the expert-data-parallel group;
ZeRO-3 with MoE is refused as DeepSpeed refuses it."""

from __future__ import annotations

import dataclasses

import pytest

from tests.test_pipeline_engine import pipe
from zsim.engine.simulation import simulate, workload_and_plan
from zsim.errors import ConfigError
from zsim.parallel.pipeline import bubble_fraction
from zsim.zero.pipeline_plan import pipeline_stages, stage_model_states
from zsim.zero.rank_states import expert_dp, rank_model_states

MOE = {"experts": 8, "top_k": 2, "expert_ffn_hidden": 4096}  # 8 × 2·8192·4096 expert elements a layer


def moe_pipe(moe=None, **sections):
    sections.setdefault("parallel", {}).setdefault("ep", 2)
    model = {"moe": moe or MOE, **sections.pop("model", {})}
    return pipe(model=model, **sections)


def _a2a_per_stage(plan, p):
    return [[op for op in plan.ops if op.stage == s and op.collective == "all_to_all"] for s in range(p)]


def test_each_stage_runs_its_moe_layers_all_to_alls_in_every_micro_batch():
    """Per stage: dispatch and combine in forward and again in backward (no recompute here), for each of
    its MoE layers and each of the m micro-batches; each carries the non-pipelined run's bytes."""
    sc = moe_pipe(moe={**MOE, "dense_layers": 1})  # the first block keeps a dense MLP: stage 0 has 3 MoE layers
    _, plan = workload_and_plan(sc)
    per_stage = _a2a_per_stage(plan, 4)
    m = sc.grad_accum
    assert [len(ops) for ops in per_stage] == [4 * m * n for n in (3, 4, 4, 4)]
    flat = pipe(model={"moe": {**MOE, "dense_layers": 1}}, parallel={"pp": 1, "dp": 8, "ep": 2},
                zero={"stage": 1, "activation_checkpointing": False})
    _, flat_plan = workload_and_plan(flat)
    flat_bytes = {op.nbytes for op in flat_plan.ops if op.collective == "all_to_all"}
    assert len(flat_bytes) == 1 and {op.nbytes for ops in per_stage for op in ops} == flat_bytes
    assert all(op.group == "ep" for ops in per_stage for op in ops)


def test_stage_model_states_hold_their_own_experts():
    """Each stage holds its own layers' local experts: ZeRO-0 all of them (bf16 parameters and gradients,
    12 bytes of Adam state an element); ZeRO-1 partitions their optimizer states over the
    expert-data-parallel group (dp / ep ranks), beside the dense part's over DP."""
    sc0 = moe_pipe(parallel={"dp": 2, "ep": 2}, zero={"stage": 0, "activation_checkpointing": False})
    w, _ = workload_and_plan(sc0)
    stages = pipeline_stages(sc0, w)
    for st, ms in zip(stages, stage_model_states(sc0, w)):
        experts, dense = st.workload.expert_params_per_rank, st.workload.params_per_mp_rank
        # 4 layers × 4 local experts (8 over ep 2), each h × f and f × h with their biases (GPT: linear_bias)
        assert experts == 4 * (8 // 2) * (2 * 8192 * 4096 + 4096 + 8192)
        assert (ms.params, ms.grads, ms.optimizer) == (2 * (dense + experts), 2 * (dense + experts), 12 * (dense + experts))
    assert sum(st.workload.expert_params_per_rank for st in stages) == w.expert_params_per_rank
    sc1 = moe_pipe(parallel={"dp": 4, "ep": 2}, model={"layers": 16}, hardware={"nodes": 2})
    w1, _ = workload_and_plan(sc1)
    assert expert_dp(sc1) == 2
    for st in pipeline_stages(sc1, w1):
        with_experts = rank_model_states(sc1, st.workload)
        mods = tuple(dataclasses.replace(m, expert_tensors=()) for m in st.workload.modules)
        dense_only = rank_model_states(sc1, dataclasses.replace(st.workload, modules=mods))
        assert with_experts.optimizer - dense_only.optimizer == 12 * st.workload.expert_params_per_rank // 2


@pytest.mark.parametrize(("schedule", "v"), [("1f1b", 1), ("interleaved", 2)])
def test_the_bubble_is_the_closed_form_on_equal_moe_stages(schedule, v):
    """MoE adds the same all-to-all time to every stage, so equal stages stay equal and the bubble is still
    (p−1)/(m+p−1), or (p−1)/(v·m+p−1) interleaved (the EP group is inside the node here)."""
    r = simulate(moe_pipe(parallel={"pipeline_schedule": schedule, "virtual_stages": v}), trace=False)
    closed = bubble_fraction(schedule, 4, 8, v)
    assert r.pipeline["bubble_closed_form"] == closed
    assert closed <= r.pipeline["bubble_measured"] < closed + 0.01, (r.pipeline["bubble_measured"], closed)


def test_expert_gradients_are_reduced_once_per_step_per_stage():
    """The local experts' gradients are reduced over the expert-data-parallel group after the step's last
    backward of each of the stage's MoE layers (stage 1: a reduce-scatter per layer), never per micro-batch."""
    sc = moe_pipe(parallel={"dp": 2, "ep": 1})  # ep 1: every expert local, reduced over dp = 2
    _, plan = workload_and_plan(sc)
    for s in range(4):
        red = [op for op in plan.ops if op.stage == s and op.group == "edp"
               and op.collective in ("reduce_scatter", "all_reduce")]
        assert len(red) == 4 and all(op.micro_batch == sc.grad_accum - 1 for op in red)


def test_zero_3_with_experts_is_refused_as_deepspeed_refuses_it():
    with pytest.raises(ConfigError, match="MoE not supported with Stage 3") as err:
        moe_pipe(parallel={"pp": 1, "dp": 8}, zero={"stage": 3, "implementation": "deepspeed-0.14"})
    assert err.value.path == "zero.implementation"


def test_shipped_mixtral_pipeline_scenario():
    """scenarios/mixtral-8x7b-pp4-ep8-dgx-h100.yaml: the all-to-all volume per GPU is the closed form (each
    of a stage's 8 MoE layers, per micro-batch, dispatches and combines T·k tokens of h bf16 values, × the
    load factor, in forward, recompute and backward), and the bubble is at least (p−1)/(m+p−1)."""
    from zsim.report.facts import facts
    from zsim.scenario.scenario import load_scenario
    from tests.conftest import ROOT

    sc = load_scenario(ROOT / "scenarios" / "mixtral-8x7b-pp4-ep8-dgx-h100.yaml")
    r = simulate(sc, trace=False)
    f = facts(r)
    a2a = [x for x in f["comm"]["collectives"] if x["group"] == "ep"]
    m, tokens, h, k = 32, 4096, 4096, 2
    assert sc.grad_accum == m
    per = 1.2 * tokens * k * h * 2
    assert a2a[0]["payload_bytes_per_step"] == pytest.approx(8 * 6 * m * per)
    closed = bubble_fraction("1f1b", 4, m, 1)
    assert r.pipeline["bubble_closed_form"] == closed <= r.pipeline["bubble_measured"]
    assert r.fits and f["model"]["expert_params_per_rank"] > 0


def test_ep_seconds_are_per_rank_as_the_other_totals():
    """The all-to-all time a pipeline reports is one rank's (the stages' representatives' mean), as its
    compute and MP seconds are: the four stages of equal MoE layers each spend the same in them."""
    r = simulate(moe_pipe(), trace=False)
    a2a = [op for op in workload_and_plan(moe_pipe())[1].ops if op.collective == "all_to_all"]
    assert len({op.stage for op in a2a}) == 4
    stats = r.comm[("ep", "all_to_all")]
    assert r.ep_comm_seconds == pytest.approx(stats.seconds, rel=1e-12)
