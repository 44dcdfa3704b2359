"""model.kernels pytorch-2: the lists of plain PyTorch 2 modules (zsim.compute.torch_kernels, the bias in the
GEMM epilogue) and zsim's runtime's own optimizer step on a GPU (zsim.compute.optimizer_kernels
runtime_step_kernels), each against the kernels the runtime's Kineto traces show or ATen's source."""

from __future__ import annotations

from dataclasses import replace

import pytest

from zsim.compute.kernel_list import UNROLLED_SHARE, mem
from zsim.compute.kernel_shape import Shape
from zsim.compute.kernels import module_kernels
from zsim.compute.optimizer_kernels import optimizer_kernels, runtime_step_kernels

# The H200 Kineto run h2048 (data/device/20261126-h200-kineto): GPT, 8 layers x 2048, 16 heads, s 1024, b 4,
# bf16, tied head, no dropout, cuDNN's fused attention.
H2048 = Shape(s=1024, b=4, h=2048, a=16, t=1, v=50304, ffn=8192, kv_heads=16, gated=False, linear_bias=True,
              qkv_bias=True, e=2, flash=3, arch=90, dropout=False, loss="torch-fp32")
TORCH = replace(H2048, kernels="pytorch-2")


def _names(kind: str, phase: str, shape: Shape) -> list[str]:
    return [k.name for k in module_kernels(kind, phase, shape).kernels]


def test_the_forward_layer_is_the_traces_four_gemms_two_norms_two_adds_a_gelu_and_the_attention():
    """h2048's fwd/layer: LN, QKV GEMM (bias epilogue), attention, proj GEMM (bias), add, LN, fc GEMM (bias),
    GeLU, proj GEMM (bias), add (the trace's cuBLASLt workspace memsets aside)."""
    names = _names("block", "fwd", TORCH)
    assert names == ["input_layernorm", "qkv", "attention.flash", "attention.dense", "attention.residual",
                     "post_attention_layernorm", "mlp.h_to_4h", "mlp.gelu", "mlp.4h_to_h", "mlp.residual"]
    assert [n for n in _names("block", "fwd", H2048) if n.endswith(".bias")] == \
        ["qkv.bias", "attention.bias", "mlp.h_to_4h.bias", "mlp.bias"]


def test_backward_keeps_its_bias_reductions_and_a_row_parallel_bias_keeps_its_add():
    """addmm's backward sums the bias gradient in a reduce_kernel (four per layer in the trace); under MP the
    row-parallel bias is added after the all-reduce (runtime/tensor_parallel.py), the column-parallel one rides
    the GEMM."""
    assert _names("block", "bwd", TORCH) == _names("block", "bwd", H2048)
    mp2 = _names("block", "fwd", replace(TORCH, t=2, loss="megatron"))
    assert "attention.bias" in mp2 and "mlp.bias" in mp2
    assert "qkv.bias" not in mp2 and "mlp.h_to_4h.bias" not in mp2


def test_the_head_is_pytorchs_cross_entropy_with_its_bytes():
    """fwd/head: LN, logits GEMM, the bf16 -> fp32 copy (unrolled), log_softmax (three reads and a write of
    fp32), nll_loss; bwd/head: nll_loss's zero-fill and scatter, log_softmax's backward, the cast back."""
    T, V = 4096, 50304
    fwd = module_kernels("head", "fwd", TORCH).kernels
    assert [k.name for k in fwd] == ["final_layernorm", "logits", "logits.float", "cross_entropy.log_softmax",
                                     "cross_entropy.nll_loss"]
    by = {k.name: k for k in fwd}
    assert by["cross_entropy.log_softmax"].bytes == 16 * T * V and by["cross_entropy.log_softmax"].kind == "reduce"
    assert by["logits.float"].rate_bytes == pytest.approx(6 * T * V / UNROLLED_SHARE[4])
    bwd = [k.name for k in module_kernels("head", "bwd", TORCH).kernels]
    assert bwd[:4] == ["cross_entropy.nll_loss.bwd.zero", "cross_entropy.nll_loss.bwd",
                       "cross_entropy.log_softmax.bwd", "logits.float.bwd"]
    # Megatron's loss, or any loss under MP, keeps Megatron-LM's seven kernels
    assert "cross_entropy.clone" in _names("head", "fwd", replace(TORCH, loss="megatron"))
    # PyTorch's cross-entropy on the bf16 logits: no cast, 2-byte passes
    bf16 = {k.name: k for k in module_kernels("head", "fwd", replace(TORCH, loss="torch")).kernels}
    assert "logits.float" not in bf16 and bf16["cross_entropy.log_softmax"].bytes == 8 * T * V


