"""Closed-form tests of the fabric: α-β collectives, bandwidth sharing, class weights, NCCL's choices."""

import dataclasses

import pytest
import simpy

from zsim.fabric.cluster import load_cluster
from zsim.engine.run_state import collective
from zsim.fabric.collective import Placement, plan_collective, uncontended_time
from zsim.fabric.nccl import Communicator, NcclTuner
from zsim.fabric.perf import run_collective
from zsim.fabric.sharing import Fabric
from zsim.fabric.topology import aggregate_capacities, build_topology
from zsim.parallel.layout import GroupShape


def caps(cluster):
    return aggregate_capacities(build_topology(cluster), cluster)


def run_phases(capacity, *phase_lists, starts=None):
    """Run collectives concurrently on one fabric; return each one's finish time."""
    env = simpy.Environment()
    fabric = Fabric(env, capacity)
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
    label, phases = plan_collective("all_reduce", size, shape, c, "ring")
    proto = label.split("/")[1]
    (end,) = run_phases(caps(c), phases)
    k = c.nccl
    alpha = k.latency_s[proto] + 2 * (n - 1) * k.step_latency_s[proto]
    beta = c.nvlink.bytes_per_s * k.share(proto, "all_reduce")  # 6 NVLinks × 25 GB/s × protocol efficiency
    assert end == pytest.approx(alpha + 2 * (n - 1) / n * size / beta, rel=1e-12)


def test_all_reduce_busbw_approaches_the_bottleneck_link():
    c = load_cluster("dgx2", 1)
    row = run_collective(c, "all_reduce", 1 << 36, 12)
    assert row.algorithm == "ring/Simple"
    assert row.busbw * 1e9 == pytest.approx(c.nvlink.bytes_per_s * c.nccl.efficiency["Simple"], rel=1e-3)
    lossless = dataclasses.replace(c, nccl=dataclasses.replace(c.nccl, efficiency={"LL": 1, "LL128": 1, "Simple": 1.0},
                                                               ll128_efficiency={}))
    assert run_collective(lossless, "all_reduce", 1 << 36, 12).busbw * 1e9 == pytest.approx(c.nvlink.bytes_per_s, rel=1e-3)


def test_doubling_ib_bandwidth_halves_the_bandwidth_term_of_an_inter_node_all_reduce():
    c = load_cluster("dgx2", 8)
    fast = dataclasses.replace(c, nic_pool=dataclasses.replace(c.nic_pool, bytes_per_s=2 * c.nic_pool.bytes_per_s),
                               nic_bytes_per_s=2 * c.nic_bytes_per_s)
    shape = GroupShape(size=8, per_node=1, nodes=8, concurrent_per_node=16)  # a ZeRO DP group, MP 16
    size = 1 << 32
    _, slow_phases = plan_collective("all_reduce", size, shape, c, "ring")
    _, fast_phases = plan_collective("all_reduce", size, shape, fast, "ring")
    latency = sum(p.latency_s for p in slow_phases)
    assert sum(p.latency_s for p in fast_phases) == latency
    slow_t, fast_t = uncontended_time(slow_phases, caps(c)), uncontended_time(fast_phases, caps(fast))
    assert fast_t - latency == pytest.approx((slow_t - latency) / 2, rel=1e-12)


def test_two_collectives_on_one_nic_each_take_longer_and_disjoint_ones_do_not():
    """Two all_reduces over the same two whole nodes share their NICs (the ring is NIC-bound there); one on a
    third node shares nothing with them. (Groups of one GPU a node would each stay on their own GPU's NIC:
    test_a_group_alone_on_its_nodes_moves_at_its_own_nics.)"""
    c = load_cluster("dgx2", 3)
    capacity = caps(c)
    inter_shape = GroupShape(size=32, per_node=16, nodes=2, concurrent_per_node=1)
    _, inter = plan_collective("all_reduce", 1 << 30, inter_shape, c, "ring", Placement(list(range(32)), False))
    _, other = plan_collective("all_reduce", 1 << 30, inter_shape, c, "ring", Placement(list(range(32)), False))
    _, intra = plan_collective("all_reduce", 1 << 30, GroupShape(8, 8, 1, 1), c, "ring",
                               Placement(list(range(32, 40)), False))
    (alone,) = run_phases(capacity, inter)
    latency = inter[0].latency_s
    both = run_phases(capacity, inter, other)
    assert both[0] == both[1] == pytest.approx(latency + 2 * (alone - latency), rel=1e-9)
    together = run_phases(capacity, inter, intra)
    assert together[0] == pytest.approx(alone, rel=1e-12)
    assert together[1] == pytest.approx(run_phases(capacity, intra)[0], rel=1e-12)


