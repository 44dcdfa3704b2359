"""Pipeline parallelism in the simulator (issue 27, item 1): the layout's checks, the stage plans and the
contract with the runtime (op names, order, p2p bytes), the simulated bubble against its closed form,
the memory of in-flight micro-batches, the p2p pricing, and the shipped 3D scenarios."""

from __future__ import annotations

import pytest

from tests.conftest import ROOT, scenario_from
from zsim.scenario.scenario import load_scenario
from zsim.engine.simulation import simulate, workload_and_plan
from zsim.errors import ConfigError
from zsim.fabric.p2p import p2p_phases
from zsim.parallel.pipeline import bubble_fraction, stage_schedule
from zsim.report.facts import facts
from zsim.report.summary import summary
from zsim.report.trace_writer import simulated_trace

# Equal stages with negligible transfers: wide layers (a micro-batch's transfer is e·s·b·h bytes against
# 24·s·b·h² forward FLOPs per layer [N21 §5.1], 3× that with backward: at h 8192 on an H100's NVLink the
# transfers of a 4-layer stage are ~0.5% of its compute), a 128-token vocabulary (the embedding and head
# cost next to nothing), no recompute.
UNIFORM = {
    "model": {"layers": 16, "hidden": 8192, "heads": 64, "seq_len": 1024, "vocab": 128, "micro_batch": 1,
              "grad_accum": 8},
    "parallel": {"dp": 2, "mp": 1, "pp": 4},
    "zero": {"stage": 1, "activation_checkpointing": False},
    "precision": {"dtype": "bf16"},
    "hardware": {"profile": "dgx-h100", "nodes": 1},
}


def pipe(**sections):
    return scenario_from(UNIFORM, "pipe", **sections)


# ---- validation -----------------------------------------------------------------------------------
@pytest.mark.parametrize(("sections", "key", "words"), [
    ({"parallel": {"pp": 2}}, "parallel.dp", "× pp 2 = 4 GPUs"),
    ({"model": {"layers": 6}}, "parallel.pp", "do not divide the 6 layers"),
    ({"parallel": {"pp_layers": [1, 2, 2, 2]}}, "parallel.pp_layers", "adding to 7"),
    ({"parallel": {"pp_layers": [4, 4]}}, "parallel.pp_layers", "2 counts"),
    ({"parallel": {"pp_layers": [8, 0, 8, 0]}}, "parallel.pp_layers", "only the first and the last"),
    ({"parallel": {"virtual_stages": 2}}, "parallel.virtual_stages", "interleaved"),
    ({"parallel": {"pipeline_schedule": "interleaved", "virtual_stages": 2}, "model": {"grad_accum": 6}},
     "parallel.pipeline_schedule", "multiple of pp 4"),
    ({"zero": {"stage": 2}}, "zero.stage", "v0.3.16 to v0.16.4"),
    ({"zero": {"stage": 3}}, "zero.stage", "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"),
    ({"fabric": {"mode": "per_rank"}}, "fabric.mode", "per-rank mode"),
    ({"zero": {"activation_checkpointing": True, "checkpoint_every": 3}}, "zero.checkpoint_every", "straddle"),
])
def test_pipeline_layouts_that_do_not_run_are_refused_naming_the_key(sections, key, words):
    with pytest.raises(ConfigError, match=words) as err:
        pipe(**sections)
    assert err.value.path == key


def test_model_states_are_checked_over_the_stages():
    """12.9B parameters at ZeRO-1 over DP 2 need 10 bytes each (129 GB) on one rank, a quarter of that on
    each of 4 stages: the layout fits; over 2 stages (64 GB a stage) with 48 layers (3 × that) it does not,
    and the error says so and offers no ZeRO-2/3 (which pipelines refuse)."""
    assert pipe().parallel.pp == 4
    with pytest.raises(ConfigError) as err:
        pipe(model={"layers": 48}, parallel={"pp": 2, "dp": 4})
    assert err.value.path == "zero.stage" and "on average over the 2 pipeline stages" in str(err.value)
    assert "ZeRO stage 2" not in str(err.value) and "pipeline stages (pp)" in str(err.value)


