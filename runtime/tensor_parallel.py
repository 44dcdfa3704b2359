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
table (learned positions only) is replicated. The head (final norm, replicated) computes this rank's V/mp logits
against the same rows (tied) or its own V/mp x C weight (untied), behind an `f` (its input gradient
is all-reduced in backward), and the cross-entropy needs three all-reduces of one fp32 per token in
forward: the max logit, the target's logit and the sum of exponentials.

`shard_block`, `shard_embedding` and `shard_head` cut the full modules into this rank's parts, so an
MP run starts from the same weights as the unsplit model and can be compared with it loss by loss.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .model import Block, Embedding, GPTConfig, Head, activate, attend, norm

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


class VocabParallelEmbedding(nn.Module):
    """This MP rank's rows of the word embedding plus the whole learned position table (none for a
    rotary model, `positions` None): (B, T) -> (B, T, C)."""

    def __init__(self, vocab: int, hidden: int, positions: int | None, mp: int, mp_rank: int,
                 all_reduce: AllReduce):
        super().__init__()
        rows = vocab // mp
        self.lo, self.hi = mp_rank * rows, (mp_rank + 1) * rows
        self.tokens = nn.Embedding(rows, hidden)  # rows [lo, hi) of the V x C word embedding
        self.positions = None if positions is None else nn.Embedding(positions, hidden)
        self.all_reduce = all_reduce

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        outside = (idx < self.lo) | (idx >= self.hi)
        local = (idx - self.lo).masked_fill(outside, 0)
        x = self.tokens(local).masked_fill(outside.unsqueeze(-1), 0.0)  # (B, T, C), zero for other ranks' tokens
        x = _ReduceFromMP.apply(x, self.all_reduce)
        if self.positions is None:
            return x
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
    """Final norm (replicated) and this rank's V/mp logits; returns the mean loss."""

    def __init__(self, cfg: GPTConfig, vocab: int, mp: int, mp_rank: int, tied: bool, all_reduce: AllReduce):
        super().__init__()
        hidden = cfg.hidden
        self.ln = norm(cfg)
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
    table = embedding.positions
    part = VocabParallelEmbedding(vocab, hidden, None if table is None else table.weight.shape[0], mp, mp_rank,
                                  all_reduce)
    part.tokens.weight.copy_(embedding.tokens.weight[part.lo:part.hi])
    if table is not None:
        part.positions.weight.copy_(table.weight)
    return part


@torch.no_grad()
def shard_head(head: Head, *, cfg: GPTConfig, mp_rank: int, mp: int, all_reduce: AllReduce) -> ParallelHead:
    """MP rank `mp_rank`'s ParallelHead: the final norm, and its rows of an untied LM weight."""
    vocab = cfg.vocab
    part = ParallelHead(cfg, vocab, mp, mp_rank, head.lm_head is None, all_reduce)
    part.ln.load_state_dict(head.ln.state_dict())
    if part.lm_head is not None:
        rows = vocab // mp
        part.lm_head.weight.copy_(head.lm_head.weight[mp_rank * rows:(mp_rank + 1) * rows])
    return part
