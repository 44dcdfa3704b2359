"""Selective recompute by module (zero.recompute_modules, Megatron-Core's --recompute-modules): what each
module drops from a block's saved tensors (closed forms), what backward brings back, runs and issues again,
the default (core_attn) unchanged bit for bit, the loader's refusals, and the summary's layout line."""

import subprocess
import sys

import pytest
import yaml

from tests.conftest import small_dict
from zsim.compute.kernel_shape import Shape as KShape
from zsim.compute.kernels import moe_block_backward
from zsim.engine.simulation import simulate
from zsim.errors import ConfigError
from zsim.report.facts import facts
from zsim.report.summary import summary
from zsim.scenario.scenario import build_scenario
from zsim.workload.moe import Moe
from zsim.workload.transformer import build_workload

E, K, H, F, S, B = 16, 2, 256, 512, 128, 2  # experts, top_k, hidden, expert width, sequence, micro-batch


def _dict(zero: dict, moe: bool = True, mp: int = 2, **model_keys) -> dict:
    model = {"layers": 2, "hidden": H, "heads": 8, "seq_len": S, "vocab": 1000, "micro_batch": B,
             "gated_mlp": True, "linear_bias": False, "ffn_hidden": F, **model_keys}
    if moe:
        model["moe"] = {"experts": E, "top_k": K}
    parallel = {"dp": 4, "mp": mp, "sequence_parallel": True, **({"ep": 8, "expert_mp": 1} if moe else {})}
    return small_dict(model=model, parallel=parallel, zero={"stage": 1, **zero},
                      hardware={"profile": "dgx-h100", "nodes": 1}, precision={"dtype": "bf16"})


SELECTIVE = {"activation_checkpointing": True, "recompute_granularity": "selective"}


def _moe_saved(modules: list[str]) -> tuple[int, ...]:
    sc = build_scenario(_dict({**SELECTIVE, "recompute_modules": modules}), source="<t>")
    w = build_workload(sc.model, 2, "bf16", sequence_parallel=True, ep=8, etp=1,
                       recompute=frozenset(modules) - {"core_attn"})
    return next(m for m in w.modules if m.name == "layer.0").saved_tensors


