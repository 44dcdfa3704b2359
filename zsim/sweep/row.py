"""One sweep point's facts as a flat table row, and its bottleneck in words.

Units follow result.json (docs/result-json.md): seconds, bytes, TFLOPS. Every value is a plain
int, float, str, bool or None, and nothing depends on the machine that ran it (no wall times), so the
same point gives the same row on any engine, bit for bit.
"""

from __future__ import annotations

from typing import Any

from zsim.engine.result import Result
from zsim.report.error_band import band_facts
from zsim.zero.rank_states import ep_dispatch

GB = 1e9

# The result columns, in table order (after `point` and the swept keys). docs/sweep.md explains each.
COLUMNS = (
    "status", "step_s", "compute_s", "mp_comm_s", "dp_comm_s", "exposed_comm_s", "offload_s", "comm_share", "exposed_share",
    "tflops_per_gpu", "percent_of_peak", "tokens_per_s", "peak_bytes", "reserved_peak_bytes", "capacity_bytes",
    "reserved_margin_share", "band_low_s", "band_high_s", "band_match", "band_regime", "allocator_flushes", "model_states_bytes", "oom", "bottleneck_kind", "bottleneck", "dp_algorithm", "gpus", "mode", "key",
)


def dp_tier(result: Result, group: str = "dp") -> str:
    """The link tier a group's collectives cross, in words: the NICs between nodes, or NVLink inside one.
    `group`: 'dp', or a MoE run's EP dispatch group ('ep', 'tpep')."""
    s = result.scenario
    c = s.cluster
    spans = s.layout.dp_shape.spans_nodes if group == "dp" else s.layout.group_shape(group).spans_nodes
    if not spans:
        return f"NVLink ({group.upper()} groups inside a node)"
    usable_gbps = c.nic_bytes_per_s * 8 / GB
    nics = [d for d in s.fabric.degrade if d.link == "nic"]
    slow = "; " + ", ".join(f"NIC {d.index} of node {d.node} at ×{d.factor:g}" for d in nics) if nics else ""
    staged = "" if c.gpudirect_rdma else ", staged through host memory (no GPUDirect RDMA)"
    return (f"network between nodes ({c.nics_per_node} × {c.nic_pool.name} NICs per node, "
            f"{usable_gbps:.0f} Gb/s usable each{staged}{slow})")


def states_need(result: Result, capacity_bytes: int) -> str:
    """'model states alone need X GB per GPU (params, grads, optimizer) > C GB': the simulated rank's
    model states (the plan's layout, padding included), the one figure a row gives for them."""
    ms = result.model_states
    return (f"model states alone need {ms.total / GB:.1f} GB per GPU (params {ms.params / GB:.1f} + grads "
            f"{ms.grads / GB:.1f} + optimizer {ms.optimizer / GB:.1f}) > {capacity_bytes / GB:.1f} GB")


def states_oom_reason(result: Result, capacity_bytes: int, loader_reason: str) -> str:
    """The `oom` of a point whose model states alone exceed the GPU: states_need, then the loader's
    advice (the stage that would fit). The loader sizes the states in closed form, without the stage 1-2
    flat buffer's padding the plan lays out (264.0 against 265.0 GB for the 1T flagship at stage 1), so
    its figure is not repeated: one row, one number for one quantity (issue 28)."""
    advice = loader_reason.rsplit("; ", 1)[-1] if "; " in loader_reason else ""
    return f"the model does not fit: {states_need(result, capacity_bytes)}" + (f"; {advice}" if advice else "")


