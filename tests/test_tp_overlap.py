"""parallel.tp_comm_overlap (zsim.zero.tp_overlap): a dense block's SP collectives beside the GEMMs Transformer
Engine's userbuffers overlap them with, chunked by TE v1.8's methods; the plan, the step and the refusals."""

from __future__ import annotations

import dataclasses

import pytest

from tests.conftest import small_scenario
from zsim.compute.kernels import module_kernels
from zsim.engine.simulation import simulate
from zsim.errors import ZsimError
from zsim.zero.plan import build_plan, scenario_workload
from zsim.zero.step_pass import StepPass
from zsim.zero.ops import PlanBuilder
from zsim.zero.tp_overlap import PAIRS, PIPELINE_SPLITS, pieces


def _scenario(overlap: bool, **model):
    return small_scenario(model={"grad_accum": 2, "layers": 4, "hidden": 1024, "heads": 16, "seq_len": 1024, **model},
                          parallel={"dp": 4, "mp": 8, "sequence_parallel": True, "tp_comm_overlap": overlap},
                          zero={"stage": 1, "activation_checkpointing": False}, precision={"dtype": "bf16"},
                          hardware={"profile": "dgx-a100", "nodes": 4})


def _shape(s):
    w = scenario_workload(s)
    return StepPass(PlanBuilder(), s, w, 0, 0, ()).shape


