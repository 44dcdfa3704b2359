"""The terminal summary: what a person reads in ten seconds."""

from __future__ import annotations

from typing import Any

from zsim.report.memory_hint import memory_hint
from zsim.zero.ops import EP_GROUPS
from zsim.report.error_band import band_line

GB = 1e9


def _params(n: float) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6)):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:.0f}"


def _is_gpu(th: dict[str, Any]) -> bool:
    """A GPU run, not a CPU host's: a CPU host's peak is below one TFLOPS."""
    return th["peak_tflops_per_gpu"] >= 1.0


def _speed(th: dict[str, Any], fits: bool = True) -> str:
    """The speed line: model FLOPs utilisation (PaLM appendix B) and hardware FLOPs (recompute included),
    TFLOPS for a GPU, GFLOPS for a CPU host. A run that does not fit says its speed is what it would be
    had the GPU had room. Where the GPU's profile knows its power-capped clock (sustained_ratio < 1), the line
    says the share of the burst rate its tensor cores ran at."""
    if _is_gpu(th):
        rate = (f"model FLOPs utilisation (MFU) {th['mfu_percent']:.1f}%, hardware FLOPs {th['percent_of_peak']:.1f}% "
                f"(recompute included): {th['tflops_per_gpu']:.1f} of {th['peak_tflops_per_gpu']:.0f} TFLOPS/GPU"
                + (f" (the 16-bit peak, as FP8 runs are reported; FP8's is {fp8:.0f})" if (fp8 := th.get("fp8_peak_tflops_per_gpu"))
                   else f" (the 16-bit peak, as NVFP4 runs are reported; NVFP4's is {fp4:.0f})"
                   if (fp4 := th.get("fp4_peak_tflops_per_gpu")) else "") + f", {th['aggregate_pflops']:.2f} PFLOPS total")
    else:
        rate = (f"MFU {th['mfu_percent']:.1f}%, hardware FLOPs {th['percent_of_peak']:.1f}% (recompute included): "
                f"{th['tflops_per_gpu'] * 1e3:.1f} of {th['peak_tflops_per_gpu'] * 1e3:.1f} GFLOPS/rank, "
                f"{th['aggregate_pflops'] * 1e6:.1f} GFLOPS total")
    lead = "  speed     " if fits else "  speed     (had it fit, which it does not) "
    capped = th.get("sustained_ratio", 1.0)
    return (f"{lead}{rate}, {th['tokens_per_second']:,.0f} tokens/s"
            + (f"; tensor cores at {capped:.2f} of their burst rate (the power cap)" if capped < 1 else ""))


def _attention_line(mem: dict[str, Any], model: dict[str, Any]) -> list[str]:
    """Names attention's share of the activations when one layer's s×s scores are most of them."""
    att = mem.get("attention") or {}
    if not att.get("score_bytes_per_layer") or att["share_of_peak_activations"] < 0.5:
        return []
    n = att["layers_holding"]
    return [f"  attention the s×s attention scores ({model['heads']} heads × {model['seq_len']}² per sequence, "
            f"{att['score_bytes_per_layer'] / GB:,.2f} GB/GPU per layer, {n} layer{'s' if n > 1 else ''} at once) are "
            f"{att['share_of_peak_activations']:.0%} of the activations at the peak: "
            "model.attention: flash2 (or flash3 on Hopper) keeps none"]


def _implementation(z: dict[str, Any]) -> str:
    """' as <implementation>' when the plan follows a framework's code, not the paper's schedule (zero.implementation)."""
    impl = z.get("implementation", "paper")
    return "" if impl == "paper" else f" as {impl}"


def _zero_r(z: dict[str, Any], mem: dict[str, Any]) -> str:
    """The ZeRO-R options in effect (paper §6 names), and host memory when Pa+cpu uses it."""
    # megatron-core has no CB: its contiguous buffer is cut into buckets of its own (zsim.zero.megatron_ddp)
    cb = z.get("implementation") != "megatron-core"
    names = [name for key, name in (("partition_activations", "Pa"), ("cpu_offload_activations", "+cpu"),
                                    ("constant_buffers", " CB" if cb else ""), ("defragment", " MD")) if z[key]]
    text = "".join(names).strip()
    host = f", host {mem['host_peak_bytes'] / GB:.2f} GB" if mem["host_peak_bytes"] else ""
    return f"; ZeRO-R {text}{host}" if text else host


