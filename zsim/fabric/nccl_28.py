"""NCCL 2.8's tuner for rings and trees (src/graph/tuning.cc of v2.8.4-1, ncclTopoTuneModel lines
78-160 and ncclTopoGetAlgoTime lines 262-285), the release family of ABCI's tables (2.8.4) and AWS
p4d's (2.8.3, 2.9.9). tuning.cc is identical in v2.8.3-1 and v2.8.4-1, and v2.9.9-1 changes only
CollNet's cells (`git diff v2.8.4-1 v2.9.9-1 -- src/graph/tuning.cc`), so this one port is exact for
all three releases' rings and trees.

What 2.8 changed against 2.7 (zsim.fabric.nccl's "2.7"), all ported here:
  * per-channel tree caps by architecture and node count (perChMaxTreeBws, line 76) instead of one
    80/110 GB/s ceiling, and tree bandwidth ×0.92 instead of ×0.9 (line 127);
  * LL's caps by architecture or CPU vendor and node count (llMaxBws, line 75) on rings and trees;
  * Ampere's whole-ring cap of 235 GB/s (line 124); all_reduce's LL128 cap 16.9 GB/s per channel
    (line 74); tree/LL128 capped at the per-channel LL128 rate without 2.7's ×7/9 (line 129);
  * hwLat[NET][tree][Simple] 28 µs instead of 50, NVLink tree/LL128 1.25 (lines 64-69);
  * the tree correction table by size (lines 265-269, 23 powers of two, 64 B to 256 MB), which 2.7
    also had but zsim's "2.7" leaves out.
NCCL reads LL's multi-node cap by CPU vendor (AMD or not); zsim has no CPU vendor in its profiles,
and the clusters of this release in the data run Intel hosts (ABCI: Xeon Gold 6148; p4d: Xeon
Platinum 8275CL), so the Intel row is used: an assumption for an AMD host. `info->nChannels` (line
279) is 0 for a single collective (enqueue.cc:494), so its rescaling does not apply to nccl-tests.
"""

from __future__ import annotations

import math

from zsim.fabric import nccl
from zsim.fabric.nccl import PROTOCOLS, Communicator, ring_steps

# tuning.cc v2.8.4-1 line 56 baseLat and lines 63-70 hwLat (µs): zsim.fabric.nccl's "2.8" entries.
BASE_LAT_US = nccl.BASE_LAT_US["2.8"]
HW_LAT_US = nccl.HW_LAT_US["2.8"]
# Line 74: ll128MaxBwPerCh (GB/s per channel).
LL128_MAX_BW_PER_CH = {"broadcast": 18.8, "reduce": 12.0, "all_gather": 18.3, "reduce_scatter": 15.2,
                       "all_reduce": 16.9}
# Line 75: llMaxBws[index1][1 node, 2 nodes, more] (GB/s); index1 = Ampere on 1 node, AMD host across.
LL_MAX_BW = ((39.0, 39.0, 20.4), (87.7, 22.5, 19.0))
# Line 76: perChMaxTreeBws[Ampere][1 node, 2 nodes, more] (GB/s per channel).
TREE_PER_CH = ((26.5, 18.5, 10.0), (24.0, 22.5, 16.0))
AMPERE_RING_CAP_GBPS = 235.0  # line 124: `if (compCap80) busBw = std::min(busBw, 235.0f)`
# Lines 265-269: treeCorrectionFactor[proto][log2i(S >> 6)], "trees are not perfectly sticking to the model".
TREE_CORRECTION = {
    "LL": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0),
    "LL128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .5, .6, .6, .7, .7, .8, .9, .9, .92, .92),
    "Simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9),
}


def predict(c: Communicator, fn: str, algo: str, proto: str) -> tuple[float, float] | None:
    """(latency µs, algbw GB/s) of one (algorithm, protocol) cell (tuning.cc lines 116-158); None
    where NCCL disables it (trees for collectives other than all_reduce, LL128 off)."""
    if algo == "tree" and fn != "all_reduce":
        return None
    if proto == "LL128" and not c.ll128:
        return None
    p = PROTOCOLS.index(proto)
    ampere = 1 if c.compute_capability == 80 else 0  # compCap80: min == max == 80
    nodes = min(c.n_nodes, 3) - 1  # index2: N1, N2, N4 (more than 2)
    ll_max = LL_MAX_BW[ampere if c.n_nodes == 1 else 0][nodes]  # across nodes: Intel hosts (module doc)
    bus = c.channels * (c.speed_intra_GBps if c.n_nodes <= 2 else c.speed_inter_GBps)
    if ampere:
        bus = min(bus, AMPERE_RING_CAP_GBPS)
    if algo == "ring" and proto == "LL":
        bus = min(ll_max, bus * (1 / 4 if (c.n_nodes > 1 or fn in ("all_reduce", "reduce")) else 1 / 3))
    if algo == "ring" and proto == "LL128":
        bus = min(bus * (0.7 if c.n_ranks / c.n_nodes < 2 else 0.92), LL128_MAX_BW_PER_CH[fn] * c.channels)
    if algo == "tree":
        bus = min(bus * 0.92, c.channels * TREE_PER_CH[ampere][nodes])
        if proto == "LL":
            bus = min(bus / 3.8, ll_max)
        if proto == "LL128":
            bus = min(bus * (7 / 9 if c.n_nodes == 1 else 0.915), LL128_MAX_BW_PER_CH[fn] * c.channels)
    nsteps = ring_steps(fn, c.n_ranks)
    algbw = bus * (c.n_ranks / nsteps if algo == "ring" else 0.5)
    intra = HW_LAT_US[c.intra_hw][algo][p] * (1.8 if c.n_nodes > 1 and proto == "LL" else 1.0)
    inter = HW_LAT_US["net"][algo][p]
    lat = BASE_LAT_US[algo][p]
    if algo == "ring":
        if fn in ("broadcast", "reduce"):
            lat += HW_LAT_US[c.intra_hw if c.n_nodes == 1 else "net"]["ring"][p]  # sameChannels rings
        else:
            n_inter = 2 * (c.n_nodes - 1) if fn == "all_reduce" else c.n_nodes - 1
            lat += (nsteps - n_inter) * intra + n_inter * inter
    else:
        lat += 2 * ((c.per_node - 1) * intra + int(math.log2(c.n_nodes)) * inter)
    return lat, algbw


def predicted_time_us(c: Communicator, fn: str, nbytes: float, algo: str, proto: str) -> float | None:
    """ncclTopoGetAlgoTime (lines 271-285): the tree correction by log2i(S >> 6) (log2i(0) = 0), the
    ring's plateau ×1.9 for inter-node all_reduce from nRanks/16 × 64 KiB on."""
    cell = predict(c, fn, algo, proto)
    if cell is None or cell[1] <= 0:
        return None
    lat, bw = cell
    log_size = max(0, (int(nbytes) >> 6).bit_length() - 1)
    if algo == "tree" and log_size < 23:
        bw *= TREE_CORRECTION[proto][log_size]
    if algo == "ring" and proto == "Simple" and c.n_nodes > 1 and fn == "all_reduce" \
            and nbytes >= c.n_ranks / 16 * 65536:
        lat *= 1.9  # "Plateau effect of ring"
    return lat + nbytes / (1000 * bw)
