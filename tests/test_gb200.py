"""The GB200 NVL72 profile (hwprofiles/gb200-nvl72.yaml, hwprofiles/gpus/gb200-185gb.yaml): the rack as zsim's node,
its datasheet figures, the B200's compute terms carried over, and a job on 16 of each rack's 18 trays."""

from __future__ import annotations

from tests.conftest import scenario_from
from zsim.compute.kernel_list import gemm
from zsim.compute.model import kernel_seconds
from zsim.engine.simulation import simulate
from zsim.fabric.cluster import load_cluster
from zsim.report.facts import facts
from zsim.report.summary import summary

TB = 1e12


def test_the_rack_is_one_nvlink_node_of_72_gpus_each_with_its_own_nic():
    c = load_cluster("gb200-nvl72", 2)
    assert (c.gpus_per_node, c.nics_per_node, c.nodes, c.nvswitches, c.nvls) == (72, 72, 2, 18, True)
    assert c.nvlink.bytes_per_s == 18 * 50e9  # 18 NVLink5 links of 50 GB/s a direction (datasheet: 1.8 TB/s)
    g = c.gpu
    # GB200 NVL72 datasheet per rack of 72, sparse, halved: BF16 360 PF, FP8 720 PF, TF32 180 PF; HBM 576 TB/s
    assert (g.peak_flops["bf16"], g.peak_flops["fp8"], g.peak_flops["tf32"]) == (2500 * TB, 5000 * TB, 1250 * TB)
    assert g.hbm_bytes_per_s == 8000e9 and g.memory_bytes == 185 * 2**30 and g.compute_capability == 100
    # a job on 16 trays a rack (MLPerf's): 64 GPUs and their 64 NICs, the fabric unchanged
    m = load_cluster("gb200-nvl72", 8, gpus_per_node=64, nics_per_node=64)
    assert (m.gpus_per_node, m.nics_per_node, m.nvlink) == (64, 64, c.nvlink)


def test_the_compute_terms_are_the_b200s_at_the_gb200_sms_and_clock():
    """The B200's terms carried over (its sustained ratio too) but for the SM count (152, published) and the burst
    ratio, which brings the datasheets' 2500/2250 credit to what SMs x maximum clock give: 152 x 2.062 GHz against
    148 x 1.965 GHz."""
    import dataclasses

    gb, b = load_cluster("gb200-nvl72", 1).gpu, load_cluster("dgx-b200", 1).gpu
    assert gb.compute.sms == 152 and b.compute.sms == 148
    assert gb.compute.burst_ratio < 1 == b.compute.burst_ratio
    assert dataclasses.replace(gb.compute, sms=148, burst_ratio=1.0) == b.compute
    k = gemm("fc1", 8192, 8192, 16384)  # compute-bound: its time scales with the peak and the burst ratio
    t_gb = kernel_seconds(k, gb.compute, gb.peak_flops["bf16"], gb.hbm_bytes_per_s, "bf16", 2, gb.peak_flops["fp8"])
    t_b = kernel_seconds(k, b.compute, b.peak_flops["bf16"], b.hbm_bytes_per_s, "bf16", 2, b.peak_flops["fp8"])
    burst = (148 * 1.965) / (152 * 2.062)
    assert burst - 0.02 < t_gb / t_b < burst + 0.02


def test_one_whole_rack_trains_without_the_network():
    """MLPerf v5.1's 72-GPU Llama 3.1 8B layout (DP 36 x CP 2 on one rack): every group inside the NVLink domain."""
    sc = scenario_from({"model": {"layers": 4, "hidden": 1024, "heads": 16, "seq_len": 2048, "vocab": 32000,
                                  "micro_batch": 1, "global_batch": 36, "attention": "flash2"},
                        "parallel": {"dp": 36, "mp": 1, "cp": 2},
                        "zero": {"stage": 1, "implementation": "megatron-core", "overlap_param_gather": True},
                        "precision": {"dtype": "bf16", "fp8": "current", "fp8_params": True},
                        "hardware": {"profile": "gb200-nvl72", "nodes": 1}}, "rack")
    assert not sc.layout.dp_shape.spans_nodes and not sc.layout.group_shape("cp").spans_nodes
    f = facts(simulate(sc))
    th = f["throughput"]
    assert th["peak_tflops_per_gpu"] == 2500 and th["fp8_peak_tflops_per_gpu"] == 5000
    assert "(the 16-bit peak, as FP8 runs are reported; FP8's is 5000)" in summary(f)
    # the power cap the speed line names is the sustained ratio alone; the burst correction is apart in result.json
    assert (th["sustained_ratio"], th["burst_ratio"]) == (0.853, 0.970)
    assert "tensor cores at 0.85 of their burst rate (the power cap)" in summary(f)


def test_a_16_bit_run_names_one_peak():
    sc = scenario_from({"model": {"layers": 2, "hidden": 1024, "heads": 16, "seq_len": 1024, "vocab": 32000,
                                  "micro_batch": 1}, "parallel": {"dp": 8, "mp": 1}, "zero": {"stage": 1},
                        "precision": {"dtype": "bf16"}, "hardware": {"profile": "dgx-b200", "nodes": 1}}, "bf16")
    f = facts(simulate(sc))
    assert "fp8_peak_tflops_per_gpu" not in f["throughput"] and "FP8's is" not in summary(f)


def test_the_shipped_scenario_is_the_carina_512_point():
    from tests.conftest import assert_shipped_is_point

    assert_shipped_is_point("llama-3.1-405b-mlperf50-gb200-nvl72.yaml", "mlperf50-llama405b-carina-512")