def _shape(m: dict[str, Any]) -> str:
    """The model's departures from the GPT shape (docs/models.md), e.g. ', SwiGLU 28672, 8 KV heads'."""
    parts = [f"{'SwiGLU' if m.get('gated_mlp') else 'MLP'} {m['ffn_hidden']}" if m.get("ffn_hidden") else
             ("SwiGLU" if m.get("gated_mlp") else ""),
             f"{m['kv_heads']} KV heads" if m.get("kv_heads") not in (None, m["heads"]) else "",
             f"MLA (KV latent {m['mla']['kv_lora_rank']})" if m.get("mla") else "",
             {"head": "QK-norm", "full": "QK-norm"}.get(m.get("qk_norm"), ""),
             f"{m['layer_norms']} norm{'s' if m['layer_norms'] != 1 else ''} per block" if m.get("layer_norms", 2) != 2 else "",
             {"rmsnorm": "RMSNorm", "nonparametric": "LayerNorm without weights"}.get(m.get("norm"), ""), {"rotary": "rotary", "alibi": "ALiBi"}.get(m.get("position"), ""),
             "embedding LayerNorm" if m.get("embedding_norm") else "",
             "untied head" if m.get("tied_head") is False else "",
             (f"MoE {m['moe']['experts']} experts top {m['moe']['top_k']}"
              + (f" + {m['moe']['shared_experts']} shared" if m["moe"].get("shared_experts") else "")
              + f" ({_params(m['active_params'])} active per token: model FLOPs count these)") if m.get("moe") else ""]
    return "".join(f", {p}" for p in parts if p)


def _pipeline(pp: dict[str, Any] | None) -> list[str]:
    """The pipeline's lines: schedule and sizes, the bubble measured beside its closed form, the p2p time,
    each stage's allocated peak (the memory line above is the worst stage's)."""
    if pp is None:
        return []
    v = f" × v {pp['virtual_stages']}" if pp["schedule"] == "interleaved" else ""
    peaks = ", ".join(f"{st['peak_bytes'] / GB:.1f}" for st in pp["per_stage"])
    return [f"  pipeline  {pp['schedule']} over p {pp['stages']} stages{v}, m {pp['micro_batches']} micro-batches: bubble "
            f"{pp['bubble_measured']:.1%} of the step measured (closed form {pp['bubble_closed_form']:.1%}); p2p sends "
            f"{pp['p2p_send_seconds_per_step']:.4f} s/step, {pp['p2p_sent_bytes_per_step'] / GB:.2f} GB/step per GPU",
            f"            allocated peak per stage {peaks} GB; the memory lines are stage {pp['worst_stage']}'s (the tightest)"]


def _cautions(mem: dict[str, Any]) -> list[str]:
    """What the step time leaves out: the caching allocator released its cache (its time is not simulated;
    one flush-and-retry measured ~3.7 ms on an H200, docs/device-check.md)."""
    lines = []
    per_step = mem["allocator_flushes_per_step"]
    if any(per_step):
        last, steps = per_step[-1], len(per_step)
        when = (f"{last} in the last of {steps} steps: every step, once the cache has settled" if last and steps > 1
                else f"in step {', '.join(str(k + 1) for k, n in enumerate(per_step) if n)} of {steps}")
        lines.append(f"  caution   {sum(per_step)} allocator cache flush{'es' if sum(per_step) > 1 else ''} ({when}): "
                     "PyTorch released its cached blocks and retried cudaMalloc, which waits for the GPU; "
                     "their time is not in the step")
    return lines


def _calibration(cal: dict[str, Any] | None) -> list[str]:
    """What a calibrated profile measured and what it carried over unmeasured, by section, and the
    warning of a poor fit accepted (zsim.calibrate.fit_quality)."""
    if not cal:
        return []
    by_section: dict[str, list[str]] = {}
    for name, value in cal["kept_from_base"].items():
        head, _, rest = name.partition(".")
        if head == "inter_node" and rest.startswith("network."):
            head, rest = "inter-node", rest[len("network."):]
        elif head == "inter_node":
            head = "inter-node"
        by_section.setdefault(head, []).append(f"{rest} {value:g}")
    if not cal["fitted_terms"] and not cal["kept_from_base"]:  # written before profiles listed their terms
        lines = [f"  profile   calibrated from '{cal['base']}' on {cal['date']} by an earlier zsim, which did not list "
                 "the terms it fitted and kept: calibrate again to see them"]
    else:
        lines = [f"  profile   calibrated from '{cal['base']}' on {cal['date']}: {len(cal['fitted_terms'])} terms fitted; "
                 f"{len(cal['kept_from_base'])} never measured, carried over from the base"
                 + (":" if cal["kept_from_base"] else "")]
    lines += [f"            {section}: {', '.join(terms)}" for section, terms in by_section.items()]
    if cal["warning"]:
        lines.append(f"  warning   a poor fit, written with --accept-poor-fit: {'; '.join(cal['warning'])}")
    return lines



