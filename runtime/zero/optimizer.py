"""Adam (Kingma & Ba, ICLR'15, Algorithm 1) on flat fp32 tensors, one segment per unit.

Each segment is what this rank owns of a unit: the whole unit in stage 0, its shard in stages 1-3.
Mixed precision keeps fp32 master weights (ZeRO paper §3.1: K = 12 bytes per parameter of
optimizer state = fp32 master + momentum + variance) and copies the updated master into the
fp16/bf16 working parameters; fp32 training updates the parameters in place (K = 8).
The update is torch.optim.Adam's single-tensor formula, op for op, so the torch cross-checks agree
bit for bit; it runs in chunks of CHUNK elements so that a chunk's tensors stay in cache between
its ops: memory sees each element's state read and written once, as with the fused Adam kernel
DeepSpeed ran (apex FusedAdam; the simulator's optimizer.adam, zsim/compute/optimizer_kernels.py), instead of
once per op with full-size temporaries (the unchunked formula moves ~2.6x the bytes).

On a GPU that loop would launch ~7 kernels per 65,536 elements (139k launches a step for a 1.3B
model, issue 26), where the simulator prices one fused kernel: there the update is torch's fused Adam
(`torch._fused_adam_`, what `torch.optim.Adam(fused=True)` runs: one multi-tensor kernel over every
segment), the same formula (the test compares the two paths on CPU, where torch also has the kernel).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from zsim.compute.optimizer_kernels import HOST_ADAM_CHUNK

from ..ledger import MemoryLedger

# Elements per chunk of the update: apex multi_tensor_apply's chunk_size (65,536), 256 KiB per fp32
# tensor; the five a chunk touches (state, gradient, denominator) fit a core's 1-2 MiB L2. The
# simulator prices a host's update by the same chunks (zsim.compute.optimizer_kernels.host_adam_kernels).
CHUNK = HOST_ADAM_CHUNK


@dataclass
class Segment:
    """What one rank owns of one unit: views of its working parameters and gradients, and the
    fp32 values they start from."""

    param: torch.Tensor  # working dtype, 1-D view
    grad: torch.Tensor  # working dtype, 1-D view, as long or shorter (stage 1: the rest is padding, read as 0)
    init32: torch.Tensor  # fp32 initial values, same length


class FlatAdam:
    """Adam over segments; state lives in contiguous fp32 tensors (accounted as `optimizer`)."""

    def __init__(self, segments: list[Segment], *, ledger: MemoryLedger, mixed: bool, lr: float,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, chunk: int = CHUNK,
                 fused: bool | None = None):
        """`fused`: torch's fused multi-tensor Adam (default: on CUDA) instead of the chunked loop."""
        self.segments = segments
        self.chunk = chunk
        self.lr, self.betas, self.eps = lr, betas, eps
        self.steps = 0
        total = sum(s.param.numel() for s in segments)
        self.elements = total
        self.exp_avg = torch.zeros(total, dtype=torch.float32, device=segments[0].param.device)
        self.exp_avg_sq = torch.zeros_like(self.exp_avg)
        self.master = torch.cat([s.init32 for s in segments]).to(self.exp_avg.device) if mixed else None
        for s in segments:  # the master holds the values now: keeping init32 would be a hidden fp32 copy
            s.init32 = None
        self.fused = self.exp_avg.device.type == "cuda" if fused is None else fused
        states = 3 if mixed else 2
        ledger.add("optimizer", states * total * 4)

    def _views(self, tensor: torch.Tensor | None):
        offset = 0
        for s in self.segments:
            n = s.param.numel()
            yield None if tensor is None else tensor[offset:offset + n]
            offset += n

    @torch.no_grad()
    def grads_copy(self, inv_scale: float = 1.0) -> list[torch.Tensor]:
        """The fp32 gradients Adam reads, one per segment: a cast (and unscale by `inv_scale`, 1/loss
        scale) pass over the partition, made before the update as DeepSpeed's ZeRO optimizer makes its
        fp32 gradient copy (the simulator's `optimizer/grads_copy`)."""
        out = []
        for seg in self.segments:
            grad = seg.grad.float() if seg.grad.dtype != torch.float32 else seg.grad
            if grad.numel() < seg.param.numel():  # a stage-1 sub-partition in the padding
                grad = torch.nn.functional.pad(grad, (0, seg.param.numel() - grad.numel()))
            out.append(grad * inv_scale if inv_scale != 1.0 else grad)
        return out

    def step(self, inv_scale: float = 1.0, grads: list[torch.Tensor] | None = None) -> None:
        """One Adam step on every segment, reading `grads` (from grads_copy; made here with
        `inv_scale` when not given)."""
        grads = self.grads_copy(inv_scale) if grads is None else grads
        self.steps += 1
        if self.fused:
            self._fused_step(grads)
            return
        beta1, beta2 = self.betas
        bias1 = 1 - beta1 ** self.steps
        bias2_sqrt = math.sqrt(1 - beta2 ** self.steps)
        workspace = torch.empty(min(self.chunk, self.elements), dtype=torch.float32, device=self.exp_avg.device)
        for seg, grad, m, v, master in zip(self.segments, grads, self._views(self.exp_avg),
                                           self._views(self.exp_avg_sq), self._views(self.master)):
            target = master if master is not None else seg.param
            for lo in range(0, m.numel(), self.chunk):
                hi = min(m.numel(), lo + self.chunk)
                g, mc, vc = grad[lo:hi], m[lo:hi], v[lo:hi]
                mc.lerp_(g, 1 - beta1)
                vc.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                denom = torch.sqrt(vc, out=workspace[:hi - lo]).div_(bias2_sqrt).add_(self.eps)
                target[lo:hi].addcdiv_(mc, denom, value=-self.lr / bias1)
            if master is not None:
                seg.param.copy_(master)

    def _fused_step(self, grads: list[torch.Tensor]) -> None:
        """One launch of torch's fused Adam over every segment (Adam, Algorithm 1, as torch.optim.Adam
        with weight_decay 0), then the cast of the master into the working parameters."""
        targets = list(self._views(self.master)) if self.master is not None else [s.param for s in self.segments]
        step = torch.tensor(float(self.steps), device=self.exp_avg.device)
        beta1, beta2 = self.betas
        torch._fused_adam_(targets, grads, list(self._views(self.exp_avg)), list(self._views(self.exp_avg_sq)), [],
                           [step] * len(targets), lr=self.lr, beta1=beta1, beta2=beta2, weight_decay=0.0,
                           eps=self.eps, amsgrad=False, maximize=False, grad_scale=None, found_inf=None)
        if self.master is not None:
            for seg, master in zip(self.segments, targets):
                seg.param.copy_(master)

    def found_overflow(self) -> bool:
        """True when a gradient this rank owns is inf or NaN."""
        return any(not torch.isfinite(s.grad).all() for s in self.segments)
