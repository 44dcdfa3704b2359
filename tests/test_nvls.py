"""NCCL's NVLS and NVLSTree (zsim.fabric.nvls) against cells worked out by hand from NVIDIA/nccl v2.23.4-1
(src/graph/tuning.cc, search.cc, transport/nvls.cc), when NCCL enables them, and the fabric's time of an
NVLS all_reduce against the tuner's closed form."""

import dataclasses

import pytest

from tests.conftest import small_scenario
from zsim.config.profiles import Profiles
from zsim.engine.simulation import simulate
from zsim.errors import ConfigError
from zsim.fabric.cluster import load_cluster
from zsim.fabric.collective import Placement, _phases, communicator, plan_collective, uncontended_time
from zsim.fabric.nccl import Communicator, NcclTuner
from zsim.fabric.nvls import nvls_graph, predict
from zsim.fabric.perf import group_of, run_collective
from zsim.fabric.topology import healthy_capacities
from zsim.parallel.layout import GroupShape


def _h100(nodes: int = 1, per_node: int = 8, nvls: bool = True, cc: int = 90, tuner: str = "2.23",
          nic_line: float = 50.0) -> Communicator:
    """An HGX H100 node as NCCL sees it: 18 NVLinks at SM90_NVLINK_BW 20.6 GB/s (topo.h), 8 NDR NICs."""
    return Communicator(n_ranks=per_node * nodes, n_nodes=nodes, channels=18, speed_intra_GBps=20.6,
                        speed_inter_GBps=50.0, tuner=tuner, compute_capability=cc, nvls=nvls,
                        nic_line_GBps=nic_line)


def test_one_node_nvls_graph_and_all_reduce_cell():
    # search.cc: 8 channels forced on one node (line 982); each GPU's NVLinks carry (8 + 1) x bwIntra each
    # way: 9 x 50 = 450 > 18 x 20.6 = 370.8, 9 x 40 = 360 fits (sm90SpeedArrayIntra, line 935).
    g = nvls_graph(_h100())
    assert (g.channels, g.bw_intra_GBps, g.bw_inter_GBps) == (8, 40.0, 40.0)
    # tuning.cc: busBw 8 x 40 = 320 (line 182), algbw x 5/6 (line 224); latency = hwLat[NVLINK][NVLS] 25 µs.
    lat, algbw = predict(_h100(), "all_reduce", "nvls", "Simple")
    assert (lat, algbw) == (pytest.approx(25.0), pytest.approx(320 * 5 / 6))


def test_one_node_nvls_all_gather_and_reduce_scatter_keep_the_bus_figure():
    # tuning.cc line 221: no busBw -> algbw conversion for a non-ring all_gather/reduce_scatter.
    for fn in ("all_gather", "reduce_scatter"):
        assert predict(_h100(), fn, "nvls", "Simple") == (pytest.approx(25.0), pytest.approx(320.0))


def test_nvls_tree_cells_on_two_four_and_eight_nodes():
    # Across nodes the search starts at the NIC's 50 GB/s: bwIntra 40 from the inter list (9 x 42 = 378 >
    # 370.8), then raises bwInter alone 42, 45, 48 (< 2 x 40, <= the NIC; line 1103).
    g = nvls_graph(_h100(2))
    assert (g.channels, g.bw_intra_GBps, g.bw_inter_GBps) == (8, 40.0, 48.0)
    # tuning.cc 183: min(bwIntra, bwInter) on 2 nodes, min(bwIntra, bwInter / 2) beyond; x 5/6; latency
    # 25 + 2 log2(nNodes) x hwLat[NET][NVLSTree] 14 µs (line 274).
    assert predict(_h100(2), "all_reduce", "nvls_tree", "Simple") == (pytest.approx(25 + 2 * 14),
                                                                       pytest.approx(8 * 40 * 5 / 6))
    assert predict(_h100(4), "all_reduce", "nvls_tree", "Simple") == (pytest.approx(25 + 4 * 14),
                                                                       pytest.approx(8 * 24 * 5 / 6))
    assert predict(_h100(8), "all_reduce", "nvls_tree", "Simple")[0] == pytest.approx(25 + 6 * 14)
    # A 200 Gb/s NIC (25 GB/s): the search starts at 24, and 30 > 25 stops the NIC side there.
    g = nvls_graph(_h100(2, nic_line=25.0))
    assert (g.bw_intra_GBps, g.bw_inter_GBps) == (24.0, 24.0)


