"""Pipeline parallelism's schedules: which forward and backward each pipeline stage runs, in order.

One function for both halves of the twin: the simulator's plan (zsim.zero.plan) and the runtime's
pipeline engine (runtime/) walk the same list, so their traces line up op for op.

Schedules (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM", §2.2; the order as Megatron-LM's megatron/core/pipeline_parallel/schedules.py runs it):
  gpipe        all m forwards, then all m backwards in micro-batch order (Huang et al. 2019, GPipe;
               torch.distributed.pipelining.ScheduleGPipe runs the backwards in the same order);
  1f1b         PipeDream-Flush (Narayanan et al. 2021 §2.2.1): stage s runs p - s - 1 warm-up
               forwards, then alternates one forward and one backward, then drains the backwards
               (forward_backward_pipelining_without_interleaving: num_warmup_microbatches);
  interleaved  1F1B over v model chunks per stage (§2.2.2): stage s holds the layers of virtual
               stages s, s + p, ..., s + (v-1)p; m must be a multiple of p
               (forward_backward_pipelining_with_interleaving: get_model_chunk_id, and its warm-up
               count (p - s - 1)·2 + (v - 1)·p, all forwards first when m == p).

Sizes are counts: p stages, m micro-batches per optimizer step, v chunks per stage.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from typing import NamedTuple

SCHEDULES = ("gpipe", "1f1b", "interleaved")


class Work(NamedTuple):
    """One compute item of a stage's schedule: `kind` 'fwd' or 'bwd' of micro-batch `mb` on model
    chunk `chunk` (0 unless interleaved). `merged`: a steady-state forward and the backward right after it,
    run as one step with the EP all-to-alls overlapped (Megatron-Core --overlap-moe-expert-parallel-comm)."""

    kind: str
    mb: int
    chunk: int = 0
    merged: bool = False


def stage_schedule(schedule: str, stages: int, stage: int, micro_batches: int, chunks: int = 1,
                   ep_overlap: bool = False) -> list[Work]:
    """The forwards and backwards pipeline stage `stage` (0-based, of `stages`) runs in one optimizer
    step of `micro_batches` micro-batches, in order. `chunks` is v for 'interleaved' (1 otherwise).
    `ep_overlap` (interleaved only; Megatron-Core --overlap-moe-expert-parallel-comm): one more warm-up
    forward, and each steady-state forward and the backward after it are marked `merged` (schedules.py
    get_pp_rank_microbatches: "we schedule one extra micro-batch forward step before the 1f1b stages"; each
    steady-state pair runs as combined_1f1b_schedule_for_interleaved_pipelining).

    Raises ValueError on a schedule name or sizes no framework accepts (the scenario loader checks
    them first and names the key)."""
    p, m, v = stages, micro_batches, chunks
    if not 0 <= stage < p or m < 1 or v < 1:
        raise ValueError(f"stage {stage} of {p}, {m} micro-batches, {v} chunks")
    if schedule == "gpipe":
        return [Work("fwd", i) for i in range(m)] + [Work("bwd", i) for i in range(m)]
    if schedule == "1f1b":
        warmup = min(p - stage - 1, m)  # schedules.py: num_warmup_microbatches
        items = [Work("fwd", i) for i in range(warmup)]
        for i in range(m - warmup):  # steady state: one forward, one backward
            items += [Work("fwd", warmup + i), Work("bwd", i)]
        return items + [Work("bwd", i) for i in range(m - warmup, m)]
    if schedule == "interleaved":
        if m % p:
            raise ValueError(f"interleaved: {m} micro-batches is not a multiple of {p} stages")
        total = m * v
        if m == p:  # schedules.py: all_warmup_microbatches
            warmup = total
        else:
            warmup = min((p - stage - 1) * 2 + (v - 1) * p + int(ep_overlap), total)
        fwd = [_virtual(k, p, v, forward=True) for k in range(total)]
        bwd = [_virtual(k, p, v, forward=False) for k in range(total)]
        items = [Work("fwd", *fwd[k]) for k in range(warmup)]
        for k in range(total - warmup):
            items += [Work("fwd", *fwd[warmup + k], merged=ep_overlap), Work("bwd", *bwd[k], merged=ep_overlap)]
        return items + [Work("bwd", *bwd[k]) for k in range(total - warmup, total)]
    raise ValueError(f"unknown pipeline schedule {schedule!r} (one of {', '.join(SCHEDULES)})")


def check_schedule_size(stages: int, micro_batches: int, chunks: int = 1, source: str | None = None) -> None:
    """Refuse to walk every stage's schedule when its 2·p·m·v forwards and backwards are more than the
    SCHEDULE_ITEMS limit (zsim.config.limits): what `zsim memory --scenario` and `zsim trace`'s memory
    guard walk, before they start (issue 28: pp 4 with 10⁶ micro-batches took 27 s). `source`: the
    file the sizes come from, for the message.

    Raises:
        ConfigError: naming the file, the count, the limit and how to lift it.
    """
    from zsim.config.limits import limit, too_many
    from zsim.errors import ConfigError

    items = 2 * stages * micro_batches * chunks
    if items > limit("SCHEDULE_ITEMS"):
        raise ConfigError(too_many("SCHEDULE_ITEMS", items, f"forwards and backwards in the schedules of pp {stages} × "
                                   f"{micro_batches:,} micro-batches × {chunks} chunks"), source=source, path="parallel.pp")


def _virtual(k: int, p: int, v: int, forward: bool) -> tuple[int, int]:
    """The (micro-batch, chunk) of a stage's k-th forward or backward under interleaving: groups of p
    micro-batches go through chunk 0, then chunk 1, ... (schedules.py get_model_chunk_id; backwards
    walk the chunks in reverse)."""
    group, within = divmod(k, p * v)
    chunk = within // p
    mb = group * p + within % p
    return mb, chunk if forward else v - 1 - chunk


def peak_in_flight(items: list[Work]) -> int:
    """The most micro-batch chunks whose forward has run and backward has not, at any point of a
    stage's schedule: how many micro-batches' activations the stage holds at its peak (1F1B: p - s,
    capped at m; GPipe: m)."""
    live = peak = 0
    for w in items:
        live += 1 if w.kind == "fwd" else -1
        peak = max(peak, live)
    return peak


def bubble_fraction(schedule: str, stages: int, micro_batches: int, chunks: int = 1) -> float:
    """The share of a step a stage idles in the pipeline bubble, with equal forward and backward times
    on every stage and free communication: (p - 1) / (m + p - 1) for GPipe and 1F1B, (p - 1) /
    (v·m + p - 1) interleaved (Narayanan et al. 2021 §2.2.1-2.2.2: bubble time (p - 1)/m, (p - 1)/(v·m)
    of the ideal step)."""
    p, m = stages, micro_batches
    v = chunks if schedule == "interleaved" else 1
    return (p - 1) / (v * m + p - 1)


@dataclass(frozen=True, slots=True)
class StageLayers:
    """The transformer layers each pipeline stage's chunks hold: `layers[s][c]` is the range of layer
    indices of chunk c of stage s. The embedding is on stage 0's chunk 0 and the head on the last
    stage's last chunk (Megatron-LM: pre_process / post_process)."""

    layers: tuple[tuple[range, ...], ...]

    @property
    def stages(self) -> int:
        return len(self.layers)


