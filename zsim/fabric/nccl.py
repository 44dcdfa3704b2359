"""How NCCL runs one collective: which algorithm and protocol it picks, and what that costs.

Two halves, kept apart on purpose:

* **The tuner** (`NcclTuner`) is NCCL's own cost model (src/graph/tuning.cc: ncclTopoTuneModel,
  ncclTopoGetAlgoTime), with NCCL's constants, of the release the system ran (the profile's
  `nccl.tuner`): "2.5" (v2.5.6-1 and v2.5.7-1, late 2019 to March 2020, identical tuning) or "2.7"
  (v2.7.3-1 to v2.7.8-1, mid 2020). NCCL uses it to choose the algorithm (ring, tree) and protocol
  (LL, LL128, Simple) per call, by predicted time, and where that prediction is wrong the real curve
  shows it: 2.5's tuner keeps LL128 for a 12-GPU DGX-2 all_reduce up to ~20 MB although Simple is
  already faster there, which is the dip in the DGX-2 nccl-tests busbw at 16 MiB (2.7 switches at
  ~10 MB). The releases differ in their latencies, in LL128's cap (2.5: one ceiling per collective;
  2.7: per channel), in the tree's cap and LL factors, in 2.7's split of a ring's steps into those
  inside and across nodes, and in 2.7's "plateau effect of ring" (×1.9 latency for large inter-node
  all_reduces).
* **The kernel** (`NcclKernel`) is what the chosen protocol really achieves on the hardware: a
  protocol's share of the link bandwidth, its fixed and per-step latencies, the host's kernel-launch
  cost, and the slow path NCCL's copy/reduce loops take when a rank's chunk is not 16-byte aligned
  (NCCL src/collectives/device/common_kernel.h, `ReduceOrCopyMulti`: 128-bit loads only when every
  pointer shares its alignment). Its numbers come from a fit to nccl-tests (zsim.fabric.nccl_fit).

Sizes are payloads S as nccl-tests counts them (the whole gathered buffer for all_gather and
reduce_scatter); bus bytes per rank follow nccl-tests doc/PERFORMANCE.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

FUNCTIONS = ("broadcast", "reduce", "all_gather", "reduce_scatter", "all_reduce", "all_to_all")
PROTOCOLS = ("LL", "LL128", "Simple")
ALGORITHMS = ("tree", "ring")
# NVLink SHARP: NVLS inside a node, NVLSTree across nodes (2.23's tuner only: zsim.fabric.nvls)
NVLS_ALGORITHMS = ("nvls", "nvls_tree")

TUNERS = ("2.5", "2.7", "2.8", "2.23")  # 2.23: zsim.fabric.nccl_223; 2.8: zsim.fabric.nccl_28
# The collectives a profile may give LL128 its own efficiency for (all_to_all runs as all_gather's ring).
LL128_COLLECTIVES = ("broadcast", "reduce", "all_gather", "reduce_scatter", "all_reduce")
# LL128 moves 120 data bytes in each 128-byte line (NCCL src/collectives/device/prims_ll128.h:
# NCCL_LL128_DATAELEMS of NCCL_LL128_LINEELEMS 8-byte words): no collective gets more of a link.
LL128_CEILING = 120 / 128  # NCCL releases whose tuner zsim has (the profile's nccl.tuner)
# The share of the bytes a protocol puts on the wire that is data: LL sends 8 data bytes and 8 flag
# bytes per 16-byte line (src/collectives/device/prims_ll.h, union ncclLLFifoLine), LL128 120 of 128
# (prims_ll128.h), Simple only data. Across nodes the NIC, not the GPU's copy loop, is the bottleneck,
# so a protocol's share of the NIC is this (times the network's fitted efficiency for Simple).
WIRE_SHARE = {"LL": 0.5, "LL128": LL128_CEILING, "Simple": 1.0}

# LL's bus bandwidth across nodes, from v2.8.3-1 on: NCCL's tuner caps a ring or tree LL call at llMaxBws
# (src/graph/tuning.cc v2.8.4-1 line 75, v2.23.4-1 line 86, v2.26.2-1 line 151; GB/s on 2 nodes, on more),
# the row of Intel and other non-AMD hosts ("for multi-node, we look at CPU type"), whatever the GPU or
# NIC: LL's flag-polled 8-byte lines cross the network through the proxy's small LL buffers, not at a
# share of the line rate. zsim takes NVIDIA's ceiling as what the kernel achieves (an assumption: the
# tuner's number, not a measurement of ours); 2.5 and 2.7 have no such cap.
LL_NET_MAX_BUSBW_GBPS = {"2.8": (39.0, 20.4), "2.23": (39.0, 20.4)}


def ll_net_cap_Bps(tuner: str, nodes: int) -> float | None:
    """The ceiling on an LL collective's bus bandwidth (B/s) across `nodes` nodes under NCCL release
    `tuner`; None on one node or where the release has none."""
    caps = LL_NET_MAX_BUSBW_GBPS.get(tuner)
    if caps is None or nodes <= 1:
        return None
    return caps[0 if nodes == 2 else 1] * 1e9


# src/graph/tuning.cc: latencies in µs, baseLat[algo][proto] and hwLat[hw][algo][proto], per release.
# 2.7: v2.7.8-1 (identical in v2.7.3-1); 2.5: v2.5.6-1 (identical in v2.5.7-1).
BASE_LAT_US = {"2.23": {"tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4)},  # v2.23.4-1 (nccl_223)
               "2.8": {"tree": (4.4, 4.4, 0.0), "ring": (3.6, 10.0, 8.4)},  # v2.8.4-1 (as 2.7)
               "2.7": {"tree": (4.4, 4.4, 0.0), "ring": (3.6, 10.0, 8.4)},
               "2.5": {"tree": (4.4, 4.4, 0.0), "ring": (3.6, 3.6, 8.4)}}
HW_LAT_US = {
    "2.23": {"nvlink": {"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4)},
             "pci": {"tree": (1.0, 1.9, 4.0), "ring": (1.0, 2.5, 5.7)},
             "net": {"tree": (5.0, 8.5, 14.0), "ring": (2.7, 4.0, 14.0),
                     "nvls_tree": (0.0, 0.0, 14.0)}},  # line 77: NVLSTree (Simple only; zsim.fabric.nvls)
    "2.8": {"nvlink": {"tree": (0.52, 1.25, 28.0), "ring": (0.47, 1.9, 3.4)},  # v2.8.4-1
            "pci": {"tree": (1.0, 1.9, 28.0), "ring": (1.0, 2.5, 5.7)},
            "net": {"tree": (5.0, 8.5, 28.0), "ring": (2.7, 4.0, 9.6)}},
    "2.7": {"nvlink": {"tree": (0.52, 1.2, 28.0), "ring": (0.47, 1.9, 3.4)},
            "pci": {"tree": (1.0, 1.9, 28.0), "ring": (1.0, 2.5, 5.7)},
            "net": {"tree": (5.0, 8.5, 50.0), "ring": (2.7, 4.0, 9.6)}},
    "2.5": {"nvlink": {"tree": (0.5, 1.9, 28.0), "ring": (0.4, 2.5, 5.7)},
            "pci": {"tree": (1.0, 1.9, 28.0), "ring": (1.0, 2.5, 5.7)},
            "net": {"tree": (5.0, 7.5, 50.0), "ring": (0.9, 2.5, 6.6)}},
}
# 2.7 ll128MaxBwPerCh (GB/s per channel) for broadcast, reduce, all_gather, reduce_scatter, all_reduce.
_LL128_MAX_BW_PER_CH = {"broadcast": 18.8, "reduce": 12.0, "all_gather": 18.3, "reduce_scatter": 15.2,
                        "all_reduce": 16.7}
# 2.5 ll128MaxBw (GB/s, the whole ring, whatever its channels), same order.
_LL128_MAX_BW_25 = {"broadcast": 113.0, "reduce": 72.0, "all_gather": 110.0, "reduce_scatter": 91.0,
                    "all_reduce": 100.0}
# The per-NVLink speed each release's topology search assumes for Volta (src/graph/topo.h
# VOLTA_NVLINK_WIDTH, 21.0 in both); None: the GPU profile's nccl_nvlink_GBps.
NVLINK_WIDTH_GBPS = {"2.5": {70: 21.0}, "2.7": {}, "2.8": {}, "2.23": {}}


def ring_steps(fn: str, n: int) -> int:
    """Ring steps of `fn` on n ranks (NCCL tuning.cc `nsteps`; Thakur et al. 2005 §3)."""
    if fn == "all_reduce":
        return 2 * (n - 1)
    if fn in ("all_gather", "reduce_scatter", "all_to_all"):
        return n - 1
    return n  # broadcast, reduce: a pipelined chain (NCCL counts nRanks)


def bus_factor(fn: str, n: int) -> float:
    """Bytes each rank moves per byte of payload S: busbw = algbw × this (nccl-tests PERFORMANCE.md)."""
    if n <= 1:
        return 0.0
    if fn == "all_reduce":
        return 2 * (n - 1) / n
    if fn in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


@dataclass(frozen=True, slots=True)
class Communicator:
    """What NCCL's tuner knows about a communicator: ranks, nodes, and the ring graph it found.

    `channels` × `speed_intra_GBps` is the ring's bandwidth inside a node (NCCL topo search: per-link
    speeds from topo.h, e.g. SM70_NVLINK_BW = 20 GB/s); `speed_inter_GBps` per channel across nodes.
    """

    n_ranks: int
    n_nodes: int
    channels: int
    speed_intra_GBps: float
    speed_inter_GBps: float
    intra_hw: str = "nvlink"  # 'nvlink' or 'pci'
    ll128: bool = True  # NCCL enables LL128 by default only on NVLink systems of some GPUs (see communicator)
    tuner: str = "2.7"  # the NCCL release whose tuner chooses (TUNERS); "2.8" (2.8.3-2.9.9): zsim.fabric.nccl_28
    compute_capability: int = 70  # 2.23's caps are per architecture (Volta, Ampere, Hopper)
    nvls: bool = False  # the node's NVSwitches do NVLink SHARP (profile intra_node.nvls; zsim.fabric.nvls)
    nic_line_GBps: float = 0.0  # the node's NIC line rate per GPU (NCCL's NET bw: port Gb/s / 8)

    @property
    def per_node(self) -> int:
        return self.n_ranks // self.n_nodes


class NcclTuner:
    """NCCL's predicted (latency µs, algbw GB/s) per (algorithm, protocol), and its choice."""

    def __init__(self, comm: Communicator):
        self.comm = comm

    def predict(self, fn: str, algo: str, proto: str) -> tuple[float, float] | None:
        """ncclTopoTuneModel (2.7; ncclSetThresholds in 2.5) for one cell, as (latency µs, algbw
        GB/s); None where NCCL disables it."""
        c = self.comm
        if algo in NVLS_ALGORITHMS:  # NCCL >= 2.17: of the releases zsim has, 2.23's tuner alone
            from zsim.fabric.nvls import predict as nvls_predict
            return nvls_predict(c, fn, algo, proto) if c.tuner == "2.23" else None
        fn_model = "all_gather" if fn == "all_to_all" else fn  # point-to-point sends: a ring of n-1 steps
        if algo == "tree" and fn_model != "all_reduce":
            return None  # only all_reduce has a tree (both releases)
        if proto == "LL128" and not c.ll128:
            return None
        if c.tuner == "2.5":
            return self._predict_25(fn_model, algo, proto)
        if c.tuner == "2.23":
            from zsim.fabric.nccl_223 import predict
            return predict(c, fn_model, algo, proto)
        if c.tuner == "2.8":
            from zsim.fabric.nccl_28 import predict
            return predict(c, fn_model, algo, proto)
        p = PROTOCOLS.index(proto)
        base, hw = BASE_LAT_US[c.tuner], HW_LAT_US[c.tuner]
        nsteps = ring_steps(fn_model, c.n_ranks)
        n_inter = {"all_reduce": 2 * (c.n_nodes - 1), "all_gather": c.n_nodes - 1,
                   "reduce_scatter": c.n_nodes - 1}.get(fn_model, c.n_nodes)
        speed = c.speed_intra_GBps if c.n_nodes <= 2 else c.speed_inter_GBps
        bus = c.channels * speed
        if algo == "ring" and proto == "LL":
            bus *= 1 / 4 if (c.n_nodes > 1 or fn_model in ("all_reduce", "reduce")) else 1 / 3
        if algo == "ring" and proto == "LL128":
            ppn = c.n_ranks / c.n_nodes
            bus = min(bus * (0.7 if ppn < 2 else 0.92), _LL128_MAX_BW_PER_CH[fn_model] * c.channels)
        if algo == "tree":
            bus = min(bus * 0.9, 80.0 if c.n_nodes > 2 else 110.0)
            if proto == "LL":
                bus /= 3.8
            if proto == "LL128":
                bus = min(bus * (7 / 9 if c.n_nodes == 1 else 0.915),
                          _LL128_MAX_BW_PER_CH[fn_model] * c.channels * 7 / 9)
        algbw = bus * (0.5 if algo == "tree" else c.n_ranks / nsteps)
        lat = base[algo][p]
        intra = hw[c.intra_hw][algo][p] * (1.8 if c.n_nodes > 1 and proto == "LL" else 1.0)
        inter = hw["net"][algo][p]
        if algo == "ring":
            if fn_model in ("broadcast", "reduce"):
                lat += hw[c.intra_hw if c.n_nodes == 1 else "net"][algo][p]  # sameChannels rings
            else:
                lat += (nsteps - n_inter) * intra + n_inter * inter
        else:
            lat += 2 * ((c.per_node - 1) * intra + int(math.log2(c.n_nodes)) * inter)
        return lat, algbw

    def _predict_25(self, fn: str, algo: str, proto: str) -> tuple[float, float]:
        """NCCL v2.5.6-1 src/graph/tuning.cc ncclSetThresholds for one enabled cell."""
        c = self.comm
        p = PROTOCOLS.index(proto)
        base, hw = BASE_LAT_US["2.5"], HW_LAT_US["2.5"]
        nsteps = ring_steps(fn, c.n_ranks)
        bus = c.channels * (c.speed_intra_GBps if c.n_nodes <= 2 else c.speed_inter_GBps)
        if algo == "ring" and proto == "LL":
            bus *= 1 / 4
        if algo == "ring" and proto == "LL128":
            bus = min(bus * LL128_CEILING, _LL128_MAX_BW_25[fn])
        if algo == "tree":
            bus = min(bus * 0.9, 70.0 if c.n_nodes > 1 else 90.0)
            if proto == "LL":
                bus /= 3
            if proto == "LL128":
                bus *= 7 / 9
        algbw = bus * (0.5 if algo == "tree" else c.n_ranks / nsteps)
        lat = base[algo][p]
        if algo == "ring":
            # every step at the latency of one tier: the node's links on one node, the network otherwise
            step = hw[c.intra_hw if c.n_nodes == 1 else "net"][algo][p]
            lat += step if fn in ("broadcast", "reduce") else nsteps * step  # sameChannels rings
        else:
            lat += 2 * ((c.per_node - 1) * hw[c.intra_hw][algo][p] + int(math.log2(c.n_nodes)) * hw["net"][algo][p])
        return lat, algbw

    def predicted_time_us(self, fn: str, nbytes: float, algo: str, proto: str) -> float | None:
        """ncclTopoGetAlgoTime, without the tree correction table (tree is chosen at scale only);
        2.23's with it (zsim.fabric.nccl_223). NVLS and NVLSTree take neither the tree's correction nor
        the ring's plateau (both are for TREE and RING alone): latency + bytes / algbw."""
        if algo in NVLS_ALGORITHMS:
            cell = self.predict(fn, algo, proto)
            return None if cell is None or cell[1] <= 0 else cell[0] + nbytes / (1000 * cell[1])
        if self.comm.tuner in ("2.23", "2.8"):
            from zsim.fabric import nccl_28, nccl_223
            port = nccl_223 if self.comm.tuner == "2.23" else nccl_28
            return port.predicted_time_us(self.comm, "all_gather" if fn == "all_to_all" else fn, nbytes, algo, proto)
        cell = self.predict(fn, algo, proto)
        if cell is None or cell[1] <= 0:
            return None
        lat, algbw = cell
        if self.comm.tuner != "2.5" and algo == "ring" and proto == "Simple" and self.comm.n_nodes > 1 \
                and fn == "all_reduce" and nbytes >= self.comm.n_ranks / 16 * 65536:
            lat *= 1.9  # NCCL 2.7 ncclTopoGetAlgoTime: "plateau effect of ring" (not in 2.5's getAlgoInfo)
        return lat + nbytes / (1000 * algbw)

    def choose(self, fn: str, nbytes: float, algorithms: tuple[str, ...] = ALGORITHMS) -> tuple[str, str]:
        """The (algorithm, protocol) NCCL would run: the least predicted time (enqueue.cc getAlgoInfo)."""
        best: tuple[float, str, str] | None = None
        for algo in algorithms:
            for proto in PROTOCOLS:
                t = self.predicted_time_us(fn, nbytes, algo, proto)
                if t is not None and (best is None or t < best[0]):
                    best = (t, algo, proto)
        assert best is not None, (fn, algorithms)
        return best[1], best[2]


