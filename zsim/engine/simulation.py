"""The simpy simulation of a ZeRO plan on a cluster, in class mode or per-rank mode.

Class mode: every rank of a symmetric scenario does the same work at the same moments, so one
representative rank is simulated (DESIGN.md, Scale); the fabric still sees every stream that shares a
link: a collective's link weights count the identical copies the other groups of its node run (see
zsim.fabric.collective). Per-rank mode: every rank runs its own streams; a collective starts when the
last member of its group arrives and moves one flow over all its members' links, so a slow link slows
exactly the groups that cross it. Memory is tracked on rank 0 (all ranks hold the same state).
Actors are generator functions taking `env`: `stream_worker` runs one stream's ops in order,
`collective` walks a collective's phases over the fabric.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable, Generator
from typing import Any

import simpy

from zsim.fabric.cluster import Cluster
from zsim.scenario.scenario import Scenario
from zsim.engine import repeat as repeat_micro_batches
from zsim.engine.compute import compute_seconds
from zsim.engine.cores import core_capacities, cpu_link, work
from zsim.engine.instance import start_instance
from zsim.engine.offload import transfer_seconds
from zsim.engine.pipeline_result import pipeline_facts, stage_bubbles, worst_stage
from zsim.engine.rank_class import RankClass, class_stream
from zsim.engine.result import CommStats, Result
from zsim.errors import ConfigError
from zsim.fabric.collective import Phase, Placement, plan_collective
from zsim.fabric.p2p import p2p_phases, stage_capacities, stage_link
from zsim.fabric.sharing import Fabric
from zsim.fabric.topology import Degradation, aggregate_capacities, build_topology, degrade, healthy_capacities
from zsim.memory.ledger import MemoryLedger
from zsim.trace import schema
from zsim.workload.transformer import Workload
from zsim.zero.ops import Op, Plan
from zsim.zero.pipeline_plan import stage_model_states
from zsim.zero.plan import build_plan, rank_model_states, scenario_workload

STREAMS = ("compute", "comm", "offload")


class CountingEnvironment(simpy.Environment):
    """A simpy Environment that counts the events it schedules (for `zsim run --stats`)."""

    @property
    def scheduled(self) -> int:
        """Events scheduled so far: simpy numbers each one it schedules from its itertools.count
        `_eid` (simpy.core.Environment.schedule), whose repr, `count(N)`, holds the next number, their
        count. Read that rather than override schedule(), which cost a Python call per event."""
        text = repr(self._eid)
        assert text.startswith("count(") and text.endswith(")"), text
        return int(text[6:-1])


def collective(env: simpy.Environment, fabric: Fabric, phases: list[Phase]) -> Generator[simpy.Event, None, None]:
    """Run a collective's phases one after another: latency, then the fabric transfer."""
    for phase in phases:
        if phase.latency_s > 0:
            yield env.timeout(phase.latency_s)
        if phase.nbytes > 0:
            yield fabric.start(phase.links, phase.nbytes, phase.cap_Bps)


def fabric_capacities(scenario: Scenario, per_rank: bool) -> dict:
    """Aggregate link capacities from the cluster's topology graph, after any degradations. Class
    mode needs only node 0 and one other node (all nodes are alike)."""
    cluster = scenario.cluster
    if cluster.host is not None:  # a CPU host: no links, but cores that compute and gloo share
        return core_capacities(cluster.host.cores, scenario.layout.world, per_rank)
    if not per_rank:
        cluster = dataclasses.replace(cluster, nodes=min(cluster.nodes, 2))
    if not per_rank and scenario.layout.pp > 1:  # each stage's representative has its own links (zsim.fabric.p2p)
        return stage_capacities(healthy_capacities(cluster), scenario.layout.pp)
    if not (per_rank and scenario.fabric.degrade):
        return healthy_capacities(cluster)  # the same numbers, without building the graph
    graph = build_topology(cluster)
    if per_rank:
        degrade(graph, cluster, [Degradation(d.link, d.factor, d.index, d.gpu, d.node)
                                 for d in scenario.fabric.degrade])
    return aggregate_capacities(graph, cluster)


_STEP_SUFFIX = re.compile(r"\.s\d+(?:\.m\d+)?(?=\.|$)")


def _step_free_tag(tag: str) -> str:
    """A plan tag without its step and micro-batch ('grad.layer.3.s1' -> 'grad.layer.3')."""
    return _STEP_SUFFIX.sub("", tag)


