"""MP groups that span whole nodes (the ZeRO paper's Megatron-LM baseline, Figure 2): the layout's
group shapes, the MP all-reduces on the network, and class and per-rank modes agreeing."""

from __future__ import annotations

import pytest

from tests.conftest import small_scenario
from zsim.engine.simulation import simulate
from zsim.parallel.layout import GroupShape, Layout


def test_group_shapes_when_mp_spans_nodes():
    lay = Layout(dp=2, mp=32, gpus_per_node=16, nodes=4)
    assert lay.mp_spans_nodes
    assert lay.mp_shape == GroupShape(size=32, per_node=16, nodes=2, concurrent_per_node=1)
    # DP members are 32 ranks apart: one per node, and each GPU of a node is in its own DP group
    assert lay.dp_shape == GroupShape(size=2, per_node=1, nodes=2, concurrent_per_node=16)
    assert list(lay.mp_group(40)) == list(range(32, 64)) and list(lay.dp_group(40)) == [8, 40]
    assert {lay.node_of(r) for r in lay.mp_group(0)} == {0, 1}


def test_group_shapes_inside_a_node_are_unchanged():
    lay = Layout(dp=8, mp=4, gpus_per_node=16, nodes=2)
    assert lay.mp_shape == GroupShape(size=4, per_node=4, nodes=1, concurrent_per_node=4)
    assert lay.dp_shape == GroupShape(size=8, per_node=4, nodes=2, concurrent_per_node=4)


def _mp_seconds(result) -> float:
    return sum(e["dur"] - e["args"].get("wait_us", 0.0) for e in result.events
               if e.get("ph") == "X" and e["name"].startswith("all_reduce/mp."))


def test_mp_all_reduces_across_nodes_use_the_network_and_are_slower():
    """The same model and MP degree on DGX-1 (8 GPUs: MP 16 spans 2 nodes) and on DGX-2 (16 GPUs: one
    node). Across nodes the ring's bandwidth is the node's 4 EDR NICs (4 x 12.5 GB/s x 0.9 = 45 GB/s)
    instead of 6 NVLinks (150 GB/s x 0.816 = 122 GB/s busbw): with 16 MB all-reduces, bandwidth-bound,
    the MP time grows by about 122/45 = 2.7x; the test asks for 2x (latency terms differ too)."""
    shape = {"model": {"heads": 16, "hidden": 2048, "seq_len": 1024, "micro_batch": 4},
             "parallel": {"dp": 2, "mp": 16}, "zero": {"stage": 2}}
    inside = simulate(small_scenario(**shape, hardware={"profile": "dgx2", "nodes": 2}))
    across = simulate(small_scenario(**shape, hardware={"profile": "dgx1", "nodes": 4}))
    assert across.scenario.layout.mp_spans_nodes and not inside.scenario.layout.mp_spans_nodes
    assert _mp_seconds(across) > 2 * _mp_seconds(inside)
    phases = across.scenario  # the MP collective's phases load the NIC pool of every node of the group
    from zsim.fabric.collective import plan_collective
    _, steps = plan_collective("all_reduce", 16 << 20, phases.layout.mp_shape, phases.cluster)
    assert any(link[0] == "nic" for p in steps for link, _ in p.links)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_class_and_per_rank_modes_agree_when_mp_spans_nodes(stage):
    s = small_scenario(model={"heads": 16}, parallel={"dp": 2, "mp": 16}, zero={"stage": stage},
                       hardware={"profile": "dgx1", "nodes": 4}, run={"steps": 2})
    a, b = simulate(s, "class"), simulate(s, "per_rank")
    assert s.layout.mp_spans_nodes
    assert b.step_seconds == pytest.approx(a.step_seconds, rel=0.01)
    assert _mp_seconds(b) == pytest.approx(_mp_seconds(a), rel=0.01)
    assert b.ledger.peak == a.ledger.peak


def test_modes_agree_with_mp_over_four_nodes_and_pa():
    """Pa's checkpoint all-gathers run over the MP group too: 32 ranks on 4 DGX-1 nodes."""
    s = small_scenario(model={"heads": 32}, parallel={"dp": 1, "mp": 32},
                       zero={"stage": 1, "partition_activations": True}, hardware={"profile": "dgx1", "nodes": 4})
    a, b = simulate(s, "class"), simulate(s, "per_rank")
    assert b.step_seconds == pytest.approx(a.step_seconds, rel=0.01)


def test_a_slow_nic_slows_mp_all_reduces_that_span_nodes():
    """Unlike MP inside a node (tests/test_modes.py), an MP group over two DGX-1 nodes crosses their
    NICs: one NIC of node 1 at a quarter speed slows its all-reduces."""
    shape = {"model": {"heads": 16, "hidden": 1024, "seq_len": 512}, "parallel": {"dp": 2, "mp": 16},
             "zero": {"stage": 2}, "hardware": {"profile": "dgx1", "nodes": 4}}
    base = simulate(small_scenario(**shape), "per_rank")
    slow = simulate(small_scenario(**shape, fabric={"degrade": [{"link": "nic", "node": 1, "index": 0,
                                                                  "factor": 0.25}]}))
    assert slow.mode == "per_rank"
    assert _mp_seconds(slow) > 1.2 * _mp_seconds(base)