def _ep_words(lay: dict) -> str:
    """The layout line's expert parallelism: EP carved out of DP (experts split across MP), or folded over MP
    and DP with the experts whole (parallel.expert_mp 1, docs/moe.md)."""
    if lay.get("ep", 1) <= 1:
        return ""
    if lay.get("expert_mp", lay["mp"]) < lay["mp"]:
        return f" (EP {lay['ep']} over MP × DP, experts whole)"
    return f" (EP {lay['ep']} within DP)"

def _fp8_words(precision: dict[str, Any]) -> str:
    """The layout line's FP8 or NVFP4 clause (precision.fp8, precision.fp4; zsim.compute.fp8) and FP8 attention's
    (precision.fp8_attention); '' without any."""
    attention = "; FP8 attention (cuDNN)" if precision.get("fp8_attention") else ""
    return _linear_words(precision) + attention


def _linear_words(precision: dict[str, Any]) -> str:
    """The FP8 or NVFP4 linear layers' clause; '' for 16-bit GEMMs."""
    if precision.get("fp4", "none") == "nvfp4":
        return f"; NVFP4 linear layers (16-element block scaling; MFU against the {precision['dtype']} peak)"
    recipe = precision.get("fp8", "none")
    if recipe == "none":
        return ""
    scaling = {"delayed": "delayed scaling", "current": "current scaling", "blockwise": "blockwise scaling",
               "mxfp8": "MXFP8 block scaling"}[recipe]
    return f"; FP8 linear layers ({scaling}; MFU against the {precision['dtype']} peak)"


