"""A CPU host's run reads as one: no CUDA context or NCCL buffers in its memory, and its speed in
GFLOPS per rank (its peak is far below one TFLOPS)."""

from zsim import api
from zsim.report.summary import summary


def test_host_run_has_no_gpu_context_and_prints_gflops():
    result = api.simulate(api.load("scenarios/calibrate/gpt-tiny-a.yaml"))
    facts = api.facts(result)
    assert facts["memory"]["peak_by_category"]["context"] == 0
    text = summary(facts)
    assert "GFLOPS/rank" in text and "TFLOPS/GPU" not in text and "% of 0)" not in text


def test_gpu_run_keeps_its_context_and_tflops():
    result = api.simulate(api.load("scenarios/paper/megatron-1.2B-1gpu.yaml", set={"model.layers": 2}))
    assert api.facts(result)["memory"]["peak_by_category"]["context"] > 700 * 2**20  # the CUDA context: 721 MiB
    assert "TFLOPS/GPU" in summary(api.facts(result))


def test_the_speed_line_says_when_tensor_cores_run_power_capped():
    """result.json carries the GPU's sustained_ratio and the speed line names it below 1 (a B200: 0.853, the
    published throttle); a V100, whose ratio is not known (1.0), says nothing of it."""
    for profile, ratio in (("dgx-b200", 0.853), (None, 1.0)):
        extra = {"hardware.profile": profile, "hardware.nodes": 1} if profile else {}
        result = api.simulate(api.load("scenarios/paper/megatron-1.2B-1gpu.yaml", set={"model.layers": 2, **extra}))
        facts = api.facts(result)
        assert facts["throughput"]["sustained_ratio"] == ratio
        said = "tensor cores at 0.85 of their burst rate (the power cap)" in summary(facts)
        assert said == (ratio < 1), profile
