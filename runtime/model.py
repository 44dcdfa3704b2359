"""A GPT-style decoder (nanoGPT's shape): token + position embedding, N pre-LN blocks of causal
self-attention and MLP, final layer norm and LM head. Shapes are commented as (B, T, C):
B = micro-batch, T = seq_len, C = hidden.

The model is cut into *units* that the ZeRO engine handles one at a time (one flat parameter
buffer each): `Embedding`, every `Block`, and `Head` (which also computes the loss). Parameters
are plain nn.Parameters here; the engine replaces them with views of its flat buffers through
`torch.func.functional_call`, so this file stays a readable model and doubles as the reference
for the single-process and torch ZeRO/FSDP cross-checks.

The LM head is tied to the word embedding by default (`tied_head`, as Megatron-LM and GPT-2 do):
the head unit then owns only the final layer norm and computes its logits with the embedding unit's
word weight, which the engine passes in. The vocabulary is padded as the simulator and Megatron-LM
pad it (`gpt_config`: a multiple of 128 x MP), so the parameter count Ψ that traces record is the
simulator's (zsim.workload.transformer.total_params).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from zsim.workload.transformer import padded_vocab


@dataclass(frozen=True, kw_only=True)
class GPTConfig:
    """The model's shape (taken from a scenario's `model:` section)."""

    layers: int  # transformer blocks N
    hidden: int  # hidden size h (C)
    heads: int  # attention heads a; divides hidden
    seq_len: int  # tokens per sequence T
    vocab: int  # vocabulary size V (padded: see gpt_config)
    tied_head: bool = True  # the LM head uses the word embedding's weight


def gpt_config(model, mp: int = 1) -> GPTConfig:
    """The GPTConfig of a scenario's model section (zsim.config.schema.ModelSection) for MP degree
    `mp`: the vocabulary padded to a multiple of 128·mp, as the simulator's workload and
    Megatron-LM (_vocab_size_with_padding) do."""
    return GPTConfig(layers=model.layers, hidden=model.hidden, heads=model.heads, seq_len=model.seq_len,
                     vocab=padded_vocab(model.vocab, mp), tied_head=getattr(model, "tied_head", True))


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
    """Final layer norm, LM head and the mean next-token cross-entropy (computed in fp32). Tied: no
    weight of its own; `forward` gets the word embedding's (V, C) weight."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln = nn.LayerNorm(cfg.hidden)
        self.lm_head = None if cfg.tied_head else nn.Linear(cfg.hidden, cfg.vocab, bias=False)  # C -> V

    def forward(self, x: torch.Tensor, targets: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
        w = weight if self.lm_head is None else self.lm_head.weight
        logits = F.linear(self.ln(x), w)  # (B, T, V)
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
        words = self.units[0].tokens.weight if self.cfg.tied_head else None
        return self.units[-1](x, targets, words)


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
    2·B·s·h·V/mp (its rows of the vocabulary); the embedding is a lookup (0).
    """
    b, s, h = micro_batch, cfg.seq_len, cfg.hidden
    if unit == "embed":
        return 0
    if unit == "head":
        return 2 * b * s * h * cfg.vocab // mp
    return (24 * b * s * h * h + 4 * b * s * s * h) // mp
