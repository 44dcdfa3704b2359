"""NCCL's NVLink SHARP algorithms, NVLS (inside a node) and NVLSTree (across nodes), as NCCL 2.23's tuner
prices them and when NCCL enables them. Ported from NVIDIA/nccl v2.23.4-1 (`nccl.tuner: "2.23"`); every
line used here reads the same in v2.26.2-1, the release of the H100 NDR tables (line numbers of both
below; 2.26.2 caps NVLS channels at NCCL_MAX_NVLS_ARITY, above 8 GPUs).

NVLS reduces in the NVSwitch: each GPU sends its buffer into the switch once (multimem.ld_reduce) and
receives the reduced result once (multimem.st multicasts it), against a ring's 2(n-1)/n each way. NVLSTree
does that inside each node and runs a tree of nodes across the network, one channel per head GPU and NIC.

Where NCCL enables them (v2.23.4-1 / v2.26.2-1):
  * the NVLS graph exists only on NVSwitch nodes of compute capability >= 90 (search.cc 973 / 973);
  * nvlsSupport: NCCL_NVLS_ENABLE (default 2: on where the driver reports multicast) and more than 2
    GPUs of the node in the communicator (transport/nvls.cc 144-165 / 147-168);
  * NVLS and NVLSTree run Simple only (tuning.cc 177 / 246); NVLSTree is off on one node (303 / 412);
    NVLS is off across nodes without CollNet, which zsim does not model (309 / 417; enqueue.cc 1795 / 1670);
  * all_gather and reduce_scatter may run NVLS on one node only (tuning.cc 173 / 242, enqueue.cc 1797 /
    1671); a sum of fp16, bf16 or fp32 is an NVLS op (include/device.h ncclNvlsSupported).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from zsim.fabric.nccl import HW_LAT_US, Communicator

if TYPE_CHECKING:
    from zsim.fabric.cluster import Cluster

# tuning.cc v2.23.4-1 lines 56-59 / v2.26.2-1 120-123: baseLat[NVLS] = baseLat[NVLSTree] = 0 (µs).
# hwLat[NVLINK][NVLS|NVLSTree][Simple] = 25 µs (line 69 / 133); hwLat[NET][NVLSTree][Simple] = 14 µs
# (line 77 / 141; zsim.fabric.nccl.HW_LAT_US, which Cluster.network_step_s scales by). LL and LL128: 0,
# NVLS runs Simple only. (hwLat[NET][NVLS] = 18 µs is for NVLS across nodes, which needs CollNet.)
HW_LAT_NVLINK_US = 25.0
HW_LAT_NET_NVLS_TREE_US = HW_LAT_US["2.23"]["net"]["nvls_tree"][2]
# Bus bandwidth to algorithm bandwidth for all_reduce: ratio 5/6 (tuning.cc line 224 / 293); all_gather
# and reduce_scatter keep the bus figure (the `!(a != RING && (AllGather || ReduceScatter))` test, line 221 / 290).
ALLREDUCE_RATIO = 5.0 / 6.0
# The topology search's per-channel speeds for compute capability >= 90 (search.cc 935-936 / 918-919), GB/s.
SM90_SPEEDS_INTRA = (60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0)
SM90_SPEEDS_INTER = (48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0, 2.4, 1.2, 0.24, 0.12)


@dataclass(frozen=True, slots=True)
class NvlsGraph:
    """What NCCL's topology search finds for the NVLS pattern: `channels` (one per head GPU), the
    per-channel speed through the NVSwitch (`bw_intra_GBps`) and through a head's NIC (`bw_inter_GBps`)."""

    channels: int
    bw_intra_GBps: float
    bw_inter_GBps: float


def nvls_supported(c: Communicator) -> bool:
    """NCCL's nvlsSupport for this communicator: an NVLink SHARP node (the profile's `intra_node.nvls`),
    compute capability >= 90, and more than 2 of the node's GPUs in it (see the module's list)."""
    return c.nvls and c.compute_capability >= 90 and c.per_node > 2


