"""Multi-token prediction (model.mtp_layers; DeepSeek-V3 §2.2 as Megatron-Core's multi_token_prediction.py builds it)
and MLA's up-projection recompute (zero.recompute_modules mla_up_proj), each against its closed form: parameters,
FLOPs, where the modules sit in a pipeline, the kernels they launch, what the layer keeps for backward."""

from __future__ import annotations

import pytest

from tests.conftest import scenario_from, with_sections
from zsim.compute.kernels import module_kernels
from zsim.compute.kernel_shape import Shape as KernelShape
from zsim.errors import ConfigError
from zsim.scenario.scenario import build_scenario
from zsim.engine.simulation import simulate
from zsim.report.facts import facts
from zsim.workload.parameters import active_params, total_params
from zsim.zero.pipeline_plan import pipeline_stages
from zsim.zero.rank_states import scenario_workload

H, HEADS, S, V = 256, 4, 256, 1024
MLA = {"q_lora_rank": 64, "kv_lora_rank": 32, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32}
# a DeepSeek-V3-shaped model in miniature: MLA, one dense layer then MoE layers with a shared expert
DS = {
    "name": "mtp",
    "model": {"layers": 4, "hidden": H, "heads": HEADS, "seq_len": S, "vocab": V, "micro_batch": 2,
              "global_batch": 32, "ffn_hidden": 512, "gated_mlp": True, "norm": "rmsnorm", "position": "rotary",
              "linear_bias": False, "tied_head": False, "dropout": False, "attention": "flash3", "loss": "fused",
              "mla": MLA, "moe": {"experts": 8, "top_k": 2, "expert_ffn_hidden": 128, "dense_layers": 1,
                                  "shared_experts": 1, "shared_ffn_hidden": 128, "imbalance": 1.0}},
    "parallel": {"dp": 8, "mp": 1, "ep": 8, "expert_mp": 1},
    "zero": {"stage": 1, "implementation": "megatron-core", "activation_checkpointing": False},
    "precision": {"dtype": "bf16"},
    "hardware": {"profile": "dgx-h100", "nodes": 1},
}


def _sc(name="mtp", mtp=1, **sections):
    base = with_sections(DS, model={**DS["model"], "mtp_layers": mtp})
    return scenario_from(base, name, **sections)


def test_parameters_add_one_layer_of_the_last_kind_a_projection_and_three_norms():
    with_mtp, without = _sc().model, _sc(mtp=0).model
    one_more_layer = total_params(_sc(mtp=0, model={**DS["model"], "layers": 5}).model) - total_params(without)
    # eh_proj 2h × h without bias; enorm, hnorm and the final norm (RMSNorm: h each)
    assert total_params(with_mtp) - total_params(without) == one_more_layer + 2 * H * H + 3 * H
    # the MTP layer is a MoE layer: its idle experts are not active
    assert active_params(with_mtp) - active_params(without) == (
        one_more_layer - 6 * 3 * H * 128 + 2 * H * H + 3 * H)  # 8 experts, top 2: 6 idle of 3·h·f each


def test_the_module_computes_its_layer_the_projection_and_its_own_logits():
    w, w0 = scenario_workload(_sc()), scenario_workload(_sc(mtp=0))
    mtp = [m for m in w.modules if m.name.startswith("mtp.")]
    assert [m.name for m in w.modules][-2:] == ["mtp.0", "head"] and len(mtp) == 1
    last, head = w0.blocks[-1], w0.modules[-1]
    T = S * 2
    assert mtp[0].fwd_flops == pytest.approx(last.fwd_flops + 2 * T * 2 * H * H + head.fwd_flops)
    assert mtp[0].moe and mtp[0].layer is None and mtp[0].ep_all_to_all_bytes == last.ep_all_to_all_bytes
    # it keeps the layer's tensors, the two norms' inputs, eh_proj's 2h-wide input, the final norm's and the loss's
    e = 2
    extra = 2 * e * T * H + 2 * e * T * H + e * T * H + sum(head.saved_tensors[1:])
    assert mtp[0].saved_bytes == last.saved_bytes + extra
    assert w.params_per_mp_rank - w0.params_per_mp_rank == mtp[0].params


def test_it_sits_on_the_last_stage_before_the_head_with_a_copy_of_the_embedding():
    sc = _sc(parallel={"dp": 4, "pp": 2, "ep": 4})
    w = scenario_workload(sc)
    stages = pipeline_stages(sc, w)
    assert [m.name for m in stages[0].chunks[-1]][0] == "embed"
    assert [m.name for m in stages[-1].chunks[-1]][-2:] == ["mtp.0", "head"]
    head = stages[-1].chunks[-1][-1]
    # untied: without MTP the last stage holds no embedding; with it, a V/t × h copy (gpt_model.py mtp_process)
    plain = pipeline_stages(_sc(mtp=0, parallel={"dp": 4, "pp": 2, "ep": 4}), scenario_workload(_sc(mtp=0)))
    assert head.params - plain[-1].chunks[-1][-1].params == w.modules[0].tensors[0] == V * H


