"""Gradient accumulation by splicing a repeating micro-batch (zsim.engine.repeat) gives the full simulation's
Result: counts, bytes, memory peaks, the memory timeline's values and the allocator's states exactly;
times to round-off. Why not to the bit: the full simulation reaches a time t + k·P by k additions of
durations to simpy's clock, the splice adds k·P once; both are float64, so they differ in the last
digits (measured: a few 1e-15 of the step). A duration read off that clock (end − start) carries the
round-off of the clock's reading, ~1e-16 of the step, not of itself: a sum of n of them is compared to
n × the tolerance × the step. The tolerance: TIME_TOL = 1e-12, or where larger the bound on the full
simulation's own round-off, one half-ulp (2^-53) of the clock per event it scheduled (each event's time
is one float addition to the clock): the flagship at ga 64 schedules 388k events and its step differs
from the splice's by 7e-13 (the bound: 4e-11). Both are far below any difference of a schedule (one
micro-batch is ~1e-2 of a step of 64)."""

import json
import math

import pytest

from zsim.scenario.scenario import load_scenario
from zsim.engine import repeat, shifted_unit
from zsim.engine.simulation import simulate
from tests.golden.engine_bits import CASES, FILE, FLAGSHIP, ROOT, SMALL

TIME_TOL = 1e-12

# (scenario, overrides, micro-batches the proof simulates) where it holds at every stage: the 7.5B example
# at 6 layers (stages 0-1: the last micro-batch reduces, so the unit is one before it, and the allocator
# settles after 2: 5 are simulated; stages 2-3: every micro-batch after the first is the first shifted,
# zsim.engine.shifted_unit: 1), stage 2 without overlap_comm (with it the reduce-scatters fall further
# behind every micro-batch: no clean boundary, see below), and the flagship (stage 1: the allocator has
# settled by the second: 3).
STAGES = {
    0: (SMALL, ("model.layers=6", "zero.stage=0"), 5),
    1: (SMALL, ("model.layers=6", "zero.stage=1"), 5),
    2: (SMALL, ("model.layers=6", "zero.stage=2", "zero.overlap_comm=false"), 1),
    3: (SMALL, ("model.layers=6",), 1),
    "flagship-1": (FLAGSHIP, ("model.layers=4", "zero.stage=1"), 3),
    "flagship-3": (FLAGSHIP, ("model.layers=4",), 1),
}


def _scenario(path, overrides, accum):
    return load_scenario(ROOT / path, [*overrides, f"model.grad_accum={accum}", "model.global_batch=null"])


def _close(a, b, clock=0.0, tol=TIME_TOL):
    """Equal to `tol` of themselves, or of `clock` (s): the time their round-off comes from."""
    return math.isclose(a, b, rel_tol=tol, abs_tol=tol * clock)


def tolerance(full) -> float:
    """TIME_TOL, or the bound on `full`'s own round-off where larger (module docstring)."""
    return max(TIME_TOL, full.sim_events * 2.0**-53)


def _same_events(spliced, full, tol):
    """Equal trace events, as multisets: the same names, tracks and args, timestamps to round-off."""
    assert len(spliced) == len(full)

    def key(e):
        args = {k: v for k, v in e["args"].items() if k != "wait_us"}
        return e["ph"], e["name"], e.get("tid", -1), repr(sorted(args.items())) if e["ph"] == "X" else "", e["ts"]

    a, b = sorted(spliced, key=key), sorted(full, key=key)
    for x, y in zip(a, b):
        assert key(x)[:4] == key(y)[:4], (x, y)
        assert _close(x["ts"], y["ts"], tol=tol), (x, y)
        if x["ph"] == "X":  # µs read off the clock
            assert _close(x["dur"], y["dur"], max(x["ts"], y["ts"]), tol), (x, y)
        else:
            assert x["args"] == y["args"], (x, y)  # memory counters: exact bytes


