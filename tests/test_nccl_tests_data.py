"""The DGX-2 profile against real nccl-tests measurements (skips when ../shared/data is absent), and
the importer and fit on synthetic tables."""

import dataclasses

import numpy as np
import pytest

from zsim.calibrate.nccl_fit import evaluate, fit, kernel_from
from zsim.commands.nccl_fit import read_tables
from zsim.fabric.cluster import load_cluster
from zsim.fabric.nccl import PROTOCOLS
from zsim.fabric.perf import run_collective
from zsim.trace.nccl_tests import NcclRow, read_nccl_tests

DGX2 = "nccl-tests/dgx2-v100-12gpu"
JUDGED = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce")


def test_reader_parses_every_row(shared_data):
    rows = read_nccl_tests(shared_data / DGX2 / "all_reduce.txt")
    assert rows[0].size == 8 and rows[0].count == 2 and rows[0].dtype == "float"
    assert rows[-1].size == 2**33 and len(rows) == 31  # 8 B doubling up to 8 GiB (-e 10240M stops there)
    assert all(b.size == 2 * a.size for a, b in zip(rows, rows[1:]))
    bcast = read_nccl_tests(shared_data / DGX2 / "broadcast.txt")  # has a root column
    assert bcast[-1].busbw == pytest.approx(122.15)
    gather = read_nccl_tests(shared_data / DGX2 / "all_gather.txt")  # no redop column
    assert gather[-1].size == 8589934560 and gather[-1].busbw == pytest.approx(73.75)


@pytest.mark.parametrize("fn", JUDGED)
def test_dgx2_profile_matches_measured_busbw(shared_data, fn):
    """From 1 MB up: median |busbw error| within 10% and no size off by more than 40%, with the
    simulated fabric (not the closed form) and NCCL's own algorithm/protocol choice per size."""
    cluster = load_cluster("dgx2", 1)
    tables = {fn: read_nccl_tests(shared_data / DGX2 / f"{fn}.txt")}
    residuals = [r for r in evaluate(cluster, tables, gpus=12, gpus_per_process=12, simulate=True)
                 if r.size >= 1 << 20]
    errors = [abs(r.error) for r in residuals]
    assert len(errors) >= 13
    assert np.median(errors) <= 0.10, residuals
    assert max(errors) <= 0.40, residuals


def test_profile_numbers_come_from_the_fit(shared_data):
    """Re-fitting the real tables reproduces the profile's predictions (the profile says so)."""
    cluster = load_cluster("dgx2", 1)
    tables = read_tables(shared_data / DGX2)
    result = fit(cluster, tables, gpus=12, gpus_per_process=12)
    refit = dataclasses.replace(cluster, nccl=kernel_from(result.values))
    for fn in JUDGED:
        for size in (1 << 20, 1 << 24, 1 << 30):
            a = run_collective(cluster, fn, size, 12, 12, simulate=False).busbw
            b = run_collective(refit, fn, size, 12, 12, simulate=False).busbw
            assert b == pytest.approx(a, rel=0.03), (fn, size)


def test_fit_recovers_known_terms_from_synthetic_tables():
    """Tables generated from known kernel terms are fitted back to the same predictions (without the
    latency prior, which would pull these made-up latencies toward NCCL's), and to every term the tables
    determine. Two things they cannot: with -g 12 a call costs 11 launches plus its protocol's fixed
    latency (NcclKernel.call_seconds), so only 11·launch + latency is determined per protocol while the
    12-launch floor is never reached; and all_gather's LL128 share, whenever S/12-byte chunks put it
    under the element-wise copy rate, is only bounded from below by that rate."""
    cluster = load_cluster("dgx2", 1)
    ll128 = {"broadcast": 0.7, "reduce": 0.65, "all_gather": 0.6, "reduce_scatter": 0.55, "all_reduce": 0.5}
    truth = {"launch_us": 4.0, "efficiency.LL": 0.4, "efficiency.Simple": 0.85,
             **{f"efficiency.LL128.{fn}": share for fn, share in ll128.items()},
             "latency_us.LL": 8.0, "latency_us.LL128": 15.0, "latency_us.Simple": 20.0,
             "step_latency_us.LL": 0.5, "step_latency_us.LL128": 1.0, "step_latency_us.Simple": 2.0,
             "unaligned_copy_GBps": 80.0, "unaligned_reduce_GBps": 45.0}
    true_cluster = dataclasses.replace(cluster, nccl=kernel_from(truth))
    tables = {}
    for fn in JUDGED:
        rows = []
        for e in range(3, 34):
            r = run_collective(true_cluster, fn, 1 << e, 12, 12, simulate=False)
            rows.append(NcclRow(r.size, r.count, "float", r.time_us, r.algbw, r.busbw))
        tables[fn] = rows
    result = fit(cluster, tables, gpus=12, gpus_per_process=12, prior_weight=0.0)
    got = result.values
    worst = max(abs(r.error) for r in result.residuals)
    assert worst < 0.01
    hidden = ("launch_us", "efficiency.LL128.all_gather", *(f"latency_us.{p}" for p in PROTOCOLS))
    for key in truth:
        if key not in hidden:
            assert got[key] == pytest.approx(truth[key], rel=0.02), key
    for p in PROTOCOLS:
        assert 11 * got["launch_us"] + got[f"latency_us.{p}"] == pytest.approx(
            11 * truth["launch_us"] + truth[f"latency_us.{p}"], rel=0.02), p
    assert got["efficiency.LL128.all_gather"] * 150 >= truth["unaligned_copy_GBps"] * 0.98  # 6 NVLinks × 25 GB/s


def test_nccl_fit_holds_the_gpu_count_to_the_tables_header(shared_data):
    """The DGX-2 tables were recorded on 12 GPUs by one process (-g 12): another --gpus or -g would fit
    terms for a machine the tables never saw, so it is refused (exit 2) naming the file and the header's."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    def nccl_fit(*args):
        return subprocess.run([sys.executable, "-m", "zsim.cli", "nccl-fit", str(shared_data / DGX2), "--profile",
                               "dgx2", *args], capture_output=True, text=True, cwd=ROOT)

    wrong = nccl_fit("--gpus", "13", "-g", "12")
    assert wrong.returncode == 2 and "its header lists 12 GPUs, 12 per process" in wrong.stderr
    one = nccl_fit("--gpus", "1")
    assert one.returncode == 2 and "--gpus 1: a collective needs at least 2 GPUs" in one.stderr