class _Run:
    """State shared by the stream workers of one simulation."""

    def __init__(self, scenario: Scenario, plan: Plan, env: CountingEnvironment, per_rank: bool = False,
                 trace: bool = True):
        self.s, self.plan, self.env = scenario, plan, env
        self.per_rank = per_rank
        self.trace = trace  # build the trace events (a sweep reads only the totals)
        self.fabric = Fabric(env, fabric_capacities(scenario, per_rank))
        self.pending: dict[tuple[int, int], list] = {}  # per-rank: (op, group) -> [arrived, started event]
        self.by_stream: list[list[int]] = []  # plan indices of each stream's ops, in STREAMS order
        self.ledger = MemoryLedger(capacity=scenario.cluster.gpu.memory_bytes)  # with its caching allocator
        # pipeline parallelism: one ledger per stage's representative (stage 0's is `ledger`), and its trace pid
        self.ledgers = [self.ledger] + [MemoryLedger(capacity=scenario.cluster.gpu.memory_bytes)
                                        for _ in range(1, plan.stages)]
        self.pids = [s * scenario.layout.stage_ranks for s in range(plan.stages)]
        self.start_time = [0.0] * len(plan.ops)
        self.pp_seconds = 0.0  # Σ send time of every stage's representative
        self.host_ledger = MemoryLedger(capacity=None)  # Pa+cpu's checkpoints in host memory
        self.offload_seconds = 0.0
        self.done = [simpy.Event(env) for _ in plan.ops]
        self.end_time = [0.0] * len(plan.ops)
        self.events: list[dict[str, Any]] = []
        self.comm: dict[tuple[str, str], CommStats] = {}
        self.compute_seconds = 0.0
        self.mp_seconds = 0.0
        self.ep_seconds = 0.0
        self.flops = 0.0
        self.algorithms: dict[str, tuple[float, str]] = {}
        self._phases: dict[tuple[str, str, int, int], tuple[str, list[Phase], float]] = {}
        self._compute_time: dict[object, float] = {}
        self.override: dict[int, float] = {}  # plan index -> seconds (trace-driven replay)
        host = scenario.cluster.host  # a CPU host: compute shares the rank's cores with gloo (zsim.engine.cores)
        self.core_share = host.cores / max(1, scenario.layout.world) if host is not None else 0.0
        self.threads = host.threads_per_rank if host is not None else 0
        self.finished = 0  # rank 0's ops done (the progress bar)
        self.left_in_step = [0] * plan.steps  # rank 0's ops of each step not yet done
        for op in plan.ops:
            self.left_in_step[op.step] += 1
        self.step_states: list[tuple] = []  # the allocator's state as each step's last op ends

    def step_done(self, step: int) -> None:
        """An op of `step` ended: when it was the step's last, record the allocator's state (tags
        without their step and micro-batch, so that equal states of two steps compare equal)."""
        self.left_in_step[step] -= 1
        if not self.left_in_step[step] and self.ledger.allocator is not None:
            self.step_states.append(self.ledger.allocator.state(_step_free_tag))

    def phases(self, op: Op, group: int = -1) -> tuple[str, list[Phase], float]:
        """The algorithm, phases and bytes sent of `op`: for the representative rank (group -1, class
        weights) or for one group instance (per-rank mode: its members' own links). Memoized: a
        simulation repeats a few shapes of collectives."""
        key = (op.collective, op.group, op.nbytes, group) if not op.stage else (op.collective, op.group, op.nbytes,
                                                                                  group, op.stage)
        planned = self._phases.get(key)
        if planned is not None:
            return planned
        if op.stage:  # another pipeline stage's representative: stage 0's phases on its own links
            algorithm, phases, sent = self.phases(op._replace(stage=0), group)
            phases = [dataclasses.replace(p, links=tuple((stage_link(link, op.stage), w) for link, w in p.links))
                      for p in phases]
            planned = self._phases[key] = (algorithm, phases, sent)
            return planned
        if self.s.cluster.host is not None:
            # gloo's thread works on the rank's cores for the whole call (zsim.engine.cores); in
            # per-rank mode on every member's, at the pace of the most loaded one
            size = self.s.layout.group_size(op.group)
            seconds = self.s.cluster.host.collective_seconds(op.collective, op.nbytes, size)
            ranks = (0,) if group < 0 else self.members(op.group, group)
            links = tuple((cpu_link(r), 1.0) for r in ranks)
            algorithm, phases = "gloo", [Phase(0.0, work(seconds, self.core_share, 1), links, 1.0)]
        else:
            layout = self.s.layout
            shape = layout.group_shape(op.group)
            where = Placement() if group < 0 else Placement(self.members(op.group, group), class_mode=False)
            algorithm, phases = plan_collective(op.collective, op.nbytes, shape, self.s.cluster,
                                                self.s.fabric.algorithm, where)
        planned = self._phases[key] = (algorithm, phases, sum(p.nbytes for p in phases))
        return planned

    def members(self, kind: str, group: int) -> list[int]:
        """Global ranks of DP group `group` (= the MP rank), MP group `group` (= the DP rank), or an
        expert group (zsim.parallel.layout.Layout.group_members)."""
        return self.s.layout.group_members(kind, group)

    def group_of(self, kind: str, rank: int) -> int:
        return self.s.layout.group_index(kind, rank)

    def run_collective(self, index: int, op: Op, rank: int) -> Generator[simpy.Event, None, tuple[str, float, float]]:
        """Run collective op `index` for `rank`; returns (algorithm, the time it started, bytes this
        rank sent). Per-rank mode: it starts when the group's last member arrives and moves one flow
        over all members' links."""
        if not self.per_rank:
            algorithm, phases, sent = self.phases(op)
            start = self.env.now
            yield from collective(self.env, self.fabric, phases)
            return algorithm, start, sent
        group = self.group_of(op.group, rank)
        algorithm, phases, sent = self.phases(op, group)
        key = (index, group)
        entry = self.pending.get(key)
        if entry is None:
            entry = self.pending[key] = [0, self.env.event()]
        entry[0] += 1
        if entry[0] == self.s.layout.group_size(op.group):
            del self.pending[key]
            start_instance(self.env, self.fabric, phases, entry[1])
        started = yield entry[1]
        return algorithm, started, sent

    def arrive_class(self, index: int, op: Op, counts: dict[int, int]) -> dict[int, simpy.Event]:
        """Per-rank mode: a class of ranks reaches collective op `index`; `counts` holds how many of its
        members each group instance has, in instance order. Each instance starts when its last member
        has arrived, as in run_collective. Returns {instance: the event of its start}."""
        size = self.s.layout.dp if op.group == "dp" else self.s.layout.mp
        ends = {}
        for group, n in counts.items():
            key = (index, group)
            entry = self.pending.get(key)
            if entry is None:
                entry = self.pending[key] = [0, self.env.event()]
            entry[0] += n
            if entry[0] == size:
                del self.pending[key]
                start_instance(self.env, self.fabric, self.phases(op, group)[1], entry[1])
            ends[group] = entry[1]
        return ends

    def compute_time(self, op: Op, index: int = -1) -> float:
        """Seconds of compute op `op` (plan index `index`) on this cluster's GPU (memoized: layers
        repeat), or its measured duration when a trace-driven replay gave one."""
        if index in self.override:
            return self.override[index]
        key = op.kernels if op.kernels is not None else (op.flops, op.hbm_bytes)  # kernel lists: by identity
        host = self.s.cluster.host
        if host is not None:  # a CPU host prices the optimizer's ops with their own terms
            key = (op.name.startswith("optimizer/"), key)
        seconds = self._compute_time.get(key)
        if seconds is None:
            seconds = compute_seconds(op, self.s.cluster.gpu, self.s.precision.dtype, host)
            self._compute_time[key] = seconds
        return seconds

    def compute(self, index: int, seconds: float, rank: int) -> simpy.Event:
        """The event of compute op `index` taking `seconds` alone on `rank`: a timeout on a GPU; on a
        CPU host, work on the rank's cores, which a collective in flight shares (zsim.engine.cores).
        A trace-driven replay's measured durations already hold that sharing: they are timeouts."""
        if self.threads and seconds > 0 and index not in self.override:
            done = self.fabric.start(((cpu_link(rank), 1.0),), work(seconds, self.core_share, self.threads),
                                     float(self.threads))
            if done is not None:
                return done
        return simpy.Timeout(self.env, seconds)

    def record_memory(self, stage: int = 0) -> None:
        self.events.append(schema.counter("memory", self.pids[stage], self.env.now * 1e6,
                                          self.ledgers[stage].counters()))

    def p2p(self, op: Op) -> tuple[str, list[Phase]]:
        """The algorithm and phases of pipeline send `op` (zsim.fabric.p2p), memoized per stage and direction."""
        key = (op.name, op.nbytes, op.stage)
        planned = self._phases.get(key)
        if planned is None:
            p, s = self.s.layout.pp, op.stage
            # the peer: the next stage forward, the previous backward (round the ring when interleaved)
            peer = (s + 1) % p if op.name == "send/pp.fwd" else (s - 1) % p
            algorithm, phases = p2p_phases(op.nbytes, self.s.cluster, self.s.layout, op.stage, peer)
            planned = self._phases[key] = (algorithm, phases, float(op.nbytes))
        return planned[0], planned[1]


