"""The training step every ZeRO stage shares; each stage (stage0.py ... stage3.py) says where the
model states live and how gradients and parameters move.

A step: zero the gradients; for each micro-batch, forward unit by unit (`fwd/<unit>` events),
then backward, where hooks time each unit (`bwd/<unit>`: from the gradient of the unit's output,
once the stage has what the unit needs (stage 3: its gathered parameters), to its parameter
gradient being accumulated) and hand the unit's gradient to the stage (`grad_ready`); then wait
for the reductions and step the optimizer (`optimizer/step`). Waiting for a collective is its own
`wait/...` event (runtime/comm.py); a span's `nested_us` is the time of the events nested in it
(Megatron's in-line MP all-reduces, a checkpointed block's recomputation).

The loss is multiplied by S / (grad_accum x Nd) before backward (S: the fp16 loss scale, else 1),
so that summing gradients over ranks gives the gradient of the mean loss over the global batch.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.func import functional_call

from ..comm import Collectives
from ..config import DEFAULT_ALLGATHER_ELEMENTS
from ..flat import FlatLayout
from ..ledger import MemoryLedger
from ..model import GPT, GPTConfig, forward_flops, unit_name
from ..tracer import Tracer
from .activations import SavedTensors
from .checkpointing import CheckpointedBlock
from .loss_scaler import DynamicLossScaler
from .optimizer import FlatAdam, Segment
from zsim.trace.schema import layer_event

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass(eq=False)
class Unit:
    """One of the model's units (embedding, a block, the head) and its flat parameter buffer."""

    index: int
    name: int | str  # "embed", block number, "head"
    module: nn.Module  # structure only (meta tensors); run with views of `param`
    layout: FlatLayout
    param: torch.Tensor  # the leaf autograd sees: the whole (padded) unit, working dtype
    flops: int  # forward FLOPs per micro-batch


def unit_what(u: Unit) -> str:
    """The `<what>` of a unit's collectives: `layer.12`, `embed`, `head`."""
    return f"layer.{u.name}" if isinstance(u.name, int) else str(u.name)


@dataclass(frozen=True, kw_only=True)
class EngineOptions:
    precision: str  # fp32, fp16, bf16
    checkpointing: bool  # activation checkpointing per block
    bucket_elements: int  # gradient elements per bucket (stage 1: per comm interval)
    prefetch_layers: int  # stage 3: 0 or 1
    lr: float
    micro_batch: int
    mp: int = 1  # tensor-parallel degree (for the FLOPs of a block and the head)
    allgather_bucket_elements: int = DEFAULT_ALLGATHER_ELEMENTS  # stage 2: elements per all-gather after the step
    # pipeline: the unit indices of each model chunk of this stage (interleaved: v of them); () = one chunk.
    # Stage 0 buckets each chunk's gradients apart, as Megatron-LM wraps each chunk in its own DDP
    chunks: tuple[tuple[int, ...], ...] = ()


