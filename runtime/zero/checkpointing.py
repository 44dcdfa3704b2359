"""Activation checkpointing of one transformer block (Chen et al., "Training Deep Nets with
Sublinear Memory Cost", 2016; ZeRO paper §6.1): the forward keeps only the block's input; the
backward recomputes the block's forward with autograd on, then backpropagates through it.

The unit's parameter leaf is passed in (so its gradient flows to the engine's hooks) but not
saved: in stage 3 its buffer is released after the forward, and the backward reads whatever the
engine has gathered into it by then.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

import torch


class CheckpointedBlock(torch.autograd.Function):
    @staticmethod
    def forward(ctx, run: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                recompute: Callable[[], AbstractContextManager], x: torch.Tensor, param: torch.Tensor
                ) -> torch.Tensor:
        ctx.run, ctx.recompute, ctx.param = run, recompute, param
        ctx.save_for_backward(x)  # the one activation a checkpointed block keeps (B, T, C)
        return run(x, param)  # autograd.Function.forward runs without grad: nothing else is saved

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        (x,) = ctx.saved_tensors
        x = x.detach().requires_grad_(True)
        param = ctx.param.detach().requires_grad_(True)  # the gathered buffer, as of now
        with torch.enable_grad(), ctx.recompute():
            y = ctx.run(x, param)
        torch.autograd.backward(y, grad_out)
        return None, None, x.grad, param.grad