def _same_ledger(a, b, tol):
    if a is None or b is None:
        assert a is b
        return
    assert a.rows == b.rows and a.reserved_rows == b.reserved_rows  # every state of the timeline, exactly
    assert len(a.times) == len(b.times) and all(_close(x, y, tol=tol) for x, y in zip(a.times, b.times))
    assert (a.peak, a.peak_by_category, a.peak_reserved) == (b.peak, b.peak_by_category, b.peak_reserved)
    assert _close(a.peak_time, b.peak_time, tol=tol) and _close(a.peak_reserved_time, b.peak_reserved_time, tol=tol)
    assert len(a.flush_times) == len(b.flush_times)
    assert all(_close(x, y, tol=tol) for x, y in zip(a.flush_times, b.flush_times))
    assert a.oom == b.oom and a.totals == b.totals
    assert (a.allocator is None) == (b.allocator is None)
    if a.allocator is not None:
        assert a.allocator.state(repeat._mb_free) == b.allocator.state(repeat._mb_free)


def assert_same_result(spliced, full):
    """Every number of the two Results: exact where it is a count, bytes or memory, else to TIME_TOL."""
    tol = tolerance(full)
    assert len(spliced.step_seconds) == len(full.step_seconds)
    assert all(_close(a, b, tol=tol) for a, b in zip(spliced.step_seconds, full.step_seconds)), \
        (spliced.step_seconds, full.step_seconds)
    clock = full.total_seconds
    ops = sum(c.count for c in full.comm.values())
    for name in ("compute_seconds", "mp_comm_seconds", "ep_comm_seconds", "offload_seconds"):
        assert _close(getattr(spliced, name), getattr(full, name), clock * ops, tol), name
    assert _close(spliced.hardware_flops, full.hardware_flops)
    assert spliced.model_flops == full.model_flops
    assert spliced.comm.keys() == full.comm.keys()
    for key, s in spliced.comm.items():
        f = full.comm[key]
        assert (s.count, s.payload_bytes) == (f.count, f.payload_bytes), key
        assert _close(s.sent_bytes, f.sent_bytes) and _close(s.seconds, f.seconds, clock * f.count, tol), key
    assert spliced.algorithms == full.algorithms
    assert spliced.model_states == full.model_states and spliced.scenario == full.scenario
    assert spliced.step_memory_states == full.step_memory_states
    _same_ledger(spliced.ledger, full.ledger, tol)
    _same_ledger(spliced.host_ledger, full.host_ledger, tol)
    _same_events(spliced.events, full.events, tol)


@pytest.mark.parametrize("accum", [2, 8, 64])
@pytest.mark.parametrize("case", list(STAGES))
def test_spliced_step_equals_the_full_simulation(case, accum):
    path, overrides, simulated = STAGES[case]
    scenario = _scenario(path, overrides, accum)
    spliced = simulate(scenario, mode="class")
    full = simulate(scenario, mode="class", repeat=False)
    assert full.repeated_micro_batches == 0
    # ga 2 is below the micro-batches the proofs cover (repeat.applies): every one is simulated
    assert spliced.repeated_micro_batches == (accum - simulated if accum > repeat.REDUCED[0] else 0)
    if spliced.repeated_micro_batches:
        assert spliced.sim_events < full.sim_events
    assert_same_result(spliced, full)


@pytest.mark.parametrize("name", ["flagship-class-ga4", "flagship-class-ga64"])
def test_spliced_flagship_step_matches_the_recorded_full_simulation(name):
    """The whole flagship at ga 4 and 64, against the step time the full simulation recorded
    (tests/golden/engine_bits.json), to the bound of that simulation's own round-off: 4.3e-11 at ga 64
    (388k events), where the two differ by 7e-13."""
    path, overrides, mode = CASES[name]
    spliced = simulate(load_scenario(ROOT / path, list(overrides)), mode=mode, trace=False)
    recorded = json.loads(FILE.read_text())[name]["step_seconds"]
    full_events = {"flagship-class-ga4": 24_274, "flagship-class-ga64": 387_934}[name]  # bench_run.py prints them
    assert spliced.repeated_micro_batches > 0
    [want] = json.loads(recorded)
    assert math.isclose(spliced.step_seconds[0], want, rel_tol=full_events * 2.0**-53)


ZERO_R = {  # ZeRO-R options (the host ledger of Pa+cpu, MD's arenas, the fused buffer without CB)
    "pa": (FLAGSHIP, ("model.layers=4", "zero.partition_activations=true")),
    "pa+cpu": (FLAGSHIP, ("model.layers=4", "zero.partition_activations=true", "zero.cpu_offload_activations=true")),
    "md+pa": (FLAGSHIP, ("model.layers=4", "zero.defragment=true", "zero.partition_activations=true")),
    "no checkpointing": (SMALL, ("model.layers=4", "zero.activation_checkpointing=false")),
    "no cb": (SMALL, ("model.layers=4", "zero.constant_buffers=false", "zero.stage=2", "zero.overlap_comm=false")),
}


