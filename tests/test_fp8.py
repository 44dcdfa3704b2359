"""precision.fp8 (zsim.compute.fp8): Transformer Engine's FP8 linear layers. Which GEMMs turn FP8 and what
quantizes their operands, their price at the FP8 peak, the cached FP8 weights in memory and the step's weight
quantize, a whole step, and the refusals."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
import yaml

from tests.conftest import scenario_from, with_sections
from zsim.compute.fp8 import FP8_LINEARS, MX_BLOCK, quantize, weight_cache_bytes
from zsim.compute.gemm import gemm_seconds
from zsim.compute.kernel_list import gemm
from zsim.compute.kernel_shape import Shape
from zsim.compute.kernels import module_kernels
from zsim.compute.model import kernel_seconds
from zsim.engine.simulation import simulate
from zsim.errors import ZsimError
from zsim.fabric.cluster import load_cluster
from zsim.workload.transformer import padded_vocab
from zsim.zero.plan import build_plan
from zsim.zero.rank_states import fp8_weight_elements, scenario_workload
from zsim.zero.stage_memory import stage_memory

H100 = {
    "model": {"layers": 4, "hidden": 1024, "heads": 16, "seq_len": 1024, "vocab": 32000, "micro_batch": 2,
              "gated_mlp": True, "ffn_hidden": 2816, "position": "rotary", "attention": "flash3"},
    "parallel": {"dp": 2, "mp": 4, "sequence_parallel": True},
    "zero": {"stage": 1, "activation_checkpointing": False, "implementation": "megatron-core"},
    "precision": {"dtype": "bf16"},
    "hardware": {"profile": "dgx-h100", "nodes": 1},
}


def _scenario(fp8: str = "current", **sections):
    base = with_sections(H100, precision={"dtype": "bf16", "fp8": fp8})
    return scenario_from(base, "fp8", **sections)


def _shape(scenario, fp8: str) -> Shape:
    m = scenario.model
    return Shape.of(m, scenario.layout.mp, padded_vocab(m.vocab, scenario.layout.mp), "bf16", sp=True, fp8=fp8,
                    arch=90)


def test_the_linear_layers_gemms_turn_fp8_and_nothing_else():
    s = _scenario()
    for phase in ("fwd", "bwd"):
        plain = module_kernels("block", phase, _shape(s, "none")).kernels
        fp8 = module_kernels("block", phase, _shape(s, "current")).kernels
        gemms = [k for k in fp8 if k.kind == "gemm"]
        assert [dataclasses.replace(k, fp8=False) for k in gemms] == [k for k in plain if k.kind == "gemm"]
        # every GEMM of this block is a TE linear's (FlashAttention's core is a 'flash' kernel, 16-bit)
        assert gemms and all(k.fp8 for k in gemms)
        assert {k.name.split(".dgrad")[0].split(".wgrad")[0] for k in gemms} <= set(FP8_LINEARS)
        assert not any(k.fp8 for k in fp8 if k.kind != "gemm")
    head = module_kernels("head", "fwd", _shape(s, "current")).kernels
    assert not any(k.fp8 for k in head)  # the output layer is not a TE module


def test_each_fp8_gemm_quantizes_its_input_forward_and_its_output_gradient_backward():
    s = _scenario()
    x = _shape(s, "current")
    fwd = module_kernels("block", "fwd", x).kernels
    bwd = module_kernels("block", "bwd", x).kernels
    T = x.s * x.b
    names = [k.name for k in fwd]
    i = names.index("qkv")
    # current scaling: an amax reduction (e read) then the cast (e read, two 1-byte copies written)
    assert [k.name for k in fwd[i - 2:i]] == ["qkv.input.amax", "qkv.input.quantize"]
    assert fwd[i - 2].bytes == 2 * T * x.h and fwd[i - 1].bytes == (2 + 2) * T * x.h
    j = [k.name for k in bwd].index("mlp.4h_to_h.dgrad")
    assert bwd[j - 1].name == "mlp.4h_to_h.grad_output.quantize" and bwd[j - 1].bytes == 4 * T * x.h
    assert sum(k.name.endswith(".quantize") for k in fwd) == 4  # qkv, proj, fc1, fc2
    assert sum(k.name.endswith(".quantize") for k in bwd) == 4
    assert not any(k.name.endswith(".quantize") for k in bwd if k.name.endswith("wgrad"))


@pytest.mark.parametrize("recipe, per_element", [("delayed", 2 + 2), ("current", 2 + 2 + 2),
                                                 ("mxfp8", 2 + 2 + 2 / MX_BLOCK)])
def test_quantize_bytes_per_recipe(recipe, per_element):
    assert sum(k.bytes for k in quantize("x", 1000, recipe, 2)) == pytest.approx(per_element * 1000)
    assert weight_cache_bytes(1000, recipe) == int(1000 * (2 + (2 / MX_BLOCK if recipe == "mxfp8" else 0)))


def test_an_fp8_gemm_runs_its_fp8_terms_at_the_fp8_peak_with_one_byte_operands():
    gpu = load_cluster("dgx-h100", 1).gpu
    c = gpu.compute
    k = gemm("qkv", 8192, 3072, 8192)
    fp8 = kernel_seconds(dataclasses.replace(k, fp8=True), c, gpu.peak_flops["bf16"], gpu.hbm_bytes_per_s, "bf16", 2,
                         gpu.peak_flops["fp8"])
    expect = gemm_seconds(8192, 3072, 8192, 1, 1, c.gemm["fp8"], c.sms, c.tiles,
                          gpu.peak_flops["fp8"] * c.sustained_ratio, gpu.hbm_bytes_per_s)
    assert fp8 == expect
    bf16 = kernel_seconds(k, c, gpu.peak_flops["bf16"], gpu.hbm_bytes_per_s, "bf16", 2, gpu.peak_flops["fp8"])
    assert 0.4 < fp8 / bf16 < 0.75  # a large GEMM: about half the time at twice the peak


def test_the_cached_fp8_weights_are_allocated_and_quantized_once_a_step():
    s = _scenario("delayed")
    w = scenario_workload(s)
    elements = fp8_weight_elements(w)
    assert elements == sum(m.params + m.expert_params for m in w.blocks)
    plan = build_plan(s, w)
    cache = [a for a in plan.persistent if a.tag == "model.fp8_weights"]
    assert [a.nbytes for a in cache] == [2 * elements]
    ops = [op for op in plan.ops if op.name == "optimizer/fp8_weights"]
    assert len(ops) == s.run.steps and ops[0].kernels.bytes == pytest.approx((2 + 2) * elements)
    plain = _scenario("none")
    assert not any(a.tag == "model.fp8_weights" for a in build_plan(plain, scenario_workload(plain)).persistent)
    # the cache is the only model-state difference (the saved activations' FP8 copies: tests/test_fp8_saved.py)
    fp8_mem, plain_mem = stage_memory(s)[0], stage_memory(plain)[0]
    assert fp8_mem.fp8_weights == 2 * elements and fp8_mem.states == plain_mem.states


def test_a_step_of_a_large_model_is_faster_with_fp8_and_holds_more():
    # Llama-3-70B's block shapes (a small model's quantize passes and launches cost more than its GEMMs save)
    big = {"layers": 2, "hidden": 8192, "heads": 64, "kv_heads": 8, "ffn_hidden": 28672, "seq_len": 4096, "micro_batch": 1}
    fast, slow = simulate(_scenario("current", model=big)), simulate(_scenario("none", model=big))
    assert fast.compute_seconds < slow.compute_seconds
    assert fast.ledger.peak > slow.ledger.peak
    assert fast.model_flops == slow.model_flops  # MFU counts the same model FLOPs


def test_pipeline_stages_hold_their_own_fp8_weights():
    s = _scenario("current", parallel={"dp": 1, "mp": 4, "pp": 2, "sequence_parallel": True})
    w = scenario_workload(s)
    plan = build_plan(s, w)
    caches = [sum(a.nbytes for a in own if a.tag == "model.fp8_weights") for own in plan.stage_persistent]
    assert len(caches) == 2 and sum(caches) == 2 * fp8_weight_elements(w)


@pytest.mark.parametrize("sections, words", [
    ({"precision": {"dtype": "fp32", "fp8": "current"}, "model": {"attention": "standard"}}, "fp32"),
    ({"precision": {"dtype": "bf16", "fp8": "current"}, "hardware": {"profile": "dgx-a100", "nodes": 1},
      "model": {"attention": "flash2"}}, "no FP8"),
    ({"precision": {"dtype": "bf16", "fp8": "mxfp8"}}, "Blackwell"),
    ({"precision": {"dtype": "bf16", "fp8": "current"}, "zero": {"stage": 3, "implementation": "paper"}}, "stage 3"),
])
def test_fp8_where_zsim_cannot_price_it_is_refused_naming_the_key(sections, words):
    with pytest.raises(ZsimError) as err:
        scenario_from(H100, "fp8", **sections)
    assert err.value.path == "precision.fp8" and words in str(err.value)


def test_the_cli_refuses_fp8_on_an_a100_with_exit_2(tmp_path):
    path = tmp_path / "a100.yaml"
    path.write_text(yaml.safe_dump(with_sections(H100, precision={"dtype": "bf16", "fp8": "delayed"},
                                                 hardware={"profile": "dgx-a100", "nodes": 1}, model={"attention": "flash2"})))
    run = subprocess.run([sys.executable, "-m", "zsim", "run", str(path), "--output", str(tmp_path / "out")],
                         capture_output=True, text=True)
    assert run.returncode == 2 and "precision.fp8" in run.stderr and "Traceback" not in run.stderr


def test_result_json_and_the_summary_say_fp8(tmp_path):
    path = tmp_path / "fp8.yaml"
    path.write_text(yaml.safe_dump(with_sections(H100, precision={"dtype": "bf16", "fp8": "current"})))
    run = subprocess.run([sys.executable, "-m", "zsim", "run", str(path), "--output", str(tmp_path / "out")],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "FP8 linear layers (current scaling" in run.stdout
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    assert result["precision"]["fp8"] == "current"


def _check_module():
    """benchmarks/fp8_gemm_check.py, which reads the published FP8 GEMM tables (data/published/gemm-fp8)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "fp8_gemm_check.py"
    spec = importlib.util.spec_from_file_location("fp8_gemm_check", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_carried_fp8_terms_predict_published_fp8_gemms_they_never_saw():
    """The figures docs/compute.md ("FP8 GEMMs") states: B200 within 5.1% median of XLA's FP8 rows, the H100 terms
    within 4.5% of TileLang's large-K H800 GEMMs and 7.4% faster than DeepGEMM's block-scaled ones (median)."""
    import statistics

    check = _check_module()
    b200 = check.errors(check.xla_rows("xla-sm_100-fp8.csv"), "gcp-a4-b200")
    assert len(b200) == 375 and statistics.median(abs(e) for e in b200) < 0.052
    tilelang = check.errors(check.tilelang_rows("v2", 2048), "dgx-h100")
    assert len(tilelang) == 4 and max(abs(e) for e in tilelang) < 0.045
    deepgemm = check.errors(check.deepgemm_rows(), "dgx-h100")
    assert len(deepgemm) == 18 and -0.08 < statistics.median(deepgemm) < -0.07


def test_gemm_fit_reads_xla_fp8_rows(tmp_path):
    """`zsim gemm-fit --dtype fp8` fits XLA's E4M3 rows against the FP8 peak (1-byte operands)."""
    from zsim.commands.gemm_fit import fit_table

    result = fit_table(_check_module().DATA / "xla-sm_100-fp8.csv", "b200-180gb", "fp8")
    summary = result.summary()
    assert summary["rows"] == 375 and summary["heldout_median"] < 0.04


def test_fp8_params_hold_the_linear_weights_in_one_byte_and_gather_them_so():
    """--fp8-param-gather: the blocks' weights are FP8 parameters (1 B, no 16-bit copy), the Hopper transpose beside
    them, the distributed optimizer casts its master shard into them and gathers them at their size."""
    sections = {"parallel": {"dp": 8, "mp": 1}, "hardware": {"profile": "dgx-h100", "nodes": 1},
                "zero": {"stage": 1, "implementation": "megatron-core", "overlap_param_gather": False,
                         "activation_checkpointing": False}}
    plain = scenario_from(H100, "p", **sections, precision={"dtype": "bf16", "fp8": "current"})
    fp8p = scenario_from(H100, "p", **sections, precision={"dtype": "bf16", "fp8": "current", "fp8_params": True})
    w = scenario_workload(fp8p)
    weights = fp8_weight_elements(w)
    from zsim.zero.rank_states import fp8_cache_bytes, param_bytes_per_element, rank_model_states

    assert rank_model_states(plain, w).params - rank_model_states(fp8p, w).params == weights
    assert fp8_cache_bytes(plain, w) == 2 * weights and fp8_cache_bytes(fp8p, w) == weights
    total = w.params_per_mp_rank
    assert param_bytes_per_element(fp8p, w) == pytest.approx((2 * total - weights) / total)
    gathers = lambda s: sum(op.nbytes for op in build_plan(s, w).ops if op.name.startswith("all_gather/params"))  # noqa: E731
    assert gathers(plain) - gathers(fp8p) == pytest.approx(weights, rel=1e-6)
    (step,) = [op for op in build_plan(fp8p, w).ops if op.name == "optimizer/fp8_weights"]
    assert [k.name for k in step.kernels.kernels] == ["fp8.master_to_params", "fp8.weights.transpose"]
    assert step.kernels.bytes == pytest.approx(9 * -(-weights // 8) + 2 * weights)


def test_blackwell_writes_one_copy_per_tensor_and_two_with_mxfp8():
    model = _scenario(model={"attention": "flash2"}).model  # FlashAttention-2 runs on both
    x, b200, mx = (Shape.of(model, 4, padded_vocab(32000, 4), "bf16", sp=True, fp8=fp8, arch=arch)
                   for fp8, arch in (("current", 90), ("current", 100), ("mxfp8", 100)))
    assert (x.fp8_copies, b200.fp8_copies, mx.fp8_copies) == (2, 1, 2)
    q = lambda s: next(k for k in module_kernels("block", "fwd", s).kernels if k.name == "qkv.input.quantize")  # noqa: E731
    T = x.s * x.b
    assert (q(x).bytes, q(b200).bytes) == (4 * T * x.h, 3 * T * x.h)
    assert q(mx).bytes == pytest.approx((2 + 2 * (1 + 1 / MX_BLOCK)) * T * x.h)


def test_sequence_parallel_all_gathers_carry_fp8_and_reduce_scatters_bf16():
    plain, fp8 = scenario_workload(_scenario("none")), scenario_workload(_scenario("current"))
    for a, b in zip(plain.blocks[0].mp_collectives_fwd + plain.blocks[0].mp_collectives_bwd,
                    fp8.blocks[0].mp_collectives_fwd + fp8.blocks[0].mp_collectives_bwd):
        assert a[0] == b[0] and b[1] == (a[1] // 2 if a[0] == "all_gather" else a[1])
    assert plain.modules[-1].mp_collectives_fwd == fp8.modules[-1].mp_collectives_fwd  # the head's stays 16-bit


@pytest.mark.parametrize("recipe, hardware, scale", [("mxfp8", {"profile": "dgx-b200", "nodes": 1}, 1 / MX_BLOCK),
                                                     ("blockwise", {"profile": "dgx-h100", "nodes": 1}, 4 / 128)])
def test_block_scaled_sp_gathers_carry_their_scales_and_output_gradients_both_usages(recipe, hardware, scale):
    """TE 366798ef: a forward SP all-gather moves the rowwise copy and its scales (distributed.py _all_gather_mxfp8,
    the blockwise gather); a row-parallel output gradient's backward gather both usages, two copies with scales
    (linear.py backward, base.py grad_output_preprocess), one with Userbuffers' TP overlap."""
    plain = scenario_workload(_scenario("none", hardware=hardware))
    block = scenario_workload(_scenario(recipe, hardware=hardware))
    overlapped = scenario_workload(_scenario(recipe, hardware=hardware,
                                             parallel={**H100["parallel"], "tp_comm_overlap": True}))
    for phase, copies in (("mp_collectives_fwd", 1), ("mp_collectives_bwd", 2)):
        for a, b, c in zip(getattr(plain.blocks[0], phase), getattr(block.blocks[0], phase),
                           getattr(overlapped.blocks[0], phase)):
            gathered = a[0] == "all_gather"
            assert b[1] == (round(a[1] * copies * (1 + scale) / 2) if gathered else a[1])
            assert c[1] == (round(a[1] * (1 + scale) / 2) if gathered else a[1])


def test_fp8_params_need_fp8_and_the_distributed_optimizer():
    with pytest.raises(ZsimError) as err:
        scenario_from(H100, "p", precision={"dtype": "bf16", "fp8_params": True})
    assert err.value.path == "precision.fp8_params"
    with pytest.raises(ZsimError) as err:
        scenario_from(H100, "p", precision={"dtype": "bf16", "fp8": "delayed", "fp8_params": True},
                      zero={"stage": 2, "implementation": "deepspeed-0.2"})
    assert err.value.path == "precision.fp8_params" and "megatron-core" in str(err.value)


def test_grad_reduce_in_fp32_false_halves_megatron_cores_gradient_buffer_and_its_reduce_scatters():
    """Megatron-Bridge's `ddp.grad_reduce_in_fp32 = False`: bf16 gradients in the buffer and on the wire."""
    fp32 = _scenario("none")
    bf16 = _scenario("none", zero={"grad_reduce_in_fp32": False})
    w = scenario_workload(fp32)
    from zsim.zero.rank_states import rank_model_states

    assert rank_model_states(fp32, w).grads == 2 * rank_model_states(bf16, w).grads
    rs = lambda s: sum(op.nbytes for op in build_plan(s, w).ops if op.collective == "reduce_scatter" and op.group == "dp")  # noqa: E731
    assert rs(fp32) == 2 * rs(bf16) > 0
    with pytest.raises(ZsimError) as err:
        scenario_from(H100, "g", zero={"stage": 1, "implementation": "paper", "grad_reduce_in_fp32": False})
    assert err.value.path == "zero.grad_reduce_in_fp32"


@pytest.mark.parametrize("recipe, params, pp", [("delayed", False, 1), ("current", True, 1), ("current", True, 2),
                                                ("delayed", True, 2)])
def test_fp8_plans_copy_their_passes_exactly(recipe, params, pp):
    """zsim.zero.pass_copy's copied passes equal the passes built one by one with FP8 (its step op's shared list)."""
    from tests.test_pass_copy import _same_plans

    dp = 2 if pp == 1 else 1
    _same_plans(_scenario(recipe, model={"grad_accum": 4}, parallel={"dp": dp, "mp": 4, "pp": pp, "sequence_parallel": True},
                          precision={"dtype": "bf16", "fp8": recipe, "fp8_params": params}))


def test_zsim_memory_lists_the_fp8_weights_in_each_stage():
    from zsim.commands.memory import stage_table

    table = stage_table(_scenario("current", parallel={"dp": 1, "mp": 4, "pp": 2, "sequence_parallel": True},
                                  model={"grad_accum": 4}))
    for st in table["stages"]:
        assert st["fp8_weights"] > 0
        assert st["total"] == st["params"] + st["grads"] + st["optimizer"] + st["activations"] + st["fp8_weights"]
    assert "fp8_weights" not in stage_table(_scenario("none", model={"grad_accum": 4}))["stages"][0]


def test_blockwise_writes_two_block_scaled_copies_and_is_hopper_only():
    """Blockwise FP8 (DeepSeek-V3's recipe): the cast finds its 1x128 scales itself (no amax pass) and writes two
    copies with a 4-byte scale per 128 elements each; refused on Blackwell (mxfp8 is its block-scaled recipe)."""
    ks = quantize("x", 1280, "blockwise", 2, 2)
    assert [k.name for k in ks] == ["x.quantize"] and ks[0].bytes == pytest.approx((2 + 2 * (1 + 4 / 128)) * 1280)
    s = _scenario("blockwise")
    x = _shape(s, "blockwise")
    assert x.fp8_copies == 2 and any(k.fp8 for k in module_kernels("block", "fwd", x).kernels)
    with pytest.raises(ZsimError) as err:
        scenario_from(H100, "b", precision={"dtype": "bf16", "fp8": "blockwise"}, model={"attention": "flash2"},
                      hardware={"profile": "dgx-b200", "nodes": 1})
    assert err.value.path == "precision.fp8" and "mxfp8" in str(err.value)


def test_bf16_adam_moments_make_k_8_and_a_lighter_update():
    """Megatron-Core's precision-aware optimizer with bf16 moments: K = 4 + 2 + 2 and 20 B an element updated."""
    from zsim.zero.model_states import optimizer_k
    from zsim.zero.rank_states import rank_model_states

    assert optimizer_k("bf16", True, "bf16") == 8 and optimizer_k("bf16", True, "fp32") == 12
    plain, light = _scenario("none"), _scenario("none", precision={"dtype": "bf16", "adam_moments": "bf16"})
    w = scenario_workload(plain)
    assert rank_model_states(light, w).optimizer * 12 == rank_model_states(plain, w).optimizer * 8
    step = lambda s: next(op for op in build_plan(s, w).ops if op.name == "optimizer/step")  # noqa: E731
    a, b = step(plain), step(light)
    assert a.hbm_bytes - b.hbm_bytes == 8 * a.elements
    fused = lambda op: next(k for k in op.kernels.kernels if k.name == "fused_adam").bytes  # noqa: E731
    assert fused(a) / fused(b) == pytest.approx(28 / 20)
    with pytest.raises(ZsimError) as err:
        scenario_from(H100, "m", precision={"dtype": "bf16", "adam_moments": "bf16"}, zero={"implementation": "paper"})
    assert err.value.path == "precision.adam_moments"


def test_fp8_params_gather_a_moe_models_experts_at_one_byte_and_its_dense_buckets_at_their_own_mean():
    """The routed experts are gathered apart from the dense buckets (zsim.zero.optimizer_step): with FP8 parameters
    each expert element is 1 byte, and the dense buckets' mean counts the dense parameters alone."""
    from zsim.zero.rank_states import expert_param_bytes, param_bytes_per_element

    moe = {"moe": {"experts": 4, "top_k": 2}}
    sections = {"parallel": {"dp": 8, "mp": 1, "ep": 4}, "zero": {"stage": 1, "implementation": "megatron-core",
                                                                   "activation_checkpointing": False}}
    plain = scenario_from(H100, "p", **sections, model=moe, precision={"dtype": "bf16", "fp8": "current"})
    fp8p = scenario_from(H100, "p", **sections, model=moe, precision={"dtype": "bf16", "fp8": "current", "fp8_params": True})
    w = scenario_workload(fp8p)
    assert w.expert_params_per_rank > 0
    assert (expert_param_bytes(plain), expert_param_bytes(fp8p)) == (2, 1)
    dense = w.params_per_mp_rank
    assert param_bytes_per_element(fp8p, w) == pytest.approx((2 * dense - sum(m.params for m in w.blocks)) / dense)
    experts = lambda s: next(op.nbytes for op in build_plan(s, w).ops if op.name == "all_gather/params.experts")  # noqa: E731
    assert experts(plain) == 2 * experts(fp8p) > 0
