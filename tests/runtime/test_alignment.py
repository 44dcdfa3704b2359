"""One op vocabulary (issue 10): a measured run of the runtime and the simulator's plan of the same
configuration line up one to one — every op of every step has exactly one simulated counterpart with
the same name, step, micro-batch and bytes, issued in the same order — for ZeRO stages 0-3, with and
without MP, tied and untied heads, gradient accumulation, checkpointing and several buckets.

The runs are real gloo processes (2 ranks, 2 steps); the simulated side runs on the shipped host
profile (hwprofiles/hosts/dev-2core.yaml: 2 ranks). Timings are not compared here (that is replay's
job): only the vocabulary, the schedule's order and the bytes.
"""

from __future__ import annotations

import json

import pytest

from tests.runtime.conftest import TINY, tiny_model
from zsim.calibrate.replay import align
from zsim.scenario.scenario import build_scenario
from zsim.engine.simulation import simulate
from zsim.report.trace_writer import simulated_trace
from zsim.zero.plan import rank_pieces
from zsim.config.struct import dump

CASES = {  # name: (stage, mp, changes to the run)
    "s0": (0, 1, {}), "s1": (1, 1, {}), "s2": (2, 1, {}), "s3": (3, 1, {}),
    "mp_s0": (0, 2, {}), "mp_s1": (1, 2, {}), "mp_s2": (2, 2, {}), "mp_s3": (3, 2, {}),
    # 2 micro-batches, checkpointing, buckets of about one block, an untied head
    "s2_accum_ckpt_untied": (2, 1, dict(model=tiny_model(grad_accum=2, tied_head=False), checkpointing=True)),
    "s3_accum_ckpt_untied": (3, 1, dict(model=tiny_model(grad_accum=2, tied_head=False), checkpointing=True)),
    "mp_s1_accum": (1, 2, dict(model=tiny_model(grad_accum=2))),
    # stage 2's all-gather after the step in several shards (zsim.zero.buckets.allgather_shards)
    "s2_allgather_shards": (2, 1, dict(allgather_bucket_elements=8_000)),
    "s3_no_prefetch": (3, 1, dict(prefetch_layers=0)),
}


def measured_and_simulated(traced, name: str):
    stage, mp, changes = CASES[name]
    model = changes.get("model", tiny_model())
    run = traced(f"align_{name}", stage=stage, world_size=2, mp=mp, steps=2, **changes)
    zero = {"stage": stage, "activation_checkpointing": changes.get("checkpointing", False),
            "reduce_bucket_elements": 10_000,  # tests/runtime/conftest.py run_config
            "prefetch_layers": changes.get("prefetch_layers", 1)}
    if "allgather_bucket_elements" in changes:
        zero["allgather_bucket_elements"] = changes["allgather_bucket_elements"]
    scenario = build_scenario({
        "model": {k: v for k, v in dump(model).items() if v is not None}, "parallel": {"dp": 2 // mp, "mp": mp}, "zero": zero,
        "precision": {"dtype": "fp32"}, "hardware": {"profile": "dev-2core", "nodes": 1}, "run": {"steps": 2}})
    return run, simulate(scenario)


def comm_order(events: list[dict]) -> list[tuple]:
    """The comm track's collectives in issue order: (name, step, micro_batch, bytes)."""
    comm = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") == "comm" and "group" in e["args"]),
                  key=lambda e: e["ts"])
    return [(e["name"], e["args"]["step"], e["args"]["micro_batch"], e["args"]["bytes"]) for e in comm]


@pytest.mark.parametrize("name", list(CASES))
def test_measured_and_simulated_ops_line_up_one_to_one(traced, name):
    run, result = measured_and_simulated(traced, name)
    for rank in range(2):
        measured = run.trace(rank)["traceEvents"]
        lined = align(measured, result.events)
        assert lined.measured_only == [] and lined.simulated_only == [], (lined.measured_only, lined.simulated_only)
        assert lined.bytes_differ == []
        assert len(lined.pairs) > 20
        assert comm_order(measured) == comm_order(result.events)


@pytest.mark.parametrize("name", ["s3", "mp_s3", "s1", "s2", "mp_s0"])
def test_metadata_means_the_same_on_both_sides(traced, name):
    """`params` is the whole model's Ψ and `params_per_mp_rank` what ZeRO partitions, on both sides;
    optimizer/step carries the elements this rank updates; model states agree to the byte (one
    layout: stage 1's comm intervals, stage 2's padded buckets, stage 3's padded tensors)."""
    run, result = measured_and_simulated(traced, name)
    sim_meta = simulated_trace(result)["metadata"]
    meta = run.trace(0)["metadata"]
    assert meta["params"] == sim_meta["params"] == result.workload.total_params
    assert meta["params_per_mp_rank"] == sim_meta["params_per_mp_rank"] == result.workload.params_per_mp_rank
    steps = [e for e in run.trace(0)["traceEvents"] if e.get("name") == "optimizer/step"]
    sim_steps = [e for e in result.events if e.get("name") == "optimizer/step"]
    measured_elements = [e["args"]["elements"] for e in steps]
    simulated_elements = [e["args"]["elements"] for e in sim_steps]
    states = {c: meta["model_states"][c]["bytes"] for c in ("params", "grads", "optimizer")}
    assert measured_elements == simulated_elements
    assert states == {c: getattr(result.model_states, c) for c in states}
    if result.scenario.zero.stage in (1, 2):  # several pieces, so the per-piece padding is exercised
        assert len(rank_pieces(result.scenario, result.workload)) > 1
    assert meta["host_facts"]["ranks_on_host"] == 2 and meta["host_facts"]["threads_per_rank"] >= 1
    assert meta["host_facts"]["python_gc"].startswith("long-lived objects frozen")


