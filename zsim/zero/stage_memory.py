"""Closed-form memory of each pipeline stage (issue 27 part 1), for `zsim memory` and `zsim maxsize`:
what one rank of stage s holds at its peak, without simulating.

Model states: the stage's own modules (its layers; the embedding on the first stage, the head and loss
on the last, and with a tied head a copy of the word embedding there too, as Megatron-LM does:
zsim.zero.pipeline_plan.pipeline_stages), ZeRO-partitioned over the stage's DP group (ZeRO Table 1,
zsim.zero.rank_states) — the same bytes the simulator allocates.

Activations: each layer of a chunk saves its tensors for backward for every micro-batch chunk whose
forward has run and backward has not; at the schedule's peak that is peak_in_flight micro-batch chunks
(1F1B: p - s; GPipe: m; interleaved: Megatron's warm-up count) [Narayanan et al. SC'21 §2.2.1-2.2.2].
One layer saves K22 eq. 2's tensors (layer_saved_tensors), or with checkpointing only its input,
e·s·b·h (/mp under sequence parallelism) [Korthikanti et al. 2022 §4-5], plus one layer's saved tensors
while it is recomputed. The last stage's last chunk adds the loss's fp32 softmax per live micro-batch
and the loss's working copies (loss_work_tensors) [K22 §4.3].
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from zsim.parallel.pipeline import check_schedule_size, split_layers, stage_schedule
from zsim.zero.model_states import ModelStates

if TYPE_CHECKING:
    from zsim.zero.inputs import Scenario


@dataclass(frozen=True, slots=True)
class StageMemory:
    """One pipeline stage's peak per rank, in bytes: its model states, its activations at the schedule's
    peak, and how many micro-batch chunks it then holds."""

    stage: int
    layers: int
    in_flight: int
    states: ModelStates
    activations: int
    fp8_weights: int = 0  # Transformer Engine's cached FP8 weight copies (precision.fp8; zsim.compute.fp8)

    @property
    def total(self) -> int:
        return self.states.total + self.activations + self.fp8_weights


def stage_memory(scenario: Scenario) -> list[StageMemory]:
    """Every stage's StageMemory for `scenario` (pp >= 1; pp 1 is one stage holding one micro-batch).
    The saved activations are the workload's own per module (zsim.workload.transformer: a block's
    saved tensors, MoE MLPs, FlashAttention and sequence parallelism included, or its checkpoint under
    recompute; the embedding's on stage 0; the head's and its loss on the last stage), held for every
    micro-batch chunk the schedule has in flight at its peak.

    Raises:
        ConfigError: the schedules to walk are longer than the SCHEDULE_ITEMS limit (check_schedule_size)."""
    from zsim.zero.pipeline_plan import pipeline_stages, stage_model_states
    from zsim.zero.rank_states import fp8_cache_bytes, scenario_workload

    par = scenario.parallel
    workload = scenario_workload(scenario)
    blocks, embed, head = workload.blocks, workload.modules[0], workload.modules[-1]
    ckpt = scenario.zero.activation_checkpointing
    kept = [blk.checkpoint_bytes if ckpt else blk.saved_bytes for blk in blocks]
    transient = max(blk.saved_bytes for blk in blocks) if ckpt and blocks else 0  # one block recomputing
    p = par.pp
    v = par.virtual_stages if par.pipeline_schedule == "interleaved" else 1
    if p > 1:
        check_schedule_size(p, scenario.grad_accum, v, scenario.source)  # before walking them (issue 28)
    split = split_layers(len(blocks), p, v, tuple(par.pp_layers or ()))
    states = stage_model_states(scenario, workload) if p > 1 else None
    # each stage's cached FP8 weights (precision.fp8), over its own layers
    caches = ([fp8_cache_bytes(scenario, stage.workload) for stage in pipeline_stages(scenario, workload)] if p > 1
              else [fp8_cache_bytes(scenario, workload)])
    out = []
    for st in range(p):
        chunks = split.layers[st]
        held_per_chunk = []
        for c, layers in enumerate(chunks):
            held = sum(kept[i] for i in layers)
            held += embed.saved_bytes if st == 0 and c == 0 else 0
            # the head's saved tensors, and what the training loop holds until the backward ends (held_tensors)
            held += head.saved_bytes + sum(head.held_tensors) if st == p - 1 and c == v - 1 else 0
            held_per_chunk.append(held)
        items = stage_schedule(par.pipeline_schedule, p, st, scenario.grad_accum if p > 1 else 1, v,
                               ep_overlap=par.ep_overlap)
        loss_work = sum(head.fwd_work_tensors)
        live = peak = in_flight = peak_items = 0
        for w in items:
            # a forward ends holding its chunk's tensors, and the loss's copies if the chunk ends in the head;
            # a backward starts holding everything in flight, and a recomputed block's tensors under recompute
            if w.kind == "fwd":
                live += held_per_chunk[w.chunk]
                in_flight += 1
                held = live + (loss_work if st == p - 1 and w.chunk == v - 1 else 0)
            else:  # the head's backward (first) frees its tensors before any block recomputes
                ends_in_head = st == p - 1 and w.chunk == v - 1
                held = live - (head.saved_bytes if ends_in_head and transient else 0) + transient
                live -= held_per_chunk[w.chunk]
                in_flight -= 1
            if held > peak:
                peak, peak_items = held, in_flight + (w.kind == "bwd")
        own = states[st] if states else _whole(scenario, workload)
        out.append(StageMemory(st, sum(len(c) for c in chunks), peak_items, own, peak, caches[st]))
    return out


def _whole(scenario: Scenario, workload) -> ModelStates:
    from zsim.zero.rank_states import rank_model_states

    return rank_model_states(scenario, workload)


def binding_stage(stages: list[StageMemory]) -> StageMemory:
    """The stage that decides whether the model fits: the one with the most bytes per rank."""
    return max(stages, key=lambda st: st.total)