@pytest.mark.parametrize("comm, fn, algo, proto, why", [
    (_h100(nvls=False), "all_reduce", "nvls", "Simple", "no NVLink SHARP in the switch"),
    (_h100(cc=80), "all_reduce", "nvls", "Simple", "search.cc 973: compute capability < 90"),
    (_h100(per_node=2), "all_reduce", "nvls", "Simple", "nvls.cc 154: 2 GPUs or fewer"),
    (_h100(tuner="2.7"), "all_reduce", "nvls", "Simple", "NCCL 2.7 has no NVLS"),
    (_h100(), "all_reduce", "nvls", "LL", "tuning.cc 177: Simple only"),
    (_h100(), "all_reduce", "nvls", "LL128", "tuning.cc 177: Simple only"),
    (_h100(), "all_reduce", "nvls_tree", "Simple", "tuning.cc 303: no NVLSTree on one node"),
    (_h100(2), "all_reduce", "nvls", "Simple", "tuning.cc 309: no NVLS across nodes without CollNet"),
    (_h100(2), "all_gather", "nvls", "Simple", "enqueue.cc 1797: NVLS all_gather on one node only"),
    (_h100(2), "reduce_scatter", "nvls_tree", "Simple", "NVLSTree is all_reduce's"),
    (_h100(), "broadcast", "nvls", "Simple", "tuning.cc 171-173: not for broadcast"),
    (_h100(), "all_to_all", "nvls", "Simple", "point to point, no NVLS"),
])
def test_nccl_refuses_nvls_where_its_rules_say(comm, fn, algo, proto, why):
    assert NcclTuner(comm).predict(fn, algo, proto) is None, why


def test_the_tuner_picks_nvls_for_large_all_reduces_and_rings_elsewhere():
    tuner = NcclTuner(_h100())
    # LL: 6.6 + 14 x 0.6 = 15 µs at min(141, 370.8 / 2) x 8/14 GB/s; NVLS: 25 µs at 266.7 GB/s: NVLS from
    # 10 µs / (1 / 80.57 - 1 / 266.7) / 1000 = 1.15 MB on.
    assert tuner.choose("all_reduce", 64 << 10, ("ring", "nvls")) == ("ring", "LL")
    assert tuner.choose("all_reduce", 2 << 20, ("ring", "nvls")) == ("nvls", "Simple")
    assert tuner.choose("all_reduce", 1 << 30, ("ring", "nvls")) == ("nvls", "Simple")
    # all_gather: the ring's 370.8 x 8/7 GB/s beats NVLS's 320 at every size, as in NCCL's own tuner.
    assert tuner.choose("all_gather", 1 << 30, ("ring", "nvls"))[0] == "ring"


def test_fabric_time_of_an_nvls_all_reduce_is_the_tuners_cell():
    cluster = load_cluster("hgx-h100-ndr", 1)
    shape, members = group_of(cluster, 8)
    capacity = healthy_capacities(cluster)
    lat, algbw = NcclTuner(communicator(shape, cluster)).predict("all_reduce", "nvls", "Simple")
    for size in (4 << 20, 256 << 20):
        for where in (Placement(members, class_mode=False), Placement()):
            label, phases = plan_collective("all_reduce", size, shape, cluster, where=where)
            assert label == "nvls/Simple"
            assert uncontended_time(phases, capacity) * 1e6 == pytest.approx(lat + size / (1000 * algbw))
        # simulated on the fabric (simpy, max-min sharing), one GPU per process: max(launch, kernel)
        row = run_collective(cluster, "all_reduce", size, 8)
        assert row.time_us == pytest.approx(lat + size / (1000 * algbw), rel=1e-9)


def test_nvls_tree_loads_the_nics_as_the_tree_does():
    # NVLSTree across nodes: each node's NICs carry S each way on 2 nodes, 2S from 3 on (tuning.cc 183:
    # bwInter, then bwInter / 2), at the network's fitted NVLSTree share.
    for nodes, weight in ((2, 1.0), (4, 2.0)):
        cluster = load_cluster("hgx-h100-ndr", nodes)
        shape, members = group_of(cluster, 8 * nodes)
        (phase,) = _phases("all_reduce", 1 << 30, shape, cluster, Placement(members, False), True, "nvls_tree", "Simple")
        nic = dict(phase.links)[("nic", 0)]
        assert nic == pytest.approx(weight / cluster.nvls_tree_efficiency)
        assert phase.nbytes == 1 << 30