def summary(f: dict[str, Any], outputs: dict[str, str] | None = None) -> str:
    """Format `facts(result)` as a few aligned lines."""
    m, lay, z, mem, t, th, c = f["model"], f["layout"], f["zero"], f["memory"], f["time"], f["throughput"], f["comm"]
    title = f["scenario"]["name"] + (f" — {f['scenario']['description']}" if f["scenario"]["description"] else "")
    every = f" every {z['checkpoint_every']} layers" if z["checkpoint_every"] > 1 else ""
    ckpt = f"checkpointing on{every}" if z["activation_checkpointing"] else "no checkpointing"
    if z["activation_checkpointing"] and z.get("recompute_granularity") == "selective":
        modules = z.get("recompute_modules")
        modules = ["core_attn"] if modules is None else modules  # Megatron-Core's default
        ckpt = f"selective recompute ({', '.join(modules) or 'nothing'})"
    peak = mem["peak_by_category"]
    states = mem["model_states"]
    if f["fits"]:
        fit = (f"FITS  reserved peak {mem['reserved_peak_bytes'] / GB:.1f} GB of {mem['capacity_bytes'] / GB:.1f} GB "
               f"(margin {mem['reserved_margin_bytes'] / GB:.1f} GB) at t = {mem['reserved_peak_time_s']:.2f} s; "
               f"allocated peak {mem['peak_bytes'] / GB:.1f} GB at t = {mem['peak_time_s']:.2f} s")
    else:
        o = mem["oom"]
        fit = (f"OOM   at t = {o['time_s']:.3f} s on {o['rank_class']}: allocating {o['allocation_bytes'] / GB:.2f} GB "
               f"of {o['category']} ({o['allocation']}) needed {o['reserved_bytes'] / GB:.1f} GB reserved "
               f"> {mem['capacity_bytes'] / GB:.1f} GB ({o['total_bytes'] / GB:.1f} GB allocated with it); "
               f"run on as if the GPU had room, the step peaks at {mem['peak_bytes'] / GB:.1f} GB allocated, "
               f"{mem['reserved_peak_bytes'] / GB:.1f} GB reserved")
    per_op = ", ".join(f"{x['op']} {x['payload_bytes_per_step'] * (2 if x['op'] == 'all_reduce' else 1) / c['psi_bytes']:.2f}Ψ"
                       for x in c["collectives"] if x["group"] == "dp") if lay["dp"] * lay.get("cp", 1) > 1 else "no DP group"
    mp_bytes = sum(x["payload_bytes_per_step"] for x in c["collectives"] if x["group"] == "mp")
    ep_bytes = sum(x["payload_bytes_per_step"] for x in c["collectives"] if x["group"] in EP_GROUPS)
    overrides = f["scenario"].get("overrides")
    lines = [
        f"zsim · {title}",
        *([f"  overrides {', '.join(overrides)} (the title is the file's)"] if overrides else []),
        f"  model     {_params(m['params'])} params (Ψ), {m['layers']} layers × hidden {m['hidden']}{_shape(m)}, "
        f"seq {m['seq_len']}, "
        f"micro-batch {m['micro_batch']}, global batch {m['global_batch']}",
        f"  layout    {lay['gpus']} × {lay['gpu']} = {lay['nodes']} {lay['hardware']} nodes; "
        f"DP {lay['dp']}" + (f" × CP {lay['cp']}" if lay.get("cp", 1) > 1 else "") + f" × MP {lay['mp']}" + _ep_words(lay)
        + (f" × PP {lay['pp']}" if lay.get("pp", 1) > 1 else "")
        + f"; ZeRO stage {z['stage']}{_implementation(z)}, {ckpt}" + _fp8_words(f["precision"]),
        f"  memory    {fit}",
        "            at peak: " + "  ".join(f"{k} {v / GB:.2f}" for k, v in peak.items()) + " GB",
        f"            model states {states['total'] / GB:.2f} GB/GPU (params {states['params'] / GB:.2f}, "
        f"grads {states['grads'] / GB:.2f}, optimizer {states['optimizer'] / GB:.2f}); fragmentation at the "
        f"reserved peak {mem['fragmentation_at_reserved_peak_bytes'] / GB:.2f} GB" + _zero_r(z, mem),
        f"  time      step {t['mean_step_seconds']:.3f} s: compute {t['compute_seconds_per_step']:.3f} s"
        + (f" ({t['sm_contention_seconds_per_step']:.3f} s of it lost to the SMs collectives held)"
           if "sm_contention_seconds_per_step" in t else "") + ", "
        f"{'exposed comm and pipeline bubble' if f.get('pipeline') else 'exposed comm'} "
        f"{t['exposed_comm_seconds_per_step']:.3f} s (MP "
        f"{'all-gather/reduce-scatter' if lay.get('sequence_parallel') else 'all-reduce'} in line "
        f"{t['mp_comm_seconds_per_step']:.3f} s"
        + (f"; Pa+cpu host copies {t['offload_seconds_per_step']:.3f} s" if t["offload_seconds_per_step"] else "")
        + (f"; EP all-to-all {'beside the other pass in 1F1B' if lay.get('ep_overlap') else 'in line'} "
           f"{t['ep_comm_seconds_per_step']:.3f} s" if t.get("ep_comm_seconds_per_step") else "")
        + ")",
        *_pipeline(f.get("pipeline")),
        *([band_line(f["band"])] if f.get("band") else []),
        *_attention_line(mem, m),
        _speed(th, f["fits"]),
        *memory_hint(f),
        *_cautions(mem),
        *_calibration(f.get("calibration")),
        f"  comm/GPU  DP {c['dp_volume_bytes_per_step'] / GB:.1f} GB/step = {c['dp_volume_over_psi']:.2f}Ψ ({per_op}); "
        f"MP {mp_bytes / GB:.1f} GB/step" + (f"; EP all-to-all {ep_bytes / GB:.1f} GB/step" if ep_bytes else "")
        + (f" ({c['ep_dispatcher']} dispatch: {c['ep_copies_per_token']:.2f} copies a token"
           + (f", {c['ep_nic_share']:.2f}x an even spread across nodes" if c["ep_nic_share"] < 1 else "") + ")"
           if ep_bytes and "ep_dispatcher" in c else ""),
    ]
    fab = f.get("fabric", {})
    algos = ", ".join(f"{g.upper()} {a}" for g, a in sorted(c["algorithms"].items()))
    degraded = "; degraded: " + ", ".join(
        f"{d['link']} {d['index']} of {'GPU ' + str(d['gpu']) if d['link'] == 'nvlink' else 'node ' + str(d['node'])} "
        f"×{d['factor']:g}" for d in fab.get("degrade", [])) if fab.get("degrade") else ""
    lines.append(f"  fabric    {fab.get('mode', 'class').replace('_', '-')} mode; {algos}{degraded}")
    net = f.get("inter_node")
    if net and net["status"] != "single node":
        t = net["terms"]
        lines.append(f"  network   inter-node: {net['line']} (efficiency {t['efficiency']:.2f}, tree "
                     f"{t['tree_efficiency']:.2f}, step {t['latency_us']:.1f} µs + {t['latency_growth_us']:.1f} µs "
                     "per doubling" + (f"; LL at most {net['ll_ceiling_GBps']:g} GB/s busbw, NCCL's ceiling"
                                       if net.get("ll_ceiling_GBps") else "") + ")")
    if outputs:
        lines.append("  outputs   " + ", ".join(outputs.values()))
    return "\n".join(lines)
