"""A GPT-style decoder (nanoGPT's shape): token + position embedding, N pre-LN blocks of causal
self-attention and MLP, final layer norm and LM head. Shapes are commented as (B, T, C):
B = micro-batch, T = seq_len, C = hidden.

The model is cut into *units* that the ZeRO engine handles one at a time (one flat parameter
buffer each): `Embedding`, every `Block`, and `Head` (which also computes the loss). Parameters
are plain nn.Parameters here; the engine replaces them with views of its flat buffers through
`torch.func.functional_call`, so this file stays a readable model and doubles as the reference
for the single-process and torch ZeRO/FSDP cross-checks.

The LM head is not tied to the token embedding (Megatron-LM ties them): tying would make one
tensor belong to two units. The parameter count Ψ that traces record is this model's exact count.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True, kw_only=True)
class GPTConfig:
    """The model's shape (taken from a scenario's `model:` section)."""

    layers: int  # transformer blocks N
    hidden: int  # hidden size h (C)
    heads: int  # attention heads a; divides hidden
    seq_len: int  # tokens per sequence T
    vocab: int  # vocabulary size V


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.heads = cfg.heads
        self.qkv = nn.Linear(cfg.hidden, 3 * cfg.hidden)  # C -> 3C
        self.proj = nn.Linear(cfg.hidden, cfg.hidden)  # C -> C

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)  # 3 x (B, T, C)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))  # (B, a, T, C/a)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, a, T, C/a)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))  # (B, T, C)


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.hidden, 4 * cfg.hidden)  # C -> 4C
        self.proj = nn.Linear(4 * cfg.hidden, cfg.hidden)  # 4C -> C

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))  # (B, T, C)


class Block(nn.Module):
    """One transformer layer: x + attn(ln1(x)), then + mlp(ln2(.)). 12h² + 13h parameters."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.hidden)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.hidden)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))  # (B, T, C)


class Embedding(nn.Module):
    """Token + learned position embedding: (B, T) int64 -> (B, T, C)."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.tokens = nn.Embedding(cfg.vocab, cfg.hidden)
        self.positions = nn.Embedding(cfg.seq_len, cfg.hidden)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        return self.tokens(idx) + self.positions(positions)  # (B, T, C)


class Head(nn.Module):
    """Final layer norm, LM head and the mean next-token cross-entropy (computed in fp32)."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln = nn.LayerNorm(cfg.hidden)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)  # C -> V

    def forward(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(self.ln(x))  # (B, T, V)
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


class GPT(nn.Module):
    """The whole model as a list of units: [Embedding, Block x N, Head]."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.units = nn.ModuleList([Embedding(cfg), *(Block(cfg) for _ in range(cfg.layers)), Head(cfg)])
        self.apply(_init_weights)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The mean loss of a (B, T) batch of tokens against (B, T) targets."""
        x = idx
        for unit in self.units[:-1]:
            x = unit(x)
        return self.units[-1](x, targets)


def unit_name(index: int, count: int) -> int | str:
    """The trace name of unit `index` of `count`: "embed", 0..N-1 (the blocks), "head"."""
    if index == 0:
        return "embed"
    if index == count - 1:
        return "head"
    return index - 1


def _init_weights(module: nn.Module) -> None:
    # GPT-2 initialisation (nanoGPT): N(0, 0.02) weights, zero biases.
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


def forward_flops(cfg: GPTConfig, unit: int | str, micro_batch: int, mp: int = 1) -> int:
    """Forward FLOPs of one unit for a micro-batch on one rank (backward is 2x, recompute 1x).

    Per block 24·B·s·h² + 4·B·s²·h (Narayanan et al., "Efficient Large-Scale Language Model
    Training on GPU Clusters", SC'21, §5.1: the matmuls of QKV, projection and MLP, plus QKᵀ and
    attention·V), divided by the MP degree (each MP rank computes 1/mp of a block); the head
    2·B·s·h·V (replicated on every MP rank); the embedding is a lookup (0).
    """
    b, s, h = micro_batch, cfg.seq_len, cfg.hidden
    if unit == "embed":
        return 0
    if unit == "head":
        return 2 * b * s * h * cfg.vocab
    return (24 * b * s * h * h + 4 * b * s * s * h) // mp
