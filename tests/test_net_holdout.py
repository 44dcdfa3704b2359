"""The held-out splits of docs/fabric.md ("Between nodes") do not regress (skips without ../shared/data).

Each bound is the error the split has now (benchmarks/net_holdout.py), rounded up to the next whole
percent: a change that makes a held-out prediction worse fails here. They are not the issue's
criteria (median <= 10%, worst <= 30%); docs/fabric.md says which splits meet those and which do not.
"""

import re

import pytest

from zsim.validate.network import SPLITS, run_split

# split name -> (median, worst) |busbw error| on held-out rows >= 1 MiB, as measured by the benchmark
# Since the tree's pipeline fill was priced (zsim.fabric.tree_chunks, NCCL's chunking per release), four splits
# improved (ABCI 16.6% / 45.3% -> 10.1% / 39.2%, Alps default 39.1% / 335.2% -> 18.9% / 245.0%, Alps tuned median 66.5%
# -> 30.1%, IB NDR by cluster 14.3% / 554.1% -> 9.0% / 506.5%) and four moved the other way, bounded below at their
# new figures: Alps tuned's worst row 1547.8% -> 1714.3%, H100 NDR by nodes' median 26.7% -> 32.2% (its worst 200.7% ->
# 132.3%), the RoCE splits by 0.8-2.6 points (docs/fabric.md, "The tree's pipeline fill").
# Since LL's ceiling across nodes (NCCL's own llMaxBws, zsim.fabric.nccl.ll_net_cap_Bps; every in-sample median better,
# one in-sample worst row worse), six figures improved (Alps default 18.9% / 245.0% -> 15.4% / 222.0%, Alps tuned median 30.1% -> 23.1%, H100 NDR
# by nodes median 32.2% -> 22.5%, IB NDR by cluster worst 506.5% -> 383.0%, OCI B4.8 12.3% / 12.6% -> 9.7% / 10.0%,
# RoCE -> B200 worst 4029% -> 2231%) and four figures got worse, bounded below at their new values: Alps tuned's
# worst row 1714.3% -> 1822.4%, H100 NDR by nodes' worst 132.3% -> 186.9%, IB NDR by cluster's median 9.0% -> 11.5%,
# RoCE -> B200's median 260.4% -> 428.6% (docs/fabric.md, "LL's ceiling across nodes").
BOUNDS = {
    # 14.6% / 40.4% until ib-edr's efficiency was held at InfiniBand's published 0.96 (zsim.calibrate.net_terms
    # .IB_EFFICIENCY) instead of fitted to tables that stop at 32 MiB: a deliberate change, worse on these rows
    # by 2 and 5 points (docs/fabric.md, "InfiniBand's efficiency")
    "ABCI EDR: fit 2-8 nodes, predict 16-32": (0.11, 0.40),
    # 40.3% / 358.7% over 78 rows until the rows nccl-tests' own check failed were left out (4 of the default
    # tables' rows, zsim.trace.nccl_tests.checked)
    "Alps Slingshot (default env): fit 2-8, predict 16-512": (0.16, 2.23),
    "Alps Slingshot (tuned env): fit 2-8, predict 16-512": (0.24, 18.23),
    # NVLSTree modelled (zsim.fabric.nvls): worst 198.6% -> 200.7% and 526.5% -> 554.1% (docs/fabric.md says why
    # it is kept); the bounds follow the new figures, as every other here
    "H100 NDR (gj-aion): fit 2-4, predict 8": (0.23, 1.87),
    "IB NDR: fit Dell XE9680, predict the gj-aion cluster": (0.12, 3.83),
    "EFA: fit p4d NCCL 2.9.9, predict p4d NCCL 2.8.3": (0.13, 0.36),
    "RoCE: fit OCI A100 all_reduce, predict GCP B200 all_gather": (4.29, 22.32),
    "RoCE: fit OCI A100 (2024), predict OCI B4.8 (NCCL 2.29)": (0.098, 0.101),
}


def test_every_split_has_a_bound():
    assert {s.name for s in SPLITS} == set(BOUNDS)


@pytest.mark.parametrize("split", SPLITS, ids=[re.sub(r"\W+", "-", s.name.split(":")[0]).strip("-") for s in SPLITS])
def test_held_out_split_does_not_regress(shared_data, split):
    result = run_split(split, shared_data / "nccl-tests")
    median, worst = BOUNDS[split.name]
    assert result.rows >= 4
    assert result.median <= median, (result.median, result.values)
    assert result.worst <= worst, (result.worst, result.values)
    assert result.trend_right, (result.trend_measured, result.trend_simulated)
