"""The facts of a Result, as one JSON-ready dict (the keys are documented in docs/result-json.md)."""

from __future__ import annotations

import bisect
import itertools
from typing import Any

from zsim import __version__
from zsim.config.struct import dump
from zsim.engine.result import Result
from zsim.memory.ledger import CATEGORIES
from zsim.memory.timeline import timeline_facts
from zsim.workload.activations import attention_score_bytes
from zsim.workload.flop_counts import megatron_core_flops
from zsim.workload.moe import Moe
from zsim.workload.parameters import active_params
from zsim.zero.model_states import PARAM_BYTES
from zsim.zero.rank_states import ep_dispatch, selective
from zsim.report.network import network_facts
from zsim.report.error_band import band_facts
from zsim.report.memory_hint import hint_facts

RESULT_SCHEMA = "zsim-result/1"


def dp_volume_bytes(result: Result) -> float:
    """DP traffic per GPU per step in the paper's convention (ZeRO §7.1): an all-reduce of S moves 2S
    (a reduce-scatter and an all-gather), a reduce-scatter or all-gather of S moves S. With DP 1 the
    plan's collectives have a group of one and move nothing: 0."""
    if result.scenario.layout.dp == 1:
        return 0.0
    total = 0.0
    for (group, op), stats in result.comm.items():
        if group == "dp":
            total += stats.payload_bytes * (2 if op == "all_reduce" else 1)
    return total / len(result.step_seconds)


def _per_step(times: list[float], step_seconds: list[float]) -> list[int]:
    """How many of `times` (s) fall in each step (steps run back to back from t = 0; the set-up before
    the first step counts as the first)."""
    ends = list(itertools.accumulate(step_seconds))
    counts = [0] * len(ends)
    for t in times:
        counts[min(bisect.bisect_left(ends, t), len(ends) - 1)] += 1
    return counts


def _fragmentation_at_reserved_peak(ledger) -> int:
    """reserved − allocated at the moment reserved memory peaked (bytes)."""
    i = ledger.reserved_rows.index(ledger.peak_reserved) if ledger.peak_reserved in ledger.reserved_rows else -1
    return ledger.peak_reserved - sum(ledger.rows[i]) if ledger.rows else 0


def _calibration(note: Any) -> dict[str, Any] | None:
    """The profile's calibration (zsim.fabric.cluster.CalibrationNote) as JSON; None for a profile
    `zsim calibrate` did not write."""
    if note is None:
        return None
    return {"base": note.base, "date": note.date, "fitted_terms": list(note.fitted),
            "kept_from_base": dict(note.kept), "warning": list(note.warning)}


def _attention_memory(result: Result) -> dict[str, Any]:
    """One layer's s×s attention tensors (zsim.workload.activations.attention_score_bytes: 0 with
    FlashAttention or selective recompute), how many layers keep them at once (all L without
    checkpointing, the k layers of a recomputed segment with full recompute), and that total's share
    of the activations held at the allocated peak: the summary names it when it dominates."""
    s, w = result.scenario, result.workload
    z = s.zero
    if w.shape is None or selective(s):
        return {"score_bytes_per_layer": 0, "layers_holding": 0, "share_of_peak_activations": 0.0}
    e = 4 if s.precision.dtype == "fp32" else 2
    scores = attention_score_bytes(w.shape, s.model.seq_len, s.model.micro_batch, s.layout.mp, e)
    full = z.activation_checkpointing and z.recompute_granularity == "full"  # selective keeps every layer's
    layers = min(z.checkpoint_every, s.model.layers) if full else s.model.layers
    held = result.ledger.peak_by_category.get("activations", 0)
    return {"score_bytes_per_layer": scores, "layers_holding": layers,
            "share_of_peak_activations": min(1.0, layers * scores / held) if held else 0.0}


