"""ZeRO stage 3 with mixture-of-experts as FSDP2 shards it (zero.implementation 'paper'), PyTorch's
bf16 cross-entropy (model.loss torch) and pure bf16 training (precision.master_weights false): the
features NeMo AutoModel's Qwen3-30B-A3B run needs (zsim validate modern, automodel-qwen3-30b-8)."""

import pytest

from tests.conftest import ROOT, small_dict
from zsim.compute.optimizer_kernels import optimizer_kernels
from zsim.engine.simulation import simulate, workload_and_plan
from zsim.errors import ConfigError
from zsim.report.facts import facts
from zsim.scenario.scenario import build_scenario, load_scenario
from zsim.workload.transformer import build_workload
from zsim.zero.model_states import PARAM_BYTES

QWEN3 = ROOT / "scenarios" / "qwen3-30b-a3b-fsdp-ep8-dgx-h100.yaml"


def _moe(dp: int = 8, ep: int = 4, stage: int = 3, **extra) -> dict:
    model = {"layers": 2, "hidden": 256, "heads": 8, "seq_len": 128, "vocab": 1000, "micro_batch": 2,
             "gated_mlp": True, "linear_bias": False, "ffn_hidden": 512, "moe": {"experts": 8, "top_k": 2},
             **extra.pop("model", {})}
    return small_dict(model=model, parallel={"dp": dp, "mp": 1, "ep": ep},
                      zero={"stage": stage, **extra.pop("zero", {})}, hardware={"profile": "dgx-h100", "nodes": 1},
                      precision={"dtype": "bf16", **extra.pop("precision", {})})


