"""Memory as DeepSpeed and PyTorch allocate it (docs/memory.md, "What the runtime really holds"): the
CUDA context and NCCL buffers outside the allocator, one allocator pool per stream, DeepSpeed's buffers
of the paper's time, and the paper's 170B run fitting on 400 V100."""

from __future__ import annotations

import pytest

from tests.conftest import small_scenario
from zsim.scenario.scenario import build_scenario
from zsim.engine.simulation import simulate
from zsim.memory.allocator import CachingAllocator
from zsim.memory.context import (
    CUDA_CONTEXT_BYTES,
    NCCL_CONNECTION_BYTES,
    context_memory,
    nccl_channels,
)
from zsim.workload.transformer import build_workload
from zsim.zero.model_states import stage_partition
from zsim.zero.plan import build_plan
from zsim.zero.residual import StepGradients, stage1_comm_intervals, stage1_flat_gradient_bytes, step_gradient_bytes

MiB = 1 << 20


def test_nccl_buffers_per_connection_are_nccl_2_7_defaults():
    # LL 8·512·8·16 B + LL128 120·640·8·8 B + Simple 4 MiB (NCCL 2.7.8 init.cc, devcomm.h)
    assert NCCL_CONNECTION_BYTES == 524_288 + 4_915_200 + 4_194_304 == 9_633_792
    assert nccl_channels(6) == 12 and nccl_channels(18) == 32 and nccl_channels(0) == 2


def test_context_counts_one_communicator_per_group_with_peers():
    paper = context_memory(world=400, dp=25, mp=16, nvlink_links=6)  # the ZeRO paper's cluster
    per_comm = 12 * 2 * NCCL_CONNECTION_BYTES  # 12 channels × 2 sending peers
    assert paper.nccl == {"world": per_comm, "dp": per_comm, "mp": per_comm}
    assert paper.cuda_context == CUDA_CONTEXT_BYTES == 721 * MiB
    assert context_memory(world=2, dp=2, mp=1, nvlink_links=6).nccl == {"world": 12 * NCCL_CONNECTION_BYTES,
                                                                       "dp": 12 * NCCL_CONNECTION_BYTES}
    assert context_memory(world=1, dp=1, mp=1, nvlink_links=0).nccl == {}  # one GPU: no peers, no buffers


def test_context_is_reserved_before_the_first_tensor_and_never_freed():
    r = simulate(small_scenario())
    lay = r.scenario.layout
    expected = context_memory(lay.world, lay.dp, lay.mp, r.scenario.cluster.nvlink_links).total
    times, rows = r.ledger.timeline()
    col = list(r.ledger.totals).index("context")
    assert rows[0][col] == expected and (rows[:, col] == expected).all()
    assert r.ledger.peak_by_category["context"] == expected


def test_context_alone_can_make_a_model_not_fit():
    """The allocator gets the GPU less the context: a scenario that needs 1 GB of tensors does not fit
    on a 1.2 GiB GPU, whose context takes ~1 GB."""
    s = small_scenario(zero={"stage": 3}, hardware={"profile": "dgx2", "nodes": 2, "gpu_memory_GiB": 1.2})
    r = simulate(s)
    assert r.ledger.totals["context"] > 0.9e9 and not r.fits


def test_a_block_freed_on_one_stream_does_not_serve_another():
    """c10/cuda/CUDACachingAllocator.cpp: blocks are matched by stream first."""
    a = CachingAllocator(capacity=1 << 30)
    a.malloc("comm.buf", 40 * MiB, "comm")
    a.free("comm.buf")
    a.malloc("compute.buf", 40 * MiB, "compute")  # the cached 40 MiB is the comm stream's
    assert a.segments == 2 and a.reserved == 80 * MiB
    a.free("compute.buf")
    a.malloc("comm.again", 40 * MiB, "comm")  # same stream: reused
    assert a.segments == 2 and a.reserved == 80 * MiB
    a.free("comm.again")
    a.release_cached()  # the cache is released for every stream
    assert a.reserved == 0


def test_stage_2_reduction_buffers_live_in_the_comm_streams_pool():
    """Stage 2 without MD flattens each bucket on the reduction stream (DeepSpeed v0.2 allreduce_and_copy
    under overlap_comm): those blocks sit in the comm stream's pool, apart from the compute stream's."""
    r = simulate(small_scenario(zero={"stage": 2, "constant_buffers": True, "reduce_bucket_elements": 50_000}))
    comm_blocks = [t for t, b in r.ledger.allocator._live.items() if b.stream == "comm"]
    assert comm_blocks == []  # all freed by the end
    pools = {stream for stream, _ in r.ledger.allocator._pools}
    assert pools == {"compute", "comm"}


def _ops(s):
    w = build_workload(s.model, s.parallel.mp, s.precision.dtype)
    return w, build_plan(s, w)