def facts(result: Result) -> dict[str, Any]:
    s, w, ledger = result.scenario, result.workload, result.ledger
    steps = len(result.step_seconds)
    gpus = s.layout.world
    mean_step = result.total_seconds / steps
    peak_flops = s.cluster.gpu.peak_flops[s.precision.dtype]
    hw_tflops = result.hardware_flops / result.total_seconds / 1e12
    psi_bytes = PARAM_BYTES[s.precision.dtype] * w.params_per_mp_rank
    if result.pipeline is not None:  # Ψ of the worst stage's rank: what its DP group reduces (stages 0-1 keep all of it)
        psi_bytes = result.model_states.params
    oom = ledger.oom
    ep_group, ep_factor, ep_share = ep_dispatch(s)  # where the MoE all-to-alls run (zsim.zero.rank_states)
    f = {
        "schema": RESULT_SCHEMA,
        "zsim_version": __version__,
        "scenario": {"name": s.name, "source": s.source, "description": s.description},
        "model": {
            "params": w.total_params,
            "params_per_mp_rank": w.params_per_mp_rank,
            # MoE: parameters one token passes through (model FLOPs count these: 6 per token, + attention)
            "active_params": active_params(s.model),
            "expert_params_per_rank": w.expert_params_per_rank,
            **dump(s.model),
            "padded_vocab": w.padded_vocab,
            "grad_accum": s.grad_accum,
            "global_batch": s.model.micro_batch * s.parallel.dp * s.grad_accum,  # data-parallel replicas: dp, not dp × cp
        },
        "layout": {
            "gpus": gpus, "nodes": s.cluster.nodes, "gpus_per_node": s.cluster.gpus_per_node,
            "dp": s.parallel.dp, "mp": s.layout.mp, "hardware": s.cluster.name, "gpu": s.cluster.gpu.name,
            **({"cp": s.parallel.cp} if s.parallel.cp > 1 else {}),
            "sequence_parallel": s.parallel.sequence_parallel and s.layout.mp > 1, "ep": s.layout.ep,
            **({"expert_mp": s.layout.expert_mp, "ep_overlap": s.parallel.ep_overlap} if s.model.moe is not None else {}),
            **({"pp": s.layout.pp} if result.pipeline is not None else {}),
        },
        **({"pipeline": result.pipeline} if result.pipeline is not None else {}),
        "zero": dump(s.zero),
        "precision": dump(s.precision),
        "fabric": {**dump(s.fabric), "mode": result.mode},
        "inter_node": network_facts(s.cluster),
        "fits": result.fits,
        "memory": {
            "capacity_bytes": ledger.capacity,
            "peak_bytes": ledger.peak,
            "peak_time_s": ledger.peak_time,
            "margin_bytes": ledger.capacity - ledger.peak,
            "peak_by_category": {c: ledger.peak_by_category[c] for c in CATEGORIES},
            "model_states": result.model_states.as_dict(),
            "reserved_peak_bytes": ledger.peak_reserved,
            "reserved_peak_time_s": ledger.peak_reserved_time,
            "reserved_margin_bytes": ledger.capacity - ledger.peak_reserved,
            "fragmentation_at_reserved_peak_bytes": _fragmentation_at_reserved_peak(ledger),
            "segments": ledger.allocator.segments,
            "allocator_flushes": len(ledger.flush_times),
            "allocator_flushes_per_step": _per_step(ledger.flush_times, result.step_seconds),
            "arenas": {name: arena.size for name, arena in ledger.arenas.items()},
            "host_peak_bytes": result.host_ledger.peak if result.host_ledger else 0,
            "oom": None if oom is None else {
                "time_s": oom.time_s, "category": oom.category, "allocation": oom.tag,
                "allocation_bytes": oom.nbytes, "total_bytes": oom.total_bytes,
                "reserved_bytes": oom.reserved_bytes,
                "rank_class": "all ranks" if result.pipeline is None else
                f"pipeline stage {result.pipeline['worst_stage']} (ranks "
                f"{result.pipeline['per_stage'][result.pipeline['worst_stage']]['ranks']})",
            },
            "timeline": timeline_facts(ledger),
            "attention": _attention_memory(result),
        },
        "time": {
            "step_seconds": result.step_seconds,
            "mean_step_seconds": mean_step,
            "compute_seconds_per_step": result.compute_seconds / steps,
            "mp_comm_seconds_per_step": result.mp_comm_seconds / steps,
            "exposed_comm_seconds_per_step": mean_step - result.compute_seconds / steps,
            "offload_seconds_per_step": result.offload_seconds / steps,
            "ep_comm_seconds_per_step": result.ep_comm_seconds / steps,
            # fabric.sm_contention: compute time lost to collectives' SMs (part of compute_seconds_per_step)
            **({"sm_contention_seconds_per_step": result.contention_seconds / steps}
               if s.fabric.sm_contention else {}),
        },
        # How wrong zsim has been on held-out published runs of this regime (zsim.report.band).
        "band": band_facts(s, mean_step),
        "throughput": {
            "tflops_per_gpu": hw_tflops,
            "model_tflops_per_gpu": result.model_flops / result.total_seconds / 1e12,
            "peak_tflops_per_gpu": peak_flops / 1e12,
            "percent_of_peak": 100 * hw_tflops * 1e12 / peak_flops,
            # Model FLOPs utilisation: the model's forward and backward FLOPs (no recompute) per second
            # over the peak (Chowdhery et al. 2022, PaLM, appendix B); percent_of_peak counts recompute.
            "mfu_percent": 100 * result.model_flops / result.total_seconds / peak_flops,
            "aggregate_pflops": hw_tflops * gpus / 1e3,
            # precision.fp8: the peaks above stay the 16-bit ones (docs/models.md, "FP8 training"); this is FP8's
            **({"fp8_peak_tflops_per_gpu": s.cluster.gpu.peak_flops["fp8"] / 1e12} if s.precision.fp8 != "none" else {}),
            # precision.fp4 likewise: the NVFP4 peak its linear layers' GEMMs run at
            **({"fp4_peak_tflops_per_gpu": s.cluster.gpu.peak_flops["fp4"] / 1e12} if s.precision.fp4 != "none" else {}),
            # the share of its tables' burst rate the GPU's tensor-core work ran at: its power-capped clock (the
            # profile's sustained_ratio, docs/compute.md "Sustained clocks"; 1 where none is known or on a CPU host)
            "sustained_ratio": 1.0 if s.cluster.gpu.compute is None else s.cluster.gpu.compute.sustained_ratio,
            # a burst's tensor-core rate over what the GPU's carried terms give at its datasheet peak (burst_ratio)
            "burst_ratio": 1.0 if s.cluster.gpu.compute is None else s.cluster.gpu.compute.burst_ratio,
            "tokens_per_second": s.model.seq_len * s.model.micro_batch * s.parallel.dp * s.grad_accum / mean_step,
            # what Megatron-Core's log line would say for this step (its own FLOP count: causal attention
            # halved, recompute not counted; zsim.workload.flop_counts), None for MLA
            "megatron_tflops_per_gpu": (None if (mc := megatron_core_flops(s.model, s.layout.mp, s.parallel.dp * s.grad_accum))
                                        is None else mc / mean_step / gpus / 1e12),
        },
        "comm": {
            "dp_volume_bytes_per_step": dp_volume_bytes(result),
            "dp_volume_over_psi": dp_volume_bytes(result) / psi_bytes,
            "psi_bytes": psi_bytes,
            "algorithms": result.algorithms,
            # MoE with EP: the copies of a token its dispatch sends (zsim.workload.moe: top_k, or DeepEP's ranks hit)
            **({"ep_dispatcher": moe.dispatcher, "ep_copies_per_token": moe.copies_per_token(s.layout.ep) * ep_factor,
                "ep_nic_share": ep_share, "ep_group": ep_group}
               if (moe := Moe.of(s.model)) is not None and s.layout.ep > 1 else {}),
            "collectives": [
                {"group": group, "op": op, "count_per_step": st.count / steps,
                 "payload_bytes_per_step": st.payload_bytes / steps, "sent_bytes_per_step": st.sent_bytes / steps,
                 "seconds_per_step": st.seconds / steps}
                for (group, op), st in sorted(result.comm.items())
            ],
        },
        "calibration": _calibration(s.cluster.calibration),
        "simulation": {
            "mode": result.mode,
            "rank_classes": [{"pid": 0, "ranks": f"0-{gpus - 1}", "count": gpus}] if result.pipeline is None else
            [{"pid": s.layout.first_rank(st["stage"]), "ranks": st["ranks"], "count": s.layout.stage_ranks}
             for st in result.pipeline["per_stage"]],
            "events": result.sim_events,
            "wall_seconds": result.wall_seconds,
        },
    }
    f["memory"]["hint"] = hint_facts(f)  # the keys that cut an out-of-memory peak (zsim.report.memory_hint)
    return f
