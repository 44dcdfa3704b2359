"""What a pipeline-parallel simulation measured beyond a plain run: the bubble, read off the simulated
timeline, beside its closed form; the point-to-point time and bytes; each stage's memory.

The bubble of stage s in one step is the share of the pipeline's span (from the step's first op to the
last backward of any stage: the flush) that stage s's compute stream does not work: 1 - busy / span,
busy being the time of its compute-stream ops up to its own last backward (compute, MP collectives in
line, its sends), the waits of its recvs excluded; with parallel.ep_overlap the union of those and its EP
all-to-alls on the comm stream. With equal stages and free transfers it is the closed
form (p - 1)/(m + p - 1) of 1F1B and GPipe, (p - 1)/(v·m + p - 1) interleaved (Narayanan et al. 2021
§2.2; zsim.parallel.pipeline.bubble_fraction); tests/test_pipeline_engine.py checks it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from zsim.memory.ledger import CATEGORIES, MemoryLedger
from zsim.parallel.pipeline import bubble_fraction, peak_in_flight, stage_schedule
from zsim.zero.model_states import ModelStates
from zsim.zero.ops import EP_GROUPS, Plan

if TYPE_CHECKING:
    from zsim.scenario.scenario import Scenario

_PASS = ("fwd/", "recompute/", "bwd/")
_ACT = CATEGORIES.index("activations")


def stage_bubbles(plan: Plan, start: list[float], end: list[float]) -> list[float]:
    """Each stage's bubble share, averaged over the steps (see the module docstring); `start` and `end`
    are the simulated times of every plan op."""
    p, steps = plan.stages, plan.steps
    last = [[-1] * steps for _ in range(p)]  # per stage and step: the index of its last backward op
    span_start = [float("inf")] * steps  # the step's first op (whatever it is)
    span_end = [0.0] * steps  # the step's last forward, recompute or backward op
    for i, op in enumerate(plan.ops):
        span_start[op.step] = min(span_start[op.step], start[i])
        if op.name.startswith(_PASS):
            last[op.stage][op.step] = i
            span_end[op.step] = max(span_end[op.step], end[i])
    intervals: list[list[list[tuple[float, float]]]] = [[[] for _ in range(steps)] for _ in range(p)]
    for i, op in enumerate(plan.ops):
        # the compute stream's work; with parallel.ep_overlap also the EP all-to-alls on the comm stream, which the
        # compute stream waits for when they are not hidden: waiting for them is exposed communication, not bubble
        counted = (op.stream == "compute" and op.collective != "recv") or (
            op.stream == "comm" and op.collective == "all_to_all" and op.group in EP_GROUPS)
        if counted and i <= last[op.stage][op.step]:
            intervals[op.stage][op.step].append((start[i], end[i]))
    busy = [[_covered(intervals[s][k]) for k in range(steps)] for s in range(p)]
    spans = [span_end[k] - span_start[k] for k in range(steps)]
    return [sum(1.0 - busy[s][k] / spans[k] for k in range(steps)) / steps if all(spans) else 0.0 for s in range(p)]


def _covered(intervals: list[tuple[float, float]]) -> float:
    """The time the union of `intervals` covers (overlapping ones counted once)."""
    total, reach = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b > reach:
            total += b - max(a, reach)
            reach = b
    return total


def worst_stage(ledgers: list[MemoryLedger]) -> int:
    """The stage whose memory is the tightest: the first to run out, else the highest reserved peak."""
    return max(range(len(ledgers)), key=lambda s: (ledgers[s].oom is not None, ledgers[s].peak_reserved))


def pipeline_facts(scenario: Scenario, plan: Plan, ledgers: list[MemoryLedger], states: list[ModelStates],
                   bubbles: list[float], comm: dict, steps: int) -> dict[str, Any]:
    """The `pipeline` block of result.json (docs/result-json.md): per rank and step, times in seconds,
    sizes in bytes."""
    par, lay = scenario.parallel, scenario.layout
    p, v, m = par.pp, par.virtual_stages, scenario.grad_accum
    sends, recvs = comm.get(("pp", "send")), comm.get(("pp", "recv"))
    worst = worst_stage(ledgers)
    per_stage = []
    for s, (ledger, st) in enumerate(zip(ledgers, states, strict=True)):
        layers = [op.name.removeprefix("fwd/layer.") for op in plan.ops
                  if op.stage == s and op.step == 0 and op.micro_batch == 0 and op.name.startswith("fwd/layer.")]
        items = stage_schedule(par.pipeline_schedule, p, s, m, v, ep_overlap=par.ep_overlap)
        per_stage.append({
            "stage": s, "ranks": lay.stage_rank_text(s),
            "layers": len(layers), "first_layer": int(layers[0]) if layers else None,
            "in_flight_micro_batches": peak_in_flight(items) if v == 1 else None,
            "in_flight_chunks": peak_in_flight(items),
            "bubble": bubbles[s], "fits": ledger.oom is None,
            "peak_bytes": ledger.peak, "reserved_peak_bytes": ledger.peak_reserved,
            # the most activation bytes held at any moment (the in-flight micro-batches' and the working set)
            "activations_peak_bytes": max((row[_ACT] for row in ledger.rows), default=0),
            "peak_by_category": {c: ledger.peak_by_category[c] for c in CATEGORIES},
            "model_states": st.as_dict(),
        })
    return {
        "schedule": par.pipeline_schedule, "stages": p, "micro_batches": m, "virtual_stages": v,
        "bubble_measured": sum(bubbles) / p,
        "bubble_closed_form": bubble_fraction(par.pipeline_schedule, p, m, v),
        # per rank (the mean over the stages' representatives) and step
        "p2p_send_seconds_per_step": (sends.seconds if sends else 0.0) / p / steps,
        "p2p_recv_wait_seconds_per_step": (recvs.seconds if recvs else 0.0) / p / steps,
        "p2p_sent_bytes_per_step": (sends.sent_bytes if sends else 0.0) / p / steps,
        "p2p_bytes_per_transfer": plan.ops[next(i for i, op in enumerate(plan.ops) if op.group == "pp")].nbytes,
        "worst_stage": worst,
        "per_stage": per_stage,
    }