def nvls_graph(c: Communicator) -> NvlsGraph | None:
    """The NVLS graph NCCL's search finds on this node; None where there is none.

    Each channel g pulls through the switch from every GPU and pushes back to every GPU, its head both ways
    twice (ncclTopoSearchTryNvls, search.cc 386-415: `d == g ? 2 : 1`, both directions at bwIntra, line
    136): with k channels on k GPUs a GPU's NVLinks carry (k + 1) x bwIntra each way. The search takes the
    fastest speed of its list at which that fits the GPU's NVLinks as NCCL sees them (channels x the
    per-link speed of topo.h, e.g. SM90_NVLINK_BW 20.6 GB/s x 18 on H100: 8 channels at 40 GB/s). On one
    node it forces k channels (line 982); across nodes it starts no faster than a GPU's NIC (1003-1004),
    keeps the most channels (423-426), then raises the NIC side alone while below twice bwIntra and within
    the NIC (1103), from the inter-node list; `nic_line_GBps` is the NICs' line rate per GPU of the node
    (NCCL's NET bw, port Gb/s / 8; the PCIe path to it is not modelled).
    """
    if not nvls_supported(c):
        return None
    k = c.per_node
    nvlink = c.channels * c.speed_intra_GBps  # the GPU's NVLinks to the switch, as NCCL's topology has them
    # across nodes the search starts at the GPU-to-NIC path's speed (system->maxBw, search.cc 1003-1004)
    speeds = SM90_SPEEDS_INTRA if c.n_nodes == 1 else [s for s in SM90_SPEEDS_INTER if s <= c.nic_line_GBps]
    fits = [s for s in speeds if (k + 1) * s <= nvlink]
    if not fits:
        return None
    intra = fits[0]
    if c.n_nodes == 1:
        return NvlsGraph(k, intra, intra)
    inter = intra
    for s in reversed(SM90_SPEEDS_INTER):  # pass 2: up the list while below 2 x bwIntra and within the NIC
        if s > inter and inter < 2 * intra and s <= c.nic_line_GBps:
            inter = s
    return NvlsGraph(k, intra, inter)


def predict(c: Communicator, fn: str, algo: str, proto: str) -> tuple[float, float] | None:
    """(latency µs, algbw GB/s) of NVLS or NVLSTree for collective `fn` (tuning.cc ncclTopoTuneModel);
    None where NCCL disables the cell (see the module's list)."""
    graph = nvls_graph(c)
    if graph is None or proto != "Simple":
        return None
    if algo == "nvls":
        if c.n_nodes > 1 or fn not in ("all_reduce", "all_gather", "reduce_scatter"):
            return None
        bus = graph.channels * min(graph.bw_intra_GBps, graph.bw_inter_GBps)  # tuning.cc 182 / 251
        algbw = bus * ALLREDUCE_RATIO if fn == "all_reduce" else bus
        return HW_LAT_NVLINK_US, algbw  # latency = intraLat (271-272 / 336-337): NVLink's, no base
    if algo == "nvls_tree":
        if c.n_nodes == 1 or fn != "all_reduce":
            return None
        inter = graph.bw_inter_GBps if c.n_nodes <= 2 else graph.bw_inter_GBps / 2  # tuning.cc 183 / 252
        bus = graph.channels * min(graph.bw_intra_GBps, inter)
        # baseLat 0 + intraLat + 2 log2i(nNodes) interLat (274-275 / 339-340); interLat: hwLat[NET] plus the
        # graph's latencyInter, 0 without a net plugin's (as nccl_223)
        lat = HW_LAT_NVLINK_US + 2 * int(math.log2(c.n_nodes)) * HW_LAT_NET_NVLS_TREE_US
        return lat, bus * ALLREDUCE_RATIO
    return None


@dataclass(frozen=True, slots=True)
class NvlsPhase:
    """The fabric's side of one NVLS or NVLSTree call: wait `latency_s`, then move `nbytes` per GPU through
    the NVSwitch at `nvlink_share` of the GPU's raw NVLink bandwidth (NVLSTree's NICs: zsim.fabric.collective)."""

    latency_s: float
    nbytes: float
    nvlink_share: float


def nvls_phase(fn: str, nbytes: float, c: Communicator, cluster: Cluster) -> NvlsPhase:
    """NVLS (one node) or NVLSTree (several) for a payload of `nbytes` on communicator `c` of `cluster`.

    Each GPU sends its S bytes into the switch once and receives S once (NVLS all_reduce: multimem
    ld_reduce, then multimem st; all_gather: its shard out, the gathered S in; reduce_scatter the
    reverse), so the bus bytes per GPU are S, at NCCL's in-switch rate: the NVLS graph's channels x
    bwIntra, x 5/6 for all_reduce (tuning.cc 182, 224). Uncontended, one node's all_reduce then takes
    exactly the tuner's cell: 25 µs + S / algbw (no NVLS table in ../shared/data to fit it to: NCCL's
    own model, an assumption the docs state). NVLSTree adds 2 ceil(log2 N) network steps at the
    network's fitted latency scaled by NCCL's hwLat ratio (Cluster.network_step_s), and its NICs carry
    the tree's bytes (collective.py).

    Raises:
        ValueError: NCCL has no NVLS graph for `c` (the caller asks only for cells the tuner enables).
    """
    graph = nvls_graph(c)
    if graph is None:
        raise ValueError(f"no NVLS on this communicator ({c.per_node} GPUs a node, compute capability "
                         f"{c.compute_capability}, nvls {c.nvls})")
    rate = graph.channels * graph.bw_intra_GBps * (ALLREDUCE_RATIO if fn == "all_reduce" else 1.0) * 1e9
    latency = HW_LAT_NVLINK_US * 1e-6
    if c.n_nodes > 1:
        latency += 2 * math.ceil(math.log2(c.n_nodes)) * cluster.network_step_s(c.n_nodes, "nvls_tree", "Simple")
    return NvlsPhase(latency, nbytes, rate / cluster.nvlink.bytes_per_s)
