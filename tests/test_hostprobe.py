"""The host probe's per-launch overhead (runtime/hostprobe.py): it times the runtime's own transformer layer and
divides by the launches the simulator counts for that layer, so the term it writes is the one the host model
prices per launch (zsim.engine.compute.host_seconds)."""

from __future__ import annotations

import math

import pytest

from zsim.runtime.hostprobe import TINY, layer_launch_seconds, tiny_layer_launches
from zsim.scenario.scenario import build_scenario
from zsim.workload.transformer import build_workload
from zsim.zero.plan import build_plan


def test_the_probes_divisor_is_the_plans_launch_count_for_that_layer():
    model = {"layers": 1, **TINY, "dropout": False}
    s = build_scenario({"model": model, "parallel": {"dp": 2, "mp": 1},
                        "zero": {"stage": 0, "activation_checkpointing": False}, "precision": {"dtype": "fp32"},
                        "hardware": {"profile": "dev-2core", "nodes": 1}})
    plan = build_plan(s, build_workload(s.model, 1, "fp32"))
    launches = {op.name.split(".")[0]: op.kernels.launches for op in plan.ops
                if op.kernels is not None and op.name.split(".")[0] in ("fwd/layer", "bwd/layer")}
    assert set(launches) == {"fwd/layer", "bwd/layer"}
    assert tiny_layer_launches() == launches["fwd/layer"] + launches["bwd/layer"]


def test_layer_launch_seconds_is_a_real_per_launch_time():
    torch = pytest.importorskip("torch")
    seconds = layer_launch_seconds(torch, repeats=20)
    # a dispatch costs at least a microsecond on any CPU torch runs on, and a 16-wide layer is no arithmetic
    assert math.isfinite(seconds) and 1e-7 < seconds < 1e-3