class ZeroEngine:
    """Template for the stages. Subclasses set `stage` and `partitioned` (the model-state
    categories split across DP ranks) and implement `setup`, `zero_grads`, `grad_ready`,
    `finish_reduction`; stage 3 also the gather hooks."""

    stage: int
    partitioned: frozenset[str]
    pads_tensors = False  # stage 3: every parameter tensor padded to a multiple of Nd (runtime/flat.py)

    def __init__(self, model: GPT, *, options: EngineOptions, comm: Collectives, tracer: Tracer,
                 ledger: MemoryLedger, device: torch.device, mp_comm: Collectives | None = None,
                 pp_comm: Collectives | None = None):
        """`model`: a GPT, or a pipeline stage's part of one (runtime/pipeline.py: `units` and
        `unit_names`); `comm`: the DP group ZeRO partitions across; `mp_comm`: the MP group, if any;
        `pp_comm`: the pipeline group, if any (the fp16 overflow decision and the gradient norm are
        agreed over DP, then MP, then PP: DeepSpeed's and Megatron-LM's model-parallel group holds
        both)."""
        self.cfg: GPTConfig = model.cfg
        self.options = options
        self.comm, self.tracer, self.ledger, self.device = comm, tracer, ledger, device
        self.mp_comm, self.pp_comm = mp_comm, pp_comm
        self.dtype = DTYPES[options.precision]
        self.mixed = options.precision != "fp32"
        self.dp = comm.size
        self.rank = comm.ranks.index(dist.get_rank())  # this rank's index in the DP group
        self.scaler = DynamicLossScaler() if options.precision == "fp16" else None
        self.skipped_steps = 0
        # Gradient views of parameters another pipeline stage also holds (a tied head's word-embedding
        # copy on the last stage), left out of the gradient norm here (runtime/pipeline.py sets them)
        self.shared_grads: list[torch.Tensor] = []
        self.reduce_now = True  # does this micro-batch's backward reduce gradients?
        parts = self.dp if self.pads_tensors else 1
        self.units: list[Unit] = []
        init32: list[torch.Tensor] = []
        count = len(model.units)
        names = getattr(model, "unit_names", None) or [unit_name(i, count) for i in range(count)]
        for i, module in enumerate(model.units):
            layout = FlatLayout.of(module, parts)
            init32.append(layout.flatten(module).to(device))
            module.to("meta")  # the engine's flat buffers replace the module's own tensors
            name = names[i]
            self.units.append(Unit(i, name, module, layout, torch.empty(0), forward_flops(
                self.cfg, name, options.micro_batch, options.mp)))
        # The units whose parameters each unit computes with: a tied head uses the embedding's too
        # (unless a pipeline's last stage holds the head with its own copy of the word embedding).
        self.uses = {u.index: (u.index,) for u in self.units}
        self.words_from_embedding = self.cfg.tied_head and names[0] == "embed" and names[-1] == "head"
        if self.words_from_embedding:
            self.uses[count - 1] = (count - 1, 0)
        self.activations = self._saved_tensors()
        self.optimizer = self.setup(init32)
        for u in self.units:
            u.param.register_post_accumulate_grad_hook(partial(self._backward_ends, u))
        self._backward_start: dict[int, tuple[float, float]] = {}

    # --- what a stage provides -------------------------------------------------------------------
    def setup(self, init32: list[torch.Tensor]) -> FlatAdam:
        """Allocate parameters, gradients and optimizer state (accounting them); return the optimizer."""
        raise NotImplementedError

    def zero_grads(self) -> None:
        raise NotImplementedError

    def grad_ready(self, unit: Unit) -> None:
        """`unit.param.grad` holds this micro-batch's (accumulated) gradient of the unit."""
        raise NotImplementedError

    def finish_reduction(self) -> None:
        """Wait for every gradient reduction of the step."""
        raise NotImplementedError

    def after_step(self) -> None:
        """After a successful optimizer step (stages 1-2: all-gather the updated parameters)."""

    def before_forward(self, unit: Unit) -> None:
        """Stage 3: gather the unit's parameters."""

    def after_forward(self, unit: Unit) -> None:
        """Stage 3: release them."""

    def before_backward(self, unit: Unit) -> None:
        """Stage 3: gather them again."""

    def after_backward(self, unit: Unit) -> None:
        """Stage 3: release them again."""

    def _saved_tensors(self) -> SavedTensors:
        def param_unit(ptr: int) -> int | None:
            return next((u.index for u in self.units if u.param.untyped_storage().data_ptr() == ptr), None)
        return SavedTensors(param_unit)

    # --- the step --------------------------------------------------------------------------------
    def train_step(self, batches: list[tuple[torch.Tensor, torch.Tensor]], *, reduce_every_micro_batch: bool
                   ) -> float:
        """One optimizer step over this rank's micro-batches; returns their mean loss (unscaled)."""
        self.zero_grads()
        losses = []
        for m, (inputs, targets) in enumerate(batches):
            self.tracer.micro_batch = m
            self.reduce_now = reduce_every_micro_batch or m == len(batches) - 1
            scale = self.scaler.scale if self.scaler else 1.0
            losses.append(self._forward_backward(inputs, targets, scale / (len(batches) * self.dp)))
        self.finish_reduction()
        self._optimizer_step()
        return sum(losses) / len(losses)

    def _forward_backward(self, inputs: torch.Tensor, targets: torch.Tensor, multiplier: float) -> float:
        with self.activations.hooks():
            h = self.forward(self.units, inputs.to(self.device), targets.to(self.device))
            (h * multiplier).backward()
        return h.item()

    def forward(self, units: list[Unit], h: torch.Tensor, targets: torch.Tensor | None) -> torch.Tensor:
        """Run `units` in order on `h` (`fwd/<unit>` spans), each output hooked to time its unit's
        backward; returns the last output (the loss after the head). Inside `activations.hooks()`."""
        for u in units:
            self.before_forward(u)
            self.activations.current = self._saved_key(u)
            with self.tracer.span(layer_event("fwd", u.name), flops=u.flops):
                h = self._run(u, h, targets)
            self.activations.current = None
            self.ledger.set("activations", self.activations.total)
            self.after_forward(u)
            h.register_hook(partial(self._backward_begins, u))
        return h

    def _saved_key(self, u: Unit) -> tuple[int, int]:
        """Whose activations autograd is saving: unit and micro-batch (a pipeline stage holds several
        micro-batches' activations of one unit at once)."""
        return u.index, self.tracer.micro_batch

    def _run(self, u: Unit, h: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if u.name == "head":
            embed = self.units[0]
            words = embed.layout.views(embed.param)["tokens.weight"] if self.words_from_embedding else None
            return functional_call(u.module, u.layout.views(u.param), (h, targets, words))
        if self.options.checkpointing and isinstance(u.name, int):
            def run(x: torch.Tensor, param: torch.Tensor, module=u.module, layout=u.layout) -> torch.Tensor:
                return functional_call(module, layout.views(param), (x,))
            return CheckpointedBlock.apply(run, partial(self._recompute, u), h, u.param)
        return functional_call(u.module, u.layout.views(u.param), (h,))

    @contextmanager
    def _recompute(self, u: Unit) -> Iterator[None]:
        self.activations.current = self._saved_key(u)
        with self.tracer.span(layer_event("recompute", u.name), flops=u.flops):
            yield
        self.activations.current = None
        self.ledger.set("activations", self.activations.total)

    def _backward_begins(self, u: Unit, grad: torch.Tensor) -> None:
        self.before_backward(u)  # stage 3 waits for the gather here, before the span starts
        self._backward_start[u.index] = self.tracer.mark(layer_event("bwd", u.name))

    def _backward_ends(self, u: Unit, param: torch.Tensor) -> None:
        mark = self._backward_start.pop(u.index)
        self.tracer.complete_span(layer_event("bwd", u.name), mark, flops=2 * u.flops)
        self.activations.release(self._saved_key(u))
        self.ledger.set("activations", self.activations.total)
        self.grad_ready(u)
        self.after_backward(u)

    def _optimizer_step(self) -> None:
        """The checks before Adam, as DeepSpeed's ZeRO optimizer and the simulator's plan run them
        (zsim/zero/plan.py _optimizer): mixed precision first agrees on a gradient overflow
        (`optimizer/overflow`, a 4-byte MAX all-reduce over DP, then MP), then the gradient norm
        (`optimizer/norm`, a SUM over DP, then MP; recorded in the summary, no clipping), then the fp32
        gradient copy (`optimizer/grads_copy`) and Adam."""
        overflow = self._overflow() if self.mixed else False
        self.grad_norm = self._grad_norm()
        with self.tracer.span("optimizer/grads_copy"):  # the fp32 gradient copy Adam reads (DeepSpeed's)
            grads = None if overflow else self.optimizer.grads_copy(1.0 / self.scaler.scale if self.scaler else 1.0)
        with self.tracer.span("optimizer/step", elements=self.optimizer.elements, skipped=overflow):
            if not overflow:
                self.optimizer.step(grads=grads)
        if self.scaler:
            self.scaler.update(overflow)
        if overflow:
            self.skipped_steps += 1
        else:
            self.after_step()

    def _agree(self, check: str, value: torch.Tensor, op: dist.ReduceOp) -> None:
        """All-reduce `value` in line (compute track) over DP, then over MP, then over PP."""
        self.comm.inline().all_reduce(value, f"{check}.dp", op=op).wait()
        if self.mp_comm is not None:
            self.mp_comm.all_reduce(value, f"{check}.mp", op=op).wait()
        if self.pp_comm is not None:
            self.pp_comm.all_reduce(value, f"{check}.pp", op=op).wait()

    def _overflow(self) -> bool:
        """Did any gradient overflow (inf or NaN) on any rank? (DeepSpeed's has_overflow.)"""
        with self.tracer.span("optimizer/overflow"):
            flag = torch.tensor([float(self.optimizer.found_overflow())], device=self.device)
        self._agree("overflow", flag, dist.ReduceOp.MAX)
        return bool(flag.item())

    def _grad_norm(self) -> float:
        """The L2 norm of the step's gradient (as the optimizer sees it: loss-scaled in fp16), from
        the squares of this rank's partition summed over DP (stage 0: every rank holds all of it,
        so the sum is divided by Nd) and MP (replicated layer norms and biases count once per MP rank)."""
        with self.tracer.span("optimizer/norm"):
            # Per tensor `g.double().norm(2)`, squared and summed, as DeepSpeed's get_grad_norm_direct
            # (deepspeed/pt/deepspeed_zero_optimizer.py, 2020): a cast pass and a norm pass, the two
            # kernels of the simulator's optimizer.norm (zsim/compute/optimizer_kernels.py).
            square = torch.zeros(1, dtype=torch.float64, device=self.device)
            for seg in self.optimizer.segments:
                square += seg.grad.double().norm(2) ** 2
                for shared in self.shared_grads:  # counted on another stage: once (Megatron's param_is_not_shared)
                    square -= _overlap(seg.grad, shared).double().norm(2) ** 2
            square.clamp_(min=0.0)
        square = square.float()
        self._agree("norm", square, dist.ReduceOp.SUM)
        return float(square.item() / (1 if self.partitioned else self.dp)) ** 0.5

    # --- facts for the trace ---------------------------------------------------------------------
    @property
    def params(self) -> int:
        """Ψ of this MP rank (what ZeRO partitions): its units' parameters."""
        return sum(u.layout.numel for u in self.units)

    @property
    def params_padded(self) -> int:
        """Ψ as allocated when whole: per bucket padded to 2·Nd (stages 1-2), per tensor to Nd (3)."""
        part = getattr(self, "part", None)
        return part.total if part is not None else sum(u.layout.padded for u in self.units)

    @property
    def grads_whole(self) -> int:
        """Elements of the gradient buffer when gradients are not partitioned (stages 0-1)."""
        return self.params_padded

    def _owned(self) -> tuple[int, int]:
        """(elements, real elements) of this rank's partition."""
        part = getattr(self, "part", None)
        if part is not None:
            return part.shard, part.shard_real(self.rank)
        return sum(u.layout.shard for u in self.units), sum(u.layout.shard_real(self.rank) for u in self.units)

    def model_state_bytes(self) -> dict[str, dict[str, int]]:
        """Per category, bytes this rank allocates (`bytes`, padding included) and of real
        parameters (`real`): es·Ψ for unpartitioned states, es·(its chunks) for partitioned ones
        (ZeRO paper Table 1 / §5: es = 2 mixed, 4 fp32; optimizer K = 12 mixed, 8 fp32)."""
        per_element = {"params": self.dtype.itemsize, "grads": self.dtype.itemsize,
                       "optimizer": 12 if self.mixed else 8}
        owned = self._owned() if self.partitioned else (0, 0)
        result = {}
        whole = {"params": self.params_padded, "grads": self.grads_whole, "optimizer": self.params_padded}
        for category, es in per_element.items():
            alloc, real = owned if category in self.partitioned else (whole[category], self.params)
            result[category] = {"bytes": alloc * es, "real": real * es}
        return result

    # --- helpers for the stages ------------------------------------------------------------------
    def _optimizer(self, segments: list[Segment]) -> FlatAdam:
        return FlatAdam(segments, ledger=self.ledger, mixed=self.mixed, lr=self.options.lr)


class PartitionedGradients(ZeroEngine):
    """Stages 2-3: each unit's gradient goes to `self.reducer` (bucketed reduce-scatter) as soon as it
    is complete and is freed; the rank keeps only its summed chunks, in `self.grad_partition`. Every
    micro-batch reduces (DeepSpeed's stages 2 and 3 do not skip the reduction under accumulation)."""

    grad_partition: torch.Tensor
    reducer: Any  # PartitionReducer (stage 2) or ReduceScatterBuckets (stage 3)

    def zero_grads(self) -> None:
        self.grad_partition.zero_()

    def grad_ready(self, unit: Unit) -> None:
        grad = unit.param.grad
        self.ledger.add("grads", grad.nbytes)  # the unit's whole gradient, until it is in its bucket
        self.reducer.grad_ready(unit.index, grad)
        unit.param.grad = None
        self.ledger.add("grads", -grad.nbytes)

    def finish_reduction(self) -> None:
        self.reducer.finish()


def _overlap(flat: torch.Tensor, part: torch.Tensor) -> torch.Tensor:
    """The elements of 1-D `flat` that lie in the memory of contiguous `part` (same storage, same
    dtype), as a slice of `flat`; empty when they do not overlap."""
    if flat.untyped_storage().data_ptr() != part.untyped_storage().data_ptr() or flat.dtype != part.dtype:
        return flat[:0]
    lo = max(flat.storage_offset(), part.storage_offset())
    hi = min(flat.storage_offset() + flat.numel(), part.storage_offset() + part.numel())
    return flat[lo - flat.storage_offset():max(lo, hi) - flat.storage_offset()]