@pytest.mark.parametrize("case", list(ZERO_R))
def test_spliced_step_equals_the_full_simulation_with_zero_r(case):
    path, overrides = ZERO_R[case]
    scenario = _scenario(path, overrides, 8)
    spliced = simulate(scenario, mode="class")
    assert spliced.repeated_micro_batches > 0
    assert_same_result(spliced, simulate(scenario, mode="class", repeat=False))


def test_without_trace_the_totals_are_the_same():
    scenario = _scenario(FLAGSHIP, ("model.layers=4",), 16)
    spliced = simulate(scenario, mode="class", trace=False)
    full = simulate(scenario, mode="class", trace=False, repeat=False)
    assert spliced.repeated_micro_batches == 15 and spliced.events == [] == full.events
    assert_same_result(spliced, full)


def test_a_comm_stream_that_falls_behind_is_simulated_in_full():
    """Stage 2 with overlap_comm: each micro-batch's reduce-scatters end after the next one has started,
    later every time, so no boundary is clean and nothing is spliced."""
    scenario = _scenario(SMALL, ("model.layers=6", "zero.stage=2"), 8)
    result = simulate(scenario, mode="class")
    assert result.repeated_micro_batches == 0
    assert result.step_seconds == simulate(scenario, mode="class", repeat=False).step_seconds


def test_runs_the_proof_does_not_cover_are_simulated_in_full():
    """Per-rank mode, several steps, a CPU host: every micro-batch is simulated."""
    per_rank = _scenario(SMALL, ("model.layers=2",), 8)
    assert simulate(per_rank, mode="per_rank").repeated_micro_batches == 0
    steps = _scenario(SMALL, ("model.layers=2", "run.steps=2"), 8)
    assert not repeat.applies(steps, per_rank=False, overridden=False)
    assert simulate(steps, mode="class").repeated_micro_batches == 0
    assert not repeat.applies(_scenario(SMALL, ("model.layers=2",), 8), per_rank=False, overridden=True)


def test_an_unsettled_allocator_is_not_spliced(monkeypatch):
    """The memory check can fail: with the allocator's state made to differ at every micro-batch, the
    proof refuses and the step is simulated in full (the same numbers as repeat=False)."""
    real = repeat.memory_state
    counter = iter(range(10**6))
    monkeypatch.setattr(repeat, "memory_state", lambda ledger: (real(ledger), next(counter)))
    scenario = _scenario(FLAGSHIP, ("model.layers=4",), 8)
    result = simulate(scenario, mode="class")
    assert result.repeated_micro_batches == 0
    assert result.step_seconds == simulate(scenario, mode="class", repeat=False).step_seconds


def test_a_schedule_that_drifts_is_not_spliced(monkeypatch):
    """The timing check can fail: an op of the unit made one microsecond slower than its counterpart
    (repeat's proof from 2 or more simulated micro-batches; the one-micro-batch proof made to fail
    first, as in the next test)."""
    monkeypatch.setattr(shifted_unit, "proven", lambda probe, reduced: None)
    real = repeat._starts

    def drifting(run):
        start = real(run)
        n = run.s.grad_accum
        i = next(i for i, op in enumerate(run.plan.ops) if op.micro_batch == n - 2 and op.stream == "compute")
        run.end_time[i] += 1e-6
        return start

    monkeypatch.setattr(repeat, "_starts", drifting)
    assert simulate(_scenario(FLAGSHIP, ("model.layers=4",), 8), mode="class").repeated_micro_batches == 0


def test_two_ops_ending_the_micro_batch_together_leave_the_shift_unproven(monkeypatch):
    """The boundary must be one op's end: with another op of the first micro-batch made to end at the
    same instant, the order of what the second's first ops do there is not the engine's to force, so
    the one-micro-batch proof fails and repeat's runs of 2 micro-batches splice the step instead."""
    real = shifted_unit.proven

    def tied(probe, reduced):
        end, n0 = probe.run.end_time, probe.n0
        t0 = max(end[:n0])
        other = max((i for i in range(n0) if end[i] < t0), key=end.__getitem__)
        end[other] = t0
        return real(probe, reduced)

    monkeypatch.setattr(shifted_unit, "proven", tied)
    scenario = _scenario(FLAGSHIP, ("model.layers=4",), 8)
    spliced = simulate(scenario, mode="class")
    assert spliced.repeated_micro_batches == 6  # 2 simulated, not 1
    assert_same_result(spliced, simulate(scenario, mode="class", repeat=False))


