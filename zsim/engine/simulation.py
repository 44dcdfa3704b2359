"""The simpy simulation of one rank class running a ZeRO plan on a cluster.

Every rank of a symmetric scenario does the same work at the same moments, so one representative
rank is simulated (DESIGN.md, Scale); the fabric still sees every stream that shares a link: a
collective's link weights count the identical copies the other ranks of its node run (see
zsim.fabric.collective). Actors are generator functions taking `env`: `stream_worker` runs one
stream's ops in order, `collective` walks a collective's phases over the fabric.
"""

from __future__ import annotations

import time
from collections.abc import Generator
from typing import Any

import simpy

from zsim.config.scenario import Scenario
from zsim.engine.compute import compute_seconds
from zsim.engine.offload import transfer_seconds
from zsim.engine.result import CommStats, Result
from zsim.fabric.collective import Phase, plan_collective, link_capacities
from zsim.fabric.sharing import Fabric
from zsim.memory.ledger import MemoryLedger
from zsim.trace import schema
from zsim.workload.transformer import build_workload
from zsim.zero.model_states import model_states
from zsim.zero.ops import Op, Plan
from zsim.zero.plan import build_plan

STREAMS = ("compute", "comm", "offload")


class CountingEnvironment(simpy.Environment):
    """A simpy Environment that counts the events it schedules (for `zsim run --stats`)."""

    def __init__(self) -> None:
        super().__init__()
        self.scheduled = 0

    def schedule(self, event: simpy.Event, priority: int = 1, delay: float = 0) -> None:  # type: ignore[override]
        self.scheduled += 1
        super().schedule(event, priority, delay)


def collective(env: simpy.Environment, fabric: Fabric, phases: list[Phase]) -> Generator[simpy.Event, None, None]:
    """Run a collective's phases one after another: latency, then the fabric transfer."""
    for phase in phases:
        if phase.latency_s > 0:
            yield env.timeout(phase.latency_s)
        if phase.nbytes > 0:
            yield from fabric.transfer(phase.links, phase.nbytes)


class _Run:
    """State shared by the stream workers of one simulation."""

    def __init__(self, scenario: Scenario, plan: Plan, env: CountingEnvironment):
        self.s, self.plan, self.env = scenario, plan, env
        cluster = scenario.cluster
        self.fabric = Fabric(env, link_capacities(cluster, range(cluster.gpus_per_node)))
        self.ledger = MemoryLedger(capacity=cluster.gpu.memory_bytes)  # with its caching allocator
        self.host_ledger = MemoryLedger(capacity=None)  # Pa+cpu's checkpoints in host memory
        self.offload_seconds = 0.0
        self.done = [env.event() for _ in plan.ops]
        self.end_time = [0.0] * len(plan.ops)
        self.events: list[dict[str, Any]] = []
        self.comm: dict[tuple[str, str], CommStats] = {}
        self.compute_seconds = 0.0
        self.mp_seconds = 0.0
        self.flops = 0.0
        self.algorithms: dict[str, tuple[float, str]] = {}
        self._phases: dict[tuple[str, str, int], tuple[str, list[Phase]]] = {}
        self._groups: dict[str, list[int]] = {}
        self._compute_time: dict[tuple[float, float], float] = {}

    def phases(self, op: Op) -> tuple[str, list[Phase]]:
        key = (op.collective, op.group, op.nbytes)
        if key not in self._phases:
            layout = self.s.layout
            shape = layout.dp_shape if op.group == "dp" else layout.mp_shape
            self._phases[key] = plan_collective(op.collective, op.nbytes, shape, self.s.cluster)
        return self._phases[key]

    def group_list(self, kind: str) -> list[int]:
        """Global ranks of the representative rank's `kind` ('dp' or 'mp') group, in group order."""
        if kind not in self._groups:
            layout = self.s.layout
            self._groups[kind] = list(layout.dp_group(0) if kind == "dp" else layout.mp_group(0))
        return self._groups[kind]

    def record_memory(self) -> None:
        self.events.append(schema.counter("memory", 0, self.env.now * 1e6, self.ledger.counters()))

    def ledger_of(self, tag: str) -> MemoryLedger:
        return self.ledger if tag in self.ledger.live else self.host_ledger


