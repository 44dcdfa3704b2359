"""A sweep reuses one workload and plan for points that differ only in speeds (zsim.engine.simulation
plan_key): the plan must not read any speed, and reusing it must change no number."""

import dataclasses
from pathlib import Path

import pytest

from zsim.scenario.scenario import load_scenario
from zsim.engine.simulation import plan_key, simulate, without_speeds
from zsim.sweep.points import plan_sweep
from zsim.sweep.spec import sweep_from_mapping
from zsim.workload.transformer import build_workload
from zsim.zero.plan import build_plan
from zsim.config.struct import replace

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ["1T-1024gpu", "paper/7.5B-64gpu-stage1", "paper/7.5B-64gpu-stage2", "paper/C5-100B-400gpu",
             "calibrate/gpt-tiny-a", "host/tiny-2rank-stage3"]


def plan_of(scenario):
    return build_plan(scenario, build_workload(scenario.model, scenario.parallel.mp, scenario.precision.dtype))


@pytest.mark.parametrize("name", SCENARIOS)
def test_the_plan_reads_no_speed(name):
    """The plan of a scenario whose cluster has every speed zeroed (None for tiers, NCCL, the compute
    terms) and no hardware section is the plan of the scenario: what plan_key leaves out, the plan
    never reads."""
    scenario = load_scenario(ROOT / "scenarios" / f"{name}.yaml")
    stripped = dataclasses.replace(scenario, cluster=without_speeds(scenario.cluster), hardware=None)
    assert plan_of(stripped) == plan_of(scenario)
    assert plan_key(stripped) == plan_key(scenario)


def test_the_key_tells_plans_apart():
    scenario = load_scenario(ROOT / "scenarios/paper/7.5B-64gpu-stage2.yaml")
    other = dataclasses.replace(scenario, zero=replace(scenario.zero, stage=1))
    assert plan_key(other) != plan_key(scenario)
    assert plan_key(dataclasses.replace(scenario, grad_accum=scenario.grad_accum + 1)) != plan_key(scenario)


def test_a_shared_plan_changes_no_number():
    """The flagship at several NIC speeds and stages: simulated with one dict of plans (as a sweep's
    chunk does) or each afresh, every total, peak and event count is the same."""
    mapping = {"name": "reuse", "base": str(ROOT / "scenarios/1T-1024gpu.yaml"),
               "axes": {"hardware.nic_Gbps": [25.0, 400.0, 6400.0], "zero.stage": [2, 3]}}
    plans: dict = {}
    points = plan_sweep(sweep_from_mapping(mapping), "<test>", ROOT).points
    for point in points:
        fresh, shared = simulate(point.scenario), simulate(point.scenario, trace=False, plans=plans)
        assert shared.step_seconds == fresh.step_seconds
        assert (shared.compute_seconds, shared.mp_comm_seconds, shared.offload_seconds) == \
            (fresh.compute_seconds, fresh.mp_comm_seconds, fresh.offload_seconds)
        assert shared.comm == fresh.comm and shared.algorithms == fresh.algorithms
        assert (shared.ledger.peak, shared.ledger.peak_reserved, shared.ledger.oom) == \
            (fresh.ledger.peak, fresh.ledger.peak_reserved, fresh.ledger.oom)
        assert shared.ledger.rows == fresh.ledger.rows and shared.sim_events == fresh.sim_events
        assert shared.events == [] and fresh.events
    assert len(plans) == 2  # one per stage