def test_rates_are_recomputed_when_a_transfer_joins_late():
    c = load_cluster("dgx2", 2)
    shape = GroupShape(32, 16, 2, 1)  # two whole nodes: both transfers on the same NIC pools
    _, phases = plan_collective("all_gather", 1 << 30, shape, c, "ring")
    capacity = caps(c)
    (alone,) = run_phases(capacity, phases)
    lat, work = phases[0].latency_s, alone - phases[0].latency_s
    # The second starts when the first is half done: the first's second half runs at half rate.
    first, second = run_phases(capacity, phases, phases, starts=[0, work / 2])
    assert first == pytest.approx(lat + work / 2 + work, rel=1e-9)
    assert second == pytest.approx(first + work / 2, rel=1e-9)


def test_class_weight_equals_explicit_identical_streams():
    """Class mode: one transfer of weight 16 on the NICs finishes when 16 explicit copies would."""
    c = load_cluster("dgx2", 4)
    capacity = caps(c)
    _, weighted = plan_collective("reduce_scatter", 1 << 28, GroupShape(4, 1, 4, 16), c, "ring")
    explicit = [plan_collective("reduce_scatter", 1 << 28, GroupShape(4, 1, 4, 1), c, "ring",
                                Placement([node * 16 + i for node in range(4)], False))[1] for i in range(16)]
    (w,) = run_phases(capacity, weighted)
    assert all(e == pytest.approx(w, rel=1e-9) for e in run_phases(capacity, *explicit))


def test_nccl_tuner_picks_ll_then_ll128_then_simple_on_one_dgx2():
    tuner = NcclTuner(Communicator(n_ranks=12, n_nodes=1, channels=6, speed_intra_GBps=20, speed_inter_GBps=20))
    assert tuner.choose("all_reduce", 8) == ("ring", "LL")
    assert tuner.choose("all_reduce", 4 << 20) == ("ring", "LL128")
    assert tuner.choose("all_reduce", 1 << 30) == ("ring", "Simple")
    no_ll128 = NcclTuner(Communicator(12, 1, 6, 20, 20, ll128=False))
    assert no_ll128.choose("all_reduce", 4 << 20)[1] != "LL128"


def test_small_all_reduce_across_many_nodes_takes_the_tree():
    """NCCL's double binary tree has 2·log2(N) network steps instead of the ring's 2(N−1): NCCL 2.5's
    tuner takes it, and its latency is below the ring's. (Whether its whole time is also below depends on
    the fitted tree share of the NICs: with ABCI's 0.27 and 16 streams a NIC, 64 KiB is not.)"""
    c = load_cluster("dgx2", 64)
    shape = GroupShape(64, 1, 64, 16)
    label, phases = plan_collective("all_reduce", 1 << 16, shape, c)
    assert label.startswith("tree/")
    _, ring_phases = plan_collective("all_reduce", 1 << 16, shape, c, "ring")
    assert sum(p.latency_s for p in phases) < sum(p.latency_s for p in ring_phases)
    assert sum(p.latency_s for p in phases) > 12 * c.network_step_s(64, "tree", label.split("/")[1])  # 2·log2(64) steps


def test_hierarchical_all_reduce_keeps_nic_bytes():
    c = load_cluster("dgx2", 4)
    shape = GroupShape(size=64, per_node=16, nodes=4, concurrent_per_node=1)
    big = 1 << 32
    label, phases = plan_collective("all_reduce", big, shape, c, "hierarchical")
    assert label.startswith("hierarchical/")
    eff_net = c.nccl.efficiency[label.split("/")[1]] / c.nccl.efficiency["Simple"]
    nic_bytes = sum(p.nbytes * w * eff_net for p in phases for link, w in p.links if link[0] == "nic")
    assert nic_bytes == pytest.approx(2 * 3 / 4 * big)  # per node: 2(N-1)/N · S


@pytest.mark.parametrize("fn,factor", [("broadcast", 1.0), ("reduce", 1.0), ("all_to_all", 11 / 12),
                                       ("all_gather", 11 / 12), ("reduce_scatter", 11 / 12)])
def test_bus_bytes_per_rank_follow_nccl_tests(fn, factor):
    c = load_cluster("dgx2", 1)
    _, (phase,) = plan_collective(fn, 12 << 24, GroupShape(12, 12, 1, 1), c)
    assert phase.nbytes == pytest.approx(factor * (12 << 24))


