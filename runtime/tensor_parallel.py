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
import torch.nn.functional as F
from torch import nn

from runtime.model import Block

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
    def __init__(self, hidden: int, heads: int, mp: int, all_reduce: AllReduce):
        super().__init__()
        self.local_heads = heads // mp
        self.head_dim = hidden // heads
        width = self.local_heads * self.head_dim  # C / mp
        self.qkv = nn.Linear(hidden, 3 * width)  # C -> 3C/mp, column-parallel (this rank's heads)
        self.proj = nn.Linear(width, hidden, bias=False)  # C/mp -> C, row-parallel
        self.proj_bias = nn.Parameter(torch.zeros(hidden))  # added once, after the all-reduce
        self.all_reduce = all_reduce

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        x = _CopyToMP.apply(x, self.all_reduce)
        q, k, v = self.qkv(x).split(self.local_heads * self.head_dim, dim=2)  # 3 x (B, T, C/mp)
        q, k, v = (t.view(B, T, self.local_heads, self.head_dim).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, a/mp, T, C/a)
        y = self.proj(y.transpose(1, 2).reshape(B, T, -1))  # partial sums (B, T, C)
        return _ReduceFromMP.apply(y, self.all_reduce) + self.proj_bias


class ParallelMLP(nn.Module):
    def __init__(self, hidden: int, mp: int, all_reduce: AllReduce):
        super().__init__()
        self.fc = nn.Linear(hidden, 4 * hidden // mp)  # C -> 4C/mp, column-parallel
        self.proj = nn.Linear(4 * hidden // mp, hidden, bias=False)  # 4C/mp -> C, row-parallel
        self.proj_bias = nn.Parameter(torch.zeros(hidden))
        self.all_reduce = all_reduce

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _CopyToMP.apply(x, self.all_reduce)
        y = self.proj(F.gelu(self.fc(x)))  # partial sums (B, T, C)
        return _ReduceFromMP.apply(y, self.all_reduce) + self.proj_bias


class ParallelBlock(nn.Module):
    """This MP rank's part of a Block: 12h²/mp + 7h/mp + 6h parameters."""

    def __init__(self, hidden: int, heads: int, mp: int, all_reduce: AllReduce):
        super().__init__()
        self.ln1 = nn.LayerNorm(hidden)
        self.attn = ParallelAttention(hidden, heads, mp, all_reduce)
        self.ln2 = nn.LayerNorm(hidden)
        self.mlp = ParallelMLP(hidden, mp, all_reduce)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


@torch.no_grad()
def shard_block(block: Block, *, heads: int, mp_rank: int, mp: int, all_reduce: AllReduce) -> ParallelBlock:
    """MP rank `mp_rank`'s ParallelBlock holding its slices of `block`'s weights."""
    hidden = block.ln1.weight.numel()
    part = ParallelBlock(hidden, heads, mp, all_reduce)
    width = hidden // mp  # this rank's heads: columns [mp_rank·C/mp, (mp_rank+1)·C/mp) of each of q, k, v
    cols = slice(mp_rank * width, (mp_rank + 1) * width)
    qkv_w, qkv_b = block.attn.qkv.weight.split(hidden), block.attn.qkv.bias.split(hidden)
    part.attn.qkv.weight.copy_(torch.cat([w[cols] for w in qkv_w]))
    part.attn.qkv.bias.copy_(torch.cat([b[cols] for b in qkv_b]))
    part.attn.proj.weight.copy_(block.attn.proj.weight[:, cols])
    part.attn.proj_bias.copy_(block.attn.proj.bias)
    inner = 4 * hidden // mp
    rows = slice(mp_rank * inner, (mp_rank + 1) * inner)
    part.mlp.fc.weight.copy_(block.mlp.fc.weight[rows])
    part.mlp.fc.bias.copy_(block.mlp.fc.bias[rows])
    part.mlp.proj.weight.copy_(block.mlp.proj.weight[:, rows])
    part.mlp.proj_bias.copy_(block.mlp.proj.bias)
    for mine, theirs in ((part.ln1, block.ln1), (part.ln2, block.ln2)):
        mine.weight.copy_(theirs.weight)
        mine.bias.copy_(theirs.bias)
    return part
