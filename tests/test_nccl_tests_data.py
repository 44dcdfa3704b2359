"""The DGX-2 profile against real nccl-tests measurements (skips when ../shared/data is absent)."""

import pytest

from zsim.config.hardware import load_cluster
from zsim.fabric.collective import ring, uncontended_time
from zsim.parallel.layout import GroupShape
from zsim.trace.nccl_tests import read_nccl_tests


def test_reader_parses_every_row(shared_data):
    rows = read_nccl_tests(shared_data / "nccl-tests/dgx2-v100-12gpu/all_reduce.txt")
    assert rows[0].size == 8 and rows[0].count == 2 and rows[0].dtype == "float"
    assert rows[-1].size == 2**33 and len(rows) == 31  # 8 B doubling up to 8 GiB (-e 10240M stops there)
    assert all(b.size == 2 * a.size for a, b in zip(rows, rows[1:]))
    bcast = read_nccl_tests(shared_data / "nccl-tests/dgx2-v100-12gpu/broadcast.txt")  # has a root column
    assert bcast[-1].busbw == pytest.approx(122.15)


def test_dgx2_all_reduce_bandwidth_matches_measurement_at_large_sizes(shared_data):
    """The spine's α-β model fits all_reduce from 64 MB up within 10%; smaller sizes (NCCL's LL/LL128
    protocols) and the other collectives need the fabric issue's NCCL model."""
    c = load_cluster("dgx2", 1)
    n = 12
    rows = read_nccl_tests(shared_data / "nccl-tests/dgx2-v100-12gpu/all_reduce.txt")
    checked = 0
    for row in rows:
        if row.size < 64 * 2**20:
            continue
        t = uncontended_time(ring("all_reduce", row.size, GroupShape(n, n, 1, 1), c), c)
        busbw = row.size / t / 1e9 * 2 * (n - 1) / n
        assert busbw == pytest.approx(row.busbw, rel=0.10), row
        checked += 1
    assert checked >= 8
