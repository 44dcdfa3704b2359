"""NCCL 2.8's tuner (zsim.fabric.nccl_28) against cells worked out by hand from tuning.cc v2.8.4-1."""

import pytest

from zsim.fabric.nccl import Communicator, NcclTuner
from zsim.fabric.nccl_28 import predict, predicted_time_us


def _comm(nodes: int, cc: int = 70, channels: int = 6, intra: float = 20.0, inter: float = 3.0) -> Communicator:
    return Communicator(n_ranks=4 * nodes, n_nodes=nodes, channels=channels, speed_intra_GBps=intra,
                        speed_inter_GBps=inter, tuner="2.8", compute_capability=cc)


def test_tree_is_capped_per_channel_by_architecture_and_nodes():
    # Volta, 4+ nodes: perChMaxTreeBws[0][2] = 10 GB/s per channel; busBw = min(6 x 20 x .92, 6 x 10) = 60 with
    # the inter speed at 20 (line 127); algbw = busBw / 2.
    lat, algbw = predict(_comm(4, inter=20.0), "all_reduce", "tree", "Simple")
    assert algbw == pytest.approx(30.0)
    # Ampere, 2 nodes: perChMaxTreeBws[1][1] = 22.5 per channel, above 6 x 20 x .92 = 110.4 / 6 = 18.4: not binding.
    assert predict(_comm(2, cc=80), "all_reduce", "tree", "Simple")[1] == pytest.approx(6 * 20 * 0.92 / 2)
    # Tree latency: baseLat 0 + 2 x ((4-1) x 28 + log2(4) x 28) µs (hwLat NVLink and NET tree/Simple: 28).
    assert lat == pytest.approx(2 * (3 * 28 + 2 * 28))


def test_ll_is_capped_by_llmaxbw_and_ampere_ring_at_235():
    # Ring/LL on 4+ nodes, Intel host: min(llMaxBws[0][2] = 20.4, 6 x 20 x 1/4 = 30) (line 125).
    _, algbw = predict(_comm(4, inter=20.0), "all_reduce", "ring", "LL")
    assert algbw == pytest.approx(20.4 * 16 / 30)  # ring algbw = busBw x nRanks / (2 (nRanks - 1))
    # Ampere: the whole ring at most 235 GB/s (line 124), then Simple as is.
    _, algbw = predict(_comm(2, cc=80, channels=12, intra=21.0), "all_gather", "ring", "Simple")
    assert algbw == pytest.approx(235.0 * 8 / 7)


def test_tree_correction_and_ring_plateau():
    c = _comm(4, inter=20.0)
    lat, algbw = predict(c, "all_reduce", "tree", "Simple")
    size = 1 << 20  # log2i(2^20 >> 6) = 14: treeCorrectionFactor[Simple][14] = .5
    assert predicted_time_us(c, "all_reduce", size, "tree", "Simple") == pytest.approx(lat + size / (1000 * algbw * 0.5))
    lat, algbw = predict(c, "all_reduce", "ring", "Simple")
    # from nRanks/16 x 64 KiB = 64 KiB on, the ring's latency x 1.9 (line 281)
    assert predicted_time_us(c, "all_reduce", 65536, "ring", "Simple") == pytest.approx(1.9 * lat + 65536 / (1000 * algbw))
    assert predicted_time_us(c, "all_reduce", 32768, "ring", "Simple") == pytest.approx(lat + 32768 / (1000 * algbw))


def test_the_tuner_dispatches_to_the_port_and_prefers_rings_at_mid_sizes():
    c = _comm(16)
    tuner = NcclTuner(c)
    assert tuner.predict("all_reduce", "tree", "LL128") == predict(c, "all_reduce", "tree", "LL128")
    assert tuner.predict("all_gather", "tree", "Simple") is None  # trees are all_reduce's only
    # At 8 MiB on 16 nodes the tree's correction (.8/.7) makes NCCL 2.8 keep its ring.
    assert tuner.choose("all_reduce", 8 << 20)[0] == "ring"