def test_waiting_is_never_inside_a_compute_span(traced):
    """Stage 3: waiting for a gather is its own `wait/` event, outside every fwd/bwd/recompute span
    of the same rank (the issue's measured backward spans included up to 80% of waiting)."""
    run = traced("align_s3_accum_ckpt_untied", stage=3, world_size=2, steps=2, model=tiny_model(
        grad_accum=2, tied_head=False), checkpointing=True)
    for rank in range(2):
        events = [e for e in run.trace(rank)["traceEvents"] if e.get("ph") == "X"]
        waits = [e for e in events if e["name"].startswith("wait/all_gather/params.")]
        spans = [e for e in events if e["name"].split("/")[0] in ("fwd", "bwd", "recompute")]
        assert waits and spans
        for w in waits:
            for s in spans:
                inside = s["ts"] < w["ts"] + w["dur"] / 2 < s["ts"] + s["dur"]
                assert not inside, (w["name"], s["name"])
        assert all(s["args"]["nested_us"] <= s["dur"] + 1e-6 for s in spans)


def test_merged_trace_puts_every_rank_on_one_clock(traced):
    run = traced("align_mp_s3", stage=3, world_size=2, mp=2, steps=2)
    merged = json.loads((run.out / "trace.json").read_text())
    assert merged["metadata"]["ranks"] == [0, 1] and merged["metadata"]["clock_aligned"]
    for rank in range(2):
        own = run.trace(rank)
        offset = own["metadata"]["clock_offset_us"]
        mine = [e for e in merged["traceEvents"] if e.get("pid") == rank and e.get("ph") == "X"
                and not e["name"].startswith("ProfilerStep#")]  # merge adds those (test_merged_trace.py)
        theirs = [e for e in own["traceEvents"] if e.get("ph") == "X"]
        assert len(mine) == len(theirs)
        assert [e["ts"] for e in mine] == pytest.approx([e["ts"] + offset for e in theirs])
    # the same MP all-reduce ends at (about) the same moment on both ranks once on one clock
    ends = {}
    for e in merged["traceEvents"]:
        if e.get("ph") == "X" and e["name"].startswith("all_reduce/mp.") and "seq" in e["args"]:
            ends.setdefault(e["args"]["seq"], []).append(e["ts"] + e["dur"])
    assert ends and all(len(v) == 2 for v in ends.values())


def test_tiny_model_is_padded_like_the_simulator():
    """The runtime pads the vocabulary as the simulator does (128 x MP): TINY's 63 becomes 128."""
    from zsim.runtime.model import gpt_config
    assert gpt_config(tiny_model()).vocab == 128 and gpt_config(tiny_model(), mp=2).vocab == 256
    assert TINY["vocab"] == 63


def test_waiting_for_the_last_rank_is_its_own_event(traced):
    """merge turns `last_arrival_ts` into `wait/arrival/<collective>`: from this rank's issue to the
    last member's, inside the collective's own span, on its track; the ops still line up."""
    run = traced("align_s3", stage=3, world_size=2, steps=2)
    arrivals = 0
    for rank in range(2):
        events = [e for e in run.trace(rank)["traceEvents"] if e.get("ph") == "X"]
        by_seq = {(tuple(e["args"]["group"]), e["args"]["seq"]): e for e in events if "group" in e["args"]}
        for w in (e for e in events if e["name"].startswith("wait/arrival/")):
            arrivals += 1
            owner = next(c for (g, seq), c in by_seq.items() if seq == w["args"]["seq"] and c["name"] == w["args"]["for"])
            assert w["cat"] == owner["cat"] and w["ts"] == owner["ts"]
            assert w["ts"] + w["dur"] == pytest.approx(min(owner["args"]["last_arrival_ts"], owner["ts"] + owner["dur"]))
    assert arrivals > 0  # two ranks never issue every collective at the same instant


def test_zero_cost_bookkeeping_ops_are_not_counted_as_simulated_only():
    """A plan's memory-only ops (Op.memory_only, marked so in the simulated trace: the runtime mirror's
    `bucket/<module>`, `bwd/head.logits`) have no measured span: the alignment leaves them out; any other
    simulated op without a twin is still counted, a zero-length one too."""
    def span(name, dur, **args):
        return {"ph": "X", "name": name, "ts": 0.0, "dur": dur, "args": {"step": 0, "micro_batch": 0, **args}}

    measured = [span("bwd/head", 10.0, flops=1.0)]
    simulated = [span("bwd/head", 9.0, flops=1.0), span("bucket/head", 0.0, flops=0.0, memory_only=True),
                 span("bwd/head.logits", 0.0, flops=0.0, memory_only=True), span("copy/x", 0.0, bytes=8),
                 span("fwd/extra", 3.0, flops=1.0), span("fwd/empty", 0.0, flops=0.0)]
    a = align(measured, simulated)
    assert [k[0] for k in a.simulated_only] == ["copy/x", "fwd/extra", "fwd/empty"]
    assert len(a.pairs) == 1