def stream_worker(env: simpy.Environment, run: _Run, indices: list[int]) -> Generator[simpy.Event, None, None]:
    """Execute the ops `indices` of one stream in order, each after its dependencies."""
    ops, done, ledger = run.plan.ops, run.done, run.ledger
    gpu, dtype = run.s.cluster.gpu, run.s.precision.dtype
    for i in indices:
        op = ops[i]
        for d in op.deps:
            if not done[d].processed:
                yield done[d]
        start = env.now
        for a in op.allocs:
            (run.host_ledger if a.where == "host" else ledger).alloc(start, a.category, a.nbytes, a.tag, a.arena)
        if op.allocs:
            run.record_memory()
        args: dict[str, Any] = {"step": op.step, "micro_batch": op.micro_batch}
        if op.is_collective:
            algorithm, phases = run.phases(op)
            yield from collective(env, run.fabric, phases)
            stats = run.comm.setdefault((op.group, op.collective), CommStats())
            stats.count += 1
            stats.payload_bytes += op.nbytes
            stats.sent_bytes += sum(p.nbytes for p in phases)
            stats.seconds += env.now - start
            if op.group == "mp":
                run.mp_seconds += env.now - start
            best = run.algorithms.get(op.group)
            if best is None or op.nbytes > best[0]:
                run.algorithms[op.group] = (op.nbytes, algorithm)
            args.update(op=op.collective, bytes=op.nbytes, dtype=run.s.precision.dtype, group=run.group_list(op.group),
                        algorithm=algorithm)
        elif op.transfer:
            seconds = transfer_seconds(op.nbytes, run.s.cluster.offload)
            yield env.timeout(seconds)
            run.offload_seconds += seconds
            args.update(op=op.transfer, bytes=op.nbytes)
        else:
            key = (op.flops, op.hbm_bytes)
            seconds = run._compute_time.get(key)
            if seconds is None:
                seconds = run._compute_time.setdefault(key, compute_seconds(op, gpu, dtype))
            yield env.timeout(seconds)
            run.compute_seconds += seconds
            run.flops += op.flops
            args["flops"] = op.flops
        for tag in op.frees:
            run.ledger_of(tag).free(env.now, tag)
        if op.frees:
            run.record_memory()
        run.events.append(schema.complete(op.name, 0, op.stream, start * 1e6, (env.now - start) * 1e6, **args))
        run.end_time[i] = env.now
        done[i].succeed()


def simulate(scenario: Scenario) -> Result:
    """Simulate `scenario.run.steps` steps of `scenario` and return the Result."""
    wall = time.perf_counter()
    workload = build_workload(scenario.model, scenario.parallel.mp, scenario.precision.dtype)
    plan = build_plan(scenario, workload)
    env = CountingEnvironment()
    run = _Run(scenario, plan, env)
    for a in plan.persistent:
        run.ledger.alloc(0.0, a.category, a.nbytes, a.tag)
    for name, nbytes in plan.arenas:  # MD: contiguous buffers reserved before the first step
        run.ledger.reserve_arena(0.0, name, nbytes)
    run.record_memory()
    for stream in STREAMS:
        env.process(stream_worker(env, run, [i for i, op in enumerate(plan.ops) if op.stream == stream]))
    env.run()
    assert all(e.processed for e in run.done), "a plan op never ran: dependency cycle"
    step_ends = [0.0] * plan.steps
    for i, op in enumerate(plan.ops):
        step_ends[op.step] = max(step_ends[op.step], run.end_time[i])
    step_seconds = [end - (step_ends[k - 1] if k else 0.0) for k, end in enumerate(step_ends)]
    mb_per_run = scenario.grad_accum * plan.steps
    model_flops = mb_per_run * sum(3 * m.fwd_flops for m in workload.modules)  # fwd + 2 × fwd for backward
    return Result(
        scenario=scenario,
        workload=workload,
        model_states=model_states(workload.params_per_mp_rank, scenario.layout.dp, scenario.zero.stage,
                                  scenario.precision.dtype, tensors=workload.tensors),
        step_seconds=step_seconds,
        compute_seconds=run.compute_seconds,
        mp_comm_seconds=run.mp_seconds,
        hardware_flops=run.flops,
        model_flops=model_flops,
        comm=run.comm,
        ledger=run.ledger,
        events=run.events,
        sim_events=env.scheduled,
        wall_seconds=time.perf_counter() - wall,
        algorithms={g: alg for g, (_, alg) in run.algorithms.items()},
        host_ledger=run.host_ledger,
        offload_seconds=run.offload_seconds,
    )
