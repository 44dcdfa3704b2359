"""LL's ceiling across nodes: from NCCL 2.8 on an LL ring or tree across nodes moves at most llMaxBws
(tuning.cc, the Intel/ARM row: 39 GB/s busbw on 2 nodes, 20.4 on more); zsim.fabric.nccl.ll_net_cap_Bps."""

import pytest

from zsim.fabric.cluster import load_cluster
from zsim.fabric.collective import GroupShape, _phases, Placement, uncontended_time
from zsim.fabric.nccl import bus_factor, ll_net_cap_Bps
from zsim.fabric.topology import aggregate_capacities, build_topology


def test_the_ceiling_is_nccls_per_release_and_node_count():
    assert ll_net_cap_Bps("2.23", 2) == 39.0e9 and ll_net_cap_Bps("2.23", 3) == 20.4e9
    assert ll_net_cap_Bps("2.8", 2) == 39.0e9 and ll_net_cap_Bps("2.8", 512) == 20.4e9
    assert ll_net_cap_Bps("2.23", 1) is None  # inside a node: the GPU's row, a tuner choice only
    assert ll_net_cap_Bps("2.7", 4) is None and ll_net_cap_Bps("2.5", 4) is None  # no llMaxBws before 2.8.3


def _busbw(profile: str, fn: str, algo: str, nodes: int, nbytes: float = 1 << 30) -> float:
    cluster = load_cluster(profile, nodes=nodes)
    k = cluster.gpus_per_node
    shape = GroupShape(size=k * nodes, per_node=k, nodes=nodes, concurrent_per_node=1)
    phases = _phases(fn, nbytes, shape, cluster, Placement(), True, algo, "LL")
    moving = uncontended_time(phases, aggregate_capacities(build_topology(cluster), cluster)) - sum(
        p.latency_s for p in phases)
    bus = 2.0 * nbytes if algo == "tree" else bus_factor(fn, shape.size) * nbytes
    return bus / moving


@pytest.mark.parametrize("algo", ["ring", "tree"])
def test_an_ll_all_reduce_across_h100_nodes_runs_at_the_ceiling(algo):
    # 8 NDR NICs a node: LL's wire share alone would give ~180 GB/s; NCCL's ceiling holds it to 39 and 20.4
    assert _busbw("hgx-h100-ndr", "all_reduce", algo, 2) == pytest.approx(39.0e9, rel=1e-9)
    assert _busbw("hgx-h100-ndr", "all_reduce", algo, 4) == pytest.approx(20.4e9, rel=1e-9)


def test_releases_before_28_and_all_to_all_are_not_capped():
    # DGX A100 runs tuner 2.7: its LL ring over 8 HDR NICs keeps the wire share, far above 39 GB/s
    assert _busbw("dgx-a100", "all_reduce", "ring", 2) > 2 * 39.0e9
    # an all_to_all is point-to-point (NCCL's p2p path or DeepEP), outside the tuner's LL cap
    assert _busbw("hgx-h100-ndr", "all_to_all", "ring", 4) > 20.4e9 * 1.2


def test_a_profile_without_a_tuner_runs_the_release_that_knows_its_gpu():
    """nccl.tuner unset: "2.23" on Hopper and newer (NCCL's tuner knows Hopper only from v2.15.1-1), "2.7" before;
    a profile's own choice stands."""
    from zsim.fabric.cluster import default_tuner

    assert default_tuner(90) == default_tuner(100) == "2.23"
    assert default_tuner(80) == default_tuner(70) == "2.7"
    assert load_cluster("dgx-a100", nodes=2).nccl_tuner == "2.7"  # no tuner named, Ampere
    assert load_cluster("dgx-a100", nodes=2, gpu="h100-sxm5-80gb").nccl_tuner == "2.23"  # the same node with H100s
    assert load_cluster("dgx2", nodes=2).nccl_tuner == "2.5"  # named in the profile
