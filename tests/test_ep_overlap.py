"""parallel.ep_overlap (Megatron-Core --overlap-moe-expert-parallel-comm): the interleaved schedule's extra warm-up
forward and merged steady-state pairs, the merged pass's order and dependencies as Megatron-Core runs it, the
all-to-alls hidden behind the other pass and no more, and the layouts Megatron-Core refuses."""

from __future__ import annotations

import pytest

from tests.test_moe_pipeline import MOE, moe_pipe
from zsim.engine.pipeline_result import _covered
from zsim.engine.simulation import simulate, workload_and_plan
from zsim.errors import ConfigError
from zsim.memory.ledger import CATEGORIES
from zsim.parallel.pipeline import peak_in_flight, stage_schedule
from zsim.zero.ep_overlap import overlap_passes
from zsim.zero.ops import PlanBuilder

INTERLEAVED = {"pipeline_schedule": "interleaved", "virtual_stages": 2}


@pytest.mark.parametrize("stage", range(4))
def test_schedule_has_one_more_warmup_forward_and_merges_each_steady_pair(stage):
    """schedules.py get_pp_rank_microbatches: one extra warm-up forward; combined_1f1b: each steady-state forward
    and the backward after it run as one step. The items are the plain schedule's, in the same order but one."""
    plain = stage_schedule("interleaved", 4, stage, 8, 2)
    merged = stage_schedule("interleaved", 4, stage, 8, 2, ep_overlap=True)
    warmup = next(k for k, w in enumerate(plain) if w.kind == "bwd") - 1  # the plain warm-up's forwards
    assert next(k for k, w in enumerate(merged) if w.merged) == warmup + 1
    assert sorted((w.kind, w.mb, w.chunk) for w in merged) == sorted((w.kind, w.mb, w.chunk) for w in plain)
    assert not any(w.merged for w in plain)
    pairs = [(a, b) for a, b in zip(merged, merged[1:]) if a.merged and a.kind == "fwd"]
    assert all(b.merged and b.kind == "bwd" for _, b in pairs)
    assert sum(w.merged for w in merged) == 2 * len(pairs) == 2 * (16 - warmup - 1)
    assert peak_in_flight(merged) == peak_in_flight(plain) + 1


def _ops(names: list[str]) -> list[dict]:
    return [dict(name=n, stream="compute", collective="all_to_all" if n.startswith("a2a") else "",
                 group="ep" if n.startswith("a2a") else "") for n in names]


def test_merged_pass_runs_in_megatron_cores_order_with_its_dependencies_explicit():
    """TransformerModelChunkSchedulePlan.run: the forward's embedding, the backward's head, then forward layer i
    beside backward layer n-1-i; each pass's all-to-alls on the comm stream after their block, the pass's next
    compute op waiting for them."""
    b = PlanBuilder()
    b.add(name="before", stream="compute")
    fwd = ["fwd/embed", "fwd/layer.0", "a2a.f0d", "a2a.f0c", "fwd/layer.1", "a2a.f1d", "a2a.f1c", "fwd/head"]
    bwd = ["bwd/layer.3", "a2a.b3d", "a2a.b3c", "bwd/layer.2", "a2a.b2d", "a2a.b2c"]
    for fields in _ops(fwd):
        b.add(deps=(b.last(),), **fields)
    mid = len(b.ops)
    for fields in _ops(bwd):
        b.add(**fields)
    overlap_passes(b, 1, mid, len(b.ops), frozenset({"fwd/layer.0", "fwd/layer.1"}),
                   frozenset({"bwd/layer.3", "bwd/layer.2"}))
    names = [op.name for op in b.ops]
    assert names == ["before", "fwd/embed", "fwd/layer.0", "a2a.f0d", "a2a.f0c", "bwd/layer.3", "a2a.b3d", "a2a.b3c",
                     "fwd/layer.1", "a2a.f1d", "a2a.f1c", "fwd/head", "bwd/layer.2", "a2a.b2d", "a2a.b2c"]
    at = {n: i for i, n in enumerate(names)}
    assert all(op.stream == ("comm" if op.name.startswith("a2a") else "compute") for op in b.ops)
    assert at["fwd/layer.0"] in b.ops[at["a2a.f0d"]].deps and at["bwd/layer.3"] in b.ops[at["a2a.b3d"]].deps
    assert at["a2a.f0c"] in b.ops[at["fwd/layer.1"]].deps and at["a2a.b3c"] in b.ops[at["bwd/layer.2"]].deps
    assert b.ops[at["fwd/layer.0"]].deps == (at["fwd/embed"],)  # the forward chain, its indices moved with it
    assert b.ops[at["fwd/embed"]].deps == (0,)  # a dependency before the two passes stays
    assert (b.last_compute, b.last_comm) == (at["bwd/layer.2"], at["a2a.b2c"])


