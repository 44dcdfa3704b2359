"""NCCL 2.23's tuner for rings and trees (src/graph/tuning.cc of v2.23.4-1, ncclTopoTuneModel and
ncclTopoGetAlgoTime), the release family of the multi-node tables of 2024–2025 (Alps: 2.23.4; the
H100 NDR clusters: 2.26.2; OCI: 2.19.3; GCP: 2.21–2.26). Releases 2.19 to 2.26 share this structure
(per-architecture LL/LL128/tree caps, netOverhead, the tree correction table); using 2.23.4's
constants for the neighbouring releases is an assumption a profile states.

Rings and trees are here; NVLS and NVLSTree (NVLink SHARP, on nodes whose profile says
`intra_node.nvls`) are in zsim.fabric.nvls, which NcclTuner asks for those cells. CollNet (SHARP
switches) and PAT (one GPU per node) are not modelled.
"""

from __future__ import annotations

import math

from zsim.fabric.nccl import PROTOCOLS, Communicator, ring_steps

# tuning.cc v2.23.4-1: baseLat[algo][proto] (µs) for Tree and Ring, (LL, LL128, Simple).
BASE_LAT_US = {"tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4)}
# hwLat[hw][algo][proto] (µs).
HW_LAT_US = {"nvlink": {"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4)},
             "pci": {"tree": (1.0, 1.9, 4.0), "ring": (1.0, 2.5, 5.7)},
             "net": {"tree": (5.0, 8.5, 14.0), "ring": (2.7, 4.0, 14.0)}}
# Per architecture (Volta, Ampere, Hopper) × (1 node, 2 nodes, more): llMaxBws (Intel/ARM hosts;
# NCCL uses its AMD row only on AMD CPUs, an input zsim does not have), perChMaxRingLL128Bws,
# perChMaxTreeLL128Bws, perChMaxTreeBws (GB/s).
LL_MAX_BW = ((39.0, 39.0, 20.4), (87.7, 22.5, 19.0), (141.0, 45.0, 35.0))
RING_LL128_PER_CH = ((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 36.7))
TREE_LL128_PER_CH = ((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 29.0))
TREE_PER_CH = ((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (38.7, 41.4, 36.0))
# "Trees are not perfectly sticking to the model for medium sizes": treeCorrectionFactor[proto][log2(S/64)].
TREE_CORRECTION = {
    "LL": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0),
    "LL128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0),
    "Simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9),
}
NET_OVERHEAD_US = 1.0  # getNetOverhead: 1 µs on Intel (and non-x86) hosts, ×3 for Simple


def _arch(cc: int) -> int:
    return 2 if cc >= 90 else 1 if cc >= 80 else 0


def predict(c: Communicator, fn: str, algo: str, proto: str) -> tuple[float, float] | None:
    """(latency µs, algbw GB/s) of one (algorithm, protocol) cell; None where NCCL disables it."""
    if algo == "tree" and fn != "all_reduce":
        return None
    if proto == "LL128" and not c.ll128:
        return None
    p = PROTOCOLS.index(proto)
    arch, nodes = _arch(c.compute_capability), min(c.n_nodes, 3) - 1
    bus = c.channels * (c.speed_intra_GBps if c.n_nodes <= 2 else c.speed_inter_GBps)
    ll_max = LL_MAX_BW[arch if c.n_nodes == 1 else 0][nodes]
    if algo == "ring" and proto == "LL":
        bus = min(ll_max, bus * 0.5)
    if algo == "ring" and proto == "LL128":
        bus = min(bus * 0.92, c.channels * RING_LL128_PER_CH[arch][nodes])
    if algo == "tree":
        bus = min(bus * 0.92, c.channels * TREE_PER_CH[arch][nodes])
        if proto == "LL":
            bus = min(bus / 3.8, ll_max)
        if proto == "LL128":
            bus = min(bus * (7 / 9 if c.n_nodes == 1 else 120 / 128), c.channels * TREE_LL128_PER_CH[arch][nodes])
    nsteps = ring_steps(fn, c.n_ranks)
    algbw = bus * (c.n_ranks / nsteps if algo == "ring" else 0.5)
    ppn = c.n_ranks / c.n_nodes
    intra = HW_LAT_US[c.intra_hw][algo][p]
    inter = HW_LAT_US["net"]["tree" if ppn == 1 else algo][p]  # graph latencyInter: 0 without a plugin's
    lat = BASE_LAT_US[algo][p]
    if algo == "ring":
        if fn in ("broadcast", "reduce"):
            lat += HW_LAT_US[c.intra_hw if c.n_nodes == 1 else "net"]["ring"][p]  # sameChannels
        else:
            overhead = NET_OVERHEAD_US * (3 if proto == "Simple" else 1) if c.n_nodes > 1 else 0.0
            intra = max(intra, overhead)  # "inter-node rings still have to launch nsteps * net overhead"
            n_inter = 0 if c.n_nodes == 1 else 2 * (c.n_nodes - 1) if fn == "all_reduce" else c.n_nodes - 1
            lat += (nsteps - n_inter) * intra + n_inter * inter
    else:
        lat += 2 * ((c.per_node - 1) * intra + int(math.log2(c.n_nodes)) * inter)
    return lat, algbw


def predicted_time_us(c: Communicator, fn: str, nbytes: float, algo: str, proto: str) -> float | None:
    """ncclTopoGetAlgoTime: the tree correction by size, the ring's plateau (×1.9 before Ampere, ×1.4
    from Ampere on), one operation per call."""
    cell = predict(c, fn, algo, proto)
    if cell is None or cell[1] <= 0:
        return None
    lat, bw = cell
    log_size = int(math.log2(max(1, int(nbytes) >> 6))) if nbytes >= 64 else -1
    if algo == "tree" and fn == "all_reduce" and 0 <= log_size < 23:
        bw *= TREE_CORRECTION[proto][log_size]
    if (algo == "ring" and proto == "Simple" and c.n_nodes > 1 and fn == "all_reduce"
            and nbytes / (c.channels * c.n_ranks) >= 64):
        lat *= 1.9 if c.compute_capability < 80 else 1.4
    return lat + nbytes / (1000 * bw)