def test_the_first_micro_batch_differs_from_the_second_at_stages_0_and_1():
    """Stages 0-1 reduce only in the last micro-batch: the second of 2 is not the first copied, so the
    one-micro-batch proof does not start (zsim.zero.plan.build_unit_plan is None), where stage 3's is."""
    from zsim.engine.simulation import workload_and_unit

    for stage, alike in ((1, False), (3, True)):
        scenario = _scenario(SMALL, ("model.layers=2", f"zero.stage={stage}"), 2)
        _, unit = workload_and_unit(scenario)
        assert (unit is not None) is alike, stage


def test_a_tensor_of_the_first_micro_batch_alive_at_the_replay_leaves_the_shift_unproven(monkeypatch):
    """The replay makes the second's calls under the first's tags: one still held when the replay
    allocates it would be two tensors under one name, so the proof stops and every micro-batch is
    simulated (the same Result)."""
    from zsim.zero import plan as planning

    real = planning.build_unit_plan

    def leaking(scenario, workload):  # the first micro-batch's first activation is never freed
        unit = real(scenario, workload)
        plan, second = unit
        tag = next(a.tag for op in plan.ops for a in op.allocs if a.category == "activations")
        ops = tuple(op._replace(frees=tuple(t for t in op.frees if t != tag)) for op in plan.ops)
        return plan.__class__(**{**{f: getattr(plan, f) for f in plan.__dataclass_fields__}, "ops": ops}), second

    import zsim.engine.simulation as simulation
    monkeypatch.setattr(simulation, "build_unit_plan", leaking)
    scenario = _scenario(SMALL, ("model.layers=2",), 8)
    stopped, replay = [], shifted_unit.Probe.replay

    def watched(probe):
        try:
            replay(probe)
        except shifted_unit.Unproven as e:
            stopped.append(str(e))
            raise

    monkeypatch.setattr(shifted_unit.Probe, "replay", watched)
    result = simulate(scenario, mode="class")
    assert len(stopped) == 1 and "outlives it" in stopped[0]
    assert result.repeated_micro_batches < 7  # not the one-micro-batch proof's
    assert_same_result(result, simulate(scenario, mode="class", repeat=False))


def _ops(*specs):
    """Ops (name, stream, deps) for _forced's tests (their times are given to _forced apart)."""
    from zsim.zero.ops import Op

    return [Op(name=name, stream=stream, deps=deps) for name, stream, deps in specs]


def test_the_order_of_one_instants_memory_calls_must_be_forced():
    """zsim.engine.shifted_unit._forced on a hand-made schedule: A (compute) ends at 1 and frees; B, the
    next compute op, starts at once (A's worker runs on to it) and allocates; C (comm) waited for A and
    allocates after. Forced in that order, not in the reverse; frees commute; an op that two ops ending
    together release, or two ops that start on their own at 0, leave the order to the engine's history."""
    ops = _ops(("A", "compute", ()), ("B", "compute", ()), ("C", "comm", (0,)), ("D", "comm", (0, 1)))
    pred = [-1, 0, -1, 2]
    start, end = [0.0, 1.0, 1.0, 2.0], [1.0, 2.0, 2.0, 3.0]
    forced = shifted_unit._forced
    assert forced([(0, "f"), (1, "a"), (2, "a")], ops, pred, start, end)
    assert not forced([(0, "f"), (2, "a"), (1, "a")], ops, pred, start, end)
    assert forced([(2, "f"), (1, "f")], ops, pred, start, end)  # two frees at 2, in either order
    # D waits for B and C, which both end at 2: which of them releases it is the engine's history
    assert not forced([(1, "f"), (3, "a"), (2, "f")], ops, pred, start, end)
    # with C ending at 1.5, B alone releases D at 2: its free comes first
    assert forced([(1, "f"), (3, "a")], ops, pred, start, [1.0, 2.0, 1.5, 3.0])
    roots = _ops(("X", "compute", ()), ("Y", "comm", ()))
    assert not forced([(0, "a"), (1, "a")], roots, [-1, -1], [0.0, 0.0], [1.0, 1.0])