class _RankProgress:
    """Which ops one quiet rank has finished: a byte per op, and events only for ops another
    stream is waiting on (a list of events per op per rank does not fit 16k ranks in memory)."""

    __slots__ = ("done", "waiting")

    def __init__(self, n_ops: int):
        self.done = bytearray(n_ops)
        self.waiting: dict[int, simpy.Event] = {}

    def finish(self, i: int) -> None:
        self.done[i] = 1
        event = self.waiting.pop(i, None)
        if event is not None:
            event.succeed()


def quiet_worker(env: simpy.Environment, run: _Run, rank: int, indices: list[int],
                 progress: _RankProgress) -> Generator[simpy.Event, None, None]:
    """A rank other than 0 in per-rank mode: the same ops and timing, nothing recorded."""
    ops = run.plan.ops
    done = progress.done
    for i in indices:
        op = ops[i]
        for d in op.deps:
            if not done[d]:
                event = progress.waiting.get(d)
                if event is None:
                    event = progress.waiting[d] = env.event()
                yield event
        if op.is_collective:
            yield from run.run_collective(i, op, rank)
        elif op.transfer:
            yield env.timeout(transfer_seconds(op.nbytes, run.s.cluster.offload))
        else:
            yield run.compute(i, run.compute_time(op, i), rank)
        progress.finish(i)


