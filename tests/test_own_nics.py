"""A group alone on its nodes moves across them at the NICs its own GPUs reach (rail-aligned: each GPU's
nearest NIC), not at the node's whole pool (zsim.fabric.collective.own_nics_Bps); groups that share a node
with others of their kind are priced as before."""

import dataclasses

import pytest

from zsim.fabric.cluster import load_cluster
from zsim.fabric.collective import Placement, own_nics_Bps, plan_collective, uncontended_time
from zsim.fabric.perf import run_collective
from zsim.fabric.topology import healthy_capacities
from zsim.parallel.layout import GroupShape

GiB = 1 << 30


def test_a_group_alone_on_its_nodes_moves_at_its_own_nics():
    """One GPU a node on DGX H100 (8 NDR NICs): a 4 GiB ring all_reduce moves at one NIC's rate; two a node at
    two; the whole node at the whole pool, as before."""
    c = load_cluster("dgx-h100", 2)
    nic = c.nic_bytes_per_s
    one = run_collective(c, "all_reduce", 4 * GiB, 2, algorithm="ring", simulate=False)
    two = run_collective(c, "all_reduce", 4 * GiB, 4, algorithm="ring", simulate=False)
    assert one.busbw * 1e9 == pytest.approx(nic, rel=0.02)  # latency is under 2% of a 4 GiB call
    assert two.busbw * 1e9 == pytest.approx(2 * nic, rel=0.02)
    whole = run_collective(c, "all_reduce", 4 * GiB, 16, algorithm="ring", simulate=False)
    assert whole.busbw > 4 * one.busbw  # the node's eight NICs (NVLink or the NICs bound it, not one GPU's NIC)


def test_a_gpu_alone_on_a_dgx2_has_its_pairs_nic():
    """DGX-2: 8 EDR NICs for 16 GPUs, one per PCIe switch pair. A GPU alone reaches one NIC, not half of
    one; sixteen groups of one GPU a node (class mode) share the pool, half a NIC each, as before."""
    c = load_cluster("dgx2", 2)
    assert own_nics_Bps(GroupShape(2, 1, 2, 1), c) == pytest.approx(c.nic_bytes_per_s)
    row = run_collective(c, "all_gather", 4 * GiB, 2, algorithm="ring", simulate=False)
    assert row.busbw * 1e9 == pytest.approx(c.nic_bytes_per_s, rel=0.02)
    shared = GroupShape(2, 1, 2, 16)  # a ZeRO DP group beside MP 16: the node's 16 groups share the NICs
    _, phases = plan_collective("all_gather", 4 * GiB, shared, c, "ring")
    unbound = [dataclasses.replace(p, cap_Bps=None) for p in phases]
    capacity = healthy_capacities(c)
    assert uncontended_time(phases, capacity) == uncontended_time(unbound, capacity)


def test_the_cap_is_absent_where_the_group_reaches_every_nic():
    """A whole node's group, or one inside a node, has no cap: the pool is its own."""
    c = load_cluster("dgx-h100", 4)
    assert own_nics_Bps(GroupShape(32, 8, 4, 1), c) is None
    assert own_nics_Bps(GroupShape(8, 8, 1, 1), c) is None
    assert own_nics_Bps(GroupShape(4, 1, 4, 8), c) == pytest.approx(c.nic_bytes_per_s / c.oversubscription)
    _, phases = plan_collective("all_reduce", GiB, GroupShape(32, 8, 4, 1), c, "ring",
                                Placement(list(range(32)), False))
    assert all(p.cap_Bps is None for p in phases)


def test_the_tree_and_hierarchical_paths_are_bound_too():
    """NCCL's tree on two nodes (half the ring's NIC bytes) and the two-level all_reduce (k parallel rings)
    keep to the group's own NICs: a lone GPU a node moves no faster than its NIC allows them."""
    c = load_cluster("dgx-h100", 2)
    shape, members = GroupShape(2, 1, 2, 1), Placement([0, 8], False)
    capacity = healthy_capacities(c)
    for algorithm in ("tree", "ring"):
        _, phases = plan_collective("all_reduce", 4 * GiB, shape, c, algorithm, members)
        bound = uncontended_time(phases, capacity)
        free = uncontended_time([dataclasses.replace(p, cap_Bps=None) for p in phases], capacity)
        assert bound > 3 * free  # eight NICs' rate before, one now
    two = GroupShape(4, 2, 2, 1)
    _, phases = plan_collective("all_reduce", 4 * GiB, two, c, "hierarchical", Placement([0, 1, 8, 9], False))
    inter = [p for p in phases if p.cap_Bps is not None]
    # two GPUs a node reach two NICs; the inter-node phase runs k = 2 rings (weight 2) at Simple's share (1.0)
    reach, k = 2 * c.nic_bytes_per_s / c.oversubscription, 2
    assert len(inter) == 1 and inter[0].cap_Bps == pytest.approx(reach / k)


def test_a_pipeline_send_across_nodes_is_bound_by_its_gpus_nic():
    """A stage of 2 ranks (TP 2) on an 8-GPU node: its two cross-node sends share the NIC pool two ways, but
    each still leaves through its own GPU's NIC (the pipeline communicator has no peer on the node to reach
    another through); a stage that fills its node gets its NIC share as before, which the cap does not bind."""
    from zsim.fabric.p2p import p2p_phases
    from zsim.parallel.layout import Layout

    c = load_cluster("dgx-h100", 2)
    thin = Layout(dp=1, mp=2, gpus_per_node=8, nodes=2, pp=8)  # stages 3 -> 4 cross the node boundary
    label, (phase,) = p2p_phases(64 << 20, c, thin, 3, 4)
    assert label == "p2p/net" and phase.cap_Bps == pytest.approx(c.nic_bytes_per_s / c.oversubscription)
    pool = c.nics_per_node * c.nic_bytes_per_s / c.oversubscription
    (link, weight), = phase.links
    assert pool / weight > phase.cap_Bps  # 4 NICs' share each without the cap
    full = Layout(dp=1, mp=8, gpus_per_node=8, nodes=2, pp=2)
    _, (phase,) = p2p_phases(64 << 20, c, full, 0, 1)
    (link, weight), = phase.links
    assert pool / weight == pytest.approx(phase.cap_Bps)  # one NIC each: the share and the cap agree
