"""Megatron-Core's FLOP count (zsim.workload.flop_counts): the TFLOPS/GPU its log line would print for a simulated
step (result.json throughput.megatron_tflops_per_gpu), the count the validation suites convert published TFLOPS
with, checked against a published table that prints both a step time and TFLOPS."""

import pytest

from tests.conftest import ROOT
from zsim import api
from zsim.config.model_section import ModelSection
from zsim.config.validation import validate
from zsim.report.facts import facts
from zsim.workload.flop_counts import megatron_core_flops


def test_result_json_says_what_megatron_core_would_log():
    sc = api.load(ROOT / "scenarios" / "qwen3-235b-a22b-16k-tp4-h100.yaml")
    f = facts(api.simulate(sc))
    flops = megatron_core_flops(sc.model, sc.layout.mp, sc.layout.dp * sc.grad_accum)
    assert f["throughput"]["megatron_tflops_per_gpu"] == pytest.approx(
        flops / f["time"]["mean_step_seconds"] / sc.layout.world / 1e12, rel=1e-12)
    # the count by hand for Qwen3-235B-A22B (h 4096, 64 heads of 128 over 4 KV heads, 94 MoE layers of 128 experts
    # of 1536, top 8, vocabulary 151,936 unpadded) at 16,384 tokens: 204.8 GFLOP a token, as the suite's note says
    per_token = 6 * (4096 * 3 * 1536 * 8 * 94 + 94 * (4096 * (8192 + 1024) + 8192 * 4096) + 4096 * 151936) + \
        6 * 8192 * 16384 * 94
    assert flops == 256 * 16384 * per_token


def test_mla_models_get_none():
    model = validate(ModelSection, dict(layers=2, hidden=256, heads=4, seq_len=64, vocab=100, micro_batch=1,
                                        position="rotary", mla={"kv_lora_rank": 32, "qk_nope_head_dim": 16,
                                                                "qk_rope_head_dim": 8, "v_head_dim": 16}), "model")
    assert megatron_core_flops(model, 1, 8) is None


def test_r08_count_is_the_closed_form_with_whole_core_attention():
    """Megatron-Core r0.8.0's count for a GPT (MHA, GeLU MLP of 4h): 72·B·s·l·h²·(1 + s/6h + V/12lh), the closed
    form of its formula; it exceeds the later count by exactly the causal half of the core attention, 6·h·s·l a
    token; a MoE with shared experts is not described (None)."""
    from zsim.workload.flop_counts import megatron_core_08_flops

    model = validate(ModelSection, dict(layers=96, hidden=12288, heads=96, seq_len=4096, vocab=131072, micro_batch=1),
                     "model")
    b, s, l, h, v = 1152, 4096, 96, 12288, 131072
    assert megatron_core_08_flops(model, 8, b) == pytest.approx(
        72 * b * s * l * h * h * (1 + s / (6 * h) + v / (12 * l * h)), rel=1e-12)
    assert megatron_core_08_flops(model, 8, b) - megatron_core_flops(model, 8, b) == pytest.approx(
        b * s * 6 * h * s * l, rel=1e-9)
    moe = validate(ModelSection, dict(layers=2, hidden=256, heads=4, seq_len=64, vocab=100, micro_batch=1,
                                      moe={"experts": 8, "top_k": 2, "shared_experts": 1}), "model")
    assert megatron_core_08_flops(moe, 1, 8) is None