def stream_worker(env: simpy.Environment, run: _Run, indices: list[int],
                  stage: int = 0) -> Generator[simpy.Event, None, None]:
    """Execute the ops `indices` of one stream of rank 0 (of pipeline stage `stage`'s representative) in
    order, each after its dependencies, and record what they do (trace events only when `run.trace`).
    Timeouts are made as simpy.Timeout(env, s), what env.timeout(s) does without a bound method made per call."""
    ops, done, ledger, trace = run.plan.ops, run.done, run.ledgers[stage], run.trace
    pid = run.pids[stage]
    for i in indices:
        op = ops[i]
        reached = env.now
        for d in op.deps:
            if not done[d].processed:
                yield done[d]
        start = run.start_time[i] = env.now
        if op.allocs:
            if any(a.where == "host" for a in op.allocs):  # Pa+cpu: a ledger records only what it holds
                for on_host in (False, True):
                    requests = [a for a in op.allocs if (a.where == "host") == on_host]
                    if requests:
                        (run.host_ledger if on_host else ledger).alloc_many(start, requests, op.stream)
            else:
                ledger.alloc_many(start, op.allocs, op.stream)
            if trace:
                run.record_memory(stage)
        if op.group == "pp":  # a pipeline send (timed on the fabric) or recv (done when its send is)
            yield from _p2p(env, run, op, reached)
            end = env.now
            if op.collective == "recv":
                start = reached  # the recv's event spans its wait for the peer stage
            if trace:  # on the comm track, as the runtime records them (the compute stream waits meanwhile)
                run.events.append(schema.complete(op.name, pid, "comm", start * 1e6, (end - start) * 1e6,
                                                  step=op.step, micro_batch=op.micro_batch, op=op.collective,
                                                  bytes=op.nbytes, group="pp"))
        elif op.is_collective:
            if run.per_rank:
                algorithm, started, sent = yield from run.run_collective(i, op, 0)
            else:  # run_collective's class-mode path, in line (one generator less per collective)
                algorithm, phases, sent = run.phases(op)
                started = start
                for phase in phases:
                    if phase.latency_s > 0:
                        yield simpy.Timeout(env, phase.latency_s)
                    if phase.nbytes > 0:
                        yield run.fabric.start(phase.links, phase.nbytes, phase.cap_Bps)
            end = env.now
            key = (op.group, op.collective)
            stats = run.comm.get(key)
            if stats is None:
                stats = run.comm[key] = CommStats()
            stats.count += 1
            stats.payload_bytes += op.nbytes
            stats.sent_bytes += sent
            stats.seconds += end - start
            if op.group == "mp":
                run.mp_seconds += end - start
            elif op.group == "ep":
                run.ep_seconds += end - start
            best = run.algorithms.get(op.group)
            if best is None or op.nbytes > best[0]:
                run.algorithms[op.group] = (op.nbytes, algorithm)
            if trace:
                # `group` names the process group; its ranks are listed once, in the trace's metadata.groups
                args: dict[str, Any] = {"step": op.step, "micro_batch": op.micro_batch, "op": op.collective,
                                        "bytes": op.nbytes, "dtype": run.s.precision.dtype, "group": op.group,
                                        "algorithm": algorithm}
                if run.per_rank:
                    args["wait_us"] = (started - start) * 1e6  # waiting for the group's last member
        elif op.transfer:
            seconds = transfer_seconds(op.nbytes, run.s.cluster.offload)
            yield simpy.Timeout(env, seconds)
            end = env.now
            run.offload_seconds += seconds
            if trace:
                args = {"step": op.step, "micro_batch": op.micro_batch, "op": op.transfer, "bytes": op.nbytes}
        else:
            seconds = run.compute_time(op, i)
            yield run.compute(i, seconds, 0)
            end = env.now
            run.compute_seconds += (end - start) if run.threads else seconds  # a host's ops may share cores
            run.flops += op.flops
            if trace:
                args = {"step": op.step, "micro_batch": op.micro_batch, "flops": op.flops}
                if op.name == "optimizer/step":
                    args.update(elements=op.elements, skipped=False)
        if op.frees:
            live = ledger.live
            if all(tag in live for tag in op.frees):
                ledger.free_many(end, op.frees)
            else:
                for on_gpu in (True, False):
                    tags = [tag for tag in op.frees if (tag in live) == on_gpu]
                    if tags:
                        (ledger if on_gpu else run.host_ledger).free_many(end, tags)
            if trace:
                run.record_memory(stage)
        if trace and op.group != "pp":
            run.events.append(schema.complete(op.name, pid, op.stream, start * 1e6, (end - start) * 1e6, **args))
        run.end_time[i] = end
        run.finished += 1
        run.step_done(op.step)
        done[i].succeed()