def test_stage_3_frees_its_fp16_gradient_partition_in_the_step():
    """DeepSpeed v0.3.13 stage3.py: grads_in_partition is made at the first reduction of backward and
    released in the step (_prepare_fp32_grad_for_sub_group drops averaged_gradients after the fp32
    copy; _release_ipg_buffers drops the flat buffer): nothing of it is left after the step."""
    s = small_scenario(zero={"stage": 3})
    w, plan = _ops(s)
    part = stage_partition(w.params_per_mp_rank, s.layout.dp, 3, w.tensors)
    made = [op.name for op in plan.ops for a in op.allocs if a.tag.startswith("grads.partition")]
    assert len(made) == 1 and made[0].startswith("reduce_scatter/grads")
    copy = next(op for op in plan.ops if op.name == "optimizer/grads_copy")
    assert "grads.partition.s0" in copy.frees
    r = simulate(s)
    assert r.ledger.totals["grads"] == 0
    assert r.ledger.peak_by_category["grads"] >= 2 * part


def test_step_gradient_copies_per_stage():
    p, g = 1000, StepGradients
    assert step_gradient_bytes(0, p, "fp16", p) == g(2 * p, 0)  # fp16 flat copy for FusedAdam
    assert step_gradient_bytes(1, p, "fp16", p) == g(4 * p, 4 * p)  # fp32 pieces, then their concatenation
    assert step_gradient_bytes(2, p, "fp16", p) == g(4 * p, 2 * p)  # fp16 flat → fp32
    assert step_gradient_bytes(3, p, "fp16", 100) == g(400, 200)  # one sub-group at a time
    assert step_gradient_bytes(3, p, "fp32", 100) == g(0, 0)


def test_stage_1_reduces_after_backward_from_a_second_flat_copy():
    """DeepSpeed v0.2 stage 1: reduce_scatter_gradients runs after backward, on a flattened copy of
    every rank's sub-partitions (all gradients, padded to whole comm intervals)."""
    s = small_scenario(zero={"stage": 1, "reduce_bucket_elements": 100_000})
    w, plan = _ops(s)
    psi, nd = w.params_per_mp_rank, s.layout.dp
    names = [op.name for op in plan.ops]
    last_bwd = max(i for i, n in enumerate(names) if n.startswith("bwd/"))
    reduces = [i for i, n in enumerate(names) if n.startswith("reduce_scatter/grads")]
    intervals, sub = stage1_comm_intervals(psi, nd, 100_000)
    assert len(reduces) == intervals and min(reduces) > last_bwd
    flat = [a for a in plan.ops[reduces[0]].allocs if a.tag.startswith("flat_grads")]
    # one tensor per (rank, interval) sub-partition, as get_flat_sub_partitions makes them
    assert len(flat) == nd * intervals and {a.nbytes for a in flat} == {2 * sub}
    assert sum(a.nbytes for a in flat) == stage1_flat_gradient_bytes(psi, nd, 100_000, 2) >= 2 * psi
    assert {a.tag for a in flat} <= set(plan.ops[reduces[-1]].frees)


def test_pa_gathers_through_a_list_staging_buffer():
    s = small_scenario(zero={"stage": 2, "partition_activations": True})
    w, plan = _ops(s)
    op = next(op for op in plan.ops if op.name.startswith("all_gather/activations"))
    sizes = sorted(a.nbytes for a in op.allocs)
    assert sizes == [w.blocks[0].checkpoint_bytes] * 2  # the full tensor and PyTorch's flat staging


PAPER_170B = {  # ZeRO Figure 2, the largest point: 400 / 16 / 212 / 8192 / 64 / 12 / 300 (issue 9)
    "model": {"layers": 212, "hidden": 8192, "heads": 64, "seq_len": 1024, "vocab": 50257, "micro_batch": 12,
              "global_batch": 300},
    "parallel": {"dp": 25, "mp": 16},
    "zero": {"stage": 2, "activation_checkpointing": True, "partition_activations": True, "constant_buffers": True,
             "defragment": True, "reduce_bucket_elements": 50_000_000, "allgather_bucket_elements": 50_000_000},
    "precision": {"dtype": "fp16"},
    "hardware": {"profile": "dgx2", "nodes": 25},
    "run": {"steps": 2},
}


def test_the_papers_170b_run_fits_on_400_v100():
    """ZeRO-100B trained 170B parameters on 400 V100-32GB (Figure 2); zsim must agree, step 2 included
    (it starts with step 1's allocator cache)."""
    r = simulate(build_scenario(PAPER_170B, source="<170B>"))
    assert r.workload.total_params > 170e9
    assert r.fits, r.ledger.oom
    assert r.ledger.peak_reserved <= r.scenario.cluster.gpu.memory_bytes


def test_stage_1_copy_groups_sub_partitions_past_the_cap():
    """Past STAGE1_COPY_TENSORS sub-partitions, runs of consecutive ones share a tensor: the bytes are
    the same, the count is bounded, and every tensor but the last holds the same whole number of them."""
    from zsim.zero.plan import STAGE1_COPY_TENSORS, _stage1_flat_copy

    exact = _stage1_flat_copy(2, 1000, 64, 64, str)
    assert len(exact) == 64 * 64 <= STAGE1_COPY_TENSORS and {a.nbytes for a in exact} == {2000}
    grouped = _stage1_flat_copy(2, 1000, 1024, 147, str)
    assert len(grouped) <= STAGE1_COPY_TENSORS < 1024 * 147
    assert sum(a.nbytes for a in grouped) == 2 * 1000 * 1024 * 147
    assert len({a.nbytes for a in grouped[:-1]}) == 1 and grouped[-1].nbytes <= grouped[0].nbytes
    assert len({a.tag for a in grouped}) == len(grouped)
