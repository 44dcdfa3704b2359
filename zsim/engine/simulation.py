"""The simpy simulation of a ZeRO plan on a cluster, in class mode or per-rank mode.

Class mode: every rank of a symmetric scenario does the same work at the same moments, so one
representative rank is simulated (DESIGN.md, Scale); the fabric still sees every stream that shares a
link: a collective's link weights count the identical copies the other groups of its node run (see
zsim.fabric.collective). Per-rank mode: every rank runs its own streams; a collective starts when the
last member of its group arrives and moves one flow over all its members' links, so a slow link slows
exactly the groups that cross it. Memory is tracked on rank 0 (all ranks hold the same state).
Actors are generator functions taking `env` (zsim.engine.workers): `stream_worker` runs one stream's ops
in order, `collective` (zsim.engine.run_state) walks a collective's phases over the fabric; the state
they share is zsim.engine.run_state.RunState. This module builds a run, starts its actors and assembles
the Result.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import simpy

from zsim.fabric.cluster import Cluster
from zsim.scenario.scenario import Scenario
from zsim.engine import repeat as repeat_micro_batches
from zsim.engine.pipeline_result import pipeline_facts, stage_bubbles, worst_stage
from zsim.engine.rank_class import RankClass, class_stream
from zsim.engine.result import Result
from zsim.engine.run_state import STREAMS, CountingEnvironment, RankProgress, RunState
from zsim.engine.workers import quiet_worker, stream_worker
from zsim.errors import ConfigError
from zsim.workload.transformer import Workload
from zsim.zero.ops import Op, Plan
from zsim.zero.pipeline_plan import stage_model_states
from zsim.zero.pass_copy import Second
from zsim.zero.plan import build_plan, build_unit_plan, rank_model_states, scenario_workload


def run_to_end(env: simpy.Environment, run: RunState, progress: bool) -> None:
    """env.run(), with a tqdm bar of rank 0's finished ops on stderr when `progress` is true."""
    if not progress:
        env.run()
        return
    from tqdm import tqdm

    with tqdm(total=len(run.plan.ops), desc=f"simulating {run.s.layout.world} ranks", unit=" ops",
              leave=False) as bar:
        try:
            while True:
                for _ in range(5_000):
                    env.step()
                bar.update(run.finished - bar.n)
        except simpy.core.EmptySchedule:
            pass


def plan_key(scenario: Scenario) -> str:
    """What the workload and the ZeRO plan of `scenario` are made from: every section but the name,
    the description and the hardware section, whose effect is in the cluster, and the cluster without
    its speeds (link bandwidths and latencies, NCCL's terms, the GPU's FLOP/s, HBM bandwidth and
    compute terms), which only time the plan's ops. Scenarios with equal keys have equal plans
    (tests/test_plan_reuse.py checks that every speed is left out of the plan)."""
    return repr((scenario.model, scenario.parallel, scenario.zero, scenario.precision, scenario.fabric, scenario.run,
                 scenario.grad_accum, scenario.layout, without_speeds(scenario.cluster)))


def without_speeds(cluster: Cluster) -> Cluster:
    """`cluster` with every speed zeroed or None, a CPU host's model included (what plan_key leaves out)."""
    return dataclasses.replace(
        cluster, nvlink_link_bytes_per_s=0.0, nvlink=None, nic_pool=None, nic_bytes_per_s=0.0, oversubscription=0.0,
        nic_line_bytes_per_s=0.0, gpudirect_rdma=True, offload=None, nccl=None, host=None,
        gpu=dataclasses.replace(cluster.gpu, peak_flops={}, hbm_bytes_per_s=0.0, nccl_nvlink_GBps=0.0, compute=None))


def workload_and_plan(scenario: Scenario, plans: dict[str, tuple[Workload, Plan]] | None = None) -> tuple[Workload, Plan]:
    """The workload and ZeRO plan of `scenario`; reused from `plans` (a dict the caller keeps, keyed by
    plan_key) when a scenario with the same key was planned before. Both are immutable."""
    return _planned(scenario, plans, "", build_plan)


def workload_and_unit(scenario: Scenario, plans: dict | None = None) -> tuple[Workload, tuple[Plan, Second] | None]:
    """The workload of `scenario` (2 micro-batches, 1 step) and zsim.zero.plan.build_unit_plan's answer,
    reused from `plans` as workload_and_plan reuses a plan (under its own key)."""
    return _planned(scenario, plans, "unit ", build_unit_plan)


