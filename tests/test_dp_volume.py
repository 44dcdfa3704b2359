"""The DP traffic fact in the paper's convention (ZeRO §7.1): 2Ψ per step for stage 0-2, zero where
there is no data parallelism to move anything."""

import pytest

from zsim import api


def test_single_gpu_moves_no_dp_traffic():
    scenario = api.load("scenarios/paper/megatron-1.2B-1gpu.yaml", set={"model.layers": 2})
    facts = api.facts(api.simulate(scenario))
    assert facts["comm"]["dp_volume_over_psi"] == 0.0


def test_stage0_moves_two_psi():
    scenario = api.load("scenarios/paper/megatron-1.2B-1gpu.yaml",
                        set={"model.layers": 2, "parallel.dp": 2, "hardware.gpus_per_node": 2})
    facts = api.facts(api.simulate(scenario))
    assert facts["comm"]["dp_volume_over_psi"] == pytest.approx(2.0, rel=1e-3)
