"""What a run that does not fit could change: when activations (or model states) are most of the
out-of-memory peak, the options of the scenario that cut them and that it does not use yet, by key
(docs/memory.md, "When a run does not fit"). A list of levers, not a promise: none of them is simulated here,
and the summary says so."""

from __future__ import annotations

from typing import Any

ACTIVATION_SHARE = 0.5  # activations at least this share of the peak: below it, model states are the problem


def activation_options(f: dict[str, Any]) -> list[str]:
    """The keys `facts(result)` `f` could set to cut activations, in the order they usually save most:
    checkpointing when off; with selective recompute, the modules it does not recompute yet that the model
    has (moe for MoE blocks, mlp for dense ones); sequence parallelism with MP and without it; FlashAttention
    when the s×s scores are a third of the activations or more; a smaller micro-batch. [] when none applies."""
    z, lay, m = f["zero"], f["layout"], f["model"]
    options = []
    if not z["activation_checkpointing"]:
        options.append("zero.activation_checkpointing: true")
    elif z.get("recompute_granularity") == "selective":
        modules = z.get("recompute_modules")
        modules = ["core_attn"] if modules is None else modules
        moe = m.get("moe")
        scores = f["memory"]["attention"]["share_of_peak_activations"] >= 1 / 3  # the s×s scores a third or more
        wanted = (["core_attn"] if scores else []) + (["moe"] if moe else []) + (
            ["mlp"] if not moe or moe.get("dense_layers") else [])
        missing = [name for name in wanted if name not in modules]
        if missing:
            options.append(f"zero.recompute_modules with {' and '.join(missing)}")
        options.append("zero.recompute_granularity: full")
    if lay["mp"] > 1 and not lay["sequence_parallel"]:
        options.append("parallel.sequence_parallel: true")
    if f["memory"]["attention"]["share_of_peak_activations"] >= 1 / 3:
        options.append("model.attention: auto (FlashAttention keeps no s×s scores)")
    if m["micro_batch"] > 1:
        options.append(f"model.micro_batch below {m['micro_batch']}")
    return options


def state_options(f: dict[str, Any]) -> list[str]:
    """The keys that cut model states (ZeRO §5): a higher ZeRO stage (stages 2-3 refused with a pipeline, as
    DeepSpeed refuses them), a larger MP degree (which also splits activations)."""
    z, lay = f["zero"], f["layout"]
    options = []
    if z["stage"] < 3 and lay.get("pp", 1) == 1:
        options.append(f"zero.stage above {z['stage']}")
    elif z["stage"] < 1:
        options.append("zero.stage: 1")
    options.append(f"parallel.mp above {lay['mp']}" + (" (or parallel.pp)" if lay.get("pp", 1) > 1 else ""))
    return options


def hint_facts(f: dict[str, Any]) -> dict[str, Any] | None:
    """result.json's memory.hint for `facts(result)` `f` (everything but memory.hint itself): for a run that
    does not fit, when activations are at least half of its allocated peak (memory.peak_by_category), the keys
    that cut them; when model states (params, grads, optimizer) are, the keys that partition or split them:
    {"tensors", "bytes", "share_of_peak", "keys"}. None for a run that fits, another peak, or no key left."""
    if f["fits"]:
        return None
    peak = f["memory"]["peak_by_category"]
    total = sum(peak.values())
    if not total:
        return None
    acts = peak.get("activations", 0)
    states = sum(peak.get(k, 0) for k in ("params", "grads", "optimizer"))
    if acts >= ACTIVATION_SHARE * total:
        what, size, options = "activations", acts, activation_options(f)
    elif states >= ACTIVATION_SHARE * total:
        what, size, options = "model states", states, state_options(f)
    else:
        return None
    if not options:
        return None
    return {"tensors": what, "bytes": size, "share_of_peak": size / total, "keys": options}


def memory_hint(f: dict[str, Any]) -> list[str]:
    """The summary's `hint` line from memory.hint (hint_facts); [] without one."""
    hint = f["memory"].get("hint")
    if not hint:
        return []
    return [f"  hint      {hint['tensors']} are {hint['share_of_peak']:.0%} of the peak ({hint['bytes'] / 1e9:.1f} GB); "
            f"keys that cut them, not simulated here: {'; '.join(hint['keys'])}"]
