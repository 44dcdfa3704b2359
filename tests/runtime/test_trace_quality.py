"""The traces follow docs/trace-schema.md: named phases per layer and micro-batch, collectives with
their facts, memory counters by category, and the metadata block."""

from __future__ import annotations

import re

from tests.runtime.conftest import tiny_model
from zsim.trace.schema import SCHEMA

COLLECTIVE = (r"(all_reduce|reduce_scatter|all_gather)/(params\.(layer\.\d+|embed|head|bucket\.\d+)|"
              r"grads\.bucket\.\d+|(overflow|norm)\.(dp|mp))|all_reduce/mp\.(layer\.\d+|embed|head)")
NAME = re.compile(rf"^((fwd|bwd)/(embed|head|layer\.\d+)|recompute/layer\.\d+|optimizer/(step|overflow|norm|grads_copy)|"
                  rf"({COLLECTIVE})|wait/(arrival/)?({COLLECTIVE}))$")


def test_every_phase_of_every_micro_batch_is_recorded(traced):
    run = traced("accum_s3_ckpt", stage=3, world_size=2, model=tiny_model(grad_accum=2), checkpointing=True)
    for rank in range(2):
        doc = run.trace(rank)
        assert doc["schema"] == SCHEMA
        spans = [e for e in doc["traceEvents"] if e["ph"] == "X"]
        assert all(NAME.match(e["name"]) for e in spans), {e["name"] for e in spans if not NAME.match(e["name"])}
        assert all(e["dur"] >= 0 and e["pid"] == rank for e in spans)
        names = {(e["name"], e["args"]["step"], e["args"]["micro_batch"]) for e in spans}
        for step in range(10):
            for micro in range(2):
                for unit in ("embed", "layer.0", "layer.1", "head"):
                    assert (f"fwd/{unit}", step, micro) in names
                    assert (f"bwd/{unit}", step, micro) in names
                for layer in (0, 1):
                    assert (f"recompute/layer.{layer}", step, micro) in names
            assert any(n == ("optimizer/step", step, 1) for n in names)


def test_collectives_carry_their_facts(traced):
    run = traced("accum_s3_ckpt", stage=3, world_size=2, model=tiny_model(grad_accum=2), checkpointing=True)
    for rank in range(2):
        comms = [e for e in run.trace(rank)["traceEvents"] if e["ph"] == "X" and e["cat"] == "comm"
                 and not e["name"].startswith("wait/")]
        assert comms
        for e in comms:
            args = e["args"]
            assert args["op"] == e["name"].split("/")[0]
            assert args["bytes"] > 0 and args["dtype"] == "fp32" and args["group"] == [0, 1]
            # filled in by merge from both ranks' issue times; this rank's own arrival bounds it below
            assert args["last_arrival_ts"] >= e["ts"]
            assert args["blocked_us"] >= 0 and isinstance(args["seq"], int)


def test_memory_counters_and_metadata(traced):
    run = traced("s2r2", stage=2, world_size=2)
    doc = run.trace(1)
    counters = [e for e in doc["traceEvents"] if e["ph"] == "C"]
    assert counters and all(set(e["args"]) == {"params", "grads", "optimizer", "activations", "buffers"}
                            for e in counters if e["name"] == "memory")
    assert max(e["args"]["activations"] for e in counters) > 0
    assert max(e["args"]["buffers"] for e in counters) > 0  # stage 2 gradient buckets
    meta = doc["metadata"]
    assert meta["source"] == "measured" and meta["rank"] == 1 and meta["zero"]["stage"] == 2
    assert meta["world_size"] == 2 and meta["dp"] == 2 and meta["mp"] == 1
    assert meta["backend"] == "gloo" and meta["device"] == "cpu" and meta["precision"] == "fp32"
    assert meta["model"]["hidden"] == 30 and meta["params"] > 0 and meta["host"]
    assert set(meta["versions"]) == {"zsim", "torch", "python"}
    assert isinstance(meta["clock_offset_us"], float)
    names = {e["name"] for e in doc["traceEvents"] if e["ph"] == "M"}
    assert names == {"process_name", "thread_name"}


def test_mp_all_reduces_run_in_line_on_the_compute_track(traced):
    """Megatron MP: per block 2 all-reduces in forward and 2 in backward, in the MP group (consecutive
    ranks), on the compute track, with the (B, T, C) activation's bytes (Shoeybi et al. §3)."""
    run = traced("mp2s3r4", stage=3, world_size=4, mp=2)
    for rank in range(4):
        events = [e for e in run.trace(rank)["traceEvents"] if e["ph"] == "X"]
        assert all(NAME.match(e["name"]) for e in events)
        mp = [e for e in events if "/mp." in e["name"] and not e["name"].startswith("wait/")]
        assert {e["tid"] for e in mp} == {0}
        assert {tuple(e["args"]["group"]) for e in mp} == {(0, 1) if rank < 2 else (2, 3)}
        blocks = [e for e in mp if "mp.layer." in e["name"]]
        assert {e["args"]["bytes"] for e in blocks} == {2 * 16 * 30 * 4}  # B·s·h fp32
        assert len(blocks) == 10 * 2 * 4  # steps x layers x (2 forward + 2 backward)
        # vocab-parallel embedding (1 in forward) and head (1 in backward of B·s·h; the cross-entropy's
        # max, target logit and sum of exponentials in forward: one fp32 per token each)
        embed = [e["args"]["bytes"] for e in mp if e["name"] == "all_reduce/mp.embed"]
        head = sorted(e["args"]["bytes"] for e in mp if e["name"] == "all_reduce/mp.head")
        assert embed == [2 * 16 * 30 * 4] * 10
        assert head == sorted([2 * 16 * 4] * 30 + [2 * 16 * 30 * 4] * 10)
        assert all("last_arrival_ts" in e["args"] for e in mp)
        dp_groups = {tuple(e["args"]["group"]) for e in events if e["cat"] == "comm" and "group" in e["args"]}
        assert dp_groups == {(0, 2) if rank % 2 == 0 else (1, 3)}
