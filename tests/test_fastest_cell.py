"""Across nodes under the 2.23 tuner zsim picks the cheapest cell NCCL enables (zsim.fabric.collective._fastest),
costed for the one communicator with its own NICs: per_node / gpus_per_node of a node's NICs (rail-aligned),
not the node's whole pool."""

import pytest

from zsim.fabric.cluster import load_cluster
from zsim.fabric.collective import GroupShape, plan_collective


@pytest.mark.parametrize("concurrent", [1, 8])
def test_a_one_gpu_a_node_group_prices_simple_on_its_own_nic(concurrent):
    # TP 8 fills each DGX H100 node, so each DP group has one GPU a node: one NDR NIC, ~46 GB/s at Simple. A
    # 215 MB all_gather (a 70B layer's ZeRO-3 gather) then runs Simple; costed on all 8 NICs it ran LL128 (and,
    # before LL's ceiling, LL), at a fraction of Simple's rate once the 8 groups shared the NICs.
    cluster = load_cluster("dgx-h100", nodes=64)
    shape = GroupShape(size=64, per_node=1, nodes=64, concurrent_per_node=concurrent)
    algo, _ = plan_collective("all_gather", 215e6, shape, cluster)
    assert algo == "ring/Simple"
    # a 20 MB one stays in LL: at LL's ceiling (20.4 GB/s) it beats Simple's 63 network steps on one NIC
    assert plan_collective("all_gather", 20e6, shape, cluster)[0] == "ring/LL"
