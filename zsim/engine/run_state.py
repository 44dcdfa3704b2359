"""The state one simulation's actors share (RunState: the fabric, ledgers, the ops' events and times,
the totals), the environment that counts its events, the collective actor, and the fabric's link
capacities for a scenario (zsim.engine.simulation runs them; zsim.engine.workers are the actors)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Generator
from typing import Any

import simpy

from zsim.engine.compute import compute_seconds
from zsim.engine.cores import compute_weight, core_capacities, cpu_link, work
from zsim.engine.instance import start_instance
from zsim.engine.result import CommStats
from zsim.engine.sm_share import SmShare, held_sms
from zsim.fabric.collective import Phase, Placement, plan_collective
from zsim.fabric.p2p import p2p_phases, stage_capacities, stage_link
from zsim.fabric.sharing import Fabric
from zsim.fabric.topology import Degradation, aggregate_capacities, build_topology, degrade, healthy_capacities
from zsim.memory.ledger import MemoryLedger
from zsim.scenario.scenario import Scenario
from zsim.trace import schema
from zsim.zero.ops import Op, Plan

STREAMS = ("compute", "comm", "offload", "host", "tp")  # "tp": overlapped TP collectives (zsim.zero.tp_overlap)


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


class RunState:
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
        self.pids = [scenario.layout.first_rank(s) for s in range(plan.stages)]
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
        # a compute op's weight against a collective's 1 on the cores: gloo gets the host's gloo_core_share
        self.compute_weight = compute_weight(host.gloo_share) if host is not None else 1.0
        # fabric.sm_contention: each simulated GPU's SMs, shared with the collectives beside its compute
        sms = scenario.cluster.gpu.compute.sms if scenario.fabric.sm_contention else 0
        self.sm_shares = [SmShare(env, sms) for _ in range(plan.stages)] if sms else []
        self.contention_seconds = 0.0  # Σ compute-stream time lost to the SMs collectives held
        self._held: dict[tuple[str, str, str], int] = {}
        self.finished = 0  # rank 0's ops done (the progress bar)
        self.left_in_step = [0] * plan.steps  # rank 0's ops of each step not yet done
        for op in plan.ops:
            self.left_in_step[op.step] += 1
        self.step_states: list[tuple] = []  # the allocator's state as each step's last op ends

    def step_done(self, step: int) -> None:
        """An op of `step` ended: when it was the step's last, record the allocator's state (tags
        without their step and micro-batch, so that equal states of two steps compare equal); with
        pipeline stages, every stage representative's, as a tuple (zsim maxsize reports the worst
        stage's peak, so its settling must cover that stage too)."""
        self.left_in_step[step] -= 1
        if not self.left_in_step[step] and self.ledger.allocator is not None:
            if len(self.ledgers) == 1:
                self.step_states.append(self.ledger.allocator.state(_step_free_tag))
            else:
                self.step_states.append(tuple(ledger.allocator.state(_step_free_tag) for ledger in self.ledgers))

    def phases(self, op: Op, group: int = -1) -> tuple[str, list[Phase], float]:
        """The algorithm, phases and bytes sent of `op`: for the representative rank (group -1, class
        weights) or for one group instance (per-rank mode: its members' own links). Memoized: a
        simulation repeats a few shapes of collectives."""
        key = (op.collective, op.group, op.nbytes, group, op.nic_share) if not op.stage else (
            op.collective, op.group, op.nbytes, group, op.nic_share, op.stage)
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
                                                self.s.fabric.algorithm, where, nic_share=op.nic_share)
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
        pending, env, fabric, phases = self.pending, self.env, self.fabric, self.phases  # the hot loop's names
        for group, n in counts.items():
            key = (index, group)
            entry = pending.get(key)
            if entry is None:
                entry = pending[key] = [0, simpy.Event(env)]
            entry[0] += n
            if entry[0] == size:
                del pending[key]
                start_instance(env, fabric, phases(op, group)[1], entry[1])
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

    def held_sms(self, op: Op) -> int:
        """SMs collective `op` holds beside compute (zsim.engine.sm_share), memoized by stream, group and kind."""
        key = (op.stream, op.group, op.collective)
        held = self._held.get(key)
        if held is None:
            moe = self.s.model.moe
            held = self._held[key] = held_sms(op, self.s.cluster, moe.dispatcher if moe is not None else "alltoall")
        return held

    def compute(self, index: int, seconds: float, rank: int) -> simpy.Event:
        """The event of compute op `index` taking `seconds` alone on `rank`: a timeout on a GPU; on a
        CPU host, work on the rank's cores, which a collective in flight shares (zsim.engine.cores).
        A trace-driven replay's measured durations already hold that sharing: they are timeouts."""
        if self.threads and seconds > 0 and index not in self.override:
            w = self.compute_weight  # w streams at equal rates: the op's work and cap per stream are 1/w of it
            done = self.fabric.start(((cpu_link(rank), w),), work(seconds, self.core_share, self.threads) / w,
                                     float(self.threads) / w)
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


class RankProgress:
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
