"""The cluster as a networkx graph: GPUs, NVLinks, NVSwitches, PCIe switches, NICs, a fat-tree.

Edges are directed (one per direction) and carry `bytes_per_s` (per direction) and `kind`. Node
names: 'n3.gpu5', 'n3.nvswitch2', 'n3.pcie1', 'n3.nic1', 'leaf1', 'spine0'. Builders:

* nvswitch (DGX-2, DGX A100, DGX H100): every GPU has `nvlink_links` links spread over the switches
  of its baseboard; DGX-2's two baseboards are joined switch to switch, 8 links per switch
  (NVIDIA DGX-2 System User Guide, "NVSwitch"; DGX A100/H100 user guides).
* cube-mesh (DGX-1 V100): the hybrid cube-mesh, 6 NVLinks per GPU to 4 neighbours, two of them
  doubled (zsim.fabric.cube_mesh); a node of fewer than 8 GPUs keeps the sub-mesh among them.
* PCIe: `gpus_per_pcie_switch` GPUs share a PCIe switch with one NIC (DGX-1/DGX-2: a GPU pair and
  its EDR NIC; DGX A100/H100: one NIC per GPU).
* between nodes: a two-level fat-tree, rail-aligned (NIC i of every node on leaf i); leaf-to-spine
  bandwidth is the NICs' bandwidth divided by `oversubscription`.

The simulator's fabric works on aggregate links (zsim.fabric.collective): a GPU's NVLinks together and
a node's NICs together. `aggregate_capacities` derives those from the graph: NCCL stripes a collective
evenly over its channels, so a group of parallel links runs at count × its slowest member, and a
failed link (capacity 0) is left out (NCCL builds its channels from the links that work).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from zsim.fabric.cluster import Cluster
from zsim.errors import ConfigError
from zsim.fabric.cube_mesh import cube_mesh_edges

if TYPE_CHECKING:  # networkx is imported only when a graph is built (~0.1 s): class mode needs none
    import networkx as nx


def _both(g: nx.MultiDiGraph, a: str, b: str, bps: float, kind: str, index: int = 0) -> None:
    g.add_edge(a, b, bytes_per_s=bps, kind=kind, index=index)
    g.add_edge(b, a, bytes_per_s=bps, kind=kind, index=index)


def build_topology(cluster: Cluster) -> nx.MultiDiGraph:
    """The whole cluster's graph (a MultiDiGraph: parallel NVLinks are separate edges)."""
    import networkx as nx

    g = nx.MultiDiGraph(name=cluster.name)
    for node in range(cluster.nodes):
        _node(g, cluster, node)
    _fat_tree(g, cluster)
    return g


