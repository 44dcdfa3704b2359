"""The activations an FP8 (or NVFP4) step keeps for backward (zsim.compute.fp8.saved_bytes,
zsim.workload.activations.layer_saved_tensors, zsim.workload.moe.Moe.saved_tensors): Transformer Engine's linear
layers keep their inputs' low-precision copies, not the 16-bit tensors; Megatron-Core's experts keep neither their
output nor a copy of it (the probabilities applied in the activation since core_r0.12)."""

from __future__ import annotations

import pytest

from tests.conftest import scenario_from, with_sections
from tests.test_fp8 import H100 as DENSE  # a 4-layer gated model, TP 4 with SP, on one DGX H100
from zsim.compute.fp8 import MX_BLOCK, NVFP4_BLOCK, proj_copy_bytes, saved_bytes
from zsim.workload.activations import layer_saved_tensors
from zsim.workload.moe import Moe
from zsim.workload.shape import Shape
from zsim.zero.rank_states import scenario_workload
from zsim.zero.stage_memory import stage_memory


def _dense(fp8: str):
    base = with_sections(DENSE, precision={"dtype": "bf16", "fp8": fp8})
    return scenario_from(base, f"saved-{fp8}")


@pytest.mark.parametrize("recipe, per_element", [("none", 0.0), ("delayed", 1.0), ("current", 1.0),
                                                 ("blockwise", 1 + 4 / 128), ("mxfp8", 1 + 1 / MX_BLOCK),
                                                 ("nvfp4", 0.5 + 1 / NVFP4_BLOCK)])
def test_a_saved_copy_is_one_low_precision_copy_with_its_scales(recipe, per_element):
    assert saved_bytes(recipe) == pytest.approx(per_element)
    # only delayed scaling keeps the projection's copy beside FlashAttention's 16-bit output
    assert proj_copy_bytes(recipe) == (saved_bytes(recipe) if recipe == "delayed" else 0.0)


def test_a_dense_block_keeps_its_three_linear_inputs_as_fp8_copies():
    # s = 1024 tokens, b = 2, h = 1024, f = 2816, t = 4 with SP: the QKV and fc1 inputs sbh/t, fc2's sbf/t
    shape = Shape.gpt(1024, heads=16)
    s, b, t = 1024, 2, 4
    plain = layer_saved_tensors(shape, s, b, t, 2, sp=True)
    fp8 = layer_saved_tensors(shape, s, b, t, 2, sp=True, q=1.0)
    sbh, sbf = s * b * 1024, s * b * 4096
    # GPT shape, unfused attention: QKV input, output-projection input (the core's output), fc1 and fc2 inputs
    assert sum(plain) - sum(fp8) == (sbh // t + s * b * 1024 // t + sbh // t + sbf // t)
    assert len(plain) == len(fp8)


def test_flash_attention_keeps_its_16_bit_output_and_only_delayed_scaling_adds_a_copy():
    shape = Shape.of(_dense("none").model)
    assert shape.flash
    s, b, t = 1024, 2, 4
    current = layer_saved_tensors(shape, s, b, t, 2, sp=True, q=1.0)
    delayed = layer_saved_tensors(shape, s, b, t, 2, sp=True, q=1.0, proj_q=1.0)
    assert sum(delayed) - sum(current) == s * b * shape.q_dim // t
    plain = layer_saved_tensors(shape, s, b, t, 2, sp=True)
    # QKV input and fc1 input (sbh/t each, SP) and the gated MLP's fc2 input (sbf/t) go from 2 bytes to 1
    assert sum(plain) - sum(current) == 2 * (s * b * 1024 // t) + s * b * 2816 // t


def test_the_step_memory_holds_the_copies_and_the_time_is_unchanged():
    plain, current = _dense("none"), _dense("current")
    wp, wc = scenario_workload(plain), scenario_workload(current)
    for a, c in zip(wp.blocks, wc.blocks):
        assert c.saved_bytes < a.saved_bytes
        assert c.fwd_hbm_bytes == a.fwd_hbm_bytes  # the forward's elementwise traffic: 16-bit tensors
    assert stage_memory(current)[0].activations < stage_memory(plain)[0].activations


def test_moe_experts_keep_no_output_and_their_inputs_as_copies():
    # Qwen3-30B-A3B's MoE MLP, balanced, the experts whole over EP 8
    moe = Moe(experts=128, top_k=8, ffn=768, shared=0, shared_ffn=0, load=1.0, dense_layers=0, gated=True, bias=False)
    T, h = 4096, 2048
    r = moe.routed_tokens(T, 8)
    assert r == T * 8  # balanced: the 8 EP ranks' tokens' copies, T·k a rank
    plain = moe.saved_tensors(T, h, 1, 2, 8, 1)
    # router logits, top-k, permuted tokens, the SwiGLU input, fc2 input, the permuted probabilities
    assert plain == (4 * T * 128, 8 * T * 8, 2 * r * h, 2 * 2 * r * 768, 2 * r * 768, 4 * r)
    mx = moe.saved_tensors(T, h, 1, 2, 8, 1, q=saved_bytes("mxfp8"))
    q = 1 + 1 / MX_BLOCK
    assert mx == (4 * T * 128, 8 * T * 8, round(q * r * h), 2 * 2 * r * 768, round(q * r * 768), 4 * r)
    # moe_act recompute drops the fc2 input whatever its size
    assert moe.saved_tensors(T, h, 1, 2, 8, 1, act_recompute=True, q=q) == mx[:4] + mx[5:]
    assert moe.combine_bytes(T, h, 1, 2, 8, 1) == 2 * r * h
