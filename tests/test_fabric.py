"""Closed-form tests of the fabric: α-β collectives, bandwidth sharing, class-mode weights."""

import pytest
import simpy

from zsim.config.hardware import load_cluster
from zsim.engine.simulation import collective
from zsim.fabric.collective import hierarchical, plan_collective, ring, uncontended_time
from zsim.fabric.sharing import Fabric
from zsim.parallel.layout import GroupShape


def run_phases(cluster, *phase_lists, starts=None):
    """Run collectives concurrently; return each one's finish time."""
    env = simpy.Environment()
    fabric = Fabric(env, {("nvlink", 0): cluster.nvlink.bytes_per_s, ("nic", 0): cluster.nic_pool.bytes_per_s})
    ends = [None] * len(phase_lists)

    def one(i, phases, start):
        yield env.timeout(start)
        yield from collective(env, fabric, phases)
        ends[i] = env.now

    for i, phases in enumerate(phase_lists):
        env.process(one(i, phases, (starts or [0] * len(phase_lists))[i]))
    env.run()
    return ends


@pytest.mark.parametrize("n", [2, 8, 16])
@pytest.mark.parametrize("size", [8, 1 << 20, 1 << 30])
def test_uncontended_ring_all_reduce_is_exactly_alpha_beta(n, size):
    c = load_cluster("dgx2", 1)
    shape = GroupShape(size=n, per_node=n, nodes=1, concurrent_per_node=16 // n)
    (end,) = run_phases(c, ring("all_reduce", size, shape, c))
    alpha, beta = c.nvlink.latency_s, c.nvlink.bytes_per_s
    assert end == pytest.approx(2 * (n - 1) * alpha + 2 * (n - 1) / n * size / beta, rel=1e-12)


def test_ring_all_gather_and_reduce_scatter_are_half_an_all_reduce_in_bytes():
    c = load_cluster("dgx2", 1)
    shape = GroupShape(16, 16, 1, 1)
    s = 1 << 28
    (ag,) = run_phases(c, ring("all_gather", s, shape, c))
    assert ag == pytest.approx(15 * c.nvlink.latency_s + 15 / 16 * s / c.nvlink.bytes_per_s, rel=1e-12)


def test_two_collectives_on_one_link_each_take_twice_as_long():
    c = load_cluster("dgx2", 2)
    shape = GroupShape(size=2, per_node=1, nodes=2, concurrent_per_node=1)
    phases = ring("all_reduce", 1 << 30, shape, c)
    (alone,) = run_phases(c, phases)
    both = run_phases(c, phases, phases)
    latency = phases[0].latency_s
    assert both[0] == both[1] == pytest.approx(latency + 2 * (alone - latency), rel=1e-9)


def test_collectives_on_disjoint_links_do_not_slow_each_other():
    c = load_cluster("dgx2", 2)
    inter = ring("all_reduce", 1 << 30, GroupShape(2, 1, 2, 1), c)  # NICs only
    intra = ring("all_reduce", 1 << 30, GroupShape(16, 16, 1, 1), c)  # NVSwitch port only
    alone = run_phases(c, inter)[0], run_phases(c, intra)[0]
    together = run_phases(c, inter, intra)
    assert together[0] == pytest.approx(alone[0], rel=1e-12)
    assert together[1] == pytest.approx(alone[1], rel=1e-12)


def test_rates_are_recomputed_when_a_transfer_joins_late():
    c = load_cluster("dgx2", 2)
    phases = ring("all_gather", 1 << 30, GroupShape(2, 1, 2, 1), c)
    (alone,) = run_phases(c, phases)
    lat, work = phases[0].latency_s, alone - phases[0].latency_s
    # The second starts when the first is half done: the first's second half runs at half rate.
    first, second = run_phases(c, phases, phases, starts=[0, lat + work / 2 - lat])
    assert first == pytest.approx(lat + work / 2 + work, rel=1e-9)
    assert second == pytest.approx(first + work / 2, rel=1e-9)


def test_class_weight_equals_explicit_identical_streams():
    """Class mode: one transfer of weight 16 on the NICs finishes when 16 explicit copies would."""
    c = load_cluster("dgx2", 4)
    shape16 = GroupShape(size=4, per_node=1, nodes=4, concurrent_per_node=16)
    shape1 = GroupShape(size=4, per_node=1, nodes=4, concurrent_per_node=1)
    (weighted,) = run_phases(c, ring("reduce_scatter", 1 << 28, shape16, c))
    explicit = run_phases(c, *[ring("reduce_scatter", 1 << 28, shape1, c)] * 16)
    assert all(e == pytest.approx(weighted, rel=1e-9) for e in explicit)


def test_hierarchical_all_reduce_cuts_latency_and_keeps_nic_bytes():
    c = load_cluster("dgx2", 4)
    shape = GroupShape(size=64, per_node=16, nodes=4, concurrent_per_node=1)
    flat, hier = ring("all_reduce", 8, shape, c), hierarchical("all_reduce", 8, shape, c)
    assert uncontended_time(hier, c) < uncontended_time(flat, c)  # 2·15 + 2·3 steps, not 2·63
    assert plan_collective("all_reduce", 8, shape, c)[0] == "hierarchical"
    big = 1 << 32
    nic_bytes = sum(p.nbytes * w for p in hierarchical("all_reduce", big, shape, c) for link, w in p.links
                    if link[0] == "nic")
    assert nic_bytes == pytest.approx(2 * 3 / 4 * big)  # per node: 2(N-1)/N · S


def test_all_reduce_busbw_approaches_the_bottleneck_link():
    c = load_cluster("dgx2", 1)
    n, size = 12, 1 << 33
    t = uncontended_time(ring("all_reduce", size, GroupShape(n, n, 1, 1), c), c)
    busbw = size / t * 2 * (n - 1) / n  # nccl-tests PERFORMANCE.md
    assert busbw == pytest.approx(c.nvlink.bytes_per_s, rel=1e-3)