def test_each_module_drops_its_closed_form():
    """layernorm drops the pre-MLP norm's output, e·s·b·h/t under SP; moe_act the experts' activation output,
    e·R·f for the R routed token copies a rank computes (Megatron-Core CheckpointWithoutOutput)."""
    e, t = 2, 2
    routed = Moe.of(build_scenario(_dict({}), source="<t>").model).routed_tokens(S * B // t, 8)  # experts whole: T/t
    none = sum(_moe_saved([]))
    assert none - sum(_moe_saved(["layernorm"])) == e * S * B * H // t
    assert none - sum(_moe_saved(["moe_act"])) == e * routed * F
    assert none - sum(_moe_saved(["layernorm", "moe_act"])) == e * S * B * H // t + e * routed * F


def test_backward_runs_each_recomputed_forward_once():
    sc = build_scenario(_dict({}), source="<t>")
    names = {}
    for mods in ((), ("layernorm",), ("moe_act",), ("layernorm", "moe_act")):
        x = KShape.of(sc.model, 2, 1024, "bf16", sp=True, ep=8, etp=1, recompute=frozenset(mods))
        names[mods] = [k.name for k in moe_block_backward(x) if k.name.startswith("recompute.")]
    assert names[()] == []
    assert names[("layernorm",)] == ["recompute.post_attention_layernorm"]
    assert names[("moe_act",)] == ["recompute.moe.experts.act"]
    assert sorted(names[("layernorm", "moe_act")]) == ["recompute.moe.experts.act", "recompute.post_attention_layernorm"]


def test_default_modules_are_core_attn_bit_for_bit():
    """Unset is Megatron-Core's default, ["core_attn"]: the same simulation as naming it."""
    a = facts(simulate(build_scenario(_dict(SELECTIVE), source="<t>")))
    b = facts(simulate(build_scenario(_dict({**SELECTIVE, "recompute_modules": ["core_attn"]}), source="<t>")))
    assert a["time"] == b["time"] and a["memory"]["peak_bytes"] == b["memory"]["peak_bytes"]


def test_recompute_trades_memory_for_time():
    """Dropping the norm and activation outputs lowers the activation peak and costs kernel time; without
    core_attn the attention keeps its scores (selective of nothing but the MoE parts)."""
    def run(modules):  # activations well above the CUDA context, so that they make the peak
        data = _dict({**SELECTIVE, "recompute_modules": modules}, seq_len=2048, micro_batch=8, layers=4)
        return facts(simulate(build_scenario(data, source="<t>")))
    none, both = run([]), run(["layernorm", "moe_act"])
    # the peak at the end of forward holds every layer's saved tensors: 4 layers × the closed-form drop
    routed = Moe.of(build_scenario(_dict({}), source="<t>").model).routed_tokens(2048 * 8 // 2, 8)
    assert none["memory"]["peak_bytes"] - both["memory"]["peak_bytes"] == 4 * (2 * 2048 * 8 * H // 2 + 2 * routed * F)
    assert both["time"]["compute_seconds_per_step"] > none["time"]["compute_seconds_per_step"]
    assert none["memory"]["attention"]["score_bytes_per_layer"] > 0  # standard attention, core not recomputed
    assert run(["core_attn"])["memory"]["attention"]["score_bytes_per_layer"] == 0


def test_summary_names_the_modules():
    f = facts(simulate(build_scenario(_dict({**SELECTIVE, "recompute_modules": ["layernorm", "moe_act"]}),
                                      source="<t>")))
    assert "selective recompute (layernorm, moe_act)" in summary(f)
    f = facts(simulate(build_scenario(_dict(SELECTIVE), source="<t>")))
    assert "selective recompute (core_attn)" in summary(f)


@pytest.mark.parametrize("zero, moe, words", [
    ({"recompute_modules": ["moe_act"]}, True, "recompute_granularity is full"),
    ({**SELECTIVE, "recompute_modules": ["mla_up_proj"]}, True, "has none (model.mla)"),
    ({**SELECTIVE, "recompute_modules": ["shared_experts"]}, True, "not modelled"),
    ({**SELECTIVE, "recompute_modules": ["moe"]}, False, "has none (model.moe)"),
    ({**SELECTIVE, "recompute_modules": ["mlp"]}, True, "every block of this model is a MoE block"),
    ({**SELECTIVE, "recompute_modules": ["attn"]}, True, "not a module to recompute"),
    ({**SELECTIVE, "recompute_modules": ["moe_act", "moe_act"]}, True, "twice"),
    ({**SELECTIVE, "recompute_modules": ["moe_act"]}, False, "has none (model.moe)"),
    ({**SELECTIVE, "recompute_modules": ["layernorm"]}, False, "fused into the linear"),
])
def test_modules_that_do_not_apply_are_refused(zero, moe, words):
    with pytest.raises(ConfigError) as err:
        build_scenario(_dict(zero, moe=moe), source="<t>")
    assert err.value.path == "zero.recompute_modules" and words in str(err.value)


def test_cli_refuses_an_unmodelled_module_with_exit_2(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(_dict({**SELECTIVE, "recompute_modules": ["shared_experts"]})))
    proc = subprocess.run([sys.executable, "-m", "zsim", "run", str(path), "-o", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "zero.recompute_modules" in proc.stderr and "Traceback" not in proc.stderr


def _block(modules: list[str], moe: bool = True, mp: int = 2, **parallel):
    data = _dict({**SELECTIVE, "recompute_modules": modules}, moe=moe, mp=mp)
    data["parallel"].update(parallel)
    sc = build_scenario(data, source="<t>")
    w = build_workload(sc.model, mp, "bf16", sequence_parallel=True, ep=sc.layout.ep, etp=sc.layout.expert_mp,
                       recompute=frozenset(modules) - {"core_attn"})
    return sc, w.blocks[0]


def test_mlp_keeps_only_the_checkpoint_input_and_brings_the_rest_back():
    """--recompute-modules mlp (a normal checkpoint of a dense MLP whose norm Transformer Engine fuses into fc1):
    the fc1 input (e·s·b·h/t under SP) and the SwiGLU's inner tensors (2e·s·b·f/t in, e·s·b·f/t out) go; the
    block's backward holds them again, issues the MLP's all-gather and reduce-scatter again and runs the MLP's
    forward GEMMs again (hardware FLOPs 3·2·s·b·h·f/t more)."""
    e, t, tokens = 2, 2, S * B
    _, none = _block([], moe=False)
    _, mlp = _block(["mlp"], moe=False)
    dropped = e * tokens * H // t + 2 * e * tokens * F // t + e * tokens * F // t
    assert none.saved_bytes - mlp.saved_bytes == dropped == mlp.recompute_bytes and none.recompute_bytes == 0
    assert list(mlp.recompute_collectives) == [("all_gather", e * tokens * H), ("reduce_scatter", e * tokens * H)]
    assert mlp.bwd_hw_extra_flops - none.bwd_hw_extra_flops == 3 * 2 * tokens * H * F / t
    sc, _ = _block(["mlp"], moe=False)
    x = KShape.of(sc.model, 2, 1024, "bf16", sp=True, recompute=frozenset(["mlp"]))
    from zsim.compute.kernels import block_backward
    names = [k.name for k in block_backward(x) if k.name.startswith("recompute.")]
    assert names[0] == "recompute.post_attention_layernorm" and names[-1] == "recompute.mlp.4h_to_h"
    _, unsplit = _block(["mlp"], moe=False, mp=1, dp=8)  # no MP: nothing to issue again
    assert unsplit.recompute_collectives == ()


def test_moe_drops_the_moe_layer_and_runs_its_all_to_alls_again():
    """--recompute-modules moe (moe_layer.py: the MoE layer checkpointed from its input, the norm's output): every
    MoE MLP tensor goes (Moe.saved_tensors' sum) and comes back in backward, where the layer's forward runs again,
    its dispatch and combine included: the simulated EP all-to-all time is 6/4 of the run without it (two in
    forward, two in backward, two again)."""
    sc, none = _block([], ep=8, expert_mp=1)
    _, moe = _block(["moe"], ep=8, expert_mp=1)
    inner = Moe.of(sc.model).saved_tensors(S * B, H, 2, 2, 8, 1)
    assert none.saved_bytes - moe.saved_bytes == sum(inner) == moe.recompute_bytes
    assert moe.recompute_all_to_alls and not none.recompute_all_to_alls
    assert moe.recompute_collectives == ()  # experts whole, no shared expert: no MP collective in the MoE MLP
    _, split = _block(["moe"], ep=4)  # experts split over MP 2: the routed copies' pair again
    routed = [n for op, n in split.mp_collectives_fwd[2:]]
    assert [n for _, n in split.recompute_collectives] == routed
    x = KShape.of(sc.model, 2, 1024, "bf16", sp=True, ep=8, etp=1, recompute=frozenset(["moe"]))
    again = [k.name for k in moe_block_backward(x) if k.name.startswith("recompute.")]
    assert again[0] == "recompute.moe.router" and "recompute.moe.experts.fc2" in again
    runs = {}
    for modules in ([], ["moe"]):
        data = _dict({**SELECTIVE, "recompute_modules": modules})
        runs[tuple(modules)] = facts(simulate(build_scenario(data, source="<t>")))["time"]
    per_rank = simulate(build_scenario(_dict({**SELECTIVE, "recompute_modules": ["moe"]}), source="<t>"), mode="per_rank")
    assert per_rank.step_seconds == pytest.approx(runs[("moe",)]["step_seconds"], rel=1e-9)
    assert runs[("moe",)]["ep_comm_seconds_per_step"] == pytest.approx(1.5 * runs[()]["ep_comm_seconds_per_step"],
                                                                       rel=1e-9)