def test_the_embedding_takes_the_feature_kernel_up_to_3072_ids_and_sorts_beyond():
    """embedding_dense_backward_cuda: `num_indices <= 3072` takes embedding_backward_feature_kernel; the
    word table of h2048 (4096 ids) sorts; its position table (1024 ids) does not; a tied head adds its
    gradient into the table's."""
    bwd = _names("embed", "bwd", TORCH)
    assert "embed.word.sort" in bwd and "embed.position.scatter_add" in bwd and "embed.position.sort" not in bwd
    assert "embed.word.tied_grad_sum" in bwd
    assert "embed.word.tied_grad_sum" not in _names("embed", "bwd", replace(TORCH, tied=False))
    small = _names("embed", "bwd", replace(TORCH, b=2))  # 2048 ids
    assert "embed.word.sort" not in small and "embed.word.scatter_add" in small
    assert _names("embed", "fwd", TORCH) == ["embed.word", "embed.position_ids", "embed.position", "embed.add"]
    assert "embed.mask_ids" in _names("embed", "fwd", H2048)


def test_the_runtimes_step_checks_run_per_segment():
    """runtime/zero/engine.py: isfinite(g).all() and g.double().norm(2) per optimizer segment; h1024's trace
    (one segment): abs, two compares, an and, an all; a fill, the cast, the norm, pow and add."""
    n = 203_000_000
    one, ten = runtime_step_kernels(n, 1, "bf16"), runtime_step_kernels(n, 10, "bf16")
    assert sum(k.count for k in one["overflow"].kernels) == 5
    assert sum(k.count for k in ten["overflow"].kernels) == 50
    assert sum(k.count for k in one["norm"].kernels) == 5
    assert one["overflow"].bytes == ten["overflow"].bytes == (4 + 2 * 3 + 3 + 1) * n
    # the step is the fused Adam and the copy back: no flatten, cast or unscale pass (grads_copy is its own op)
    assert [k.name for k in one["adam"].kernels] == ["fused_adam", "params.to_working"]
    assert [k.name for k in optimizer_kernels(n, 148, "bf16")["adam"].kernels][:2] == ["grads.flatten", "grads.to_fp32"]
    assert runtime_step_kernels(n, 1, "fp32")["overflow"].kernels == ()


def test_a_kernels_share_of_the_vectorized_rate_prices_its_bytes():
    assert mem("x", 100.0).rate_bytes == 100.0
    assert mem("x", 96.0, efficiency=0.48).rate_bytes == pytest.approx(200.0)


def test_rebuilt_gpu_runs_take_the_pytorch_2_lists_and_cpu_runs_keep_megatrons():
    from zsim.calibrate.rebuild import runtime_model_options

    gpu = runtime_model_options({"mp": 1, "device_facts": {"type": "cuda", "capability": "9.0"}})
    cpu = runtime_model_options({"mp": 1, "device_facts": {"type": "cpu"}})
    assert gpu["kernels"] == "pytorch-2" and "kernels" not in cpu


def test_the_key_is_validated_and_the_default_keeps_megatrons_lists():
    from tests.conftest import small_dict
    from zsim.errors import ConfigError
    from zsim.scenario.scenario import build_scenario

    d = small_dict()
    assert build_scenario(d, source="<t>").model.kernels == "megatron-2020"
    d["model"]["kernels"] = "pytorch-3"
    with pytest.raises(ConfigError) as info:
        build_scenario(d, source="<t>")
    assert "kernels" in str(info.value)


def test_a_pytorch_2_run_simulates_and_differs_from_megatrons_only_in_compute():
    """The same scenario with either list: the same memory model and collectives, a different compute time."""
    from tests.conftest import small_dict
    from zsim.scenario.scenario import build_scenario
    from zsim.engine.simulation import simulate

    d = small_dict(parallel={"dp": 32, "mp": 1})
    d["model"].update(dropout=False, loss="torch-fp32")
    a = simulate(build_scenario(d, source="<t>"), mode="class")
    d["model"]["kernels"] = "pytorch-2"
    b = simulate(build_scenario(d, source="<t>"), mode="class")
    assert a.step_seconds != b.step_seconds
    assert a.ledger.peak_reserved == b.ledger.peak_reserved