def _node(g: nx.MultiDiGraph, c: Cluster, node: int) -> None:
    p = f"n{node}."
    link = c.nvlink_link_bytes_per_s
    for i in range(c.gpus_per_node):
        g.add_node(p + f"gpu{i}", kind="gpu", node=node, local=i)
    if c.fabric == "nvswitch":
        per_board = max(1, c.nvswitches // c.baseboards)
        gpus_per_board = c.gpus_per_node // c.baseboards
        for i in range(c.gpus_per_node):
            board = i // gpus_per_board
            for j in range(c.nvlink_links):
                switch = board * per_board + j % per_board
                _both(g, p + f"gpu{i}", p + f"nvswitch{switch}", link, "nvlink", j)
        if c.baseboards == 2:  # DGX-2: each switch has 8 links to its peer on the other board
            for s in range(per_board):
                for j in range(8):
                    _both(g, p + f"nvswitch{s}", p + f"nvswitch{s + per_board}", link, "nvlink-bridge", j)
    else:
        for a, b, count in cube_mesh_edges(c.gpus_per_node):
            for j in range(count):
                _both(g, p + f"gpu{a}", p + f"gpu{b}", link, "nvlink", j)
    switches = -(-c.gpus_per_node // c.gpus_per_pcie_switch)  # the last switch may hold fewer GPUs
    for s in range(switches):
        for i in range(s * c.gpus_per_pcie_switch, min((s + 1) * c.gpus_per_pcie_switch, c.gpus_per_node)):
            _both(g, p + f"gpu{i}", p + f"pcie{s}", c.offload.bytes_per_s, "pcie")
    for nic in range(c.nics_per_node):
        switch = nic * switches // c.nics_per_node
        _both(g, p + f"pcie{switch}", p + f"nic{nic}", c.offload.bytes_per_s, "pcie")


def _fat_tree(g: nx.MultiDiGraph, c: Cluster) -> None:
    if c.nodes == 1:
        return
    spines = max(1, c.nics_per_node)
    for rail in range(c.nics_per_node):
        for node in range(c.nodes):
            _both(g, f"n{node}.nic{rail}", f"leaf{rail}", c.nic_bytes_per_s, "nic", 0)
        up = c.nodes * c.nic_bytes_per_s / c.oversubscription / spines
        for s in range(spines):
            _both(g, f"leaf{rail}", f"spine{s}", up, "uplink", 0)


@dataclass(frozen=True, slots=True)
class Degradation:
    """One slow or failed link: 'nvlink' (GPU `gpu`, link `index`) or 'nic' (node `node`, NIC
    `index`); its bandwidth is multiplied by `factor` (0 = failed)."""

    link: str
    factor: float
    index: int = 0
    gpu: int | None = None
    node: int | None = None


def degrade(g: nx.MultiDiGraph, cluster: Cluster, items: Iterable[Degradation]) -> None:
    """Scale the named links' bandwidth in place (both directions).

    Raises:
        ConfigError: a named GPU, node or link index does not exist.
    """
    for d in items:
        if d.link == "nvlink":
            if d.gpu is None or not 0 <= d.gpu < cluster.world:
                raise ConfigError(f"fabric.degrade: gpu(={d.gpu}) must be a global rank in 0..{cluster.world - 1}")
            node, local = divmod(d.gpu, cluster.gpus_per_node)
            name = f"n{node}.gpu{local}"
            edges = [(u, v, key) for u, v, key, data in g.edges(name, keys=True, data=True)
                     if data["kind"] == "nvlink"]
            edges = sorted(edges, key=lambda e: (g.edges[e]["index"], e[1]))
            if not 0 <= d.index < len(edges):
                raise ConfigError(f"fabric.degrade: GPU {d.gpu} has NVLinks 0..{len(edges) - 1}, not {d.index}")
            u, v, key = edges[d.index]
            targets = [(u, v, key)] + [(v, u, k2) for k2, data in g.get_edge_data(v, u).items()
                                       if data["index"] == g.edges[u, v, key]["index"]][:1]
        elif d.link == "nic":
            if d.node is None or not 0 <= d.node < cluster.nodes:
                raise ConfigError(f"fabric.degrade: node(={d.node}) must be in 0..{cluster.nodes - 1}")
            if not 0 <= d.index < cluster.nics_per_node:
                raise ConfigError(f"fabric.degrade: node {d.node} has NICs 0..{cluster.nics_per_node - 1}, not {d.index}")
            nic, leaf = f"n{d.node}.nic{d.index}", f"leaf{d.index}"
            if cluster.nodes == 1:
                raise ConfigError("fabric.degrade: a NIC only matters with more than one node")
            targets = [(nic, leaf, 0), (leaf, nic, 0)]
        else:
            raise ConfigError(f"fabric.degrade: link(={d.link!r}) must be 'nvlink' or 'nic'")
        for e in targets:
            g.edges[e]["bytes_per_s"] *= d.factor


def _striped(rates: list[float]) -> float:
    """Parallel links NCCL stripes evenly: count of working links × the slowest working one."""
    working = [r for r in rates if r > 0]
    return len(working) * min(working) if working else 0.0


def aggregate_capacities(g: nx.MultiDiGraph, cluster: Cluster) -> dict[Hashable, float]:
    """('nvlink', rank) and ('nic', node) capacities in bytes/s, for the fabric."""
    caps: dict[Hashable, float] = {}
    for node in range(cluster.nodes):
        for i in range(cluster.gpus_per_node):
            name = f"n{node}.gpu{i}"
            rates = [d["bytes_per_s"] for _, _, d in g.out_edges(name, data=True) if d["kind"] == "nvlink"]
            caps[("nvlink", node * cluster.gpus_per_node + i)] = _striped(rates)
        if cluster.nodes > 1:
            nics = [g.edges[f"n{node}.nic{j}", f"leaf{j}", 0]["bytes_per_s"] for j in range(cluster.nics_per_node)]
            caps[("nic", node)] = _striped(nics) / cluster.oversubscription
        else:
            caps[("nic", node)] = cluster.nic_pool.bytes_per_s
    return caps


def healthy_capacities(cluster: Cluster) -> dict[Hashable, float]:
    """What `aggregate_capacities(build_topology(cluster), cluster)` returns when no link is degraded,
    without building the graph (class mode and `zsim collective` need only these aggregates; the
    graph of a 64-node cluster and networkx's import cost more than the rest of the start-up).
    tests/test_topology.py checks both agree on every shipped profile."""
    if cluster.fabric == "nvswitch":
        links = [cluster.nvlink_links] * cluster.gpus_per_node
    else:  # cube-mesh: a GPU's NVLinks are its entries in the mesh table
        links = [sum(n for a, b, n in cube_mesh_edges(cluster.gpus_per_node) if gpu in (a, b)) for gpu in range(cluster.gpus_per_node)]
    caps: dict[Hashable, float] = {}
    for node in range(cluster.nodes):
        for i in range(cluster.gpus_per_node):
            caps[("nvlink", node * cluster.gpus_per_node + i)] = links[i] * cluster.nvlink_link_bytes_per_s
        caps[("nic", node)] = (cluster.nics_per_node * cluster.nic_bytes_per_s / cluster.oversubscription
                               if cluster.nodes > 1 else cluster.nic_pool.bytes_per_s)
    return caps
