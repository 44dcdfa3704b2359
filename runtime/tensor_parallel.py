"""Megatron-style tensor (model) parallelism of a transformer block inside an MP group
(Shoeybi et al., "Megatron-LM", 2019, §3, Figures 3 and 4).

The attention's QKV projection and the MLP's first linear are split by output columns (by heads
for attention), their second linears by input rows; `f` (identity forward, all-reduce backward)
sits before each column-parallel layer and `g` (all-reduce forward, identity backward) after each
row-parallel one: 2 all-reduces of the (B, T, C) activations in forward and 2 in backward per
block. Layer norms and the row-parallel biases are replicated (their gradients are identical on
every MP rank, because the activations and gradients at block boundaries are).

The embedding and the head are split by vocabulary, as Megatron-LM does (VocabParallelEmbedding,
parallel_lm_logits, vocab_parallel_cross_entropy in megatron/core/tensor_parallel/): MP rank m holds
rows [m·V/mp, (m+1)·V/mp) of the (padded) word embedding; its lookup zeroes the tokens outside its
range and one all-reduce of the (B, T, C) output sums the parts (forward only); the position
embedding is replicated. The head (final layer norm, replicated) computes this rank's V/mp logits
against the same rows (tied) or its own V/mp x C weight (untied), behind an `f` (its input gradient
is all-reduced in backward), and the cross-entropy needs three all-reduces of one fp32 per token in
forward: the max logit, the target's logit and the sum of exponentials.

`shard_block`, `shard_embedding` and `shard_head` cut the full modules into this rank's parts, so an
MP run starts from the same weights as the unsplit model and can be compared with it loss by loss.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

import torch.distributed as dist

from runtime.model import Block, Embedding, Head

AllReduce = Callable[..., None]  # all_reduce(tensor, op=SUM): in place over the MP group (traced)


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


class VocabParallelEmbedding(nn.Module):
    """This MP rank's rows of the word embedding plus the whole position embedding: (B, T) -> (B, T, C)."""

    def __init__(self, vocab: int, hidden: int, seq_len: int, mp: int, mp_rank: int, all_reduce: AllReduce):
        super().__init__()
        rows = vocab // mp
        self.lo, self.hi = mp_rank * rows, (mp_rank + 1) * rows
        self.tokens = nn.Embedding(rows, hidden)  # rows [lo, hi) of the V x C word embedding
        self.positions = nn.Embedding(seq_len, hidden)
        self.all_reduce = all_reduce

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        outside = (idx < self.lo) | (idx >= self.hi)
        local = (idx - self.lo).masked_fill(outside, 0)
        x = self.tokens(local).masked_fill(outside.unsqueeze(-1), 0.0)  # (B, T, C), zero for other ranks' tokens
        x = _ReduceFromMP.apply(x, self.all_reduce)
        positions = torch.arange(idx.shape[1], device=idx.device)
        return x + self.positions(positions)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Per-token cross-entropy of logits split by vocabulary (Megatron-LM vocab_parallel_cross_entropy):
    all-reduce the max logit (MAX), the target's logit and the sum of exponentials (SUM)."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, lo: int, all_reduce: AllReduce) -> torch.Tensor:
        # logits (N, V/mp) fp32, targets (N,)
        logits_max = logits.max(dim=-1).values
        all_reduce(logits_max, op=dist.ReduceOp.MAX)
        shifted = logits - logits_max.unsqueeze(-1)
        outside = (targets < lo) | (targets >= lo + logits.shape[-1])
        local = (targets - lo).masked_fill(outside, 0)
        rows = torch.arange(logits.shape[0], device=logits.device)
        predicted = shifted[rows, local].masked_fill(outside, 0.0)
        all_reduce(predicted)
        exp = shifted.exp()
        sum_exp = exp.sum(dim=-1)
        all_reduce(sum_exp)
        ctx.save_for_backward(exp.div_(sum_exp.unsqueeze(-1)), outside, local)
        return sum_exp.log() - predicted  # (N,)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        softmax, outside, local = ctx.saved_tensors
        rows = torch.arange(softmax.shape[0], device=softmax.device)
        g = softmax.clone()
        g[rows, local] -= (~outside).to(g.dtype)
        return g * grad.unsqueeze(-1), None, None, None


class ParallelHead(nn.Module):
    """Final layer norm (replicated) and this rank's V/mp logits; returns the mean loss."""

    def __init__(self, vocab: int, hidden: int, mp: int, mp_rank: int, tied: bool, all_reduce: AllReduce):
        super().__init__()
        self.ln = nn.LayerNorm(hidden)
        self.lo = mp_rank * (vocab // mp)
        self.lm_head = None if tied else nn.Linear(hidden, vocab // mp, bias=False)
        self.all_reduce = all_reduce

    def forward(self, x: torch.Tensor, targets: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
        w = weight if self.lm_head is None else self.lm_head.weight
        x = _CopyToMP.apply(self.ln(x), self.all_reduce)
        logits = F.linear(x, w)  # (B, T, V/mp)
        loss = _VocabParallelCrossEntropy.apply(logits.float().flatten(0, 1), targets.flatten(), self.lo,
                                                self.all_reduce)
        return loss.mean()


@torch.no_grad()
def shard_embedding(embedding: Embedding, *, mp_rank: int, mp: int, all_reduce: AllReduce) -> VocabParallelEmbedding:
    """MP rank `mp_rank`'s VocabParallelEmbedding holding its rows of `embedding`."""
    vocab, hidden = embedding.tokens.weight.shape
    part = VocabParallelEmbedding(vocab, hidden, embedding.positions.weight.shape[0], mp, mp_rank, all_reduce)
    part.tokens.weight.copy_(embedding.tokens.weight[part.lo:part.hi])
    part.positions.weight.copy_(embedding.positions.weight)
    return part


@torch.no_grad()
def shard_head(head: Head, *, vocab: int, mp_rank: int, mp: int, all_reduce: AllReduce) -> ParallelHead:
    """MP rank `mp_rank`'s ParallelHead: the layer norm, and its rows of an untied LM weight."""
    hidden = head.ln.weight.numel()
    part = ParallelHead(vocab, hidden, mp, mp_rank, head.lm_head is None, all_reduce)
    part.ln.load_state_dict(head.ln.state_dict())
    if part.lm_head is not None:
        rows = vocab // mp
        part.lm_head.weight.copy_(head.lm_head.weight[mp_rank * rows:(mp_rank + 1) * rows])
    return part