def _moe_run(overlap: bool):
    """A MoE pipeline whose EP group spans two nodes (its all-to-alls cost about as much as the compute)."""
    return simulate(moe_pipe(moe={**MOE, "experts": 16}, parallel={**INTERLEAVED, "dp": 4, "ep": 4, "ep_overlap": overlap},
                             hardware={"nodes": 2}, model={"layers": 16}), trace=False)


def test_all_to_alls_are_hidden_behind_the_other_pass_and_no_more():
    """Each steady-state pair runs one pass's all-to-alls beside the other's compute: the step shrinks, by at most the
    all-to-all time (nothing else moves), and stays above the compute alone. The traffic is the same."""
    plain, merged = _moe_run(False), _moe_run(True)
    step_plain, step_merged = plain.step_seconds[0], merged.step_seconds[0]
    assert step_merged < step_plain
    assert step_merged > step_plain - plain.ep_comm_seconds
    assert step_merged > merged.compute_seconds
    a2a = {k: (round(v.count, 9), round(v.payload_bytes)) for k, v in plain.comm.items() if k[1] == "all_to_all"}
    assert a2a and a2a == {k: (round(v.count, 9), round(v.payload_bytes)) for k, v in merged.comm.items()
                           if k[1] == "all_to_all"}


def test_only_merged_passes_move_their_all_to_alls_off_the_compute_stream():
    """Warm-up forwards and cool-down backwards run alone, their all-to-alls in line as before."""
    _, plan = workload_and_plan(moe_pipe(parallel={**INTERLEAVED, "ep_overlap": True}))
    a2a = [op for op in plan.ops if op.collective == "all_to_all"]
    on_comm = sum(op.stream == "comm" for op in a2a)
    # stage 0 with p 4, m 8, v 2: 16 chunk passes each way, (4 - 0 - 1)·2 + (2 - 1)·4 + 1 = 11 warm-up forwards
    # alone, 5 merged pairs, each of 2 passes over 2 layers (16 layers in 8 chunks), 2 all-to-alls a layer and pass
    s0 = [op for op in a2a if op.stage == 0]
    assert sum(op.stream == "comm" for op in s0) == 5 * 2 * 2 * 2
    assert 0 < on_comm < len(a2a)


@pytest.mark.parametrize(("sections", "key", "words"), [
    ({"parallel": {**INTERLEAVED, "ep": 1, "ep_overlap": True}}, "parallel.ep_overlap", "only supported with expert"),
    ({"parallel": {"ep_overlap": True}}, "parallel.pipeline_schedule", "set interleaved"),
    ({"parallel": {**INTERLEAVED, "ep_overlap": True}, "zero": {"activation_checkpointing": True}},
     "zero.recompute_granularity", "disable full recomputation"),
    ({"parallel": {**INTERLEAVED, "ep_overlap": True},
      "zero": {"activation_checkpointing": True, "recompute_granularity": "selective", "recompute_modules": ["moe"]}},
     "zero.recompute_modules", "disable moe in recompute_modules"),
    ({"parallel": {**INTERLEAVED, "ep_overlap": True}, "precision": {"dtype": "fp32"}}, "precision.dtype", "bf16 or fp16"),
])
def test_layouts_megatron_core_refuses_are_refused_naming_the_key(sections, key, words):
    with pytest.raises(ConfigError, match=words) as err:
        moe_pipe(**sections)
    assert err.value.path == key