def test_unaligned_chunks_take_the_element_wise_path():
    """reduce_scatter chunks 4-byte aligned are slower than 8-byte aligned, which are slower than 16."""
    c = load_cluster("dgx2", 1)
    n = 12
    by_alignment = {a: run_collective(c, "reduce_scatter", n * ((1 << 26) + a), n).busbw for a in (4, 8, 16)}
    assert by_alignment[4] < by_alignment[8] < by_alignment[16]
    assert run_collective(c, "all_reduce", n * ((1 << 26) + 4), n).busbw > by_alignment[16] * 0.9


def test_launch_floor_of_a_process_driving_many_gpus():
    """nccl-tests -g g: one thread launches g kernels per call, so small calls cost g × launch, and a
    call's kernel starts moving data only after the other g − 1 launches (NcclKernel.call_seconds)."""
    c = load_cluster("dgx2", 1)
    launch_us = c.nccl.launch_s * 1e6
    kernel = run_collective(c, "all_reduce", 8, 12, gpus_per_process=1).time_us
    assert kernel > launch_us  # one GPU per process: the kernel alone
    staggered = run_collective(c, "all_reduce", 8, 12, gpus_per_process=12).time_us
    assert staggered == pytest.approx(11 * launch_us + kernel)
    tiny = dataclasses.replace(c, nccl=dataclasses.replace(c.nccl, launch_s=10 * kernel * 1e-6))
    assert run_collective(tiny, "all_reduce", 8, 12, gpus_per_process=12).time_us == pytest.approx(12 * 10 * kernel)
    big = run_collective(c, "all_reduce", 1 << 30, 12, gpus_per_process=1).time_us
    assert run_collective(c, "all_reduce", 1 << 30, 12, gpus_per_process=12).time_us == pytest.approx(
        big + 11 * launch_us)


def test_ll128_efficiency_per_collective():
    """A profile may give LL128 one share per collective (NCCL's tuner caps LL128 per collective too);
    all_to_all runs at all_gather's; a single number still applies to every collective."""
    c = load_cluster("dgx2", 1)
    k = c.nccl
    assert set(k.ll128_efficiency) == {"broadcast", "reduce", "all_gather", "reduce_scatter", "all_reduce"}
    assert k.share("LL128", "all_reduce") == k.ll128_efficiency["all_reduce"] != k.share("LL128", "broadcast")
    assert k.share("LL128", "all_to_all") == k.ll128_efficiency["all_gather"]
    assert k.share("Simple", "all_reduce") == k.efficiency["Simple"]
    shape = GroupShape(size=12, per_node=12, nodes=1, concurrent_per_node=1)
    for fn in ("all_reduce", "broadcast"):  # the rate of an LL128 call follows its own collective's share
        label, (phase,) = plan_collective(fn, 4 << 20, shape, c, "ring")
        assert label == "ring/LL128"
        assert phase.links[0][1] == pytest.approx(1 / k.ll128_efficiency[fn])
    uniform = dataclasses.replace(k, efficiency={**k.efficiency, "LL128": 0.6}, ll128_efficiency={})
    assert {uniform.share("LL128", fn) for fn in ("all_reduce", "broadcast", "all_to_all")} == {0.6}


@pytest.mark.parametrize("edit, message", [
    ("all_reduce: 0.526}", "missing all_reduce"),
    ("Simple: 0.813}", "efficiency.Simple must be one number"),
    ("all_gather: 0.458", "efficiency.LL128.all_gather = 0.95"),
])
def test_a_bad_ll128_mapping_is_a_clear_error(tmp_path, capsys, edit, message):
    from zsim.cli import main
    from zsim.config.profiles import builtin_folder

    text = (builtin_folder() / "dgx2.yaml").read_text()
    assert edit in text
    bad = {"all_reduce: 0.526}": "}", "Simple: 0.813}": "Simple: {all_reduce: 0.8}}",
           "all_gather: 0.458": "all_gather: 0.95"}[edit]  # over LL128's 120/128
    (tmp_path / "dgx2x.yaml").write_text(text.replace(edit, bad).replace("name: DGX-2", "name: DGX-2x"))
    assert main(["collective", "--profile", str(tmp_path / "dgx2x.yaml"), "--gpus", "12", "--op", "all_reduce",
                 "-b", "8", "-e", "8"]) == 2
    err = capsys.readouterr().err
    assert "dgx2x.yaml" in err and message in err and "Traceback" not in err


def test_simulated_collective_equals_its_closed_form():
    c = load_cluster("dgx2", 2)
    for fn in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all"):
        for size in (1 << 10, 1 << 24, 1 << 32):
            a = run_collective(c, fn, size, 16, simulate=True)
            b = run_collective(c, fn, size, 16, simulate=False)
            assert a.time_us == pytest.approx(b.time_us, rel=1e-9), (fn, size)