def test_stages_that_straddle_nodes_are_refused():
    with pytest.raises(ConfigError, match="straddle") as err:
        pipe(parallel={"dp": 3, "mp": 2, "pp": 4}, model={"layers": 8}, hardware={"nodes": 3})
    assert err.value.path == "parallel.pp"


def test_a_caller_asking_per_rank_mode_gets_a_typed_error():
    with pytest.raises(ConfigError, match="per-rank mode"):
        simulate(pipe(), mode="per_rank", trace=False)


# ---- the plan: the contract with the runtime ------------------------------------------------------
def _stage_ops(plan, stage):
    return [op for op in plan.ops if op.stage == stage and op.step == 0]


def test_each_stage_runs_its_schedule_in_the_contracts_order():
    s = pipe()
    _, plan = workload_and_plan(s)
    p, m = 4, 8
    for st in range(p):
        ops = _stage_ops(plan, st)
        layers = sorted({int(op.name.split(".")[-1]) for op in ops if op.name.startswith("fwd/layer.")})
        assert layers == [4 * st + i for i in range(4)]  # 16 layers over 4 stages
        assert any(op.name == "fwd/embed" for op in ops) == (st == 0)
        assert any(op.name == "fwd/head" for op in ops) == (st == p - 1)
        # the compute and p2p ops in order, one (kind, mb) per Work item, as the schedule lists them
        walked = []
        for op in ops:
            kind = op.name.split("/")[0]
            if op.name in ("recv/pp.fwd", "recv/pp.bwd") or (kind in ("fwd", "bwd") and
                                                              (not walked or walked[-1][2] != op.micro_batch
                                                               or walked[-1][0] != kind)):
                walked.append((kind, op.name, op.micro_batch))
        expected = []
        for w in stage_schedule("1f1b", p, st, m):
            if w.kind == "fwd":
                expected += [("recv", "recv/pp.fwd", w.mb)] if st > 0 else []
                expected += [("fwd", f"fwd/{'embed' if st == 0 else f'layer.{4 * st}'}", w.mb)]
            else:
                expected += [("recv", "recv/pp.bwd", w.mb)] if st < p - 1 else []
                expected += [("bwd", f"bwd/{'head' if st == p - 1 else f'layer.{4 * st + 3}'}", w.mb)]
        assert walked == expected
        sends = [op for op in ops if op.name.startswith("send/")]
        assert len(sends) == m * ((st < p - 1) + (st > 0))
        # on the compute stream, a send follows the chunk's last forward or backward op, on the same micro-batch
        ops = [op for op in ops if op.stream == "compute"]
        for i, op in enumerate(ops):
            if op.name == "send/pp.fwd":
                assert ops[i - 1].name.startswith("fwd/") and ops[i - 1].micro_batch == op.micro_batch
            if op.name == "send/pp.bwd":
                assert ops[i - 1].name.startswith("bwd/") and ops[i - 1].micro_batch == op.micro_batch


def test_a_recv_waits_for_its_matching_send_on_the_neighbouring_stage():
    _, plan = workload_and_plan(pipe(parallel={"pipeline_schedule": "interleaved", "virtual_stages": 2}))
    recvs = [op for op in plan.ops if op.collective == "recv"]
    assert len(recvs) == 2 * 8 * (4 * 2 - 1)  # forward and backward, m micro-batches, pv - 1 hops
    for op in recvs:
        send = plan.ops[op.deps[-1]]
        assert send.collective == "send" and send.group == "pp" and send.micro_batch == op.micro_batch
        assert send.name.split("/")[1] == op.name.split("/")[1]  # pp.fwd <- pp.fwd, pp.bwd <- pp.bwd
        hop = 1 if op.name == "recv/pp.fwd" else -1
        assert send.stage == (op.stage - hop) % 4  # interleaved: stage 0's chunk 1 hears from stage 3


