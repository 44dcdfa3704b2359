"""The tree's pipeline fill (zsim.fabric.tree_chunks): NCCL's chunk sizes per release, read from its
enqueue.cc, and what filling 2L − 1 levels costs a tree all_reduce against the closed form."""

from __future__ import annotations

import pytest

from zsim.fabric.cluster import load_cluster
from zsim.fabric.collective import Placement, _phases, uncontended_time
from zsim.fabric.topology import healthy_capacities
from zsim.fabric.tree_chunks import LL128_STEP, SIMPLE_STEP, chunk_bytes, fill_bytes, fill_steps
from zsim.parallel.layout import GroupShape

KiB, MiB = 1 << 10, 1 << 20


def test_nccl_constants():
    assert SIMPLE_STEP == 512 * KiB  # DEFAULT_BUFFSIZE 4 MiB / NCCL_STEPS 8
    assert LL128_STEP == 614400  # 120 elements x 640 threads x 8 B
    assert chunk_bytes("2.23", "LL", 1 * MiB, 8, 4, 8) == 32 * KiB  # 64 KiB of 16-byte lines, half of it data


def test_simple_chunks_per_release():
    # 2.23 keeps a 512 KiB chunk for trees at every size (calcCollChunking has no tree/Simple loop)
    assert {chunk_bytes("2.23", "Simple", s, 18, 64, 4) for s in (64 * KiB, 4 * MiB, 1 << 30)} == {SIMPLE_STEP}
    # through 2.18: halved until a channel has depth x 8 chunks (to 128 KiB), depth x 4 (64 KiB), depth (32 KiB);
    # 8 nodes of 4: depth 3 + 3 = 6
    assert chunk_bytes("2.8", "Simple", 1 * MiB, 6, 8, 4) == 32 * KiB
    assert chunk_bytes("2.8", "Simple", 64 * MiB, 6, 8, 4) == 128 * KiB
    assert chunk_bytes("2.8", "Simple", 4 << 30, 6, 8, 4) == SIMPLE_STEP


def test_ll128_chunk_shrinks_with_the_tree():
    # nsteps = 1 + log2 8 + 0.1 x 4 = 4.4: halved while a channel has < 70.4 chunks (to 128 KiB), < 17.6 (to 32 KiB)
    assert chunk_bytes("2.23", "LL128", 1 * MiB, 6, 8, 4) == 18000
    assert chunk_bytes("2.8", "LL128", 1 * MiB, 6, 8, 4) == pytest.approx(19200 * 15 / 16)


def test_fill_steps_and_bytes():
    assert [fill_steps(n) for n in (1, 2, 3, 8, 128)] == [0, 1, 3, 5, 13]
    assert fill_bytes("2.23", "Simple", 1 * MiB, 18, 1, 4) == 0.0  # one node: no tree across nodes
    assert fill_bytes("2.23", "Simple", 1 * MiB, 18, 8, 4) == 1 * MiB  # one chunk a channel: all of it in flight
    assert fill_bytes("2.23", "Simple", 1 << 30, 18, 8, 4) == 18 * SIMPLE_STEP


@pytest.mark.parametrize("nodes", [8, 64])
def test_below_the_in_flight_cap_the_tree_runs_unpipelined(nodes):
    """A 2.23 tree/Simple call of at most channels x 512 KiB is one chunk a channel: it crosses all 2L levels
    unpipelined, so its time grows (2 + 2L - 1)/2 times as fast with the size as a large call's does."""
    cluster = load_cluster("alps-gh200", nodes)
    shape = GroupShape(size=4 * nodes, per_node=4, nodes=nodes, concurrent_per_node=1)
    caps = healthy_capacities(cluster)

    def seconds(size):
        return uncontended_time(_phases("all_reduce", size, shape, cluster, Placement(), True, "tree", "Simple"), caps)

    mid = (seconds(2 * MiB) - seconds(1 * MiB)) / MiB
    large = (seconds(8 << 30) - seconds(4 << 30)) / (4 << 30)
    assert mid / large == pytest.approx((2 + fill_steps(nodes)) / 2, rel=1e-6)



def test_nccl_25_cuts_ll128_by_its_own_rule():
    """v2.5.7-1: halved while a channel gets fewer than (1 + log2 N) x 4 chunks, down to 32 KiB."""
    # 8 nodes: target (1 + 3) x 4 = 16. 64 MiB over 6 channels is 18 whole steps a channel: not halved;
    # 1 MiB: 614400 -> 307200 -> ... -> 19200 (9 a channel), which is not above 32768: stops there
    assert chunk_bytes("2.5", "LL128", 64 * MiB, 6, 8, 16) == LL128_STEP * 15 / 16
    assert chunk_bytes("2.5", "LL128", 1 * MiB, 6, 8, 16) == pytest.approx(19200 * 15 / 16)
    # 16 MiB: 2.5 stops at 153600 (18 a channel >= 16); 2.7 goes on to 76800 (its first target is 22.4)
    assert (chunk_bytes("2.5", "LL128", 16 * MiB, 6, 8, 16), chunk_bytes("2.7", "LL128", 16 * MiB, 6, 8, 16)) == (144000, 72000)