def test_stage3_gathers_experts_over_their_group_after_the_dense_part():
    sc = build_scenario(_moe(dp=8, ep=4), source="<t>")  # edp = 2 ranks hold each expert's shards
    w, plan = workload_and_plan(sc)
    ops = plan.ops
    blocks = [m for m in w.modules if m.expert_params]
    gathers = [i for i, op in enumerate(ops) if op.name.startswith("all_gather/params.experts.")]
    # one per MoE block and phase (forward, then backward's recompute/backward pass), over edp
    assert len(gathers) == 2 * len(blocks)
    for i in gathers:
        op, m = ops[i], next(b for b in blocks if ops[i].name.endswith("." + b.name))
        assert (op.group, op.stream, op.collective) == ("edp", "comm", "all_gather")
        assert op.nbytes == PARAM_BYTES["bf16"] * sum(-(-n // 2) * 2 for n in m.expert_tensors)
        assert ops[op.deps[0]].name == f"all_gather/params.{m.name}"  # after the block's dense gather
        tag = op.allocs[0].tag
        users = [k for k, o in enumerate(ops) if o.stream == "compute" and i in o.deps]
        assert users and any(tag in ops[k].frees for k in range(i, len(ops)))  # used, then freed
    r = simulate(sc, mode="class")
    assert r.fits and not [tag for tag in r.ledger.live if tag.startswith("gathered")]  # every gather freed
    # each rank holds 1/edp of its local experts' states, K = 12 (mixed precision)
    experts = w.expert_params_per_rank
    dense = r.model_states.optimizer - 12 * experts // 2
    assert dense == pytest.approx(12 * w.params_per_mp_rank / 8, rel=2e-2)


def test_stage3_with_one_rank_per_expert_group_gathers_no_experts_and_agrees_across_modes():
    sc = build_scenario(_moe(dp=8, ep=8), source="<t>")  # edp = 1: the experts whole on their rank
    _, plan = workload_and_plan(sc)
    assert not [op for op in plan.ops if op.name.startswith("all_gather/params.experts.")]
    a, b = simulate(sc, mode="class"), simulate(sc, mode="per_rank")
    assert a.step_seconds == pytest.approx(b.step_seconds, rel=1e-9) and a.ledger.peak == b.ledger.peak


def test_deepspeed_implementations_still_refuse_stage3_with_experts():
    for impl in ("deepspeed-0.5", "deepspeed-0.14"):
        with pytest.raises(ConfigError) as err:
            build_scenario(_moe(zero={"implementation": impl}), source="<t>")
        assert err.value.path == "zero.implementation" and "MoE not supported with Stage 3" in str(err.value)


def test_torch_loss_saves_the_bf16_log_softmax_and_holds_the_logits_until_backward_ends():
    sc = build_scenario(_moe(dp=8, ep=8, model={"loss": "torch"}), source="<t>")
    w, plan = workload_and_plan(sc)
    head = w.modules[-1]
    logits = 2 * 128 * w.padded_vocab * 2  # micro-batch x sequence x (padded) vocabulary x bf16
    assert head.held_tensors == (logits,) and head.fwd_work_tensors == ()
    assert head.saved_tensors[1:] == (logits,)  # the log-softmax output; [0] is the final norm's input
    held = "held0.head.s0.m0"
    start = next(i for i, op in enumerate(plan.ops) if any(a.tag == held for a in op.allocs))
    end = next(i for i, op in enumerate(plan.ops) if held in op.frees)
    assert plan.ops[start].name == "fwd/head"
    # freed by the pass's last compute op: the embedding's backward, after every block's
    assert plan.ops[end].name == "bwd/embed"
    assert all(not op.name.startswith("bwd/") for op in plan.ops[end + 1:] if op.stream == "compute"
               and op.micro_batch == 0)
    # the loss's bytes: 2 + 2 a logit, where Megatron's fp32 loss holds 2 + 4 + 4 while forward runs and saves 4
    megatron = workload_and_plan(build_scenario(_moe(dp=8, ep=8), source="<t>"))[0].modules[-1]
    assert sum(megatron.saved_tensors[1:]) + sum(megatron.fwd_work_tensors) == 14 * logits // 2
    assert simulate(sc, mode="class").fits


def test_pure_bf16_keeps_adam_in_bf16_without_a_master_copy():
    mixed = build_scenario(_moe(dp=8, ep=8), source="<t>")
    pure = build_scenario(_moe(dp=8, ep=8, precision={"master_weights": False}), source="<t>")
    a, b = simulate(mixed, mode="class"), simulate(pure, mode="class")
    assert (b.model_states.params, b.model_states.grads) == (a.model_states.params, a.model_states.grads)
    assert b.model_states.optimizer * 3 == a.model_states.optimizer  # K = 4 against 12
    names = {op.name: op for op in workload_and_plan(pure)[1].ops}
    assert names["optimizer/grads_copy"].allocs[0].nbytes == 0  # Adam reads the bf16 gradients in place
    kernels = optimizer_kernels(1000, 1, "bf16", master=False)
    assert kernels["overflow"].kernels == () and kernels["adam"].bytes == (4 + 14) * 1000
    assert optimizer_kernels(1000, 1, "bf16")["adam"].bytes == (4 + 6 + 8 + 28 + 6) * 1000  # unchanged
    for dtype in ("fp16", "fp32"):
        with pytest.raises(ConfigError) as err:
            build_scenario(_moe(dp=8, ep=8, precision={"dtype": dtype, "master_weights": False}), source="<t>")
        assert err.value.path == "precision.master_weights"


def test_shipped_qwen3_scenario_fits_with_its_recipes_states():
    sc = load_scenario(QWEN3)
    w = build_workload(sc.model, 1, "bf16", ep=8)
    assert w.total_params == 30_532_122_624 and sc.grad_accum == 16
    r = simulate(sc)
    assert r.fits
    # 8 bytes a parameter (bf16 parameters, gradients, momentum, variance) over 8 ranks, each tensor padded
    assert r.model_states.total == pytest.approx(8 * w.total_params / 8, rel=1e-4)
    f = facts(r)
    assert not [x for x in f["comm"]["collectives"] if x["group"] == "edp" and x["op"] == "all_gather"]


def test_torch_loss_under_tensor_parallelism_is_refused():
    data = _moe(dp=4, ep=4, model={"loss": "torch"})
    data["parallel"] = {"dp": 4, "mp": 2, "ep": 4, "sequence_parallel": True}
    with pytest.raises(ConfigError) as err:
        build_scenario(data, source="<t>")
    assert err.value.path == "model.loss" and "gathered first under tensor parallelism" in str(err.value)