def test_pp1_beyond_zero_1_and_dense_models_are_refused():
    with pytest.raises(ConfigError, match="pp 1 is not modelled") as err:
        moe_pipe(parallel={"pp": 1, "dp": 8, "ep": 2, "ep_overlap": True}, zero={"stage": 3})
    assert err.value.path == "zero.stage"
    from tests.test_pipeline_engine import pipe
    with pytest.raises(ConfigError, match="no experts") as err:
        pipe(parallel={**INTERLEAVED, "ep_overlap": True})
    assert err.value.path == "parallel.ep_overlap"


# ---- pp 1: combined_1f1b_schedule_for_no_pipelining ------------------------------------------------
def _flat(overlap: bool, grad_accum: int = 4, **sections):
    return moe_pipe(moe={**MOE, "experts": 16}, parallel={"pp": 1, "dp": 16, "ep": 16, "ep_overlap": overlap},
                    hardware={"nodes": 2}, model={"layers": 4, "grad_accum": grad_accum}, **sections)


def test_pp1_runs_the_first_forward_alone_then_each_forward_with_the_previous_backward():
    """Megatron-Core (combined_1f1b.py): F0; F1 + B0; ...; F(m-1) + B(m-2); B(m-1). A merged pair's layers
    alternate (forward layer i, backward layer n-1-i) and its all-to-alls run on the comm stream; the first forward's
    and the last backward's stay in line."""
    _, plan = workload_and_plan(_flat(True))
    # (pass, micro-batch) of each block op in plan order, 4 layers a pass
    runs = [(op.name.split("/")[0], op.micro_batch) for op in plan.ops if op.name.startswith(("fwd/layer", "bwd/layer"))]
    assert runs[:4] == [("fwd", 0)] * 4
    assert runs[4:12] == [("fwd", 1), ("bwd", 0)] * 4
    assert runs[-4:] == [("bwd", 3)] * 4
    a2a = [op for op in plan.ops if op.collective == "all_to_all"]
    on_comm = [op for op in a2a if op.stream == "comm"]
    assert {(op.micro_batch, op.name.split(".")[-1]) for op in a2a if op.stream == "compute"} >= {(0, "dispatch")}
    # in line: the first forward's and the last backward's (micro-batches 0 and 3), 4 layers × dispatch and combine each
    in_line = [op for op in a2a if op.stream == "compute"]
    assert {op.micro_batch for op in in_line} == {0, 3} and len(in_line) == 2 * 4 * 2
    # 3 merged pairs, 2 passes each, 4 layers, dispatch and combine
    assert len(on_comm) == 3 * 2 * 4 * 2 and len(a2a) == 4 * 2 * 4 * 2


def test_pp1_overlap_hides_all_to_alls_holds_one_more_micro_batch_and_moves_the_same_traffic():
    plain, merged = (simulate(_flat(o), trace=False) for o in (False, True))
    step_plain, step_merged = plain.step_seconds[0], merged.step_seconds[0]
    assert step_merged < step_plain
    assert step_merged > step_plain - plain.ep_comm_seconds
    assert step_merged > merged.compute_seconds
    a2a = {k: (v.count, round(v.payload_bytes)) for k, v in plain.comm.items() if k[1] == "all_to_all"}
    assert a2a and a2a == {k: (v.count, round(v.payload_bytes)) for k, v in merged.comm.items() if k[1] == "all_to_all"}
    # a pair holds the next micro-batch's activations beside the previous one's
    held = [max(row[CATEGORIES.index("activations")] for row in r.ledger.rows) for r in (plain, merged)]
    assert held[1] > held[0]


def test_pp1_with_one_micro_batch_is_the_plain_run():
    plain, merged = (simulate(_flat(o, grad_accum=1), trace=False) for o in (False, True))
    assert merged.step_seconds[0] == pytest.approx(plain.step_seconds[0], rel=1e-12)


def test_busy_time_counts_overlapping_intervals_once():
    assert _covered([(0.0, 2.0), (1.0, 3.0), (5.0, 6.0), (5.5, 5.7)]) == pytest.approx(4.0)
    assert _covered([]) == 0.0
