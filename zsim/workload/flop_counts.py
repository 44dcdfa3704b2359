"""FLOP counts as frameworks log them, beside zsim's own (model FLOPs, zsim.workload.transformer): what a user
compares zsim's speed with when reading a framework's log line.
"""

from __future__ import annotations

from zsim.config.model_section import ModelSection
from zsim.workload.transformer import model_vocab


def megatron_core_flops(model: ModelSection, mp: int, sequences: int) -> float | None:
    """FLOPs of one step of `sequences` sequences (micro-batch × DP × accumulation) as Megatron-Core counts them
    for its TFLOPS/GPU log line (megatron/training/training.py num_floating_point_operations, transformer_flops;
    read at NVIDIA/Megatron-LM d98e8a6): per token 3 (forward, wgrad, dgrad) × 2 (FMA) × [h·(3 or 2)·(f·dense
    layers + f_e·top_k·MoE layers + f_s·MoE layers) + L·(h·(q + 2kv) + q·h) + h·V_padded] and per token and layer
    3·2·q·s/2·2 for the causal core attention, q = heads·d and kv = kv_heads·d; recompute not counted. The
    vocabulary padded as zsim pads it (model.vocab_padding × mp). None for MLA, whose count Megatron-Core forms
    otherwise (not implemented here)."""
    if getattr(model, "mla", None) is not None:
        return None
    m = model
    tokens = m.micro_batch * sequences * m.seq_len
    h, layers, gated = m.hidden, m.layers, 3 if m.gated_mlp else 2
    d = m.head_dim or h // m.heads
    q, kv = m.heads * d, (m.kv_heads or m.heads) * d
    moe = m.moe
    if moe is None:
        mlp = (m.ffn_hidden or 4 * h) * layers
    else:
        moe_layers = layers - moe.dense_layers
        expert = moe.expert_ffn_hidden or m.ffn_hidden or 4 * h
        shared = moe.shared_experts * (moe.shared_ffn_hidden or expert)
        mlp = (m.ffn_hidden or 4 * h) * moe.dense_layers + (expert * moe.top_k + shared) * moe_layers
    per_token = 6 * (h * gated * mlp + layers * (h * (q + 2 * kv) + q * h) + h * model_vocab(m, mp))
    return tokens * (per_token + 6 * q * m.seq_len * layers)


def megatron_core_08_flops(model: ModelSection, mp: int, sequences: int) -> float | None:
    """FLOPs of one step as Megatron-Core r0.8.0 counted them for its TFLOPS/GPU line (megatron/training/training.py
    @ core_r0.8.0 L73-108, num_floating_point_operations): 12·B·s·L·h²·[(1 + g/a + s/h)·q/h + (f/h)·k·(3/2 if
    SwiGLU) + V_padded/(2·L·h)], B the step's sequences, g/a query groups over heads, q = heads·d, k the experts a
    token is routed to (1 for a dense model). Unlike the later count (megatron_core_flops) the core attention is
    counted whole (s/h, not halved for causality) and a shared expert not at all. None for MLA and for a MoE with
    shared experts or dense layers, which r0.8.0's formula does not describe."""
    m = model
    moe = m.moe
    if getattr(m, "mla", None) is not None or (moe is not None and (moe.shared_experts or moe.dense_layers)):
        return None
    batch = m.micro_batch * sequences
    s, h, layers = m.seq_len, m.hidden, m.layers
    d = m.head_dim or h // m.heads
    q_ratio = m.heads * d / h
    groups = (m.kv_heads or m.heads) / m.heads
    ffn = (moe.expert_ffn_hidden or m.ffn_hidden or 4 * h) if moe is not None else (m.ffn_hidden or 4 * h)
    routed = moe.top_k if moe is not None else 1
    gated = 1.5 if m.gated_mlp else 1.0
    bracket = ((1 + groups + s / h) * q_ratio + ffn / h * routed * gated + model_vocab(m, mp) / (2 * layers * h))
    return 12 * batch * s * layers * h * h * bracket