def split_layers(num_layers: int, stages: int, chunks: int = 1, counts: tuple[int, ...] = ()) -> StageLayers:
    """Assign `num_layers` layers to `stages` stages of `chunks` chunks. With `counts` (one per virtual
    stage, s·v of them, in virtual-stage order) the split is that stated uneven one; without, every
    virtual stage takes num_layers / (stages·chunks) (Megatron-LM requires it to divide:
    get_num_layers_to_build). Virtual stage c·p + s is chunk c of stage s (§2.2.2).

    The first and the last virtual stage may hold no layer (the embedding's and the head's own stage,
    Megatron-Core's --account-for-embedding-in-pipeline-split / --account-for-loss-in-pipeline-split, which
    count each as a layer when splitting); every other one holds at least one.

    Raises ValueError when the layers do not divide or `counts` do not add up."""
    virtual = stages * chunks
    if counts:
        inner = counts[1:-1] if virtual > 2 else ()
        if min(counts) < 0 or (inner and min(inner) < 1):  # [10**30, 4 - 10**30] adds up, and was reported as if it did not
            low = min(counts) if min(counts) < 0 else min(inner)
            raise ValueError(f"layer count {low:.3g} of a virtual stage is less than "
                             f"{0 if min(counts) < 0 else 1} (only the first and the last may hold none)")
        if len(counts) != virtual or sum(counts) != num_layers:
            raise ValueError(f"{len(counts)} layer counts adding to {sum(counts)} for {virtual} virtual stages of "
                             f"{num_layers} layers")
    else:
        if num_layers % virtual:
            raise ValueError(f"{num_layers} layers do not divide into {virtual} virtual stages")
        counts = (num_layers // virtual,) * virtual
    starts = [0, *accumulate(counts)]  # running sums: linear in the virtual stages (a sum per prefix was quadratic)
    ranges = [range(starts[i], starts[i + 1]) for i in range(virtual)]
    return StageLayers(tuple(tuple(ranges[c * stages + s] for c in range(chunks)) for s in range(stages)))


def pipeline_rank(rank: int, tp: int, dp: int) -> int:
    """The pipeline stage of a global rank in Megatron-LM's order (tensor fastest, then data, then
    pipeline: megatron/core/parallel_state.py initialize_model_parallel, order 'tp-dp-pp'):
    rank = pp_rank·(dp·tp) + dp_rank·tp + tp_rank."""
    return rank // (dp * tp)
