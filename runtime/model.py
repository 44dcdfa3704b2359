"""A decoder-only transformer: GPT (nanoGPT's shape) by default: token + position embedding, N pre-LN
blocks of causal self-attention and MLP, final layer norm and LM head. The shape options of the
scenario's model section (docs/models.md) give the LLaMA, Mistral, Qwen2 and GPT-NeoX shapes the
simulator counts: grouped-query attention (kv_heads), a gated SwiGLU MLP of any width, RMSNorm,
rotary positions, biases on or off. Shapes are commented as (B, T, C): B = micro-batch,
T = seq_len, C = hidden.

The model is cut into *units* that the ZeRO engine handles one at a time (one flat parameter
buffer each): `Embedding`, every `Block`, and `Head` (which also computes the loss). Parameters
are plain nn.Parameters here; the engine replaces them with views of its flat buffers through
`torch.func.functional_call`, so this file stays a readable model and doubles as the reference
for the single-process and torch ZeRO/FSDP cross-checks.

The LM head is tied to the word embedding by default (`tied_head`, as Megatron-LM and GPT-2 do):
the head unit then owns only the final layer norm and computes its logits with the embedding unit's
word weight, which the engine passes in. The vocabulary is padded as the simulator and Megatron-LM
pad it (`gpt_config`: a multiple of vocab_padding x MP, 128 unless the model says), so the parameter count Ψ that traces record is the
simulator's (zsim.workload.parameters.total_params).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from zsim.workload.transformer import model_vocab

if TYPE_CHECKING:
    from zsim.config.model_section import ModelSection


@dataclass(frozen=True, kw_only=True)
class GPTConfig:
    """The model's shape (taken from a scenario's `model:` section: `GPTConfig.of(model)`); the
    defaults are GPT's, the field names and meanings ModelSection's."""

    layers: int  # transformer blocks N
    hidden: int  # hidden size h (C)
    heads: int  # attention (query) heads a; divides hidden
    seq_len: int  # tokens per sequence T
    vocab: int  # vocabulary size V (padded: see gpt_config)
    ffn_hidden: int | None = None  # MLP inner width f; None: 4h
    gated_mlp: bool = False  # SwiGLU: down(silu(gate(x)) * up(x)), gate and up fused in one linear
    kv_heads: int | None = None  # key/value heads (grouped-query attention); None: heads
    linear_bias: bool = True  # biases on the attention output and the MLP's linears
    qkv_bias: bool | None = None  # biases on Q, K, V; None: linear_bias
    norm: str = "layernorm"  # "layernorm" or "rmsnorm"
    position: str = "learned"  # "learned" (a table) or "rotary" (RoPE, no parameters)
    max_positions: int | None = None  # rows of the learned position table; None: seq_len
    tied_head: bool = True  # the LM head uses the word embedding's weight

    @classmethod
    def of(cls, model: ModelSection) -> GPTConfig:
        """The shape of a validated model section (the same fields, same defaults)."""
        return cls(**{name: getattr(model, name) for name in cls.__dataclass_fields__})

    @property
    def ffn(self) -> int:
        return self.ffn_hidden or 4 * self.hidden

    @property
    def kv(self) -> int:
        """Key/value heads."""
        return self.kv_heads or self.heads

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def has_qkv_bias(self) -> bool:
        return self.linear_bias if self.qkv_bias is None else self.qkv_bias


def gpt_config(model: ModelSection, mp: int = 1) -> GPTConfig:
    """The GPTConfig of a scenario's model section for MP degree `mp`: every shape field copied, the
    vocabulary padded as the simulator's workload and Megatron-LM (_vocab_size_with_padding) pad it
    (zsim.workload.transformer.model_vocab: a multiple of vocab_padding·mp, 128 unless the model says)."""
    return replace(GPTConfig.of(model), vocab=model_vocab(model, mp))


def norm(cfg: GPTConfig) -> nn.Module:
    """LayerNorm (weight and bias) or RMSNorm (weight; eps 1e-5 as LLaMA's rms_norm_eps)."""
    return nn.LayerNorm(cfg.hidden) if cfg.norm == "layernorm" else nn.RMSNorm(cfg.hidden, eps=1e-5)


def rotary(x: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Rotary position embedding of (B, heads, T, d) queries or keys (Su et al. 2021, "RoFormer", eq. 34),
    in the rotate-half layout of Hugging Face's LLaMA (apply_rotary_pos_emb): pairs (i, i + d/2)."""
    T, d = x.shape[-2], x.shape[-1]
    inv_freq = base ** (-torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)  # (d/2,)
    angles = torch.outer(torch.arange(T, device=x.device, dtype=torch.float32), inv_freq).repeat(1, 2)  # (T, d)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * angles.cos().to(x.dtype) + torch.cat((-x2, x1), dim=-1) * angles.sin().to(x.dtype)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: bool) -> torch.Tensor:
    """Causal attention of (B, a, T, d) queries over (B, kv, T, d) keys and values; a query head i
    reads key/value head i // (a / kv) (grouped-query attention, Ainslie et al. 2023)."""
    if rope:
        q, k = rotary(q), rotary(k)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=k.shape[1] != q.shape[1])


def activate(y: torch.Tensor, gated: bool) -> torch.Tensor:
    """GeLU, or SwiGLU on the fused (gate, up) halves: silu(gate) * up (Shazeer 2020; LLaMA)."""
    if not gated:
        return F.gelu(y)
    gate, up = y.chunk(2, dim=-1)
    return F.silu(gate) * up


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = cfg.heads, cfg.kv, cfg.head_dim
        self.rope = cfg.position == "rotary"
        kv_width = cfg.kv * cfg.head_dim
        self.qkv = nn.Linear(cfg.hidden, cfg.hidden + 2 * kv_width, bias=cfg.has_qkv_bias)  # C -> C + 2·kv·d
        self.proj = nn.Linear(cfg.hidden, cfg.hidden, bias=cfg.linear_bias)  # C -> C

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        kv_width = self.kv_heads * self.head_dim
        q, k, v = self.qkv(x).split([C, kv_width, kv_width], dim=2)  # (B, T, C), 2 x (B, T, kv·d)
        q = q.view(B, T, self.heads, self.head_dim).transpose(1, 2)  # (B, a, T, d)
        k, v = (t.view(B, T, self.kv_heads, self.head_dim).transpose(1, 2) for t in (k, v))  # (B, kv, T, d)
        y = attend(q, k, v, self.rope)  # (B, a, T, d)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))  # (B, T, C)


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.gated = cfg.gated_mlp
        # C -> f (GeLU), or C -> 2f: gate and up fused in one matrix (Megatron-Core's linear_fc1)
        self.fc = nn.Linear(cfg.hidden, (2 if cfg.gated_mlp else 1) * cfg.ffn, bias=cfg.linear_bias)
        self.proj = nn.Linear(cfg.ffn, cfg.hidden, bias=cfg.linear_bias)  # f -> C

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(activate(self.fc(x), self.gated))  # (B, T, C)


class Block(nn.Module):
    """One transformer layer: x + attn(ln1(x)), then + mlp(ln2(.)). 12h² + 13h parameters for GPT."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.ln1 = norm(cfg)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = norm(cfg)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))  # (B, T, C)


class Embedding(nn.Module):
    """Token + learned position embedding: (B, T) int64 -> (B, T, C). A rotary model has no position
    table (its blocks rotate queries and keys)."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.tokens = nn.Embedding(cfg.vocab, cfg.hidden)
        self.positions = nn.Embedding(cfg.max_positions or cfg.seq_len, cfg.hidden) \
            if cfg.position == "learned" else None

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tokens(idx)  # (B, T, C)
        if self.positions is None:
            return x
        return x + self.positions(torch.arange(idx.shape[1], device=idx.device))  # (B, T, C)


class Head(nn.Module):
    """Final layer norm, LM head and the mean next-token cross-entropy (computed in fp32). Tied: no
    weight of its own; `forward` gets the word embedding's (V, C) weight."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln = norm(cfg)
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

    Per block, 2 FLOPs per multiply-add of each matmul (Narayanan et al., "Efficient Large-Scale
    Language Model Training on GPU Clusters", SC'21, §5.1): QKV 2·B·s·h·(h + 2·kv·d), QKᵀ and
    attention·V 4·B·s²·h, output projection 2·B·s·h², MLP 2·B·s·h·f per matrix (2 matrices, 3 when
    gated); for GPT 24·B·s·h² + 4·B·s²·h. Divided by the MP degree (each MP rank computes 1/mp of a
    block); the head 2·B·s·h·V/mp (its rows of the vocabulary); the embedding is a lookup (0).
    """
    b, s, h = micro_batch, cfg.seq_len, cfg.hidden
    if unit == "embed":
        return 0
    if unit == "head":
        return 2 * b * s * h * cfg.vocab // mp
    qkv = 2 * b * s * h * (h + 2 * cfg.kv * cfg.head_dim)
    mlp = (3 if cfg.gated_mlp else 2) * 2 * b * s * h * cfg.ffn
    return (qkv + 4 * b * s * s * h + 2 * b * s * h * h + mlp) // mp