@pytest.mark.parametrize(("mp", "sp"), [(1, False), (2, False), (2, True)])
def test_p2p_bytes_are_one_ranks_share_of_the_activation(mp, sp):
    s = pipe(parallel={"dp": 2 // mp, "mp": mp, "pp": 4, "sequence_parallel": sp})
    _, plan = workload_and_plan(s)
    m = s.model
    # e·s·b·h, / mp under SP or Megatron's scatter/gather (Narayanan et al. 2021 §4.1)
    assert {op.nbytes for op in plan.ops if op.collective in ("send", "recv")} == {2 * m.seq_len * m.micro_batch * m.hidden // mp}


def test_1f1b_keeps_p_minus_s_micro_batches_in_flight_on_stage_s():
    """Walk each stage's allocations: a micro-batch's activations live from its forward to its backward."""
    _, plan = workload_and_plan(pipe())
    for st in range(4):
        live: dict[str, int] = {}
        peak = 0
        for op in _stage_ops(plan, st):
            for a in op.allocs:
                if a.tag.startswith("act"):
                    live[a.tag] = op.micro_batch
            for tag in op.frees:
                live.pop(tag, None)
            peak = max(peak, len(set(live.values())))
        assert peak == 4 - st


# ---- the engine: bubble, memory, p2p ---------------------------------------------------------------
@pytest.mark.parametrize(("schedule", "v"), [("1f1b", 1), ("gpipe", 1), ("interleaved", 2)])
def test_simulated_bubble_is_the_closed_form_on_equal_stages(schedule, v):
    s = pipe(parallel={"pipeline_schedule": schedule, "virtual_stages": v})
    r = simulate(s, trace=False)
    pp = r.pipeline
    closed = bubble_fraction(schedule, 4, 8, v)
    assert pp["bubble_closed_form"] == closed
    # transfers only add idle time; here they are ~0.5% of a stage's compute (~1% interleaved: twice the hops)
    assert closed <= pp["bubble_measured"] < closed + 0.006, (pp["bubble_measured"], closed)
    assert all(closed - 0.002 < st["bubble"] < closed + 0.008 for st in pp["per_stage"]), pp["per_stage"]


def test_in_flight_activation_memory_per_stage():
    r = simulate(pipe(), trace=False)
    w = r.workload
    per_mb = 4 * w.blocks[0].saved_bytes  # the four layers' saved activations of one micro-batch on a stage
    act = [st["activations_peak_bytes"] for st in r.pipeline["per_stage"]]
    assert [st["in_flight_micro_batches"] for st in r.pipeline["per_stage"]] == [4, 3, 2, 1]
    assert act[1] - act[2] == per_mb  # middle stages: equal layers, one micro-batch more in flight
    g = simulate(pipe(parallel={"pipeline_schedule": "gpipe"}), trace=False)
    gact = [st["activations_peak_bytes"] for st in g.pipeline["per_stage"]]
    assert gact[1] == gact[2] and gact[1] - act[1] == (8 - 3) * per_mb  # GPipe: all m in flight everywhere


def test_p2p_traffic_and_its_trace_events():
    s = pipe()
    r = simulate(s)
    pp = r.pipeline
    nbytes = 2 * 1024 * 8192
    assert pp["p2p_bytes_per_transfer"] == nbytes
    # stage 0 sends m activations, the last stage m gradients, the middle ones both: 2m(p - 1) transfers
    assert pp["p2p_sent_bytes_per_step"] == 2 * 8 * 3 * nbytes / 4
    assert pp["p2p_send_seconds_per_step"] > 0
    events = [e for e in r.events if e.get("ph") == "X" and e["name"].endswith(("/pp.fwd", "/pp.bwd"))]
    assert {e["cat"] for e in events} == {"comm"}
    assert {e["pid"] for e in events} == {0, 2, 4, 6}  # one representative per stage: ranks s·dp·mp
    assert all(e["args"]["group"] == "pp" and e["args"]["bytes"] == nbytes and "micro_batch" in e["args"]
               and "step" in e["args"] for e in events)
    meta = simulated_trace(r)["metadata"]
    assert meta["groups"]["pp"] == [0, 2, 4, 6] and [c["pid"] for c in meta["rank_classes"]] == [0, 2, 4, 6]
    f = facts(r)
    assert f["layout"]["pp"] == 4 and f["pipeline"]["stages"] == 4
    assert len(f["simulation"]["rank_classes"]) == 4
    text = summary(f)
    assert "pipeline  1f1b over p 4 stages, m 8 micro-batches: bubble" in text and "DP 2 × MP 1 × PP 4" in text


def test_p2p_inside_a_node_uses_nvlink_and_across_nodes_the_nic():
    s = pipe()
    inside, phases_in = p2p_phases(16 << 20, s.cluster, s.layout, 0, 1)
    assert inside == "p2p/nvlink" and phases_in[0].links[0][0] == ("nvlink", 0)
    big = load_scenario(ROOT / "scenarios" / "llama-3-70b-3d-dgx-h100.yaml")
    across, phases_out = p2p_phases(16 << 20, big.cluster, big.layout, 1, 2)
    assert across == "p2p/net" and phases_out[0].links[0][0] == ("nic", 0, 1)  # stage 1's own NIC pool
    assert phases_out[0].links[0][1] == 8  # the node's 8 ranks of the stage send at once, over its 8 NICs
    assert phases_out[0].latency_s > phases_in[0].latency_s


def test_stages_share_no_link_in_class_mode():
    """Each stage's representative sits on other GPUs: its links are its own copies of stage 0's, and a
    collective of stage s runs on them."""
    from zsim.engine.run_state import fabric_capacities

    s = pipe()
    caps = fabric_capacities(s, per_rank=False)
    for stage in (1, 2, 3):
        assert caps[("nvlink", 0, stage)] == caps[("nvlink", 0)] and caps[("nic", 0, stage)] == caps[("nic", 0)]
    r = simulate(s, trace=False)
    assert len(r.stage_ledgers) == 4 and ("dp", "reduce_scatter") in r.comm


# ---- shipped scenarios --------------------------------------------------------------------------------
def test_llama_3_70b_3d_scenario():
    s = load_scenario(ROOT / "scenarios" / "llama-3-70b-3d-dgx-h100.yaml")
    assert (s.layout.mp, s.layout.pp, s.layout.dp, s.grad_accum) == (8, 4, 16, 32)
    r = simulate(s, trace=False)
    pp = r.pipeline
    assert r.fits and pp["bubble_closed_form"] == pytest.approx(3 / 35)
    assert [st["in_flight_micro_batches"] for st in pp["per_stage"]] == [4, 3, 2, 1]
    assert [st["layers"] for st in pp["per_stage"]] == [20] * 4
    assert pp["p2p_bytes_per_transfer"] == 2 * 8192 * 8192 // 8  # SP: s/t tokens of each rank
    # stage 0 holds the most micro-batches in flight: the tightest
    assert pp["worst_stage"] == 0 and r.ledger is r.stage_ledgers[0]
    peaks = [st["activations_peak_bytes"] for st in pp["per_stage"]]
    assert peaks == sorted(peaks, reverse=True)


@pytest.mark.parametrize(("name", "layout", "bubble"), [
    ("ptdp-145.6B-1536gpu", (8, 8, 24, 96, 1536), 7 / 199),  # Table 1: interleaved, v 2
    ("ptdp-gpt3-175B-384gpu", (8, 12, 4, 384, 384), 11 / 395),  # Table 2: 1F1B
])
def test_ptdp_scenarios_load_their_published_layouts(name, layout, bubble):
    """Loaded, not simulated: a pipeline simulates every micro-batch (these take ~10 s and ~1 min of CPU)."""
    s = load_scenario(ROOT / "scenarios" / "megatron" / f"{name}.yaml")
    assert (s.layout.mp, s.layout.pp, s.layout.dp, s.grad_accum, s.layout.world) == layout
    par = s.parallel
    assert bubble_fraction(par.pipeline_schedule, par.pp, s.grad_accum, par.virtual_stages) == pytest.approx(bubble)


def test_the_tightest_stage_is_reported_when_one_runs_out_of_memory():
    """Stage 0 holds p micro-batches under 1F1B, the last stage one: with activations the largest part
    (narrower layers, a longer sequence), 12 GiB is too little for stage 0 only."""
    r = simulate(pipe(model={"layers": 8, "hidden": 4096, "heads": 32, "seq_len": 2048},
                      hardware={"gpu_memory_GiB": 12}), trace=False)
    fits = [st["fits"] for st in r.pipeline["per_stage"]]
    assert fits == [False, True, True, True] and not r.fits and r.pipeline["worst_stage"] == 0
    assert facts(r)["memory"]["oom"]["rank_class"] == "pipeline stage 0 (ranks 0-1)"


def test_a_stated_uneven_split_puts_its_layers_on_each_virtual_stage():
    """pp_layers lists virtual stages in order: virtual stage c·p + s is chunk c of stage s."""
    s = pipe(parallel={"pipeline_schedule": "interleaved", "virtual_stages": 2,
                       "pp_layers": [1, 2, 2, 3, 3, 2, 2, 1]})
    _, plan = workload_and_plan(s)
    held = {st: sorted({int(op.name.rsplit(".", 1)[1]) for op in _stage_ops(plan, st)
                        if op.name.startswith("fwd/layer.")}) for st in range(4)}
    assert held == {0: [0, 8, 9, 10], 1: [1, 2, 11, 12], 2: [3, 4, 13, 14], 3: [5, 6, 7, 15]}
    r = simulate(pipe(parallel={"pp_layers": [2, 6, 4, 4]}), trace=False)
    layers = [st["layers"] for st in r.pipeline["per_stage"]]
    assert layers == [2, 6, 4, 4] and r.pipeline["per_stage"][1]["bubble"] < r.pipeline["per_stage"][0]["bubble"]
    assert r.pipeline["bubble_measured"] > r.pipeline["bubble_closed_form"]  # unequal stages idle more


def test_the_first_and_last_virtual_stage_may_hold_only_the_embedding_and_the_head():
    """Megatron-Core's --account-for-embedding-in-pipeline-split / --account-for-loss-in-pipeline-split count the
    embedding and the loss as a layer each: with as many virtual stages as layers + 2 the first holds only the
    embedding and the last only the head. The stages then carry those modules' states alone and idle the most."""
    from zsim.parallel.pipeline import split_layers

    assert [len(r) for r in split_layers(6, 4, 2, (0, 1, 1, 1, 1, 1, 1, 0)).layers[0]] == [0, 1]
    with pytest.raises(ValueError, match="only the first and the last"):
        split_layers(6, 4, 1, (3, 0, 3, 0))
    s = pipe(parallel={"pp_layers": [0, 8, 8, 0]})
    w, plan = workload_and_plan(s)
    assert not any(op.name.startswith("fwd/layer.") for op in _stage_ops(plan, 0))
    assert any(op.name.startswith("fwd/") for op in _stage_ops(plan, 0))  # its embedding still runs
    r = simulate(s, trace=False)
    per = r.pipeline["per_stage"]
    assert [st["layers"] for st in per] == [0, 8, 8, 0]
    e = 2  # bf16 parameters; ZeRO-1 keeps them whole
    assert per[0]["model_states"]["params"] == e * w.modules[0].params  # the embedding (tied head: stage 3 too)
    assert per[0]["bubble"] > per[1]["bubble"] and r.pipeline["bubble_measured"] > r.pipeline["bubble_closed_form"]
