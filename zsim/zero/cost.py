"""What a scenario costs before anything is expanded (issue 13): closed-form model states (so that "does
not fit" is decided without building one Module per layer) and an estimate of a simulation's events,
memory and wall time (so that a run too large for this machine is refused with a message instead of
swapping, or running for hours in silence).

The event and byte rates are measured on the development machine (2 shared cores, `zsim run
--stats`, /usr/bin/time): the 1T flagship in class mode makes ~48 simpy events and ~21 trace events per
layer and micro-step (6,194 and 2,717 for 128 layers; 123,766 and 54,321 for 20 steps, 74 MB more RSS:
~1.4 kB per trace event held); per-rank mode adds ~7 simpy events per layer, micro-step and rank
(15,457 for the 7.5B 64-GPU example, 36 layers); simpy ran 9-37k events/s there. The constants below
round those up, so the estimate errs on the side of "large".
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from zsim.errors import ZsimError
from zsim.zero.model_states import PARAM_BYTES, ModelStates, adam_k, model_states, tensor_partition

SIM_EVENTS_PER_LAYER_STEP = 50  # class mode, per layer and micro-step (measured 48)
RANK_EVENTS_PER_LAYER_STEP = 8  # per-rank mode: more per layer, micro-step and rank (measured ~7)
TRACE_EVENTS_PER_LAYER_STEP = 25  # trace events kept in memory (measured 21)
# Stages 1/2 with constant buffers all-gather the updated parameters in chunks of reduce_bucket_elements
# after each step (zsim/zero/plan.py `_optimizer`): measured 7.5M simpy and 1.87M trace events for 1.87M
# chunks (reduce_bucket_elements: 1 on a 1.9M-parameter scenario), i.e. ~4 and 1 per chunk.
SIM_EVENTS_PER_CHUNK = 5
TRACE_EVENTS_PER_CHUNK = 1
BYTES_PER_TRACE_EVENT = 2000  # Python objects held per trace event and its memory samples (measured ~1.4 kB)
EVENTS_PER_SECOND = 10_000  # simpy events per second, the low end measured on 2 shared cores
MAX_SECONDS = 1800.0  # refuse runs estimated longer than this (ZSIM_MAX_SECONDS overrides)
MEMORY_SHARE = 0.5  # refuse runs estimated to need more than this share of the available memory


def model_states_closed_form(model, mp: int, dp: int, stage: int, dtype: str, ep: int = 1,
                             k: int | None = None, etp: int | None = None) -> ModelStates:
    """Per-GPU model states (ZeRO Table 1, with DeepSpeed's padding) of `model` with any number of
    layers, from the workloads of 1 and 2 layers: every block is the same, so Ψ(L) = Ψ(1) + (L-1)·Ψ_block
    and stage 3's per-tensor partition grows by the block's partition per layer. Cost: O(1) in L.
    A MoE model (whose first blocks may be dense) is built whole, O(L): its dense part over `dp`, its
    local experts over the dp·mp/(ep·etp) ranks of the expert-data-parallel group (dp/ep when the experts split
    across MP, etp = mp, the default; zsim.parallel.layout)."""
    if getattr(model, "moe", None) is not None:
        from zsim.workload.transformer import build_workload

        etp = mp if etp is None else etp
        w = build_workload(model, mp, dtype, ep=ep, etp=etp)
        dense = model_states(w.params_per_mp_rank, dp, stage, dtype, k=k)
        experts = model_states(w.expert_params_per_rank, dp * mp // (ep * etp), stage, dtype, k=k)
        return ModelStates(params=dense.params + experts.params, grads=dense.grads + experts.grads,
                           optimizer=dense.optimizer + experts.optimizer)
    one, block = _one_layer_and_block(model, mp, dtype)
    extra = model.layers - 1
    psi = one.params_per_mp_rank + extra * block.params
    if stage != 3:
        return model_states(psi, dp, stage, dtype, k=k)
    part = tensor_partition(one.tensors, dp) + extra * tensor_partition(block.tensors, dp)
    e = PARAM_BYTES[dtype]
    return ModelStates(params=e * part, grads=e * part, optimizer=(adam_k(dtype) if k is None else k) * part)


def _one_layer_and_block(model, mp: int, dtype: str):
    """The workload of `model` with one layer, and one block of it (every block is the same)."""
    from zsim.config.struct import replace
    from zsim.workload.transformer import build_workload

    one = build_workload(replace(model, layers=1), mp, dtype)
    two = build_workload(replace(model, layers=2), mp, dtype)
    return one, two.blocks[-1]


def params_per_mp_rank(model, mp: int, dtype: str = "fp16") -> int:
    """Ψ of one MP rank for any number of layers, in O(1): Ψ(1) + (L-1)·Ψ_block; a MoE model (whose
    first moe.dense_layers blocks differ from the rest) is built whole, O(L), as in
    model_states_closed_form."""
    if getattr(model, "moe", None) is not None:
        from zsim.workload.transformer import build_workload

        return build_workload(model, mp, dtype).params_per_mp_rank
    one, block = _one_layer_and_block(model, mp, dtype)
    return one.params_per_mp_rank + (model.layers - 1) * block.params


@dataclass(frozen=True, slots=True)
class Cost:
    """Estimated size of a simulation: simpy events, trace events, bytes held, seconds of wall time."""

    per_rank: bool
    sim_events: float
    trace_events: float
    bytes: float
    seconds: float


def estimate(scenario) -> Cost:
    """The estimated cost of `zsim run` on `scenario` (see the module docstring for the rates)."""
    per_rank = scenario.fabric.mode == "per_rank" or (scenario.fabric.mode == "auto" and bool(scenario.fabric.degrade))
    work = float(scenario.model.layers + 2) * scenario.grad_accum * scenario.run.steps
    z = scenario.zero
    chunks = 0.0
    if z.stage in (1, 2) and z.constant_buffers:  # the parameter all-gathers after each step
        psi = params_per_mp_rank(scenario.model, scenario.parallel.mp, scenario.precision.dtype)
        chunks = float(scenario.run.steps) * -(-psi // z.reduce_bucket_elements)
    sim = work * SIM_EVENTS_PER_LAYER_STEP + chunks * SIM_EVENTS_PER_CHUNK
    if per_rank:
        sim += (work * RANK_EVENTS_PER_LAYER_STEP + chunks * SIM_EVENTS_PER_CHUNK) * scenario.layout.world
    trace = work * TRACE_EVENTS_PER_LAYER_STEP + chunks * TRACE_EVENTS_PER_CHUNK
    return Cost(per_rank, sim, trace, trace * BYTES_PER_TRACE_EVENT, sim / EVENTS_PER_SECOND)


def available_bytes() -> float:
    """Memory this process could still use: MemAvailable from /proc/meminfo (Linux), else no limit."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return float("inf")


def max_seconds() -> float:
    try:
        value = float(os.environ.get("ZSIM_MAX_SECONDS", MAX_SECONDS))
    except ValueError:
        raise ZsimError(f"ZSIM_MAX_SECONDS={os.environ['ZSIM_MAX_SECONDS'][:20]!r}: expected seconds") from None
    return value if value == value and value > 0 else MAX_SECONDS


def check_cost(scenario, trace: bool = True) -> Cost:
    """Refuse a simulation that would not fit this machine's memory or would run longer than
    MAX_SECONDS (ZSIM_MAX_SECONDS), with what to change. Returns the estimate. Without `trace` (a sweep
    keeps the totals, not the trace events) only the time is checked.

    Raises:
        ZsimError: too large for this machine or this mode.
    """
    cost = estimate(scenario)
    per_rank = cost.per_rank
    size = (f"{scenario.model.layers} layers × {scenario.grad_accum} micro-batches × {scenario.run.steps} steps"
            + (f" × {scenario.layout.world} ranks" if per_rank else ""))
    advice = ("use fabric.mode: class (one rank per class; fine for a symmetric scenario)" if per_rank
              else "lower run.steps, the grad_accum, or the layers")
    z = scenario.zero
    if z.stage in (1, 2) and z.constant_buffers and z.reduce_bucket_elements < 1_000_000:
        advice += f", or raise zero.reduce_bucket_elements ({z.reduce_bucket_elements:,})"
    need, have = cost.bytes, available_bytes() * MEMORY_SHARE
    if trace and need > have:
        raise ZsimError(f"too large for this machine: {size} would hold ~{need / 1e9:.1f} GB of trace events "
                        f"(~{have / 1e9:.1f} GB usable here); {advice}")
    limit = max_seconds()
    if cost.seconds > limit:
        raise ZsimError(f"too large for {'per-rank' if per_rank else 'class'} mode: {size} is ~{cost.sim_events:.2g} "
                        f"events, ~{cost.seconds / 60:.0f} min here (limit {limit / 60:.0f} min, ZSIM_MAX_SECONDS); "
                        f"{advice}")
    return cost
