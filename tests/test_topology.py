"""The topology graphs match the systems' published shapes, and every profile loads."""

import dataclasses

import pytest

from zsim.fabric.cluster import load_cluster
from zsim.config.profiles import Profiles
from zsim.fabric.topology import aggregate_capacities, build_topology, healthy_capacities
from zsim.fabric.perf import run_collective


def nvlinks(g, gpu):
    return [(v, d) for _, v, d in g.out_edges(gpu, data=True) if d["kind"] == "nvlink"]


def test_dgx2_gpus_reach_the_six_switches_of_their_board():
    c = load_cluster("dgx2", 1)
    g = build_topology(c)
    assert sum(1 for n, d in g.nodes(data=True) if d.get("kind") == "gpu") == 16
    for i in range(16):
        links = nvlinks(g, f"n0.gpu{i}")
        assert len(links) == 6
        board = range(0, 6) if i < 8 else range(6, 12)
        assert sorted(int(v.split("nvswitch")[1]) for v, _ in links) == list(board)
    bridge = [d for _, _, d in g.edges(data=True) if d["kind"] == "nvlink-bridge"]
    assert len(bridge) == 2 * 6 * 8  # 6 switch pairs × 8 links, both directions
    pcie = {v for _, v, d in g.out_edges("n0.gpu4", data=True) if d["kind"] == "pcie"}
    assert pcie == {"n0.pcie2"} and g.has_edge("n0.pcie2", "n0.nic2")  # a GPU pair shares a switch and NIC


def test_dgx1_cube_mesh_has_six_links_per_gpu_to_four_neighbours():
    c = load_cluster("dgx1", 1)
    g = build_topology(c)
    for i in range(8):
        links = nvlinks(g, f"n0.gpu{i}")
        assert len(links) == 6 and len({v for v, _ in links}) == 4


@pytest.mark.parametrize("profile,links,nics", [("dgx-a100", 12, 8), ("dgx-h100", 18, 8), ("dgx2", 6, 8), ("dgx1", 6, 4)])
def test_every_profile_loads_and_aggregates(profile, links, nics):
    c = load_cluster(profile, 2)
    caps = aggregate_capacities(build_topology(c), c)
    assert caps[("nvlink", 0)] == pytest.approx(links * c.nvlink_link_bytes_per_s)
    assert caps[("nic", 1)] == pytest.approx(nics * c.nic_bytes_per_s)


def test_oversubscribed_fat_tree_cuts_node_bandwidth():
    c = load_cluster("dgx2", 4)
    tight = dataclasses.replace(c, oversubscription=2.0)
    assert aggregate_capacities(build_topology(tight), tight)[("nic", 0)] == pytest.approx(
        aggregate_capacities(build_topology(c), c)[("nic", 0)] / 2)


def test_newer_generations_are_faster():
    bus = {p: run_collective(load_cluster(p, 1), "all_reduce", 1 << 30, 8).busbw for p in ("dgx1", "dgx-a100", "dgx-h100")}
    assert bus["dgx1"] < bus["dgx-a100"] < bus["dgx-h100"]


@pytest.mark.parametrize("profile", sorted(Profiles().names("system")))
@pytest.mark.parametrize("nodes", [1, 2, 3])
def test_healthy_capacities_equal_the_graphs_without_building_it(profile, nodes):
    """Class mode and `zsim collective` skip the graph (and networkx): the aggregates must agree."""
    c = load_cluster(profile, nodes)
    assert healthy_capacities(c) == pytest.approx(aggregate_capacities(build_topology(c), c))
    c = dataclasses.replace(c, oversubscription=2.0)
    assert healthy_capacities(c) == pytest.approx(aggregate_capacities(build_topology(c), c))
