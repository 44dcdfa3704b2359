"""zero.implementation: stage 3 as DeepSpeed's versions ran it (zsim.zero.implementation), the paper's
schedule by default, and stages 0-2 untouched by the key."""

from __future__ import annotations

import pytest

from tests.conftest import small_scenario
from zsim.engine.simulation import simulate
from zsim.errors import ConfigError
from zsim.zero.implementation import (GATHER_PYTHON_HOST_OPS, PERSISTENCE_THRESHOLD, V014_HOST_OPS_PER_TENSOR, coordinator,
                                      live_grads,
                                      list_copy_launches, list_copy_tail, fetch_host, fetch_prologue, reduce_lists,
                                      unflatten)
from zsim.zero.plan import build_plan, scenario_workload

# Large enough that every block's weight matrices pass the persistence threshold (h 1024: QKV 3.1M,
# dense 1M, the MLP's two 4M elements) while its biases and LayerNorms (1024-4096 elements) do not.
BIG = {"model": {"layers": 4, "hidden": 1024, "heads": 16, "seq_len": 256, "vocab": 5000, "micro_batch": 2},
       "parallel": {"dp": 16, "mp": 1}, "hardware": {"profile": "dgx2", "nodes": 1}}


def _scenario(implementation: str | None = None, stage: int = 3):
    zero = {"stage": stage, "activation_checkpointing": True}
    if implementation:
        zero["implementation"] = implementation
    return small_scenario(zero=zero, **BIG)


def _plan(implementation: str | None = None, stage: int = 3):
    s = _scenario(implementation, stage)
    return s, scenario_workload(s), build_plan(s, scenario_workload(s))


def test_default_is_the_paper_schedule_op_for_op():
    _, _, default = _plan()
    _, _, paper = _plan("paper")
    assert default.ops == paper.ops and default.persistent == paper.persistent


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_stages_0_to_2_do_not_depend_on_the_stage_3_versions(stage):
    ops = {impl: _plan(impl, stage)[2].ops for impl in ("paper", "deepspeed-0.5", "deepspeed-0.14")}
    assert ops["paper"] == ops["deepspeed-0.5"] == ops["deepspeed-0.14"]


@pytest.mark.parametrize("stage", [0, 1])
def test_deepspeed_02_changes_only_stage_2(stage):
    assert _plan("deepspeed-0.2", stage)[2].ops == _plan("paper", stage)[2].ops


