"""precision.fp4 (zsim.compute.fp8, recipe 'nvfp4'): Transformer Engine's NVFP4 linear layers on Blackwell. Which
GEMMs turn NVFP4 and what quantizes their operands, their price at the FP4 peak, the cached NVFP4 weights, a whole
step, what the summary and result.json say, and the refusals; with the Blackwell Ultra profiles (B300, GB300) and
their attention."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
import yaml

from tests.conftest import scenario_from, with_sections
from zsim.compute import flash
from zsim.compute.fp8 import FP4_BYTES, NVFP4_BLOCK, copies, quantize, weight_cache_bytes
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

B200 = {
    "model": {"layers": 4, "hidden": 1024, "heads": 16, "seq_len": 1024, "vocab": 32000, "micro_batch": 2,
              "gated_mlp": True, "ffn_hidden": 2816, "position": "rotary", "attention": "flash3"},
    "parallel": {"dp": 2, "mp": 4, "sequence_parallel": True},
    "zero": {"stage": 1, "activation_checkpointing": False, "implementation": "megatron-core"},
    "precision": {"dtype": "bf16", "fp4": "nvfp4"},
    "hardware": {"profile": "dgx-b200", "nodes": 1},
}
PER_ELEMENT = FP4_BYTES + 1 / NVFP4_BLOCK  # an E2M1 value and its share of an E4M3 scale per 16


def _scenario(fp4: str = "nvfp4", **sections):
    return scenario_from(with_sections(B200, precision={"dtype": "bf16", "fp4": fp4}), "fp4", **sections)


def test_the_linear_layers_gemms_turn_nvfp4_and_quantize_into_two_copies_after_an_amax():
    s = _scenario()
    shape = Shape.of(s.model, 4, padded_vocab(32000, 4), "bf16", sp=True, fp8="nvfp4", arch=100)
    plain = Shape.of(s.model, 4, padded_vocab(32000, 4), "bf16", sp=True, arch=100)
    assert shape.fp8_copies == 2 == copies("nvfp4", 100)  # rows and columns on Blackwell too (K-major FP4 operands)
    fwd = module_kernels("block", "fwd", shape).kernels
    gemms = [k for k in fwd if k.kind == "gemm"]
    assert gemms and all(k.fp4 and not k.fp8 for k in gemms)
    assert [dataclasses.replace(k, fp4=False) for k in gemms] == [k for k in module_kernels("block", "fwd", plain).kernels
                                                                  if k.kind == "gemm"]
    names = [k.name for k in fwd]
    amax, cast = names.index("qkv.input.amax"), names.index("qkv.input.quantize")
    assert amax + 1 == cast < names.index("qkv")
    T = shape.s * shape.b
    assert fwd[amax].bytes == 2 * T * shape.h
    assert fwd[cast].bytes == pytest.approx((2 + 2 * PER_ELEMENT) * T * shape.h)
    assert not any(k.fp4 for k in module_kernels("head", "fwd", shape).kernels)  # the output layer stays 16-bit


def test_quantize_and_weight_cache_bytes():
    assert sum(k.bytes for k in quantize("x", 1600, "nvfp4", 2)) == pytest.approx((2 + 2 + 2 * PER_ELEMENT) * 1600)
    assert weight_cache_bytes(1600, "nvfp4") == int(1600 * 2 * PER_ELEMENT)


def test_an_nvfp4_gemm_runs_its_fp4_terms_at_the_fp4_peak_with_half_byte_operands():
    gpu = load_cluster("dgx-b200", 1).gpu
    c = gpu.compute
    assert gpu.peak_flops["fp4"] == 2 * gpu.peak_flops["fp8"] == 9000e12  # HGX B200 datasheet, dense
    k = gemm("mlp.h_to_4h", 8192, 14336, 4096)
    fp4 = kernel_seconds(dataclasses.replace(k, fp4=True), c, gpu.peak_flops["bf16"], gpu.hbm_bytes_per_s, "bf16", 2,
                         gpu.peak_flops["fp8"], gpu.peak_flops["fp4"])
    expect = gemm_seconds(8192, 14336, 4096, 1, 0.5, c.gemm["fp4"], c.sms, c.tiles,
                          gpu.peak_flops["fp4"] * c.sustained_ratio, gpu.hbm_bytes_per_s)
    assert fp4 == expect
    fp8 = kernel_seconds(dataclasses.replace(k, fp8=True), c, gpu.peak_flops["bf16"], gpu.hbm_bytes_per_s, "bf16", 2,
                         gpu.peak_flops["fp8"], gpu.peak_flops["fp4"])
    assert 0.4 < fp4 / fp8 < 0.75  # a large GEMM: about half the FP8 time at twice the peak


def test_the_cached_nvfp4_weights_are_allocated_and_quantized_once_a_step():
    s = _scenario()
    w = scenario_workload(s)
    elements = fp8_weight_elements(w)
    plan = build_plan(s, w)
    cache = [a for a in plan.persistent if a.tag == "model.fp8_weights"]
    assert [a.nbytes for a in cache] == [int(2 * PER_ELEMENT * elements)]
    ops = [op for op in plan.ops if op.name == "optimizer/fp8_weights"]
    assert len(ops) == s.run.steps
    assert ops[0].kernels.bytes == pytest.approx((2 + 2 + 2 * PER_ELEMENT) * elements)  # amax, then the cast


def test_a_step_of_a_large_model_is_faster_with_nvfp4_than_with_fp8():
    big = {"layers": 2, "hidden": 8192, "heads": 64, "kv_heads": 8, "ffn_hidden": 28672, "seq_len": 4096, "micro_batch": 1}
    fp4 = simulate(_scenario(model=big))
    fp8 = simulate(scenario_from(with_sections(B200, precision={"dtype": "bf16", "fp4": "none", "fp8": "current"}), "fp8",
                                 model=big))
    plain = simulate(_scenario("none", model=big))
    assert fp4.compute_seconds < fp8.compute_seconds < plain.compute_seconds
    assert fp4.model_flops == plain.model_flops  # MFU counts the same model FLOPs


@pytest.mark.parametrize("sections, path, words", [
    ({"precision": {"dtype": "bf16", "fp4": "nvfp4", "fp8": "current"}}, "precision.fp4", "mutually exclusive"),
    ({"precision": {"dtype": "bf16", "fp4": "nvfp4"}, "hardware": {"profile": "dgx-h100", "nodes": 1}},
     "precision.fp4", "Blackwell"),
    ({"precision": {"dtype": "fp32", "fp4": "nvfp4"}, "model": {"attention": "standard"}}, "precision.fp4", "fp32"),
    ({"precision": {"dtype": "bf16", "fp4": "nvfp4"}, "zero": {"stage": 3, "implementation": "paper"}},
     "precision.fp4", "stage 3"),
    ({"precision": {"dtype": "bf16", "fp4": "nvfp4", "fp8_params": True}}, "precision.fp8_params", "precision.fp8"),
])
def test_nvfp4_where_zsim_cannot_price_it_is_refused_naming_the_key(sections, path, words):
    with pytest.raises(ZsimError) as err:
        scenario_from(B200, "fp4", **sections)
    assert err.value.path == path and words in str(err.value)


def test_the_cli_runs_nvfp4_on_a_gb300_rack_and_says_so(tmp_path):
    path = tmp_path / "fp4.yaml"
    path.write_text(yaml.safe_dump(with_sections(B200, hardware={"profile": "gb300-nvl72", "nodes": 1, "gpus_per_node": 8})))
    run = subprocess.run([sys.executable, "-m", "zsim", "run", str(path), "--output", str(tmp_path / "out")],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "NVFP4 linear layers" in run.stdout and "NVFP4's is 15000" in run.stdout
    assert "FP8 attention" not in run.stdout
    result = json.loads(next((tmp_path / "out").rglob("result.json")).read_text())
    assert result["throughput"]["fp4_peak_tflops_per_gpu"] == 15000
    assert result["precision"]["fp4"] == "nvfp4" and "fp8_peak_tflops_per_gpu" not in result["throughput"]
    bad = tmp_path / "h100.yaml"
    bad.write_text(yaml.safe_dump(with_sections(B200, hardware={"profile": "dgx-h100", "nodes": 1})))
    run = subprocess.run([sys.executable, "-m", "zsim", "run", str(bad), "--output", str(tmp_path / "o2")],
                         capture_output=True, text=True)
    assert run.returncode == 2 and "precision.fp4" in run.stderr and "Traceback" not in run.stderr


@pytest.mark.parametrize("profile, gpu_name, peaks, memory, nic_Gbps", [
    # GB300 NVL72 datasheet per 72 GPUs, dense; MLPerf v5.1 system file's 284208 MiB
    ("gb300-nvl72", "GB300-278GB", {"bf16": 2500, "fp8": 5000, "fp4": 15000}, 277.5, 800),
    # HGX B300 datasheet per 8 GPUs, dense; MLPerf v5.1 system files' 275040 MiB
    ("dgx-b300", "B300-269GB", {"bf16": 2250, "fp8": 4500, "fp4": 13500}, 268.6, 800),
])
def test_the_blackwell_ultra_profiles_carry_their_datasheets(profile, gpu_name, peaks, memory, nic_Gbps):
    c = load_cluster(profile, 2)
    assert c.gpu.name == gpu_name and c.gpu.compute_capability == 103
    assert {k: c.gpu.peak_flops[k] / 1e12 for k in peaks} == peaks
    assert c.gpu.memory_bytes == pytest.approx(memory * 2**30)
    assert c.nic_bytes_per_s / c.network_efficiency * 8 / 1e9 == pytest.approx(nic_Gbps)


def test_blackwell_ultra_attention_is_blackwells_times_the_measured_gb300_over_gb200_ratio():
    for seq, fwd, bwd in flash.ULTRA_OVER_BLACKWELL:
        assert flash.efficiency(3, "fwd", 103, seq) == pytest.approx(flash.efficiency(3, "fwd", 100, seq) * fwd)
        assert flash.efficiency(3, "bwd", 103, seq) == pytest.approx(flash.efficiency(3, "bwd", 100, seq) * bwd)
    # cuDNN 9.22's rows (cudnn-frontend @ 3929da2): GB300 1856 against GB200 1574 TFLOPs/s forward at 8k tokens
    assert flash.ultra_ratio("fwd", 8192) == pytest.approx(1856 / 1574)
    assert flash.ultra_ratio("bwd", 1 << 20) == pytest.approx(1490 / 1226)  # beyond the table: its last row
    assert 1.07 < min(min(r[1:]) for r in flash.ULTRA_OVER_BLACKWELL) and max(max(r[1:]) for r in flash.ULTRA_OVER_BLACKWELL) < 1.26


def test_the_shipped_gb300_scenario_is_the_theia_512_point():
    from tests.conftest import assert_shipped_is_point

    assert_shipped_is_point("llama-3.1-405b-mlperf51-gb300-nvl72-nvfp4.yaml", "mlperf51-llama405b-theia-512")


def test_fp8_attention_runs_cudnns_kernel_at_the_measured_fp8_over_bf16_rate_after_its_casts():
    s = scenario_from(with_sections(B200, precision={"dtype": "bf16", "fp4": "nvfp4", "fp8_attention": True}), "fp8a")
    plain = _scenario()
    a = Shape.of(s.model, 4, padded_vocab(32000, 4), "bf16", sp=True, fp8="nvfp4", arch=100, fp8_attention=True)
    b = Shape.of(plain.model, 4, padded_vocab(32000, 4), "bf16", sp=True, fp8="nvfp4", arch=100)
    for phase, name, cast in (("fwd", "attention.flash", "attention.qkv_fp8"),
                              ("bwd", "attention.flash.bwd", "attention.grad_output_fp8")):
        ka, kb = ({k.name: k for k in module_kernels("block", phase, x).kernels} for x in (a, b))
        assert ka[name].efficiency == pytest.approx(kb[name].efficiency * flash.fp8_ratio(phase, a.s))
        assert f"{cast}.amax" in ka and f"{cast}.quantize" in ka and f"{cast}.quantize" not in kb
    # NVIDIA's B200 table (cudnn-frontend @ cb560b9): FP8 1370.101 against bf16 1248.265 TFLOPs/s forward at 8k tokens
    assert flash.fp8_ratio("fwd", 8192) == pytest.approx(1370.101 / 1248.265)
    assert flash.fp8_ratio("bwd", 1024) < 1  # at short sequences the casts cost more than the matmuls save
    from zsim.report.summary import _fp8_words

    assert _fp8_words({"dtype": "bf16", "fp4": "nvfp4", "fp8_attention": True}).endswith("; FP8 attention (cuDNN)")


@pytest.mark.parametrize("sections, words", [
    ({"hardware": {"profile": "dgx-h100", "nodes": 1}, "precision": {"dtype": "bf16", "fp4": "none", "fp8_attention": True}},
     "Blackwell"),
    ({"model": {"attention": "flash2"}, "precision": {"dtype": "bf16", "fp8_attention": True}}, "flash3"),
])
def test_fp8_attention_where_zsim_cannot_price_it_is_refused(sections, words):
    with pytest.raises(ZsimError) as err:
        scenario_from(with_sections(B200, precision={"dtype": "bf16"}), "fp8a", **sections)
    assert err.value.path == "precision.fp8_attention" and words in str(err.value)


def test_sequence_parallel_all_gathers_carry_nvfp4_and_reduce_scatters_bf16():
    """TE's _all_gather_nvfp4 (since the NVFP4 recipe, v2.9): a forward SP all-gather moves 0.5 + 1/16 bytes an
    element (rowwise only); a backward one, a row-parallel layer's output gradient quantized with both usages
    (TE 366798ef linear.py), two such copies, unless Userbuffers' TP overlap moves one usage; the reduce-scatters
    the 16-bit outputs; the head's gather (the bf16 output layer's input) stays 16-bit."""
    plain = scenario_workload(_scenario("none"))
    fp4 = scenario_workload(_scenario())
    overlapped = scenario_workload(_scenario(parallel={**B200["parallel"], "tp_comm_overlap": True}))
    for phase, n_copies in (("mp_collectives_fwd", 1), ("mp_collectives_bwd", 2)):
        pairs = list(zip(getattr(plain.blocks[0], phase), getattr(fp4.blocks[0], phase),
                         getattr(overlapped.blocks[0], phase)))
        assert any(a[0] == "all_gather" for a, _, _ in pairs)
        for a, b, c in pairs:
            gathered = a[0] == "all_gather"
            assert a[0] == b[0] and b[1] == (round(a[1] * n_copies * PER_ELEMENT / 2) if gathered else a[1])
            assert c[1] == (round(a[1] * PER_ELEMENT / 2) if gathered else a[1])
    assert plain.modules[-1].mp_collectives_fwd == fp4.modules[-1].mp_collectives_fwd

