"""Class mode and per-rank mode agree on symmetric scenarios; a degraded link slows exactly the
collectives that cross it."""

import pytest

from tests.conftest import small_scenario
from zsim.fabric.cluster import load_cluster
from zsim.errors import ConfigError
from zsim.engine.simulation import simulate
from zsim.fabric.collective import Placement, plan_collective, uncontended_time
from zsim.fabric.perf import run_collective
from zsim.fabric.topology import Degradation, aggregate_capacities, build_topology, degrade
from zsim.parallel.layout import GroupShape


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("algorithm", ["auto", "ring", "hierarchical"])
def test_class_and_per_rank_modes_agree_on_symmetric_scenarios(stage, algorithm):
    s = small_scenario(zero={"stage": stage}, fabric={"algorithm": algorithm}, run={"steps": 2})
    a, b = simulate(s, "class"), simulate(s, "per_rank")
    assert b.mode == "per_rank" and a.mode == "class"
    for x, y in zip(a.step_seconds, b.step_seconds):
        assert y == pytest.approx(x, rel=0.01)
    assert b.ledger.peak == a.ledger.peak


@pytest.mark.parametrize("zero", [
    {"stage": 2, "partition_activations": True, "cpu_offload_activations": True, "defragment": True},
    {"stage": 3, "partition_activations": True, "constant_buffers": False},
])
def test_modes_agree_with_zero_r(zero):
    """Pa's MP all-gathers and Pa+cpu's offload stream run on every rank in per-rank mode."""
    s = small_scenario(zero=zero, run={"steps": 2})
    a, b = simulate(s, "class"), simulate(s, "per_rank")
    assert b.step_seconds == pytest.approx(a.step_seconds, rel=0.01)
    assert b.ledger.peak == a.ledger.peak


def test_modes_agree_with_mp_1_and_many_groups_per_node():
    s = small_scenario(parallel={"dp": 32, "mp": 1}, zero={"stage": 2})
    assert simulate(s, "per_rank").step_seconds[0] == pytest.approx(simulate(s, "class").step_seconds[0], rel=0.01)


def _durations(result, prefix):
    """Each matching collective's own time on rank 0: its duration less the wait for its group."""
    return [e["dur"] - e["args"].get("wait_us", 0.0) for e in result.events
            if e.get("ph") == "X" and e["name"].startswith(prefix)]


def test_a_slow_nic_slows_dp_collectives_but_not_mp_ones():
    """MP 16 fills a node: DP groups use only the NICs, MP groups only the NVLinks."""
    shape = {"model": {"heads": 16}, "parallel": {"dp": 2, "mp": 16}, "zero": {"stage": 3}}
    base = small_scenario(**shape)
    slow = small_scenario(**shape, fabric={"degrade": [{"link": "nic", "node": 1, "index": 0, "factor": 0.25}]})
    a, b = simulate(base, "per_rank"), simulate(slow, "per_rank")
    assert b.mode == "per_rank"  # auto picks per-rank for degraded links
    assert sum(_durations(b, "all_gather/params")) > 1.5 * sum(_durations(a, "all_gather/params"))
    assert _durations(b, "all_reduce/mp") == pytest.approx(_durations(a, "all_reduce/mp"), rel=1e-9)
    assert b.step_seconds[0] > a.step_seconds[0]


def test_a_slow_nvlink_slows_exactly_the_groups_that_use_that_gpu():
    c = load_cluster("dgx2", 1)
    graph = build_topology(c)
    degrade(graph, c, [Degradation("nvlink", 0.5, index=2, gpu=5)])
    capacity = aggregate_capacities(graph, c)
    # NCCL stripes over the 6 links: 6 × the slow one (half speed) = half the GPU's bandwidth.
    assert capacity[("nvlink", 5)] == pytest.approx(0.5 * capacity[("nvlink", 4)])
    healthy = aggregate_capacities(build_topology(c), c)
    # GPUs 0-7 include GPU 5; a group on 8-15 does not touch it.
    shape = GroupShape(8, 8, 1, 2)
    _, with5 = plan_collective("all_reduce", 1 << 30, shape, c, "ring", Placement(list(range(8)), False))
    _, without = plan_collective("all_reduce", 1 << 30, shape, c, "ring", Placement(list(range(8, 16)), False))
    assert uncontended_time(with5, capacity) > 1.5 * uncontended_time(with5, healthy)
    assert uncontended_time(without, capacity) == uncontended_time(without, healthy)


def test_a_failed_nic_leaves_the_others_working():
    c = load_cluster("dgx2", 2)
    graph = build_topology(c)
    degrade(graph, c, [Degradation("nic", 0.0, index=3, node=0)])
    capacity = aggregate_capacities(graph, c)
    assert capacity[("nic", 0)] == pytest.approx(7 / 8 * capacity[("nic", 1)])


def test_degraded_links_must_exist_and_need_per_rank_mode():
    with pytest.raises(ConfigError, match="fabric.degrade"):
        small_scenario(fabric={"degrade": [{"link": "nic", "node": 9, "factor": 0.5}]})
    with pytest.raises(ConfigError, match="fabric.degrade"):
        small_scenario(fabric={"degrade": [{"link": "nvlink", "gpu": 3, "index": 6, "factor": 0.5}]})
    with pytest.raises(ConfigError, match="fabric.mode"):
        small_scenario(fabric={"mode": "class", "degrade": [{"link": "nic", "node": 1, "factor": 0.5}]})
    with pytest.raises(ConfigError, match="gpu"):
        small_scenario(fabric={"degrade": [{"link": "nvlink", "factor": 0.5}]})


def test_run_collective_on_two_nodes_crosses_the_nics():
    c = load_cluster("dgx2", 2)
    one = run_collective(load_cluster("dgx2", 1), "all_reduce", 1 << 30, 16)
    two = run_collective(c, "all_reduce", 1 << 30, 32)
    assert two.busbw < one.busbw  # 8 EDR NICs (90 GB/s) < 16 GPUs' NVLinks
