"""Megatron-style tensor (model) parallelism of a transformer block inside an MP group
(Shoeybi et al., "Megatron-LM", 2019, §3, Figures 3 and 4).

The attention's QKV projection and the MLP's first linear are split by output columns (by heads
for attention), their second linears by input rows; `f` (identity forward, all-reduce backward)
sits before each column-parallel layer and `g` (all-reduce forward, identity backward) after each
row-parallel one: 2 all-reduces of the (B, T, C) activations in forward and 2 in backward per
block. Layer norms and the row-parallel biases are replicated (their gradients are identical on
every MP rank, because the activations and gradients at block boundaries are). The embedding and
the head are replicated too (Megatron splits them by vocabulary; here they stay whole, so an MP
rank holds them entirely).

`shard_block` cuts a full `Block` into this rank's `ParallelBlock`, so an MP run starts from the
same weights as the unsplit model and can be compared with it loss by loss.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from .model import Block, GPTConfig, activate, attend, norm

AllReduce = Callable[[torch.Tensor], None]  # in-place sum over the MP group (traced)


class _CopyToMP(torch.autograd.Function):
    """Megatron's f: identity in forward, all-reduce of the gradient in backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, all_reduce: AllReduce) -> torch.Tensor:
        ctx.all_reduce = all_reduce
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous().clone()
        ctx.all_reduce(grad)
        return grad, None


class _ReduceFromMP(torch.autograd.Function):
    """Megatron's g: all-reduce in forward, identity in backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, all_reduce: AllReduce) -> torch.Tensor:
        y = x.contiguous().clone()
        all_reduce(y)
        return y

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


class ParallelAttention(nn.Module):
    """This rank's heads: a/mp query heads and kv/mp key/value heads (Megatron-Core splits GQA's query
    groups across MP, so a rank's query heads read only its own key/value heads)."""

    def __init__(self, cfg: GPTConfig, mp: int, all_reduce: AllReduce):
        super().__init__()
        self.local_heads, self.local_kv, self.head_dim = cfg.heads // mp, cfg.kv // mp, cfg.head_dim
        self.rope = cfg.position == "rotary"
        width = (self.local_heads + 2 * self.local_kv) * self.head_dim
        self.qkv = nn.Linear(cfg.hidden, width, bias=cfg.has_qkv_bias)  # C -> (C + 2·kv·d)/mp, column-parallel
        self.proj = nn.Linear(self.local_heads * self.head_dim, cfg.hidden, bias=False)  # C/mp -> C, row-parallel
        # The row-parallel bias is added once, after the all-reduce.
        self.proj_bias = nn.Parameter(torch.zeros(cfg.hidden)) if cfg.linear_bias else None
        self.all_reduce = all_reduce

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        x = _CopyToMP.apply(x, self.all_reduce)
        d = self.head_dim
        q, k, v = self.qkv(x).split([self.local_heads * d, self.local_kv * d, self.local_kv * d], dim=2)
        q = q.view(B, T, self.local_heads, d).transpose(1, 2)  # (B, a/mp, T, d)
        k, v = (t.view(B, T, self.local_kv, d).transpose(1, 2) for t in (k, v))  # (B, kv/mp, T, d)
        y = attend(q, k, v, self.rope)  # (B, a/mp, T, d)
        y = self.proj(y.transpose(1, 2).reshape(B, T, -1))  # partial sums (B, T, C)
        y = _ReduceFromMP.apply(y, self.all_reduce)
        return y if self.proj_bias is None else y + self.proj_bias


class ParallelMLP(nn.Module):
    def __init__(self, cfg: GPTConfig, mp: int, all_reduce: AllReduce):
        super().__init__()
        self.gated, inner = cfg.gated_mlp, cfg.ffn // mp
        # C -> f/mp (or gate and up, 2f/mp), column-parallel
        self.fc = nn.Linear(cfg.hidden, (2 if cfg.gated_mlp else 1) * inner, bias=cfg.linear_bias)
        self.proj = nn.Linear(inner, cfg.hidden, bias=False)  # f/mp -> C, row-parallel
        self.proj_bias = nn.Parameter(torch.zeros(cfg.hidden)) if cfg.linear_bias else None
        self.all_reduce = all_reduce

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _CopyToMP.apply(x, self.all_reduce)
        y = self.proj(activate(self.fc(x), self.gated))  # partial sums (B, T, C)
        y = _ReduceFromMP.apply(y, self.all_reduce)
        return y if self.proj_bias is None else y + self.proj_bias


class ParallelBlock(nn.Module):
    """This MP rank's part of a Block: 12h²/mp + 7h/mp + 6h parameters for GPT."""

    def __init__(self, cfg: GPTConfig, mp: int, all_reduce: AllReduce):
        super().__init__()
        self.ln1 = norm(cfg)
        self.attn = ParallelAttention(cfg, mp, all_reduce)
        self.ln2 = norm(cfg)
        self.mlp = ParallelMLP(cfg, mp, all_reduce)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


def _columns(weight: torch.Tensor, parts: list[int], mp_rank: int, mp: int) -> torch.Tensor:
    """This rank's 1/mp of each of the row blocks `parts` of a column-parallel weight (or bias), stacked."""
    return torch.cat([w.chunk(mp)[mp_rank] for w in weight.split(parts)])


@torch.no_grad()
def shard_block(block: Block, *, mp_rank: int, mp: int, all_reduce: AllReduce) -> ParallelBlock:
    """MP rank `mp_rank`'s ParallelBlock holding its slices of `block`'s weights."""
    cfg = block.cfg
    part = ParallelBlock(cfg, mp, all_reduce)
    qkv_parts = [cfg.hidden, cfg.kv * cfg.head_dim, cfg.kv * cfg.head_dim]  # Q, K, V: this rank's heads of each
    part.attn.qkv.weight.copy_(_columns(block.attn.qkv.weight, qkv_parts, mp_rank, mp))
    if cfg.has_qkv_bias:
        part.attn.qkv.bias.copy_(_columns(block.attn.qkv.bias, qkv_parts, mp_rank, mp))
    part.attn.proj.weight.copy_(block.attn.proj.weight.chunk(mp, dim=1)[mp_rank])
    fc_parts = [cfg.ffn] * (2 if cfg.gated_mlp else 1)  # (gate, up) or the one f-wide matrix
    part.mlp.fc.weight.copy_(_columns(block.mlp.fc.weight, fc_parts, mp_rank, mp))
    part.mlp.proj.weight.copy_(block.mlp.proj.weight.chunk(mp, dim=1)[mp_rank])
    if cfg.linear_bias:
        part.mlp.fc.bias.copy_(_columns(block.mlp.fc.bias, fc_parts, mp_rank, mp))
        part.attn.proj_bias.copy_(block.attn.proj.bias)
        part.mlp.proj_bias.copy_(block.mlp.proj.bias)
    part.ln1.load_state_dict(block.ln1.state_dict())
    part.ln2.load_state_dict(block.ln2.state_dict())
    return part