def test_its_kernels_are_the_embedding_the_projection_the_layer_and_the_head():
    sc = _sc(precision={"dtype": "bf16", "fp8": "current"})
    w = scenario_workload(sc)
    shape = KernelShape.of(sc.model, 1, w.padded_vocab, "bf16", arch=90, ep=8, fp8="current")
    names = [k.name for k in module_kernels("mtp_moe", "fwd", shape).kernels]
    assert names[0].startswith("embed.") and "mtp.eh_proj" in names and names.index("mtp.eh_proj") < names.index(
        "moe.router") < names.index("logits")
    ks = {k.name: k for k in module_kernels("mtp_moe", "fwd", shape).kernels}
    assert ks["mtp.eh_proj"].fp8 and not ks["logits"].fp8  # eh_proj under the FP8 context, the output layer not
    assert (ks["mtp.eh_proj"].m, ks["mtp.eh_proj"].n, ks["mtp.eh_proj"].k) == (S * 2, H, 2 * H)
    bwd = [k.name for k in module_kernels("mtp_moe", "bwd", shape).kernels]
    assert bwd.index("logits.dgrad") < bwd.index("moe.router.wgrad") < bwd.index("mtp.eh_proj.dgrad")


def test_a_step_with_it_takes_longer_and_counts_its_flops():
    f1, f0 = facts(simulate(_sc())), facts(simulate(_sc(mtp=0)))
    assert f1["time"]["mean_step_seconds"] > f0["time"]["mean_step_seconds"]
    flops = [f["throughput"]["model_tflops_per_gpu"] * f["time"]["mean_step_seconds"] for f in (f1, f0)]
    assert flops[0] > flops[1]  # model FLOPs a step: the MTP module's are counted


def test_tensor_parallelism_without_sequence_parallelism_is_refused():
    dense = {k: v for k, v in DS["model"].items() if k != "moe"} | {"mtp_layers": 1}
    with pytest.raises(ConfigError) as err:  # (a MoE model with EP is refused TP without SP before: moe_checks)
        build_scenario({**DS, "model": dense, "parallel": {"dp": 4, "mp": 2}}, source="<test>")
    assert err.value.path == "model.mtp_layers" and "sequence_parallel" in str(err.value)
    sc = _sc(parallel={"dp": 4, "mp": 2, "ep": 4, "sequence_parallel": True})
    mtp = [m for m in scenario_workload(sc).modules if m.name == "mtp.0"][0]
    # eh_proj's gathers and their mirrors beside the layer's SP pairs and the logits' (module docstring)
    assert len(mtp.mp_collectives_fwd) == 3 + 4 + 1 and mtp.mp_allreduces_fwd == 0


# ---- MLA's up projections recomputed (zero.recompute_modules mla_up_proj) ----

def _up(modules):
    return _sc(mtp=0, zero={**DS["zero"], "activation_checkpointing": True, "recompute_granularity": "selective",
                             "recompute_modules": modules})


def test_mla_up_proj_drops_q_k_v_and_keeps_the_rope_key():
    none, up = scenario_workload(_up([])).blocks, scenario_workload(_up(["mla_up_proj"])).blocks
    T, e, qk, v, rope = S * 2, 2, 32 + 16, 32, 16
    for a, b in zip(none, up):  # Q, K a·(d_h + d_h^R), V a·d_v wide; the RoPE key d_h^R in their place
        assert a.saved_bytes - b.saved_bytes == e * T * HEADS * (2 * qk + v) - e * T * rope
        assert b.recompute_bytes - a.recompute_bytes == a.saved_bytes - b.saved_bytes
        # the up projections' forward again: Q from its 64-wide latent, K^C and V from the 32-wide c^KV
        up_flops = 2 * T * (64 * HEADS * qk + 32 * HEADS * (32 + v))
        assert b.bwd_hw_extra_flops - a.bwd_hw_extra_flops == pytest.approx(up_flops)
        assert b.fwd_flops == a.fwd_flops


def test_mla_up_proj_runs_the_up_projections_again_before_the_attention_backward():
    sc = _up(["mla_up_proj"])
    w = scenario_workload(sc)
    shape = KernelShape.of(sc.model, 1, w.padded_vocab, "bf16", arch=90, ep=8, recompute=frozenset(["mla_up_proj"]))
    names = [k.name for k in module_kernels("moe_block", "bwd", shape).kernels]
    assert names.index("recompute.mla.q_up") < names.index("recompute.mla.kv_up") < names.index("attention.flash.bwd")
    assert "recompute.attention.rotary" in names
    assert "recompute.mla.q_up" not in [k.name for k in module_kernels(
        "moe_block", "bwd", KernelShape.of(sc.model, 1, w.padded_vocab, "bf16", arch=90, ep=8)).kernels]
    assert facts(simulate(sc))["time"]["mean_step_seconds"] > facts(simulate(_up([])))["time"]["mean_step_seconds"]