@pytest.mark.parametrize("tuner, size, proto", [
    # Worked by hand from tuning.cc (12 ranks, 6 channels; Volta NVLink width 21 GB/s in both releases'
    # topo.h, 20 as the GPU profile gives for 2.7). 2.5: ring LL 3.6 + 22·0.4 µs at 126/4·12/22 GB/s,
    # LL128 3.6 + 22·2.5 µs at min(126·120/128, 100)·12/22, Simple 8.4 + 22·5.7 µs at 126·12/22:
    # LL → LL128 at 1.08 MB, LL128 → Simple at 19.8 MB.
    ("2.5", 1 << 20, "LL"), ("2.5", 2 << 20, "LL128"), ("2.5", 16 << 20, "LL128"), ("2.5", 20 << 20, "Simple"),
    # 2.7: LL 3.6 + 22·0.47 at 120/4·12/22, LL128 10 + 22·1.9 at min(120·0.92, 16.7·6)·12/22, Simple
    # 8.4 + 22·3.4 at 120·12/22: LL → LL128 at 0.88 MB, LL128 → Simple at 10.2 MB.
    ("2.7", 1 << 20, "LL128"), ("2.7", 8 << 20, "LL128"), ("2.7", 12 << 20, "Simple"), ("2.7", 16 << 20, "Simple"),
])
def test_each_nccl_release_has_its_own_protocol_switch_points(tuner, size, proto):
    """The ring protocol each release's tuner predicts fastest (the tree is a separate choice)."""
    speed = 21.0 if tuner == "2.5" else 20.0
    t = NcclTuner(Communicator(n_ranks=12, n_nodes=1, channels=6, speed_intra_GBps=speed, speed_inter_GBps=1.0,
                               tuner=tuner))
    ring = {p: t.predicted_time_us("all_reduce", size, "ring", p) for p in ("LL", "LL128", "Simple")}
    assert min(ring, key=ring.get) == proto


def test_the_profile_names_the_release_and_the_communicator_follows_it():
    """`nccl.tuner` of the system profile reaches the communicator: 2.5's topology search assumes 21 GB/s
    per Volta NVLink, and 2.5 enables LL128 on Volta only (tuning.cc v2.5.6-1)."""
    from zsim.fabric.collective import communicator

    old = load_cluster("dgx2", 1)
    assert old.nccl_tuner == "2.5"  # hwprofiles/dgx2.yaml: the recording's release, by date
    c = dataclasses.replace(old, nccl_tuner="2.7")
    shape = GroupShape(size=12, per_node=12, nodes=1, concurrent_per_node=1)
    assert communicator(shape, old).tuner == "2.5" and communicator(shape, old).speed_intra_GBps == 21.0
    assert communicator(shape, c).speed_intra_GBps == c.gpu.nccl_nvlink_GBps
    a100 = load_cluster("dgx-a100", 1)
    assert communicator(GroupShape(size=8, per_node=8, nodes=1, concurrent_per_node=1), a100).ll128
    assert not communicator(GroupShape(size=8, per_node=8, nodes=1, concurrent_per_node=1), dataclasses.replace(a100, nccl_tuner="2.5")).ll128


def test_an_unknown_tuner_release_is_a_clear_error(tmp_path, capsys):
    from zsim.cli import main
    from zsim.config.profiles import builtin_folder

    text = (builtin_folder() / "dgx2.yaml").read_text().replace('tuner: "2.5"', 'tuner: "2.6"')
    (tmp_path / "dgx2x.yaml").write_text(text.replace("name: DGX-2", "name: DGX-2x"))
    assert main(["run", "scenarios/paper/fig2-zero-1.5B.yaml", "--profile", str(tmp_path / "dgx2x.yaml"),
                 "--no-plot", "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "nccl.tuner" in err and "'2.5'" in err and "'2.7'" in err and "'2.23'" in err


def test_the_plateau_factor_is_2_7s_only():
    """2.7's ncclTopoGetAlgoTime multiplies a large inter-node ring all_reduce's latency by 1.9; 2.5's
    getAlgoInfo has no such term."""
    for tuner, factor in (("2.5", 1.0), ("2.7", 1.9)):
        t = NcclTuner(Communicator(n_ranks=32, n_nodes=2, channels=6, speed_intra_GBps=20.0, speed_inter_GBps=4.0,
                                   tuner=tuner))
        lat, algbw = t.predict("all_reduce", "ring", "Simple")
        assert t.predicted_time_us("all_reduce", 1 << 30, "ring", "Simple") == pytest.approx(
            factor * lat + (1 << 30) / (1000 * algbw))