@pytest.mark.parametrize("profile, gpus", [("dgx2", 16), ("dgx-a100", 8), ("dgx1", 8)])
def test_v100_and_a100_runs_are_unchanged_even_if_a_profile_claimed_nvls(profile, gpus):
    # NCCL has no NVLS graph below compute capability 90 (search.cc 973): a V100 or A100 profile that said
    # intra_node.nvls would plan every collective as before, and the shipped ones do not say it.
    for nodes in (1, 2):
        cluster = load_cluster(profile, nodes)
        assert not cluster.nvls
        claimed = dataclasses.replace(cluster, nvls=True)
        shape = GroupShape(gpus * nodes, gpus, nodes, 1)
        for fn in ("all_reduce", "all_gather", "reduce_scatter"):
            for size in (1 << 16, 8 << 20, 1 << 30):
                assert plan_collective(fn, size, shape, claimed) == plan_collective(fn, size, shape, cluster)


def test_nvls_needs_an_nvswitch_fabric(tmp_path):
    text = Profiles().path("system", "dgx1").read_text()
    assert "  fabric: cube-mesh\n" in text
    (tmp_path / "meshbox.yaml").write_text(text.replace("  fabric: cube-mesh\n", "  fabric: cube-mesh\n  nvls: true\n"))
    with pytest.raises(ConfigError, match=r"meshbox.yaml.*nvls: true needs fabric: nvswitch"):
        load_cluster("meshbox", 1, Profiles.from_environment([tmp_path]))


def test_nvls_off_in_a_scenario_runs_the_large_all_reduce_as_a_ring():
    """hardware.nvls: false is NCCL_NVLS_ENABLE=0 (MLPerf Training v3.1's GPT-3 runs set it): the 1 GiB
    all_reduce on one H100 node leaves NVLS for the ring, and nothing else in the cluster changes."""
    on, off = load_cluster("hgx-h100-ndr", 1), load_cluster("hgx-h100-ndr", 1, nvls=False)
    assert on.nvls and not off.nvls and dataclasses.replace(off, nvls=True) == on
    assert run_collective(on, "all_reduce", 1 << 30, 8).algorithm == "nvls/Simple"
    ring = run_collective(off, "all_reduce", 1 << 30, 8)
    assert ring.algorithm.startswith("ring/") and ring.time_us > run_collective(on, "all_reduce", 1 << 30, 8).time_us
    assert load_cluster("hgx-h100-ndr", 1, nvls=True) == on


def test_nvls_on_a_node_whose_switches_cannot_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match="NVLink SHARP") as err:
        load_cluster("dgx2", 1, nvls=True)
    assert err.value.path == "hardware.nvls"
    assert load_cluster("dgx2", 1, nvls=False) == load_cluster("dgx2", 1)
    with pytest.raises(ConfigError, match="no NVSwitch") as err:
        small_scenario(hardware={"profile": "dev-2core", "nodes": 1, "nvls": False})
    assert err.value.path == "hardware.nvls"


@pytest.mark.parametrize("parallel, stage", [({"dp": 2, "mp": 8}, 1), ({"dp": 8, "mp": 2}, 0), ({"dp": 4, "mp": 4}, 2)])
def test_class_and_per_rank_modes_agree_on_nvls_nodes(parallel, stage):
    """TP all-reduces inside a DGX H100 run NVLS; DP groups of 4 or 8 GPUs a node may run NVLSTree, and two or
    four of them share each node's NICs. NCCL 2.23's choice across nodes (the cheapest cell) is made for the one
    communicator, as NCCL's tuner makes it, so both modes choose, and time, alike."""
    s = small_scenario(model={"layers": 2, "hidden": 2048, "heads": 16, "seq_len": 1024, "vocab": 1000, "micro_batch": 2},
                       parallel=parallel, zero={"stage": stage}, hardware={"profile": "dgx-h100", "nodes": 2},
                       run={"steps": 2})
    a, b = simulate(s, "class"), simulate(s, "per_rank")
    assert (a.mode, b.mode) == ("class", "per_rank")
    assert b.step_seconds == pytest.approx(a.step_seconds, rel=1e-9)
    labels = {e["args"]["algorithm"] for e in a.events if e.get("ph") == "X" and "algorithm" in e.get("args", {})}
    # 8 MB TP all-reduces: NVLS on 8 GPUs (266.7 GB/s); on 4 the ring's 370.8 x 4/6 GB/s beats NVLS's 4 x 60 x 5/6
    assert ("nvls/Simple" in labels) == (parallel["mp"] == 8), labels
