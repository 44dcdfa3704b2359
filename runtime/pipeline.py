"""Pipeline parallelism in the runtime: each stage builds its part of the model and runs the
schedule of zsim.parallel.pipeline (GPipe, 1F1B, interleaved 1F1B) — the same list of forwards and
backwards the simulator's plan walks — sending activations forward and their gradients back.

Ranks are Megatron-LM's (megatron/core/parallel_state.py, order 'tp-dp-pp'): rank =
pp_rank·(dp·mp) + dp_rank·mp + mp_rank (zsim.parallel.pipeline.pipeline_rank). Stage s holds the
layers of virtual stages s, s + p, ... (split_layers); the embedding is on stage 0, the head and the
loss on the last stage. A tied head needs the word embedding on the last stage too: as Megatron-LM
does (LanguageModule.setup_embeddings_and_output_layer: a copy of the word embedding on the last
stage, its gradient all-reduced with stage 0's over the embedding group), the last stage's head holds
a copy (`tie_on_last_stage`), and after the backwards the two gradients are summed by
`all_reduce/embed` over [first stage, last stage] of the same data- and tensor-parallel rank.

One step on a stage (`PipelineSchedule.train_step`), for each Work of stage_schedule:
  fwd  recv/pp.fwd (unless the first virtual stage), the chunk's forward, send/pp.fwd (unless last);
  bwd  recv/pp.bwd (unless the last virtual stage), the chunk's backward (recomputation first under
       checkpointing), send/pp.bwd (unless first).
then the gradient reductions and the optimizer step of the ZeRO stage (0 or 1) over the stage's DP
group. Sizes: p stages, m micro-batches per step (grad_accum), v chunks per stage.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from .comm import Collectives
from .model import GPT, GPTConfig, unit_name
from .p2p import PointToPoint
from .zero.engine import Unit, ZeroEngine
from zsim.parallel.pipeline import StageLayers, stage_schedule


@dataclass(frozen=True)
class StagePlace:
    """Where this rank sits in the pipeline: stage `stage` of `stages`, `chunks` model chunks, the
    global ranks of the previous and next stage (wrapping round: interleaved chunks pass from the
    last stage back to the first), the schedule's name."""

    stage: int
    stages: int
    chunks: int
    prev: int
    next: int
    schedule: str

    def first(self, chunk: int) -> bool:
        """Is chunk `chunk` of this stage the model's first virtual stage (the one with the embedding)?"""
        return self.stage == 0 and chunk == 0

    def last(self, chunk: int) -> bool:
        """Is it the last virtual stage (the head and the loss)?"""
        return self.stage == self.stages - 1 and chunk == self.chunks - 1


class StageModel(nn.Module):
    """A pipeline stage's units of a GPT (in model order) and their trace names; `chunks[c]` are the
    indices (into `units`) of chunk c. What the ZeRO engine takes in place of the whole GPT."""

    def __init__(self, cfg: GPTConfig, units: list[nn.Module], names: list[int | str], chunks: list[list[int]]):
        super().__init__()
        self.cfg = cfg
        self.units = nn.ModuleList(units)
        self.unit_names = names
        self.chunks = chunks


@torch.no_grad()
def tie_on_last_stage(model: GPT) -> None:
    """Give the head of a tied model its own copy of the word embedding (V, C): the last stage's
    weight, all-reduced with the first stage's each step (Megatron-LM initialises it from stage 0's;
    here every rank builds the same model from the same seed, so the copy starts equal)."""
    head, words = model.units[-1], model.units[0].tokens.weight
    head.lm_head = nn.Linear(words.shape[1], words.shape[0], bias=False)
    head.lm_head.weight.copy_(words)


def stage_model(model: GPT, split: StageLayers, stage: int) -> StageModel:
    """Stage `stage`'s part of `model` (whole units: embedding, blocks, head; the rest is dropped)."""
    count = len(model.units)
    chunks = split.layers[stage]
    picked: list[int] = []
    chunk_units: list[list[int]] = []
    for c, layers in enumerate(chunks):
        first = [0] if stage == 0 and c == 0 else []
        last = [count - 1] if stage == split.stages - 1 and c == len(chunks) - 1 else []
        ids = first + [1 + layer for layer in layers] + last
        chunk_units.append(list(range(len(picked), len(picked) + len(ids))))
        picked += ids
    return StageModel(model.cfg, [model.units[i] for i in picked], [unit_name(i, count) for i in picked],
                      chunk_units)


