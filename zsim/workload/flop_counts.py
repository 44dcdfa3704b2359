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
