"""The actors of a simulation, generator functions taking `env`: `stream_worker` runs one stream of
rank 0 (or of a pipeline stage's representative) and records what it does; `quiet_worker` runs another
rank's stream in per-rank mode without recording; `_p2p` times a pipeline send or receive."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import simpy

from zsim.engine.offload import transfer_seconds
from zsim.engine.result import CommStats
from zsim.engine.run_state import RankProgress, RunState
from zsim.trace import schema
from zsim.zero.ops import EP_GROUPS, Op

def quiet_worker(env: simpy.Environment, run: RunState, rank: int, indices: list[int],
                 progress: RankProgress) -> Generator[simpy.Event, None, None]:
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


def stream_worker(env: simpy.Environment, run: RunState, indices: list[int],
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
            held = run.held_sms(op) if run.sm_shares else 0
            if held:
                run.sm_shares[stage].hold(held)
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
            if held:
                run.sm_shares[stage].release(held)
            key = (op.group, op.collective)
            stats = run.comm.get(key)
            if stats is None:
                stats = run.comm[key] = CommStats()
            stats.count += 1
            stats.payload_bytes += op.nbytes
            stats.sent_bytes += sent
            stats.seconds += end - start
            if op.group == "mp" and op.stream == "compute":  # in line (not those beside a GEMM: tp_overlap)
                run.mp_seconds += end - start
            elif op.group in EP_GROUPS:
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
            if run.sm_shares and op.stream == "compute" and i not in run.override:  # fabric.sm_contention
                yield from run.sm_shares[stage].compute(seconds)
                run.contention_seconds += max(0.0, env.now - start - seconds)  # round-off alone is no contention
            else:
                yield run.compute(i, seconds, 0)
            end = env.now
            if op.stream != "host":  # the 'host' lane's launches are no compute-stream time (Result.compute_seconds)
                # a host's ops may share cores, a GPU's its SMs with the collectives beside them
                run.compute_seconds += (end - start) if run.threads or run.sm_shares else seconds
            run.flops += op.flops
            if trace:
                args = {"step": op.step, "micro_batch": op.micro_batch, "flops": op.flops}
                if op.memory_only:  # no measured span is its twin (zsim.calibrate.replay.align)
                    args["memory_only"] = True
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


def _p2p(env: simpy.Environment, run: RunState, op: Op, reached: float) -> Generator[simpy.Event, None, None]:
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