class PipelineSchedule:
    """Runs one optimizer step of a stage: the stage's schedule of forwards and backwards with its
    transfers, then the ZeRO stage's reductions and optimizer step (see the module docstring)."""

    def __init__(self, engine: ZeroEngine, p2p: PointToPoint, place: StagePlace, chunks: list[list[int]],
                 embed_comm: Collectives | None = None):
        """`chunks`: the engine's unit indices of each chunk (StageModel.chunks); `embed_comm`: the
        embedding group (first and last stage) of a tied head, None otherwise."""
        self.engine, self.p2p, self.place = engine, p2p, place
        self.chunks: list[list[Unit]] = [[engine.units[i] for i in ids] for ids in chunks]
        # Megatron-LM's scatter/gather optimisation (Narayanan et al. 2021 §4.1; p2p_communication.py
        # _communicate with scatter_gather_tensors_in_pipeline, on by default): with MP the activation
        # a stage sends is the same on every MP rank, so each sends its 1/mp slice and the receiver
        # all-gathers the slices over its MP group (mpu.gather_split_1d_tensor), traced in line on the
        # compute track as `all_gather/pp.fwd|pp.bwd` (the plan's: zsim.zero.pipeline_plan)
        self.mp_comm = engine.mp_comm.inline() if engine.mp_comm is not None else None
        self.embed_comm = embed_comm
        if embed_comm is not None and place.stage != 0:  # the last stage's copy of the word embedding
            engine.shared_grads = [self._tied_grad()]

    def train_step(self, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> float | None:
        """One optimizer step over this DP rank's micro-batches; returns their mean loss on the last
        stage, None on the others."""
        engine, tracer, place = self.engine, self.engine.tracer, self.place
        m = len(batches)
        engine.zero_grads()
        scale = engine.scaler.scale if engine.scaler else 1.0
        multiplier = scale / (m * engine.dp)  # as ZeroEngine.train_step: the mean over the global batch
        inputs: dict[tuple[int, int], torch.Tensor] = {}  # (micro-batch, chunk) -> received activation
        outputs: dict[tuple[int, int], torch.Tensor] = {}  # -> the chunk's output (the scaled loss: last)
        losses = []
        with engine.activations.hooks():
            for work in stage_schedule(place.schedule, place.stages, place.stage, m, place.chunks):
                tracer.micro_batch = work.mb
                key = (work.mb, work.chunk)
                if work.kind == "fwd":
                    out = self._forward(work.chunk, batches[work.mb], key, inputs)
                    if place.last(work.chunk):
                        losses.append(out.detach())  # read after the step: no device sync mid-pipeline
                        outputs[key] = out * multiplier
                    else:
                        outputs[key] = out
                        self.p2p.send(self._slice(out.detach()), place.next, "pp.fwd")
                else:
                    engine.reduce_now = work.mb == m - 1  # the chunk's last backward of the step
                    self._backward(work.chunk, outputs.pop(key))
                    if not place.first(work.chunk):
                        self.p2p.send(self._slice(inputs.pop(key).grad), place.prev, "pp.bwd")
            self.p2p.finish()
        tracer.micro_batch = m - 1
        self._reduce()
        engine._optimizer_step()
        return float(torch.stack(losses).sum()) / m if losses else None

    def _forward(self, chunk: int, batch: tuple[torch.Tensor, torch.Tensor], key: tuple[int, int],
                 inputs: dict[tuple[int, int], torch.Tensor]) -> torch.Tensor:
        engine, place = self.engine, self.place
        tokens, targets = (t.to(engine.device) for t in batch)
        if place.first(chunk):
            self.p2p.flush()
            h = tokens
        else:  # (B, T, C) activations of the previous virtual stage, in the working dtype
            shape = (tokens.shape[0], tokens.shape[1], engine.cfg.hidden)
            h = self._recv(shape, engine.dtype, place.prev, "pp.fwd").requires_grad_(True)
            inputs[key] = h
        return engine.forward(self.chunks[chunk], h, targets if place.last(chunk) else None)

    def _backward(self, chunk: int, out: torch.Tensor) -> None:
        if self.place.last(chunk):
            self.p2p.flush()
            out.backward()  # the scaled loss
        else:
            grad = self._recv(tuple(out.shape), out.dtype, self.place.next, "pp.bwd")
            torch.autograd.backward(out, grad)

    def _slice(self, tensor: torch.Tensor) -> torch.Tensor:
        """What this rank sends of `tensor`: all of it, or with MP its 1/mp slice of the flattened tensor
        (Megatron-LM mpu.split_tensor_into_1d_equal_chunks)."""
        if self.mp_comm is None:
            return tensor
        return tensor.reshape(-1).chunk(self.mp_comm.size)[self.mp_comm.ranks.index(dist.get_rank())].contiguous()

    def _recv(self, shape: tuple[int, ...], dtype: torch.dtype, peer: int, what: str) -> torch.Tensor:
        """A tensor of `shape` from `peer`: received whole, or with MP received as this rank's 1/mp slice
        and all-gathered over the MP group (Megatron-LM mpu.gather_split_1d_tensor)."""
        engine = self.engine
        if self.mp_comm is None:
            return self.p2p.recv(shape, dtype, engine.device, peer, what)
        numel = 1
        for n in shape:
            numel *= n
        part = self.p2p.recv((numel // self.mp_comm.size,), dtype, engine.device, peer, what)
        whole = torch.empty(numel, dtype=dtype, device=engine.device)
        self.mp_comm.all_gather(whole, part, what).wait()
        return whole.view(shape)

    def _reduce(self) -> None:
        """The step's gradient reductions. Stage 0's bucket all-reduces are already in flight: wait for
        them, then sum the tied word embedding's gradient over the embedding group (Megatron-LM's
        finalize_model_grads: finish_grad_sync, then _allreduce_embedding_grads). Stage 1 reduce-scatters
        the gradients and keeps only this rank's partition summed, so the tied gradient is summed first
        (DeepSpeed's pipeline TrainSchedule: ReduceTiedGrads, then ReduceGrads)."""
        if self.engine.stage == 0:
            self.engine.finish_reduction()
            self._reduce_tied()
        else:
            self._reduce_tied()
            self.engine.finish_reduction()

    def _tied_grad(self) -> torch.Tensor:
        """The gradient of the tied word embedding on this stage: a view of the stage's gradient buffer
        (stage 0 and 1 keep theirs for the whole run)."""
        engine = self.engine
        unit, name = (engine.units[0], "tokens.weight") if self.place.stage == 0 else (engine.units[-1], "lm_head.weight")
        return unit.layout.views(unit.param.grad)[name]

    def _reduce_tied(self) -> None:
        if self.embed_comm is not None:
            self.embed_comm.all_reduce(self._tied_grad(), "embed").wait()