def _p2p(env: simpy.Environment, run: _Run, op: Op, reached: float) -> Generator[simpy.Event, None, None]:
    """A pipeline point-to-point op of stage `op.stage`'s representative: a send moves its bytes over the
    fabric (zsim.fabric.p2p); a recv has waited, from `reached` (when its stream came to it), for its
    send through its dependency and takes no more time. Both count in the run's ('pp', send|recv) stats: the sends' seconds are the p2p time, the
    recvs' the waiting for the peer stage (the bubble among it)."""
    begin = env.now if op.collective == "send" else reached
    if op.collective == "send":
        _algorithm, phases = run.p2p(op)
        for phase in phases:
            if phase.latency_s > 0:
                yield simpy.Timeout(env, phase.latency_s)
            if phase.nbytes > 0:
                yield run.fabric.start(phase.links, phase.nbytes, phase.cap_Bps)
        run.pp_seconds += env.now - begin
    key = ("pp", op.collective)
    stats = run.comm.get(key)
    if stats is None:
        stats = run.comm[key] = CommStats()
    stats.count += 1
    stats.payload_bytes += op.nbytes
    stats.sent_bytes += op.nbytes if op.collective == "send" else 0
    stats.seconds += env.now - begin


def run_to_end(env: simpy.Environment, run: _Run, progress: bool) -> None:
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
        offload=None, nccl=None, host=None,
        gpu=dataclasses.replace(cluster.gpu, peak_flops={}, hbm_bytes_per_s=0.0, nccl_nvlink_GBps=0.0, compute=None))


def workload_and_plan(scenario: Scenario, plans: dict[str, tuple[Workload, Plan]] | None = None) -> tuple[Workload, Plan]:
    """The workload and ZeRO plan of `scenario`; reused from `plans` (a dict the caller keeps, keyed by
    plan_key) when a scenario with the same key was planned before. Both are immutable."""
    key = plan_key(scenario) if plans is not None else ""
    if plans is not None and key in plans:
        return plans[key]
    workload = scenario_workload(scenario)
    planned = workload, build_plan(scenario, workload)
    if plans is not None:
        plans[key] = planned
    return planned


def simulate(scenario: Scenario, mode: str | None = None, progress: bool = False,
             compute_override: Callable[[list[Op]], dict[int, float]] | None = None, trace: bool = True,
             plans: dict[str, tuple[Workload, Plan]] | None = None, rank_classes: bool = True,
             repeat: bool = True, observe: Callable[[_Run], None] | None = None) -> Result:
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
    if repeat and repeat_micro_batches.applies(scenario, per_rank, compute_override is not None):
        extrapolated = repeat_micro_batches.extrapolate(scenario, lambda reduced, watch: simulate(
            reduced, mode="class", trace=trace, plans=plans, repeat=False, observe=watch))
        if extrapolated is not None:
            return extrapolated
    workload, plan = workload_and_plan(scenario, plans)
    env = CountingEnvironment()
    run = _Run(scenario, plan, env, per_rank, trace)
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
        for a in persistent:
            ledger.alloc(0.0, a.category, a.nbytes, a.tag)
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
            finished = _RankProgress(len(plan.ops))
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

