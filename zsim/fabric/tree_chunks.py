"""How NCCL cuts a tree all_reduce into chunks, and what filling the tree's pipeline costs.

NCCL's double binary tree moves each channel's data in chunks: a chunk climbs the tree (reduce) and comes
back down (broadcast), one level per step, and the next chunk follows one step behind. With L tree levels
across nodes a chunk takes 2L steps, so a call of n chunks per channel takes n + 2L − 1 chunk-times, not n:
the pipeline's fill (Sanders, Speck & Träff 2009, §2, the pipelined binary tree). The chunk is set by the
release that runs (src/enqueue.cc, `computeColl` to 2.18, `calcCollChunking` in 2.19+):

* Simple: one step of the 4 MiB buffer, DEFAULT_BUFFSIZE / NCCL_STEPS = 512 KiB (init.cc, device.h).
  Through 2.18 (v2.5.7-1 L340-344, v2.7.8-1 L368-372, v2.8.4-1 L382-388) it is halved while a channel gets
  fewer than depth·8 chunks (down to 128 KiB), depth·4 (64 KiB) and depth (32 KiB), depth = GPUs per node
  − 1 + log2 N (graph/connect.cc L134). v2.23.4-1 (L2009-2013 of calcCollChunking) keeps 512 KiB for
  trees, and spreads a call over all its channels (MinTrafficPerChannel, 16 KiB, L723): a call of up to
  channels × 512 KiB is one chunk per channel, climbing and descending the whole tree unpipelined.
* LL: a step of DEFAULT_LL_BUFFSIZE (8 lines × 512 threads × 8 steps × 16 B) is 64 KiB of lines, 32 KiB
  of data (`chunkSize /= 2`), every release.
* LL128: a step of DEFAULT_LL128_BUFFSIZE (120 × 640 × 8 × 8 B) / 8 = 600 KiB, 15/16 of it data, halved
  while a channel gets fewer than nsteps·64/ppn chunks (down to 128 KiB) and nsteps·16/ppn (32 KiB),
  nsteps = 1 + log2 N + 0.1·ppn (v2.7.8-1 L392-394, v2.8.4-1 L406-409, v2.23.4-1 L2051-2059); in 2.5 while
  it gets fewer than (1 + log2 N)·4 (down to 32 KiB; v2.5.7-1 L354-356, NCCL_LL128_BUFF_SIZE the same).

The fill is priced as the time (2L − 1) chunks take on the tree's own links, uncontended: a whole
chunk per channel on every channel at once, `in_flight` = min(S, channels × chunk) bytes. What it leaves
out: the intra-node chain's share of the depth (NVLink steps, an order of magnitude faster than a NIC's),
and NCCL ≤ 2.18 using fewer channels for small calls (its thread threshold), which changes no fill: a
call smaller than channels × chunk is one chunk a channel either way.
"""

from __future__ import annotations

import math

NCCL_STEPS = 8  # src/include/device.h (devcomm.h before 2.19)
SIMPLE_STEP = (1 << 22) // NCCL_STEPS  # DEFAULT_BUFFSIZE 4 MiB (init.cc) / NCCL_STEPS
LL_STEP = 8 * 512 * NCCL_STEPS * 16 // NCCL_STEPS  # DEFAULT_LL_BUFFSIZE / NCCL_STEPS, in 16-byte lines
LL128_STEP = 120 * 640 * NCCL_STEPS * 8 // NCCL_STEPS  # DEFAULT_LL128_BUFFSIZE / NCCL_STEPS
LL128_DATA = 15 / 16  # NCCL_LL128_DATAELEMS / NCCL_LL128_LINEELEMS: 8 bytes of flags per 128-byte line


def _halve(chunk: int, nbytes: float, channels: int, target: float, floor: int) -> int:
    """NCCL's `while (nBytes / (nChannels * chunkSize) < target && chunkSize > floor) chunkSize /= 2`."""
    while nbytes // (channels * chunk) < target and chunk > floor:
        chunk //= 2
    return chunk


def chunk_bytes(tuner: str, proto: str, nbytes: float, channels: int, nodes: int, per_node: int) -> float:
    """Data bytes of one tree chunk on one channel, as the release `tuner` ("2.5", "2.7", "2.8", "2.23")
    cuts an all_reduce of `nbytes` over `channels` channels on `nodes` nodes of `per_node` ranks."""
    levels = int(math.log2(nodes)) if nodes > 1 else 0  # NCCL's log2i: floor
    if proto == "LL":
        return LL_STEP / 2
    if proto == "LL128" and tuner == "2.5":  # v2.5.7-1 L354-356: one loop, nstepsInter = 1 + log2 N
        return _halve(LL128_STEP, nbytes, channels, (1 + levels) * 4, 32768) * LL128_DATA
    if proto == "LL128":
        nsteps = 1 + levels + 0.1 * per_node
        chunk = int(LL128_STEP * LL128_DATA) if tuner == "2.23" else LL128_STEP
        chunk = _halve(chunk, nbytes, channels, nsteps * 64 / per_node, 131072)
        chunk = _halve(chunk, nbytes, channels, nsteps * 16 / per_node, 32768)
        return chunk if tuner == "2.23" else chunk * LL128_DATA
    if tuner == "2.23":
        return SIMPLE_STEP
    depth = per_node - 1 + levels
    chunk = _halve(SIMPLE_STEP, nbytes, channels, depth * 8, 131072)
    chunk = _halve(chunk, nbytes, channels, depth * 4, 65536)
    return _halve(chunk, nbytes, channels, depth, 32768)


def fill_bytes(tuner: str, proto: str, nbytes: float, channels: int, nodes: int, per_node: int) -> float:
    """Bytes whose transfer time, (2L − 1) times over, is the pipeline's fill (module docstring): what a
    node has in flight per step, min(S, channels × chunk); 0 on one node (no tree across nodes)."""
    if nodes <= 1:
        return 0.0
    return min(nbytes, channels * chunk_bytes(tuner, proto, nbytes, channels, nodes, per_node))


def fill_steps(nodes: int) -> int:
    """Chunk-times a tree over `nodes` nodes adds to its transfer: 2L − 1, L = ceil(log2 N) levels."""
    return 2 * int(math.ceil(math.log2(nodes))) - 1 if nodes > 1 else 0