def test_deepspeed_02_reduces_each_bucket_to_its_owners():
    """Stage 2 of v0.2 with contiguous gradients (MD): per bucket, one reduce per rank whose partition the
    bucket overlaps; together they move the whole gradient (Ψ elements a pass), and each is at most one
    partition."""
    s = small_scenario(zero={"stage": 2, "activation_checkpointing": True, "implementation": "deepspeed-0.2",
                             "defragment": True, "reduce_bucket_elements": 5_000_000}, **BIG)
    w = scenario_workload(s)
    plan = build_plan(s, w)
    reduces = [op for op in plan.ops if op.collective == "reduce"]
    assert not [op for op in plan.ops if op.collective == "reduce_scatter"]
    psi, nd = w.params_per_mp_rank, s.layout.dp
    assert sum(op.nbytes for op in reduces) == 2 * psi
    assert max(op.nbytes for op in reduces) <= 2 * -(-psi // nd)
    buckets = {op.name.rsplit(".", 1)[0] for op in reduces}
    # each bucket starts a new reduce at every partition boundary it crosses: at least Nd reduces in all
    assert nd <= len(reduces) <= nd + len(buckets)


def test_deepspeed_02_without_contiguous_gradients_all_reduces_each_bucket():
    """Stage 2 of v0.2 without MD (contiguous_gradients false, v0.2.0's default): each bucket flattened,
    all-reduced whole over DP and copied back, on the reduction stream (buffered_reduce_fallback(None)).
    The buckets' all-reduces carry the whole gradient once (e·Ψ bytes a pass), so the DP traffic is 3Ψ
    a step (all-reduce 2Ψ, the parameters' all-gather Ψ) against 2Ψ with MD; the step is no faster."""
    zero = {"stage": 2, "activation_checkpointing": True, "implementation": "deepspeed-0.2",
            "reduce_bucket_elements": 5_000_000}
    s = small_scenario(zero=zero, **BIG)
    w = scenario_workload(s)
    plan = build_plan(s, w)
    dp = [op for op in plan.ops if op.collective and op.group == "dp"]
    reduces = [op for op in dp if op.name.startswith("all_reduce/grads.bucket.")]
    assert {op.collective for op in dp} == {"all_reduce", "all_gather"}  # (and the step's scalar all-reduces)
    assert sum(op.nbytes for op in reduces) == 2 * w.params_per_mp_rank  # fp16: every gradient once
    for op in reduces:  # each between its flatten and its copy-back, on one stream
        what = op.name.split("/", 1)[1]
        flatten, back = (next(o for o in plan.ops if o.name == f"{kind}/{what}") for kind in ("flatten", "copy"))
        assert flatten.stream == op.stream == back.stream and flatten.hbm_bytes == 2 * back.hbm_bytes > 0
    contiguous = small_scenario(zero={**zero, "defragment": True}, **BIG)
    a, b = simulate(s, trace=False), simulate(contiguous, trace=False)
    assert a.step_seconds[0] >= b.step_seconds[0]


def test_deepspeed_02_builds_each_shards_list_on_the_host_and_launches_its_copy_outs_beside_the_gather():
    """v0.2.0's stage-2 step all-gathers the partition in shards, each from a list of Nd narrowed and detached
    views the host builds, and c10d launches the Nd copy-outs while the transfer runs: per shard a 'list' op
    (2·Nd host ops) before the gather, a 'launch' op (Nd) beside it on the host lane, and the copies' GPU time
    after it. The host's 3·Nd ops per shard bound the phase from below."""
    zero = {"stage": 2, "implementation": "deepspeed-0.2", "defragment": True, "allgather_bucket_elements": 2_000_000}
    s = small_scenario(zero=zero, **BIG)
    plan = build_plan(s, scenario_workload(s))
    nd = s.layout.dp
    index = {op.name: i for i, op in enumerate(plan.ops) if op.step == 0}
    shards = sorted(int(n.rsplit(".", 1)[1]) for n in index if n.startswith("all_gather/params.bucket."))
    assert len(shards) > 1
    for j in shards:
        listed, gather = plan.ops[index[f"list/params.bucket.{j}"]], plan.ops[index[f"all_gather/params.bucket.{j}"]]
        launch, copy = plan.ops[index[f"launch/params.bucket.{j}"]], plan.ops[index[f"copy/params.bucket.{j}"]]
        assert listed.stream == launch.stream == "host" and gather.stream == copy.stream == "comm"
        assert index[f"list/params.bucket.{j}"] in gather.deps and index[f"launch/params.bucket.{j}"] in copy.deps
        assert listed.kernels.launches == 2 * nd and launch.kernels.launches == nd and copy.kernels.launches == 0
    spans = _spans(simulate(s))
    start = min(spans[f"list/params.bucket.{j}"][0] for j in shards)
    end = max(spans[f"copy/params.bucket.{j}"][1] for j in shards)
    host_op_us = s.cluster.gpu.compute.host_op_s * 1e6
    assert end - start >= len(shards) * 3 * nd * host_op_us - 1e-6
    paper = small_scenario(zero={**zero, "implementation": "paper"}, **BIG)
    assert not [op for op in build_plan(paper, scenario_workload(paper)).ops if op.stream == "host"]


def test_deepspeed_02_has_no_stage_3():
    with pytest.raises(ConfigError, match="zero.implementation.*v0.3.13"):
        _scenario("deepspeed-0.2")


def _gathers(plan):
    return [op for op in plan.ops if op.collective == "all_gather" and op.group == "dp"]


def test_deepspeed_05_gathers_each_large_tensor_in_line_with_compute():
    s, w, plan = _plan("deepspeed-0.5")
    gathers = _gathers(plan)
    assert gathers and all(op.stream == "compute" for op in gathers)
    fetched = [n for m in w.modules for n in m.tensors if n >= PERSISTENCE_THRESHOLD]
    blocks = [n for n in w.blocks[0].tensors if n >= PERSISTENCE_THRESHOLD]
    assert len(blocks) == 4  # QKV, attention output, the MLP's two
    # per step: every module in forward, and in backward once for a block's recompute and backward
    # together (stage3_max_reuse_distance, 1e9 by default, keeps it between the two)
    assert len(gathers) == 2 * len(fetched)
    nd = s.layout.dp
    assert {op.nbytes for op in gathers} == {2 * nd * -(-n // nd) for n in fetched}


def test_deepspeed_05_reduces_each_tensor_and_copies_its_list():
    s, w, plan = _plan("deepspeed-0.5")
    rs = [op for op in plan.ops if op.collective == "reduce_scatter"]
    assert len(rs) == sum(len(m.tensors) for m in w.modules)
    copies = [op for op in plan.ops if op.name.startswith("copy/grads.bucket")]
    assert copies and all(op.stream == "compute" for op in copies)


def test_host_work_grows_with_the_rank_count():
    """Each gathered or reduced tensor costs Nd narrows and Nd copies (the list API): the host ops of a
    fetch or of a reduction's lists grow linearly with Nd."""
    padded = (4096, 1024)
    for nd in (8, 64, 1024):
        assert fetch_prologue(padded, nd, 2).launches == len(padded)
        assert fetch_host(padded, nd).launches == len(padded) * (nd + GATHER_PYTHON_HOST_OPS)
        assert reduce_lists(padded, nd, 2).launches == len(padded) * 2 * nd
        assert unflatten(padded, nd, 2).launches == len(padded) * (nd + V014_HOST_OPS_PER_TENSOR + 1)


def test_a_gather_costs_the_host_time_deepspeed_measured():
    """At the measurement's Nd = 8 (DeepSpeed issue #1069: pre_launch ~130 µs + launch ~250 µs per
    parameter gather on p4d), the host ops zsim charges around one gather add up to that 380 µs at the
    A100 profile's 10 µs per op, and they sit in a host-only op: nothing hides them behind GPU work."""
    padded, nd = (320 * 8,), 8
    ops = (fetch_prologue(padded, nd, 2).launches + fetch_host(padded, nd).launches
           + list_copy_launches(padded[0], nd).launches)
    assert ops * 10.0 == 380.0
    assert list_copy_tail(padded[0], nd, 2).launches == 0  # the copies' GPU side: launched with the gather
    assert all(k.kind == "host" for k in fetch_host(padded, nd).kernels)


def test_deepspeed_05_runs_the_host_work_between_the_zero_fill_and_the_gather():
    s, w, plan = _plan("deepspeed-0.5")
    names = [op.name for op in plan.ops if op.stream == "compute"]
    fetch = next(i for i, n in enumerate(names) if n.startswith("fetch/params."))
    module = names[fetch].removeprefix("fetch/params.")
    assert names[fetch + 1] == f"fetch_host/params.{module}"
    assert names[fetch + 2].startswith(f"all_gather/params.{module}.")


def _spans(result) -> dict[str, tuple[float, float]]:
    """Step 0's trace events of rank 0 by name: (start, end) in µs."""
    return {e["name"]: (e["ts"], e["ts"] + e["dur"]) for e in result.events
            if e["ph"] == "X" and e["pid"] == 0 and e["args"].get("step") == 0}


def test_deepspeed_05_launches_each_gathers_copies_while_its_transfer_runs():
    """c10d's all_gather launches the list's Nd copies in its post hook, right after enqueueing the transfer:
    on the plan's 'host' lane each tensor's launches start with its gather, the copies' GPU time follows the
    transfer, and the host issues the next gather (or the compute after the fetch) only once it has launched
    them. Across two DGX-2 nodes (DP 32) a fetch of k tensors then costs less than their transfers plus their
    launches in a row."""
    s = small_scenario(zero={"stage": 3, "implementation": "deepspeed-0.5"},
                       model={"layers": 2, "hidden": 1024, "heads": 16, "seq_len": 128, "vocab": 5000, "micro_batch": 1},
                       parallel={"dp": 32, "mp": 1}, hardware={"profile": "dgx2", "nodes": 2})
    plan = build_plan(s, scenario_workload(s))
    launches = [op for op in plan.ops if op.name.startswith("launch/params.")]
    assert launches and all(op.stream == "host" and op.kernels.launches == s.layout.dp for op in launches)
    tails = [op for op in plan.ops if op.name.startswith("copy/params.")]
    assert tails and all(op.kernels.launches == 0 and op.stream == "compute" for op in tails)
    spans = _spans(simulate(s))
    host_op_us = s.cluster.gpu.compute.host_op_s * 1e6
    hidden = 0.0
    for op in launches:
        gather = spans[op.name.replace("launch/", "all_gather/")]
        launch = spans[op.name]
        assert launch[0] == pytest.approx(gather[0])
        assert launch[1] - launch[0] == pytest.approx(s.layout.dp * host_op_us)
        hidden += min(gather[1], launch[1]) - launch[0]
        module, i = op.name.removeprefix("launch/params.").rsplit(".", 1)
        after = spans.get(f"all_gather/params.{module}.{int(i) + 1}") or spans[f"launched/params.{module}"]
        assert after[0] >= launch[1] - 1e-6  # the host is free again only when it has launched them
    # here the launches (32 × 10 µs) outlast the smaller tensors' transfers: some 40% of them hide
    assert hidden > 0.3 * sum(spans[op.name][1] - spans[op.name][0] for op in launches)


def test_deepspeed_05_builds_the_next_tensors_list_while_a_reduce_scatter_runs():
    """v0.3.13's _reduce_scatter_gradients launches each tensor's reduce-scatter (list copies, then the
    collective, async) before building the next tensor's list: a tensor's list waits for no earlier
    reduce-scatter of its bucket, and in the trace some list is built while the previous tensor's
    reduce-scatter is still running."""
    s = small_scenario(zero={"stage": 3, "implementation": "deepspeed-0.5"},
                       model={"layers": 2, "hidden": 1024, "heads": 16, "seq_len": 128, "vocab": 5000, "micro_batch": 1},
                       parallel={"dp": 32, "mp": 1}, hardware={"profile": "dgx2", "nodes": 2})
    plan = build_plan(s, scenario_workload(s))
    index = {op.name: i for i, op in enumerate(plan.ops) if op.step == 0}
    pairs = []
    for name, i in index.items():
        if name.startswith("reduce_scatter/grads.bucket."):
            what, k = name.removeprefix("reduce_scatter/").rsplit(".", 1)
            copy = index[f"copy/{what}.{k}"]
            assert plan.ops[i].deps == (copy,)
            nxt = index.get(f"copy/{what}.{int(k) + 1}")
            if nxt is not None:
                assert i not in plan.ops[nxt].deps
                pairs.append((name, plan.ops[nxt].name))
    spans = _spans(simulate(s))
    assert pairs and any(spans[nxt][0] < spans[rs][1] for rs, nxt in pairs)


def test_deepspeed_014_coalesces_each_module_and_unflattens_it():
    s, w, plan = _plan("deepspeed-0.14")
    _, _, paper = _plan("paper")
    gathers = _gathers(plan)
    assert all(op.stream == "comm" for op in gathers)
    assert len(gathers) == len(_gathers(paper))  # one per module and phase, as the paper's
    unflatten = [op for op in plan.ops if op.name.startswith("unflatten/")]
    assert len(unflatten) == len(gathers)
    # persistent tensors (biases, LayerNorms) are not gathered: fewer bytes than the paper's
    assert sum(op.nbytes for op in gathers) < sum(op.nbytes for op in _gathers(paper))


def test_step_time_orders_the_versions():
    """No overlap and per-tensor gathers (0.5) cannot beat the paper's overlapped per-module gathers;
    v0.14's unflatten copies add to its compute stream. Model states are the same for all."""
    results = {impl: simulate(_scenario(impl)) for impl in ("paper", "deepspeed-0.5", "deepspeed-0.14")}
    step = {k: r.total_seconds for k, r in results.items()}
    assert step["deepspeed-0.5"] > step["paper"]
    assert step["deepspeed-0.5"] > step["deepspeed-0.14"]
    states = {k: r.model_states for k, r in results.items()}
    assert states["paper"] == states["deepspeed-0.5"] == states["deepspeed-0.14"]


def test_an_unknown_implementation_names_the_key_and_value():
    with pytest.raises(ConfigError, match=r"zero.implementation.*deepspeed-0.3"):
        _scenario("deepspeed-0.3")


@pytest.mark.parametrize(("implementation", "stage", "extra"), [
    ("deepspeed-0.2", 2, {}), ("deepspeed-0.2", 2, {"defragment": True}), ("deepspeed-0.5", 3, {}), ("deepspeed-0.14", 3, {}),
    # the coordinator releasing tensors after the recompute and gathering them again
    ("deepspeed-0.5", 3, {"activation_checkpointing": True, "max_reuse_elements": 1_000_000,
                          "prefetch_bucket_elements": 1_000_000})])
def test_class_and_per_rank_modes_agree(implementation, stage, extra):
    """Two nodes (DP 32 over the NICs), symmetric: one rank per class and every rank give the same step."""
    s = small_scenario(zero={"stage": stage, "implementation": implementation, **extra},
                       model={"layers": 2, "hidden": 1024, "heads": 16, "seq_len": 128, "vocab": 5000,
                              "micro_batch": 1},
                       parallel={"dp": 32, "mp": 1}, hardware={"profile": "dgx2", "nodes": 2})
    a, b = simulate(s, "class"), simulate(s, "per_rank")
    assert b.step_seconds == pytest.approx(a.step_seconds, rel=0.01)
    assert b.ledger.peak == a.ledger.peak


def test_host_ops_take_host_time_and_no_gpu_time():
    """A 'host' kernel (a narrow) costs the GPU nothing; a list of them takes launches × host_op_s."""
    from zsim.compute.kernel_list import Kernel, KernelList
    from zsim.compute.model import list_seconds
    s = _scenario("deepspeed-0.5")
    terms = s.cluster.gpu.compute
    gpu = s.cluster.gpu
    narrows = KernelList("narrows", (Kernel("fetch.narrow", "host", count=64),))
    seconds = list_seconds(narrows, terms, gpu.peak_flops["fp16"], gpu.hbm_bytes_per_s, "fp16")
    assert seconds == pytest.approx(64 * terms.host_op_s)


def test_fixed_global_batch_per_gpu_rate_falls_faster_under_deepspeed_05():
    """Global batch fixed, GPUs ×4 (1 to 4 DGX-2 nodes, micro-batch 4 to 1): v0.5's per-tensor gathers
    and Nd-view copies do not shrink with the per-GPU batch, so its per-GPU rate falls further than
    the paper schedule's."""
    def rate(implementation: str, nodes: int) -> float:
        dp = 16 * nodes
        s = small_scenario(zero={"stage": 3, "activation_checkpointing": True, "implementation": implementation},
                           model={**BIG["model"], "micro_batch": 4 // nodes},
                           parallel={"dp": dp, "mp": 1}, hardware={"profile": "dgx2", "nodes": nodes})
        return (4 // nodes) / simulate(s).total_seconds  # samples per second per GPU
    paper = rate("paper", 4) / rate("paper", 1)
    v05 = rate("deepspeed-0.5", 4) / rate("deepspeed-0.5", 1)
    assert v05 < paper


def test_deepspeed_05_waits_for_the_previous_buckets_reduction_before_the_next():
    """v0.3.13's reduce_ipg_grads blocks the host on the reduction stream under overlap_comm: each
    bucket's list copies (on the compute stream) depend on the previous bucket's last reduce-scatter."""
    s = small_scenario(zero={"stage": 3, "activation_checkpointing": True, "implementation": "deepspeed-0.5",
                             "reduce_bucket_elements": 2_000_000}, **BIG)
    plan = build_plan(s, scenario_workload(s))
    firsts = [(i, op) for i, op in enumerate(plan.ops) if op.name.startswith("copy/grads.bucket") and op.name.endswith(".0")]
    assert len(firsts) >= 2
    for (i, prev), (j, op) in zip(firsts, firsts[1:]):
        last_rs = max(k for k in range(i, j) if plan.ops[k].collective == "reduce_scatter")
        assert last_rs in op.deps


# ---- deepspeed-0.5's parameter coordinator: what it holds gathered, what it gathers again -------------
def _block(h: int, t: int = 1) -> tuple[int, ...]:
    """A GPT block's four weight matrices in forward order (QKV, attention output, the MLP's two)."""
    return tuple(n // t for n in (3 * h * h, h * h, 4 * h * h, 4 * h * h))


def test_coordinator_releases_what_is_used_again_too_far_and_gathers_it_again():
    """GPT-175B's block (h 12288): after the recompute, QKV, the attention output and the MLP's first matrix
    are used again in backward beyond stage3_max_reuse_distance (1e9 elements of fetches), so the
    coordinator releases them and gathers them again; the MLP's last matrix, used again at once, is kept."""
    block = _block(12288)
    c = coordinator(block, True, True, 50_000_000, 10**9, 10**9)
    assert sorted(c.refetched) == [0, 1, 2]
    # at most a tensor and the one prefetched after it: the MLP's two (8h², 2/3 of the block)
    assert c.peak_elements == block[2] + block[3]
    # without the recompute nothing is used twice; forward holds the same pair at most
    assert coordinator(block, False, True, 50_000_000, 10**9, 10**9).refetched == ()
    assert coordinator(block, False, False, 50_000_000, 10**9, 10**9).peak_elements == block[2] + block[3]
    # a reuse distance larger than the pass keeps everything: one gather per tensor, as before
    assert coordinator(block, True, True, 50_000_000, 10**9, 10**12).refetched == ()


def test_coordinator_keeps_a_small_block_whole_between_recompute_and_backward():
    """BigScience's 52B under TP 4 (h 8192, their prefetch bucket 6.04e7): every tensor is used again within
    1e9 elements, so the block stays gathered from its recompute through its backward."""
    block = _block(8192, 4)
    c = coordinator(block, True, True, 60_397_977, 10**9, 10**9)
    assert c.refetched == () and c.peak_elements == sum(block)


def test_coordinator_does_not_prefetch_past_the_live_limit():
    """GPT-530B (h 20480): one MLP matrix alone (1.68e9 elements) exceeds stage3_max_live_parameters, so
    nothing is prefetched after it; the peak is a smaller tensor and the one prefetched after it."""
    block = _block(20480)
    c = coordinator(block, False, False, 50_000_000, 10**9, 10**9)
    assert c.peak_elements == block[1] + block[2]
    assert coordinator(block, False, False, 50_000_000, 10**12, 10**9).peak_elements > c.peak_elements


def test_live_grads_is_one_gradient_and_an_oversized_predecessor():
    """Each gradient leaves for the bucket buffer when its hook runs; one larger than the bucket waits for
    the next gradient (stage3.py @ v0.3.13 extra_large_param_to_reduce)."""
    block = _block(12288)
    assert live_grads(block, 5 * 10**8) == block[3] + block[2]  # fc1's gradient arrives while fc2's waits
    assert live_grads(block, 10**10) == max(block)
    assert live_grads((), 5 * 10**8) == 0


def test_deepspeed_05_plan_gathers_released_tensors_again_and_holds_less():
    """In the plan: with a reuse distance under one block's fetches, backward gathers the released tensors
    again (`.again` ops before the block's backward), and a block's gathered memory and gradient are its
    largest tensors', not the whole block's."""
    zero = {"stage": 3, "activation_checkpointing": True, "implementation": "deepspeed-0.5",
            "prefetch_bucket_elements": 1_000_000}
    kept = small_scenario(zero=zero, **BIG)
    released = small_scenario(zero={**zero, "max_reuse_elements": 1_000_000}, **BIG)
    for s, again in ((kept, False), (released, True)):
        w = scenario_workload(s)
        plan = build_plan(s, w)
        assert any(op.name.startswith("fetch/params.layer.0.again") for op in plan.ops) == again
        gathered = [a.nbytes for op in plan.ops for a in op.allocs if a.tag.startswith("gathered.bwd.layer.0.")]
        grads = [a.nbytes for op in plan.ops for a in op.allocs if a.tag.startswith("grad.layer.0.")]
        block = [n for n in w.blocks[0].tensors if n >= PERSISTENCE_THRESHOLD]
        padded = tuple(s.layout.dp * -(-n // s.layout.dp) for n in block)
        peak = coordinator(padded, True, True, 1_000_000, 10**9, s.zero.max_reuse_elements).peak_elements
        assert gathered == [2 * peak]  # one allocation a pass, of the most held at once
        assert grads == [2 * live_grads(w.blocks[0].tensors, s.zero.reduce_bucket_elements)] < [2 * sum(block)]
    # released tensors leave room: the block is never held whole
    assert peak < sum(padded)
    assert simulate(released).step_seconds[0] > simulate(kept).step_seconds[0]


@pytest.mark.parametrize(("implementation", "stage"), [("paper", 3), ("deepspeed-0.14", 3), ("deepspeed-0.5", 2)])
def test_the_coordinators_keys_are_refused_where_no_coordinator_runs(implementation, stage):
    with pytest.raises(ConfigError, match=r"zero.max_reuse_elements.*deepspeed-0.5 at stage 3 only"):
        small_scenario(zero={"stage": stage, "implementation": implementation, "max_reuse_elements": 10}, **BIG)