@pytest.mark.parametrize("phase", ["fwd", "bwd"])
def test_pieces_keep_every_kernel_and_flop_and_chunk_as_te_does(phase):
    s = _scenario(True)
    kernels = module_kernels("block", phase, _shape(s))
    parts = pieces(kernels, phase, 8)
    assert len(parts) == 5 and parts[-1].collective is None
    assert [p.collective for p in parts[:4]] == [0, 1, 2, 3]
    lists = [kl for p in parts for kl in (p.alone, p.beside, p.after) if kl is not None]
    assert sum(kl.flops for kl in lists) == pytest.approx(kernels.flops)  # tokens divide by tp and by 4
    gemms = {k.name: k for k in kernels.kernels}
    for piece, (_, name, method) in zip(parts, PAIRS[phase]):
        (beside,) = piece.beside.kernels
        g = gemms[name]
        if method == "ring_exchange":  # tp − 1 chunks beside the ring, the last after it
            assert (beside.m, beside.count) == (g.m // 8, 7) and piece.after.kernels[0].m == g.m // 8
            assert piece.share == 1
        elif method == "pipeline":  # the first chunk alone, three beside three quarters of the reduce-scatter
            assert piece.alone.kernels[-1].m == g.m // PIPELINE_SPLITS
            assert (beside.m, beside.count) == (g.m // PIPELINE_SPLITS, PIPELINE_SPLITS - 1)
            assert piece.share == (PIPELINE_SPLITS - 1) / PIPELINE_SPLITS and piece.after is None
        else:  # bulk: the whole GEMM beside the whole collective
            assert beside == g and piece.share == 1 and piece.after is None
    assert pieces(kernels, phase, 8) is parts  # cached per list, as the lists are shared


def test_the_plan_moves_the_same_bytes_beside_the_gemms():
    inline, over = _scenario(False), _scenario(True)
    a, b = build_plan(inline, scenario_workload(inline)), build_plan(over, scenario_workload(over))

    def mp_bytes(plan, stream=None):
        return sum(op.nbytes for op in plan.ops if op.group == "mp" and (stream is None or op.stream == stream))

    assert mp_bytes(a) == mp_bytes(b)
    assert mp_bytes(a, "tp") == 0 and mp_bytes(b, "tp") > 0.7 * mp_bytes(b)
    # every block pass keeps its name on its first op, with its allocations, and its FLOPs in total
    for plan in (a, b):
        assert sum(op.flops for op in plan.ops if op.name.startswith("fwd/layer.1")) == pytest.approx(
            sum(op.flops for op in a.ops if op.name == "fwd/layer.1"))
    first = [op for op in b.ops if op.name == "fwd/layer.1"]
    assert len(first) == 2 and all(op.allocs for op in first)  # one a micro-batch


def test_the_overlap_shortens_a_large_blocks_step_and_leaves_less_in_line():
    big = {"layers": 2, "hidden": 8192, "heads": 64, "seq_len": 4096}
    a, b = simulate(_scenario(False, **big)), simulate(_scenario(True, **big))
    assert b.step_seconds[-1] < a.step_seconds[-1]
    assert b.mp_comm_seconds < 0.5 * a.mp_comm_seconds
    # the chunked GEMMs cost something: compute is not shorter
    assert b.compute_seconds >= a.compute_seconds


def test_a_small_blocks_chunks_cost_more_than_the_overlap_hides():
    """At 128-token chunks (1,024 tokens over TP 8) the GEMMs lose more to chunking than the collectives cost in
    line: zsim's overlap makes this step slower (the chunk count's trade, priced by the GEMM model)."""
    a, b = simulate(_scenario(False)), simulate(_scenario(True))
    assert b.step_seconds[-1] > a.step_seconds[-1]


def test_copied_passes_equal_built_ones():
    s = dataclasses.replace(_scenario(True), grad_accum=4)
    w = scenario_workload(s)
    assert build_plan(s, w) == build_plan(s, w, copy_passes=False)


def _moe(overlap: bool, **parallel):
    return small_scenario(model={"grad_accum": 2, "layers": 2, "hidden": 2048, "heads": 16, "seq_len": 4096,
                                 "moe": {"experts": 8, "top_k": 2}},
                          parallel={"dp": 4, "mp": 8, "ep": 8, "expert_mp": 1, "sequence_parallel": True,
                                    "tp_comm_overlap": overlap, **parallel},
                          zero={"stage": 1, "activation_checkpointing": False}, precision={"dtype": "bf16"},
                          hardware={"profile": "dgx-a100", "nodes": 4})


def test_a_moe_block_overlaps_its_attention_pair_and_runs_its_experts_alone():
    """With each expert whole (expert_mp 1) a MoE block's SP collectives are its attention's all-gather and
    reduce-scatter: overlapped beside qkv and the attention's output projection (backward: its input gradient
    and qkv's weight gradient), the experts' kernels after (forward) or before (backward) them, whole."""
    s = _moe(True)
    w = scenario_workload(s)
    block = next(m for m in w.modules if m.moe)
    assert [op for op, _ in block.mp_collectives_fwd] == ["all_gather", "reduce_scatter"]
    x = StepPass(PlanBuilder(), s, w, 0, 0, ()).shape
    for phase in ("fwd", "bwd"):
        kernels = module_kernels("moe_block", phase, x)
        parts = pieces(kernels, phase, 8, attention_only=True)
        assert len(parts) == 3 and [p.collective for p in parts] == [0, 1, None]
        assert sum(kl.flops for p in parts for kl in (p.alone, p.beside, p.after) if kl is not None) == pytest.approx(
            kernels.flops)
        experts = [k.name for p in parts for kl in (p.alone, p.beside, p.after) if kl is not None
                   for k in kl.kernels if k.name.startswith("moe.experts") and k.kind == "gemm"]
        assert len(experts) == (2 if phase == "fwd" else 4)  # fc1 and fc2 (backward: dgrad and wgrad of each)
        assert experts == [k.name for k in kernels.kernels if k.name.startswith("moe.experts") and k.kind == "gemm"]
        # the experts run after the attention (forward: the tail) or before it (backward: the first piece's own)
        holder = parts[-1].alone if phase == "fwd" else parts[0].alone
        assert {k.name for k in holder.kernels} >= set(experts)
    plain, over = simulate(_moe(False)), simulate(s)
    tp = [op for op in build_plan(s, w).ops if op.stream == "tp"]
    assert tp and {op.group for op in tp} == {"mp"}
    assert over.mp_comm_seconds < plain.mp_comm_seconds


@pytest.mark.parametrize("parallel, model, key", [
    ({"dp": 4, "mp": 8, "sequence_parallel": False, "tp_comm_overlap": True}, {}, "parallel.tp_comm_overlap"),
    ({"dp": 32, "mp": 1, "sequence_parallel": True, "tp_comm_overlap": True}, {}, "parallel.tp_comm_overlap"),
    # experts split across TP (their gathers and scatters are the dispatcher's, not TE's), a shared expert
    ({"dp": 4, "mp": 8, "ep": 4, "sequence_parallel": True, "tp_comm_overlap": True},
     {"moe": {"experts": 4, "top_k": 2}}, "parallel.tp_comm_overlap"),
    ({"dp": 4, "mp": 8, "ep": 4, "expert_mp": 1, "sequence_parallel": True, "tp_comm_overlap": True},
     {"moe": {"experts": 4, "top_k": 2, "shared_experts": 1}}, "parallel.tp_comm_overlap"),
    ({"dp": 4, "mp": 8, "ep": 8, "expert_mp": 1, "sequence_parallel": True, "tp_comm_overlap": True, "ep_overlap": True},
     {"moe": {"experts": 8, "top_k": 2}}, "parallel.tp_comm_overlap"),
])
def test_the_loader_refuses_it_without_sp_or_where_moe_is_not_modelled(parallel, model, key):
    with pytest.raises(ZsimError, match=key.replace(".", r"\.")):
        small_scenario(parallel=parallel, model=model, zero={"stage": 1, "activation_checkpointing": False},
                       precision={"dtype": "bf16"}, hardware={"profile": "dgx-a100", "nodes": 4})