def bottleneck(result: Result, oom: str | None, capacity_bytes: int, states_oom: bool) -> tuple[str, str]:
    """(kind, words): what bounds this point's step: `memory`, `compute`, `network` (DP comm, or a MoE run's
    EP all-to-alls where they take longer, over the tier dp_tier names), `nvlink` (MP all-reduces) or `host
    link` (Pa+cpu copies)."""
    if states_oom:
        return "memory", f"memory: {states_need(result, capacity_bytes)}"
    if oom:
        return "memory", f"memory: {oom}"
    steps = len(result.step_seconds)
    step = result.total_seconds / steps
    compute = result.compute_seconds / steps
    mp = result.mp_comm_seconds / steps
    waiting = max(0.0, step - compute - mp)  # DP comm and host copies not hidden behind compute
    offload = result.offload_seconds / steps
    dp = sum(st.seconds for (g, _), st in result.comm.items() if g == "dp") / steps
    parts = {"compute": compute, "nvlink": mp, "waiting": waiting}
    kind = max(parts, key=parts.get)  # type: ignore[arg-type]
    share = parts[kind] / step if step else 0.0
    if kind == "compute":
        return "compute", f"compute: {share:.0%} of the step is compute kernels"
    if kind == "nvlink":
        return "nvlink", f"NVLink: MP all-reduces take {share:.0%} of the step"
    if offload > dp:
        link = result.scenario.cluster.offload.name
        return "host link", f"host link ({link}): {share:.0%} of the step waits on Pa+cpu copies"
    ep = result.ep_comm_seconds / steps
    if ep > dp:  # a MoE run's all-to-alls (in line, or what overlap leaves exposed) outweigh its DP traffic
        group = ep_dispatch(result.scenario)[0]
        kind = "network" if result.scenario.layout.group_shape(group).spans_nodes else "nvlink"
        return kind, (f"{dp_tier(result, group)}: {share:.0%} of the step waits on communication, EP all-to-alls the "
                      f"most ({ep:.2f} s a step)")
    tier = dp_tier(result)
    kind = "network" if result.scenario.layout.dp_shape.spans_nodes else "nvlink"
    return kind, f"{tier}: {share:.0%} of the step waits on DP communication"


def result_row(result: Result, oom_reason: str | None, capacity_bytes: int, key: str) -> dict[str, Any]:
    """The result columns (COLUMNS) of one simulated point. `oom_reason` marks a point whose model
    states alone exceed `capacity_bytes` (simulated on a roomy GPU); a simulated OOM is read from the
    ledger."""
    s, ledger = result.scenario, result.ledger
    steps = len(result.step_seconds)
    step = result.total_seconds / steps
    compute = result.compute_seconds / steps
    dp_comm = sum(st.seconds for (g, _), st in result.comm.items() if g == "dp") / steps
    peak_flops = s.cluster.gpu.peak_flops[s.precision.dtype]
    tflops = result.hardware_flops / result.total_seconds / 1e12
    oom = states_oom_reason(result, capacity_bytes, oom_reason) if oom_reason is not None else None
    if oom is None and ledger.oom is not None:
        o = ledger.oom
        oom = (f"{o.category} ({o.tag}, {o.nbytes / GB:.2f} GB) needed {o.reserved_bytes / GB:.1f} GB reserved "
               f"> {o.capacity_bytes / GB:.1f} GB at t = {o.time_s:.3f} s")
    kind, words = bottleneck(result, oom, capacity_bytes, states_oom=oom_reason is not None)
    share = (capacity_bytes - ledger.peak_reserved) / capacity_bytes if capacity_bytes else 1.0
    band = band_facts(s, step) if step else {"match": "outside", "regime": None}
    return {
        "status": "oom" if oom else "fits",
        "step_s": step,
        "compute_s": compute,
        "mp_comm_s": result.mp_comm_seconds / steps,
        "dp_comm_s": dp_comm,
        "exposed_comm_s": step - compute,
        "offload_s": result.offload_seconds / steps,
        "comm_share": dp_comm / step if step else 0.0,
        "exposed_share": (step - compute) / step if step else 0.0,
        "tflops_per_gpu": tflops,
        "percent_of_peak": 100 * tflops * 1e12 / peak_flops,
        "tokens_per_s": s.model.seq_len * s.model.micro_batch * s.parallel.dp * s.grad_accum / step,
        "peak_bytes": ledger.peak,
        "reserved_peak_bytes": ledger.peak_reserved,
        "capacity_bytes": capacity_bytes,
        "reserved_margin_share": share,
        # The step range held-out published runs of this regime imply (zsim.report.band); None outside.
        "band_low_s": band.get("step_low_s"),
        "band_high_s": band.get("step_high_s"),
        "band_match": band["match"],
        "band_regime": band.get("regime") if band["match"] != "outside" else None,
        "allocator_flushes": len(ledger.flush_times),
        "model_states_bytes": result.model_states.total,
        "oom": oom,
        "bottleneck_kind": kind,
        "bottleneck": words,
        "dp_algorithm": result.algorithms.get("dp"),
        "gpus": s.layout.world,
        "mode": result.mode,
        "key": key,
    }