@dataclass(frozen=True, slots=True)
class NcclKernel:
    """What NCCL's kernels achieve on one system (fitted; zsim.fabric.nccl_fit). Times in seconds.

    efficiency[proto]: achieved bus bandwidth / raw link bandwidth of the bottleneck link.
    ll128_efficiency[fn]: LL128's share per collective, where the profile gives one (empty: every
    collective at efficiency["LL128"]). NCCL's own tuner caps LL128 per collective (2.5 ll128MaxBw,
    2.7 ll128MaxBwPerCh) because its kernels reach different rates there (a reduction per 128-byte line
    or a copy); on the DGX-2 tables all_reduce's LL128 reaches 0.53 of the NVLinks, broadcast's the
    protocol's ceiling (`share`).
    latency_s[proto]: fixed cost of one collective; step_latency_s[proto]: per ring step on the
    node's own links (steps across the network add the network tier's latency instead).
    launch_s: host time to launch one GPU's kernel. A process driving g GPUs (nccl-tests -g g) cannot
    issue collectives faster than one per g × launch_s, and a call's data moves only once the last of
    its g kernels is launched (`call_seconds`).
    unaligned_copy_Bps: bus bandwidth of all_gather (out of place) when a rank's chunk is not 16-byte
    aligned (NCCL's element-wise copy loop).
    unaligned_reduce_Bps: bus bandwidth of NCCL's element-wise reduce loop, which reduce_scatter runs
    on every chunk whose offset c·S/n is not 16-byte aligned (see `unaligned_fraction`).
    """

    efficiency: dict[str, float]
    latency_s: dict[str, float]
    step_latency_s: dict[str, float]
    launch_s: float
    unaligned_copy_Bps: float
    unaligned_reduce_Bps: float
    ll128_efficiency: dict[str, float] = field(default_factory=dict)

    def share(self, proto: str, fn: str) -> float:
        """The achieved share of the bottleneck link's bandwidth for `proto` running collective `fn`.
        all_to_all's LL128 is all_gather's (its sends run as all_gather's ring, as the tuner models them)."""
        if proto == "LL128" and self.ll128_efficiency:
            return self.ll128_efficiency["all_gather" if fn == "all_to_all" else fn]
        return self.efficiency[proto]

    def call_seconds(self, kernel_s: float, gpus_per_process: int) -> float:
        """Time per call of a collective whose kernel takes `kernel_s`, issued back to back by a process
        driving `gpus_per_process` GPUs (nccl-tests -g): never faster than the host's g launches, and the
        kernel's data moves only after the other g − 1 kernels are launched. One GPU per process
        (training): max(launch, kernel). The staggered start is measured, not read from NCCL's code: on
        the DGX-2 tables (-g 12) every all_reduce row from 32 KiB to 1 MiB lies on one line rising from
        the ~61 µs floor, and with max(g·launch, kernel) instead every protocol's fitted latency lands
        at ~30–80 µs (the floor, again) and held-out rows miss by up to 45% (docs/fabric.md)."""
        g = gpus_per_process
        return max(g * self.launch_s, (g - 1) * self.launch_s + kernel_s)

    def alignment_cap(self, fn: str, nbytes: float, n: int, in_place: bool = False) -> float | None:
        """all_gather's element-wise-path bus bandwidth (B/s) if its per-rank chunks are not 16-byte
        aligned, else None. Chunk c starts at c × S/n bytes; NCCL's fast path needs 16 (common_kernel.h)."""
        if fn != "all_gather" or n <= 1 or in_place:
            return None  # in place: a chunk's source and destination share their alignment
        return self.unaligned_copy_Bps if _alignment(int(nbytes) // n) < 16 else None

    def unaligned_fraction(self, fn: str, nbytes: float, n: int) -> float:
        """The share of reduce_scatter's bus bytes that NCCL's element-wise reduce loop handles.

        Rank r's chunk c starts at byte c·S/n of its input; ReduceOrCopyMulti takes the 128-bit path
        only when that offset is 16-byte aligned (NCCL common_kernel.h), so the chunks with
        c·S/n ≢ 0 (mod 16) run element-wise. Each of the n chunks carries 1/n of the bytes; the time
        is the sum of both paths' shares (fast at the link's protocol rate, slow at
        `unaligned_reduce_Bps`). With S/n aligned to 8 bytes half the chunks are slow, to 4 bytes
        three quarters: one term explains both levels of the measured DGX-2 reduce_scatter busbw
        (~62 and ~48 GB/s, alternating as S doubles) and predicts one level from the other.
        """
        if fn != "reduce_scatter" or n <= 1:
            return 0.0
        chunk = int(nbytes) // n
        return sum(1 for c in range(n) if (c * chunk) % 16) / n


def _alignment(chunk_bytes: int) -> int:
    """The largest power of two ≤ 16 that divides `chunk_bytes`."""
    if chunk_bytes == 0:
        return 16
    return min(16, chunk_bytes & -chunk_bytes)


@dataclass(frozen=True, slots=True)
class CollectiveCost:
    """One collective as NCCL would run it, uncontended: the closed form the simulator reproduces."""

    algorithm: str
    protocol: str
    latency_s: float  # fixed + per-step latency
    bus_bytes: float  # bytes each rank moves over its bottleneck link (payload × bus_factor)
    rate_Bps: float  # achieved bus bandwidth (bottleneck link × protocol efficiency, alignment cap)

    @property
    def seconds(self) -> float:
        return self.latency_s + (self.bus_bytes / self.rate_Bps if self.bus_bytes else 0.0)
