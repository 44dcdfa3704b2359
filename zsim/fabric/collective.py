"""Collective algorithms as phases on the fabric's links, the way NCCL runs them.

A collective on a group of n ranks, k per node over N nodes, becomes one or more phases. Each phase
waits its latency, then moves its bus bytes per stream over its links, sharing them with whatever
else runs (zsim.fabric.sharing). NCCL's tuner picks the algorithm and protocol (zsim.fabric.nccl);
the protocol sets how much of a link's raw bandwidth a byte costs (a link's weight is 1/efficiency)
and the latency. Bus bytes per rank follow nccl-tests (doc/PERFORMANCE.md); ring step counts are
the standard ones (Thakur, Rabenseifner & Gropp 2005, §3; NCCL tuning.cc):
    all_reduce      2(n-1) steps, 2(n-1)/n · S        ring (NCCL: reduce-scatter + all-gather)
    reduce_scatter   (n-1) steps,  (n-1)/n · S        ring
    all_gather       (n-1) steps,  (n-1)/n · S        ring
    broadcast/reduce (n-1) steps,          S         pipelined chain (NCCL's ring with one root)
    all_to_all       (n-1) sends,  (n-1)/n · S        point to point
    all_reduce tree  2(k-1) + 2·log2 N steps, 2·S    NCCL's double binary tree across nodes with a
                                                     chain inside each node (Sanders et al. 2009)
Hierarchical (DeepSpeed/Horovod two-level, Sergeev & Del Balso 2018 §4): intra-node reduce-scatter
over k, inter-node all-reduce of S/k by k parallel rings, intra-node all-gather.
Links: ('nvlink', rank) is a GPU's NVLinks together; ('nic', node) is a node's NICs together (NCCL
spreads its channels over all of them). In class mode a phase's link weights also count the identical
streams that the other groups of the node run at the same time (`concurrent_per_node`).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from zsim.fabric.cluster import Cluster
from zsim.fabric.nccl import (FUNCTIONS, NVLINK_WIDTH_GBPS, NVLS_ALGORITHMS, PROTOCOLS, WIRE_SHARE, Communicator,
                              NcclTuner, bus_factor, ll_net_cap_Bps, ring_steps)
from zsim.fabric.nvls import nvls_phase
from zsim.fabric.tree_chunks import fill_bytes, fill_steps
from zsim.parallel.layout import GroupShape

ALGORITHMS = ("auto", "ring", "tree", "hierarchical")


@dataclass(frozen=True, slots=True)
class Phase:
    """Wait `latency_s`, then move `nbytes` bus bytes per stream over `links` [(link, weight)], no
    faster than `cap_Bps` (NCCL's element-wise path) when it is set."""

    latency_s: float
    nbytes: float
    links: tuple[tuple[Hashable, float], ...]
    cap_Bps: float | None = None


def nccl_channels(cluster: Cluster) -> int:
    """NCCL's channels in zsim: one per NVLink of a GPU (a one-GPU cube-mesh node has no NVLink, NCCL still
    has a channel)."""
    return max(1, cluster.nvlink_links)


def communicator(shape: GroupShape, cluster: Cluster) -> Communicator:
    """NCCL's view of a group: one channel per NVLink, at NCCL's per-link speed (topo.h); across
    nodes, the NIC share of the group's GPUs (rail-aligned: a GPU uses the NIC nearest to it). The
    tuner is the profile's NCCL release; LL128 is on by default on NVLink systems of Volta only in 2.5
    (tuning.cc v2.5.6-1: minCompCap == maxCompCap == 70), of Volta and Ampere in 2.7, and of Volta,
    Ampere and Hopper in 2.23 (v2.23.4-1: not on Blackwell)."""
    channels = nccl_channels(cluster)
    nic_share = cluster.nics_per_node * cluster.nic_bytes_per_s / 1e9 * shape.per_node / cluster.gpus_per_node
    tuner, cc = cluster.nccl_tuner, cluster.gpu.compute_capability
    speed = NVLINK_WIDTH_GBPS[tuner].get(cc, cluster.gpu.nccl_nvlink_GBps)
    return Communicator(
        n_ranks=shape.size, n_nodes=shape.nodes, channels=channels,
        speed_intra_GBps=speed, speed_inter_GBps=max(nic_share, 1e-3) / channels,
        ll128=cc == 70 if tuner == "2.5" else cc in (70, 80) if tuner in ("2.7", "2.8") else cc in (70, 80, 90),
        tuner=tuner, compute_capability=cc, nvls=cluster.nvls,
        nic_line_GBps=cluster.nics_per_node * cluster.nic_bytes_per_s / cluster.network_efficiency / 1e9
        / cluster.gpus_per_node,
    )


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a collective's streams run: the representative rank with class weights, or every
    member of one group instance (per-rank mode)."""

    members: Sequence[int] = (0,)
    class_mode: bool = True

    def nodes(self, cluster: Cluster) -> list[int]:
        return sorted({r // cluster.gpus_per_node for r in self.members})


def _links(shape: GroupShape, cluster: Cluster, where: Placement, eff: float, eff_net: float,
           nvlink: bool, nic_weight: float) -> tuple[tuple[Hashable, float], ...]:
    """The links one phase loads: members' NVLinks (if the phase moves data inside nodes) and the
    nodes' NIC pools (if it crosses nodes), each weighted by streams / efficiency."""
    links: list[tuple[Hashable, float]] = []
    if nvlink:
        links += [(("nvlink", r), 1.0 / eff) for r in where.members]
    if nic_weight > 0:
        copies = shape.concurrent_per_node if where.class_mode else 1
        links += [(("nic", node), copies * nic_weight / eff_net) for node in where.nodes(cluster)]
    return tuple(links)


def plan_collective(fn: str, nbytes: float, shape: GroupShape, cluster: Cluster, algorithm: str = "auto",
                    where: Placement = Placement(), in_place: bool = True,
                    nic_share: float = 1.0) -> tuple[str, list[Phase]]:
    """('algorithm/protocol', phases) for collective `fn` of payload `nbytes` on a group of `shape`.
    `nic_share` scales what an all_to_all sends across nodes, relative to its even spread (DeepEP's
    dispatch, which crosses to each node once: zsim.workload.moe.Moe.nic_share); 1 for every other call.

    Raises:
        ValueError: unknown `fn` or `algorithm` (the scenario schema rejects them earlier).
    """
    if fn not in FUNCTIONS:
        raise ValueError(f"collective fn(={fn!r}) is not modelled; use one of {', '.join(FUNCTIONS)}")
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm(={algorithm!r}) is not one of {', '.join(ALGORITHMS)}")
    n, k, big_n = shape.size, shape.per_node, shape.nodes
    if n <= 1 or nbytes <= 0:
        return "none", []
    tuner = NcclTuner(communicator(shape, cluster))
    if algorithm == "hierarchical" and fn in ("all_reduce", "reduce_scatter", "all_gather") and k > 1 and big_n > 1:
        _, proto = tuner.choose(fn, nbytes, ("ring",))
        return f"hierarchical/{proto}", _hierarchical(fn, nbytes, shape, cluster, where, proto)
    across = fn == "all_reduce" and big_n > 1  # NCCL: trees are for all_reduce across nodes
    if algorithm == "auto":  # NVLS and NVLSTree wherever the tuner enables them (zsim.fabric.nvls)
        allowed = ("tree", "ring", *NVLS_ALGORITHMS) if across else ("ring", *NVLS_ALGORITHMS)
    else:
        allowed = ("tree",) if algorithm == "tree" and across else ("ring",)
    if cluster.nccl_tuner == "2.23" and big_n > 1:
        algo, proto = _fastest(fn, nbytes, shape, cluster, where, in_place, tuner, allowed, nic_share)
    else:
        algo, proto = tuner.choose(fn, nbytes, allowed)
    return f"{algo}/{proto}", _phases(fn, nbytes, shape, cluster, where, in_place, algo, proto, nic_share)


def _fastest(fn: str, nbytes: float, shape: GroupShape, cluster: Cluster, where: Placement, in_place: bool,
             tuner: NcclTuner, allowed: tuple[str, ...], nic_share: float = 1.0) -> tuple[str, str]:
    """Across nodes, for the 2.23-family releases: the (algorithm, protocol) NCCL enables that costs
    least on this system's own fitted terms. NCCL 2.19-2.26's tuner reads the ring's and the tree's
    bandwidth across nodes from topology-search speeds zsim does not reproduce, and the tables show
    it choosing what is fastest where the choice is visible: trees on 2 nodes above the NICs' line
    rate (Alps, GCP TCPXO, OCI, the H100 NDR clusters), rings where a forced ring is no slower
    (issue-309 NCCL_ALGO=Ring). An assumption, stated in docs/fabric.md; single-node calls and the
    2.5/2.7 releases keep NCCL's own tuner. Each cell is costed for this one communicator, as NCCL's
    tuner knows no other: without the class mode's count of the node's concurrent groups, so class and
    per-rank mode choose alike; and with its own share of the node's NICs, per_node / gpus_per_node of
    them (rail-aligned: each GPU's nearest NIC, as `communicator` gives NCCL's tuner), not the node's whole
    pool, which a group with one GPU a node would otherwise see as eight times its NIC."""
    where = Placement(where.members, class_mode=False)
    own = shape.per_node / cluster.gpus_per_node

    def cost(algo: str, proto: str) -> float:
        total = 0.0
        for p in _phases(fn, nbytes, shape, cluster, where, in_place, algo, proto, nic_share):
            rate = _uncontended_rate(p.links, cluster, own)
            rate = min(rate, p.cap_Bps) if p.cap_Bps else rate
            total += p.latency_s + (p.nbytes / rate if p.nbytes else 0.0)
        return total

    cells = [(a, p) for a in allowed for p in PROTOCOLS if tuner.predict(fn, a, p) is not None]
    return min(cells, key=lambda cell: cost(*cell))


def _uncontended_rate(links: tuple[tuple[Hashable, float], ...], cluster: Cluster, nic_fraction: float = 1.0) -> float:
    """Bus bytes per second a phase on `links` moves when nothing else shares them: the slowest of its
    links' aggregate capacity (a GPU's NVLinks, a node's NICs under the fat tree's oversubscription, of
    which `nic_fraction` is the group's: its GPUs' own NICs) over its weight."""
    caps = {"nvlink": cluster.nvlink_links * cluster.nvlink_link_bytes_per_s,
            "nic": cluster.nics_per_node * cluster.nic_bytes_per_s / cluster.oversubscription * nic_fraction}
    return min(caps[link[0]] / w for link, w in links) if links else math.inf


def _phases(fn: str, nbytes: float, shape: GroupShape, cluster: Cluster, where: Placement, in_place: bool,
            algo: str, proto: str, nic_share: float = 1.0) -> list[Phase]:
    """The phases of `fn` run as `algo`/`proto` (see the module's table); `nic_share` as plan_collective's."""
    n, k, big_n = shape.size, shape.per_node, shape.nodes
    if algo in NVLS_ALGORITHMS:
        phase = nvls_phase(fn, nbytes, communicator(shape, cluster), cluster)
        # NVLSTree's NICs carry the tree's bytes: S each way on 2 nodes, 2S from 3 on (tuning.cc v2.23.4-1
        # line 183: bwInter on <= 2 nodes, bwInter / 2 beyond); NVLS inside one node crosses no NIC
        nic = (1.0 if big_n == 2 else 2.0) if algo == "nvls_tree" else 0.0
        return [Phase(phase.latency_s, phase.nbytes,
                      _links(shape, cluster, where, phase.nvlink_share, cluster.nvls_tree_efficiency, True, nic),
                      _own_cap(shape, cluster, cluster.nvls_tree_efficiency, nic))]
    kern = cluster.nccl
    eff = kern.share(proto, fn)
    # the NIC's share for this protocol, relative to Simple: LL's wire share, LL128's fitted one
    eff_net = cluster.ll128_share if proto == "LL128" else WIRE_SHARE[proto]
    net_lat = cluster.network_step_s(big_n, algo, proto)
    if algo == "tree":
        steps_intra, steps_inter = 2 * (k - 1), 2 * int(math.ceil(math.log2(big_n)))
        latency = kern.latency_s[proto] + steps_intra * kern.step_latency_s[proto] + steps_inter * net_lat
        # The double binary tree on 2 nodes: each tree carries S/2, and each node is the other's only
        # child in one tree and its parent in the other, so a node's NICs send S/2 up and S/2 down: S in
        # all, against ~2S (as a ring) from 3 nodes on (Sanders, Speck & Träff 2009; NCCL 2.4's trees).
        # This is the measured 2-node busbw above the NICs' line rate (Alps 158 of 100 GB/s, GCP TCPXO
        # 339 of 200 GB/s).
        nic_weight = 0.5 if big_n == 2 else 1.0
        links = _links(shape, cluster, where, eff, eff_net * cluster.tree_efficiency, nvlink=k > 1,
                       nic_weight=nic_weight)
        # the pipeline's fill: 2L - 1 chunk-times on the tree's own links, uncontended (zsim.fabric.tree_chunks)
        own = _links(shape, cluster, Placement(where.members, class_mode=False), eff, eff_net * cluster.tree_efficiency,
                     nvlink=k > 1, nic_weight=nic_weight)
        in_flight = fill_bytes(cluster.nccl_tuner, proto, nbytes, nccl_channels(cluster), big_n, k)
        latency += fill_steps(big_n) * in_flight / _uncontended_rate(own, cluster)
        return [Phase(latency, 2.0 * nbytes, links,
                      _min_cap(_ll_cap(cluster, fn, proto, big_n),
                               _own_cap(shape, cluster, eff_net * cluster.tree_efficiency, nic_weight)))]
    steps = n - 1 if fn in ("broadcast", "reduce") else ring_steps(fn, n)
    crossings = {"all_reduce": 2 * (big_n - 1), "all_gather": big_n - 1, "reduce_scatter": big_n - 1,
                 "all_to_all": big_n - 1}.get(fn, big_n - 1)
    latency = (kern.latency_s[proto] + (steps - crossings) * kern.step_latency_s[proto] + crossings * net_lat)
    bus = bus_factor(fn, n) * nbytes
    if fn == "all_to_all":  # the node's members' off-node share (× nic_share: DeepEP's once per node)
        nic_weight = nic_share * k * (n - k) / (n - 1) if big_n > 1 else 0.0
    else:
        nic_weight = 1.0 if big_n > 1 else 0.0  # a ring leaves and enters each node once per stream
    links = _links(shape, cluster, where, eff, eff_net, nvlink=k > 1, nic_weight=nic_weight)
    own = _own_cap(shape, cluster, eff_net, nic_weight)
    cap = _min_cap(kern.alignment_cap(fn, nbytes, n, in_place=in_place), _ll_cap(cluster, fn, proto, big_n), own)
    slow = kern.unaligned_fraction(fn, nbytes, n)
    if slow > 0:  # reduce_scatter: the aligned chunks at the link's rate, then the rest element-wise
        net_cap = _min_cap(_ll_cap(cluster, fn, proto, big_n), own)  # LL's ceiling, the group's own NICs
        return [Phase(latency, (1 - slow) * bus, links, net_cap),
                Phase(0.0, slow * bus, links, _min_cap(kern.unaligned_reduce_Bps, net_cap))]
    return [Phase(latency, bus, links, cap)]


def _ll_cap(cluster: Cluster, fn: str, proto: str, nodes: int) -> float | None:
    """NCCL's ceiling on LL's bus bandwidth across nodes (zsim.fabric.nccl.ll_net_cap_Bps), else None. Its
    tuner sets it for the collectives it tunes; an all_to_all is point-to-point sends (NCCL's p2p path,
    or DeepEP's own kernels), which it does not cap."""
    return ll_net_cap_Bps(cluster.nccl_tuner, nodes) if proto == "LL" and fn != "all_to_all" else None


def _min_cap(*caps: float | None) -> float | None:
    return min((c for c in caps if c is not None), default=None)


def own_nics_Bps(shape: GroupShape, cluster: Cluster) -> float | None:
    """Bytes per second per node of the NICs a group's own GPUs reach, when that is less than the node's
    pool, else None. Rail-aligned, as `communicator` tells NCCL's tuner: each GPU sends through the NIC
    nearest to it, ceil(per_node · NICs / GPUs) of them for the group (a GPU alone on a DGX-2 still has
    its pair's NIC, one, not half). NCCL reaches another NIC only through a peer GPU of its communicator
    on that node (PXN) or across the host (no GPUDirect there): a communicator of one GPU a node has
    neither, and a GPU's own PCIe link carries about one NIC's line rate (16 lanes of the NIC's generation).
    In class mode the node's other groups share the pool and this is not reached; it binds a group with
    the node to itself (`zsim collective --gpus 2 --nodes 2`), which would otherwise move at all eight NICs'
    rate through one GPU."""
    if shape.nodes <= 1:
        return None
    reach = math.ceil(shape.per_node * cluster.nics_per_node / cluster.gpus_per_node)
    if reach >= cluster.nics_per_node:
        return None
    return reach * cluster.nic_bytes_per_s / cluster.oversubscription


def _own_cap(shape: GroupShape, cluster: Cluster, eff_net: float, nic_weight: float) -> float | None:
    """A phase's bus-byte rate when its NIC streams fill the NICs its group reaches (own_nics_Bps), at the
    links' weight nic_weight / eff_net (as `_links`), else None."""
    own = own_nics_Bps(shape, cluster)
    return own * eff_net / nic_weight if own is not None and nic_weight > 0 else None


def _hierarchical(fn: str, nbytes: float, shape: GroupShape, cluster: Cluster, where: Placement,
                  proto: str) -> list[Phase]:
    """Intra-node reduce-scatter, inter-node `fn` on S/k by k parallel rings, intra-node all-gather;
    reduce_scatter and all_gather keep only their own half."""
    k, big_n = shape.per_node, shape.nodes
    kern = cluster.nccl
    eff = kern.share(proto, fn)
    # the NIC's share for this protocol, relative to Simple: LL's wire share, LL128's fitted one
    eff_net = cluster.ll128_share if proto == "LL128" else WIRE_SHARE[proto]
    intra_lat = kern.latency_s[proto] + (k - 1) * kern.step_latency_s[proto]
    rs = Phase(intra_lat, (k - 1) / k * nbytes, _links(shape, cluster, where, eff, eff_net, True, 0.0))
    ag = Phase(intra_lat, (k - 1) / k * nbytes, _links(shape, cluster, where, eff, eff_net, True, 0.0))
    inter_fn = fn
    inter = Phase(kern.latency_s[proto] + ring_steps(inter_fn, big_n) * cluster.network_step_s(big_n, "ring", proto),
                  bus_factor(inter_fn, big_n) * nbytes / k,
                  _links(shape, cluster, where, eff, eff_net, False, float(k)), _own_cap(shape, cluster, eff_net, float(k)))
    if fn == "all_reduce":
        return [rs, inter, ag]
    if fn == "reduce_scatter":
        return [rs, inter]
    return [inter, ag]


def uncontended_time(phases: list[Phase], capacity: dict[Hashable, float]) -> float:
    """The time of `phases` when nothing else shares their links (the closed form of the fabric)."""
    def rate(p: Phase) -> float:
        r = min(capacity[link] / weight for link, weight in p.links)
        return min(r, p.cap_Bps) if p.cap_Bps else r
    return sum(p.latency_s + (p.nbytes / rate(p) if p.nbytes else 0.0) for p in phases)