def _planned(scenario: Scenario, plans: dict | None, kind: str, build: Callable[[Scenario, Workload], Any]) -> tuple:
    """(workload, build(scenario, workload)), from `plans` under `kind` + plan_key when there, else made and
    kept there."""
    key = kind + plan_key(scenario) if plans is not None else ""
    if plans is not None and key in plans:
        return plans[key]
    workload = scenario_workload(scenario)
    planned = workload, build(scenario, workload)
    if plans is not None:
        plans[key] = planned
    return planned


def simulate(scenario: Scenario, mode: str | None = None, progress: bool = False,
             compute_override: Callable[[list[Op]], dict[int, float]] | None = None, trace: bool = True,
             plans: dict[str, tuple[Workload, Plan]] | None = None, rank_classes: bool = True,
             repeat: bool = True, observe: Callable[[RunState], None] | None = None) -> Result:
    """Simulate `scenario.run.steps` steps of `scenario` and return the Result. `mode` ('class' or
    'per_rank') overrides the scenario's fabric.mode. `progress`: show a tqdm bar of the
    ops done on stderr (the caller decides when the run is long enough to want one: zsim run, by its
    cost estimate). `compute_override(plan.ops)`
    may give measured seconds per compute op index (trace-driven replay, zsim.calibrate.trace_driven).
    `trace=False` leaves `Result.events` empty (what a sweep does: its rows need only the totals, the
    ledger and its peaks; every number is the same). `plans`: a dict kept across calls that reuses
    the workload and plan of scenarios differing only in speeds (a sweep's points; workload_and_plan).
    `rank_classes=False` runs per-rank mode one process per rank instead of one per class of identical
    ranks (zsim.engine.rank_class): the same numbers, bit for bit, slower; the tests' reference.
    `repeat=False` simulates every micro-batch of a gradient-accumulation step, where by default a
    micro-batch proven to repeat is simulated once and spliced (zsim.engine.repeat; the same numbers,
    times to round-off). `observe(run)` is called with the run's state before it starts (repeat's probe)."""
    wall = time.perf_counter()
    mode = mode or scenario.fabric.mode
    per_rank = mode == "per_rank" or (mode == "auto" and bool(scenario.fabric.degrade))
    if per_rank and scenario.layout.pp > 1:  # the loader refuses it in the file; this is a caller's mode
        raise ConfigError("per-rank mode with parallel.pp > 1 is not modelled: use class mode (docs/parallel.md)",
                          source=scenario.source, path="fabric.mode")
    if per_rank and scenario.fabric.sm_contention:  # likewise: only rank 0 would share its SMs
        raise ConfigError("per-rank mode with fabric.sm_contention is not modelled: use class mode (docs/fabric.md)",
                          source=scenario.source, path="fabric.mode")
    if repeat and repeat_micro_batches.applies(scenario, per_rank, compute_override is not None):
        plans = {} if plans is None else plans  # the reduced plan, built once for the proofs that use it
        extrapolated = repeat_micro_batches.extrapolate(scenario, lambda reduced, watch, planned=None: simulate(
            reduced, mode="class", trace=trace, plans=plans if planned is None else {plan_key(reduced): planned},
            repeat=False, observe=watch), lambda two: workload_and_unit(two, plans))
        if extrapolated is not None:
            return extrapolated
    workload, plan = workload_and_plan(scenario, plans)
    env = CountingEnvironment()
    run = RunState(scenario, plan, env, per_rank, trace)
    if compute_override is not None:
        run.override = compute_override(plan.ops)
    if observe is not None:
        observe(run)
    # CUDA context, cuBLAS, NCCL: before the first tensor. A CPU host's ranks have none of them (gloo's
    # buffers are transient): the plan's context is a GPU's.
    for stage, persistent in enumerate(plan.stage_persistent or (plan.persistent,)):
        ledger = run.ledgers[stage]
        for name, nbytes in plan.context if scenario.cluster.host is None else ():
            ledger.reserve_context(0.0, name, nbytes)
        for a in plan.setup + persistent:  # setup's transient tensors first (zero.setup_residue), then the states
            ledger.alloc(0.0, a.category, a.nbytes, a.tag)
        if plan.setup:  # freed, left cached; peaks from here on, as the runtime resets torch's after setup
            ledger.free_many(0.0, [a.tag for a in plan.setup])
            ledger.reset_peaks()
    for name, nbytes in plan.arenas:  # MD: contiguous buffers reserved before the first step
        run.ledger.reserve_arena(0.0, name, nbytes)
    if trace:
        for stage in range(plan.stages):
            run.record_memory(stage)
    by_stream = {stream: [i for i, op in enumerate(plan.ops) if op.stream == stream] for stream in STREAMS}
    run.by_stream = [by_stream[stream] for stream in STREAMS]
    if plan.stages == 1:
        for stream in STREAMS:
            env.process(stream_worker(env, run, by_stream[stream]))
    else:  # one representative rank per pipeline stage (zsim.zero.pipeline_plan), its streams and ledger
        for stage in range(plan.stages):
            for stream in STREAMS:
                env.process(stream_worker(env, run, [i for i in by_stream[stream] if plan.ops[i].stage == stage],
                                          stage))
    # rank classes split along the DP and MP groups only (zsim.engine.rank_class): a plan with expert
    # groups (ep, edp: mixture-of-experts) runs one process per rank, as do a CPU host's ranks, which
    # compute on their own cores, shared with gloo through the fabric
    class_groups = {op.group for op in plan.ops if op.is_collective} <= {"dp", "mp"}
    if per_rank and rank_classes and class_groups and scenario.cluster.host is None and scenario.layout.world > 1:
        quiet = RankClass(run, set(range(1, scenario.layout.world)), bytearray(len(plan.ops)), len(STREAMS))
        for s, indices in enumerate(run.by_stream):
            env.process(class_stream(env, run, quiet, s, indices))
    elif per_rank:
        for rank in range(1, scenario.layout.world):
            finished = RankProgress(len(plan.ops))
            for stream in STREAMS:
                env.process(quiet_worker(env, run, rank, by_stream[stream], finished))
    run_to_end(env, run, progress)
    assert all(e.processed for e in run.done), "a plan op never ran: dependency cycle"
    step_ends = [0.0] * plan.steps
    for i, op in enumerate(plan.ops):
        step_ends[op.step] = max(step_ends[op.step], run.end_time[i])
    step_seconds = [end - (step_ends[k - 1] if k else 0.0) for k, end in enumerate(step_ends)]
    mb_per_run = scenario.grad_accum * plan.steps
    model_flops = mb_per_run * sum(3 * m.fwd_flops for m in workload.modules)  # fwd + 2 × fwd for backward
    p = plan.stages
    states, ledger, pipeline = rank_model_states(scenario, workload), run.ledger, None
    if p > 1:  # per rank: the mean over the stages' representatives; memory: the worst stage's
        stage_states = stage_model_states(scenario, workload)
        worst = worst_stage(run.ledgers)
        states, ledger = stage_states[worst], run.ledgers[worst]
        bubbles = stage_bubbles(plan, run.start_time, run.end_time)
        pipeline = pipeline_facts(scenario, plan, run.ledgers, stage_states, bubbles, run.comm, plan.steps)
        model_flops /= p  # a model replica's FLOPs are spread over its p stages
        run.compute_seconds, run.mp_seconds, run.flops = run.compute_seconds / p, run.mp_seconds / p, run.flops / p
        run.ep_seconds /= p  # a MoE stage's all-to-alls, per rank as the rest
        run.contention_seconds /= p
        for stats in run.comm.values():
            stats.count, stats.payload_bytes, stats.sent_bytes, stats.seconds = (
                stats.count / p, stats.payload_bytes / p, stats.sent_bytes / p, stats.seconds / p)
    return Result(
        scenario=scenario,
        workload=workload,
        model_states=states,
        step_seconds=step_seconds,
        compute_seconds=run.compute_seconds,
        mp_comm_seconds=run.mp_seconds,
        ep_comm_seconds=run.ep_seconds,
        contention_seconds=run.contention_seconds,
        hardware_flops=run.flops,
        model_flops=model_flops,
        comm=run.comm,
        ledger=ledger,
        events=run.events,
        sim_events=env.scheduled,
        wall_seconds=time.perf_counter() - wall,
        algorithms={g: alg for g, (_, alg) in run.algorithms.items()},
        mode="per_rank" if per_rank else "class",
        host_ledger=run.host_ledger,
        offload_seconds=run.offload_seconds,
        step_memory_states=run.step_states,
        stage_ledgers=run.ledgers if p > 1 else [],
        pipeline=pipeline,
    )

