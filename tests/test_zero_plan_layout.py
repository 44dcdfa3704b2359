"""The one stage 1-2 layout (zsim.zero.buckets) that the simulator's plan and the runtime share:
DeepSpeed v0.2's comm intervals (stage 1), padded buckets (stage 2), v0.2's all-gather shards, and
the runtime's BucketPartition built from them. The numbers are worked by hand from DeepSpeed v0.2.0's
code (deepspeed/pt/zero_optimizer_stage1.py, deepspeed_zero_optimizer.py), cited in the comments."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import small_scenario
from zsim.engine.simulation import simulate
from zsim.runtime.zero.partition import BucketPartition
from zsim.zero.buckets import allgather_shards, flat_pieces, padded_bucket, plan_buckets
from zsim.zero.model_states import model_states
from zsim.zero.plan import rank_pieces


def test_stage1_pieces_are_deepspeed_v02_comm_intervals():
    # flatten_dense_tensors_sub_partition_aligned: sub = min(bucket, Ψ) // Nd; Ψ padded to whole
    # intervals of sub·Nd. Ψ = 101 on 2 ranks, bucket above Ψ: sub 50, 2 intervals of 100.
    assert flat_pieces(1, [60, 41], 2, 10**9) == [100, 100]
    # Ψ = 26,760 with 10,000-element intervals on 4 ranks: sub 2,500, 3 intervals, 3,240 of padding.
    assert flat_pieces(1, [2370, 11190, 11190, 2010], 4, 10_000) == [10_000] * 3
    # one rank: intervals of the bucket
    assert flat_pieces(1, [7, 8], 1, 4) == [4] * 4


def test_stage2_pieces_are_the_buckets_padded_to_2nd():
    modules = [4320, 11190, 11190, 60]
    assert flat_pieces(2, modules, 4, 10_000) == [padded_bucket(n, 4) for n in (11250, 11190, 4320)]
    assert [sum(modules[i] for i in b) for b in plan_buckets(modules, 10_000)] == [11250, 11190, 4320]
    # without constant buffers: one piece, the whole buffer padded once
    assert flat_pieces(2, modules, 4, 10_000, constant_buffers=False) == [padded_bucket(26760, 4)]
    with pytest.raises(ValueError, match="stage"):
        flat_pieces(3, modules, 4, 10_000)


def test_allgather_shards_as_deepspeed_v02():
    # step(): num_shards = max(1, P·Nd // allgather_bucket_size); shards of P // num_shards, last the rest.
    assert allgather_shards(253_000_000, 25, 500_000_000) == [21_083_333] * 11 + [253_000_000 - 11 * 21_083_333]
    assert allgather_shards(1000, 4, 5_000_000_000) == [1000]
    assert allgather_shards(10, 2, 1) == [1] * 10  # never an empty shard


@settings(deadline=None)  # 2 shared cores: timings vary
@given(partition=st.integers(1, 10**7), nd=st.integers(1, 64), bucket=st.integers(1, 10**9))
def test_allgather_shards_cover_the_partition_once(partition, nd, bucket):
    shards = allgather_shards(partition, nd, bucket)
    assert sum(shards) == partition and min(shards) >= 1


@settings(deadline=None, max_examples=60)
@given(units=st.lists(st.integers(1, 5000), min_size=1, max_size=6), nd=st.integers(1, 8),
       capacity=st.integers(100, 20_000), stage=st.sampled_from([1, 2]))
def test_runtime_partition_is_the_plan_layout(units, nd, capacity, stage):
    """The runtime's BucketPartition has the plan's pieces; every real element is owned exactly once,
    and partition_pieces maps each rank's partition onto its chunks of the flat buffer."""
    part = (BucketPartition.intervals if stage == 1 else BucketPartition.of)(units, capacity, nd)
    assert part.bucket_padded == flat_pieces(stage, units, nd, capacity)
    assert part.total == sum(part.bucket_padded) and part.shard * nd == part.total
    assert sum(part.shard_real(r) for r in range(nd)) == sum(units)
    owner = torch.full((part.total,), -1)
    for r in range(nd):
        for at, offset, length in part.partition_pieces(0, part.shard, r):
            assert (owner[at:at + length] == -1).all()
            owner[at:at + length] = r
    assert (owner >= 0).all()
    for u, n in enumerate(units):  # units never overlap
        assert part.unit_offset[u] + n <= part.total


@pytest.mark.parametrize("stage", [1, 2])
def test_simulated_model_states_follow_the_pieces(stage):
    r = simulate(small_scenario(zero={"stage": stage, "reduce_bucket_elements": 10_000}))
    pieces = rank_pieces(r.scenario, r.workload)
    assert len(pieces) > 1
    psi, nd = r.workload.params_per_mp_rank, r.scenario.layout.dp
    assert r.model_states == model_states(psi, nd, stage, "fp16", pieces=pieces)
    assert r.model_states.params == 2 * sum(pieces)  # the whole padded fp16 buffer
    steps = [e for e in r.events if e["name"] == "optimizer/step"]
    assert {e["args"]["elements"] for e in steps} == {sum(pieces) // nd}


@pytest.mark.parametrize("stage, constant_buffers, copies", [(0, True, False), (1, True, False), (2, True, True),
                                                              (2, False, False), (3, True, True)])
def test_backward_copies_each_gradient_into_its_bucket_in_stages_2_and_3(stage, constant_buffers, copies):
    """DeepSpeed's ZeRO-2 with contiguous gradients and ZeRO-3 copy each gradient into the ipg bucket in
    the backward hook (e bytes read and written per element); stages 0-1 reduce autograd's buffer."""
    from zsim.workload.transformer import build_workload
    from zsim.zero.plan import build_plan

    s = small_scenario(zero={"stage": stage, "constant_buffers": constant_buffers})
    w = build_workload(s.model, s.parallel.mp, s.precision.dtype)
    plan = build_plan(s, w)
    params = {str(m.name): m.params for m in w.modules}
    e = 2 if s.precision.dtype != "fp32" else 4
    backward = [op for op in plan.ops if op.name.startswith("bwd/")]
    assert backward
    for op in backward:
        copy = [k for k in op.kernels.kernels if k.name == "grads.to_bucket"]
        assert bool(copy) == copies, op.name
        if copies:
            assert copy[0].bytes == 2 * e * params[op.name.split("/", 1)[1]]
