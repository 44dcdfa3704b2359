"""The ZeRO plan: the ops one rank executes per step, for each stage (Rajbhandari et al., ZeRO).

What each stage does, as DeepSpeed implements it:
  stage 0 (DP):     backward produces full gradients; buckets of them are all-reduced on the comm
                    stream while backward goes on; the optimizer updates all Ψ parameters.
  stage 1 (Pos):    the same buckets are reduce-scattered; the optimizer updates this rank's 1/Nd;
                    the updated parameters are all-gathered after the step (§5.1, §7.2.1).
  stage 2 (Pos+g):  as stage 1, but a bucket's gradients are freed once reduced: each rank keeps only
                    its gradient partition (§5.2).
  stage 3 (Pos+g+p): parameters are partitioned; each module's parameters are all-gathered before
                    its forward (prefetching `prefetch_layers` ahead) and again before its backward,
                    freed after use; its gradients are reduce-scattered right after its backward (§5.3,
                    §7.2.2: 3Ψ of traffic instead of 2Ψ).
Megatron MP all-reduces run in line on the compute stream (Shoeybi et al. 2019, §3). With gradient
accumulation, stages 0/1 reduce only on the last micro-batch (no_sync); stages 2/3 reduce every
micro-batch, as DeepSpeed does.

ZeRO-R (§6; sizes in zsim.zero.residual, explained in docs/memory.md):
  checkpointing keeps one layer input every `checkpoint_every` layers; backward recomputes a segment's
      layers in forward order, then runs their backward in reverse (Megatron-LM checkpoint_num_layers);
  Pa keeps 1/mp of each checkpoint and all-gathers it over the MP group, in line on the compute
      stream, before the segment's recompute (DeepSpeed checkpointing.py get_full_inputs);
  Pa+cpu copies each partition to host memory on the 'offload' stream once the forward made it, and
      back one segment ahead of its recompute;
  CB: constant-size gradient buckets; without it stages 0-2 reduce all gradients at once from one
      fused fp32 buffer of 4Ψ bytes (§3.2), and stage 3's optimizer upcasts its whole partition;
  MD: checkpoints and stage 2/3 gradients are placed in contiguous arenas reserved at the start.
Every compute op also holds its working memory while it runs: a forward under checkpointing its
layer's activations, a backward the gradients of its input and output.
"""

from __future__ import annotations

from dataclasses import dataclass

from zsim.config.scenario import Scenario
from zsim.workload.transformer import Module, Workload
from zsim.zero.buckets import padded_bucket, padded_tensors, plan_buckets
from zsim.zero.model_states import PARAM_BYTES, model_states, stage_partition
from zsim.zero.ops import Alloc, Op, Plan
from zsim.zero.residual import (
    bucket_buffer_bytes,
    checkpoint_bytes_per_rank,
    checkpoint_segments,
    fused_gradient_buffer_bytes,
    md_arena_bytes,
    optimizer_gradient_bytes,
)

# Adam's update streams, per element: reads fp32 master, momentum, variance and the fp16 gradient
# (4+4+4+2 bytes) and writes master, momentum, variance and the fp16 parameter (4+4+4+2): memory-bound
# (DeepSpeed FusedAdam; counts from the update rule in Kingma & Ba 2015, Alg. 1).
ADAM_BYTES_PER_ELEMENT = 28


class _Builder:
    """Appends ops and hands out their indices."""

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self.last_comm: int | None = None
        self.last_compute: int | None = None

    def add(self, **fields) -> int:
        self.ops.append(Op(**fields))
        if fields["stream"] == "comm":
            self.last_comm = len(self.ops) - 1
        elif fields["stream"] == "compute":
            self.last_compute = len(self.ops) - 1
        return len(self.ops) - 1

    def last(self) -> int | None:
        return len(self.ops) - 1 if self.ops else None


def build_plan(scenario: Scenario, workload: Workload) -> Plan:
    """The ops of `scenario.run.steps` optimizer steps for one rank (all ranks of a class are alike)."""
    zero, dtype = scenario.zero, scenario.precision.dtype
    nd = scenario.layout.dp
    psi = workload.params_per_mp_rank
    states = model_states(psi, nd, zero.stage, dtype, tensors=workload.tensors)
    persistent = (
        Alloc("params", states.params, "model.params"),
        Alloc("grads", states.grads, "model.grads"),
        Alloc("optimizer", states.optimizer, "model.optimizer"),
    )
    b = _Builder()
    for step in range(scenario.run.steps):
        boundary = b.last()
        for mb in range(scenario.grad_accum):
            last_mb = mb == scenario.grad_accum - 1
            first_dep = (boundary,) if boundary is not None and mb == 0 else ()
            _StepPass(b, scenario, workload, step, mb, first_dep).run(reduce=zero.stage >= 2 or last_mb)
        _optimizer(b, scenario, workload, step)
    arenas = _arenas(scenario, workload) if zero.defragment else {}
    return Plan(persistent=persistent, ops=tuple(b.ops), steps=scenario.run.steps, arenas=tuple(arenas.items()))


def _arenas(s: Scenario, w: Workload) -> dict[str, int]:
    """MD's arenas for this scenario (zsim.zero.residual.md_arena_bytes)."""
    z = s.zero
    live = 0
    if z.activation_checkpointing and not z.cpu_offload_activations:
        per = checkpoint_bytes_per_rank(w.blocks[0].checkpoint_bytes, s.layout.mp, z.partition_activations) \
            if w.blocks else 0
        live = per * checkpoint_segments(len(w.blocks), z.checkpoint_every)
    return md_arena_bytes(z.stage, PARAM_BYTES[s.precision.dtype], w.params_per_mp_rank, w.largest_module_params,
                          z.reduce_bucket_elements, z.constant_buffers, live)


@dataclass(frozen=True, slots=True)
class _Item:
    """One compute step of a pass: `kind` fwd, recompute or bwd, of `module`."""

    kind: str
    module: Module


class _StepPass:
    """Forward and backward of one micro-batch."""

    def __init__(self, b: _Builder, scenario: Scenario, workload: Workload, step: int, mb: int,
                 first_dep: tuple[int, ...]):
        self.b, self.s, self.w = b, scenario, workload
        self.z = scenario.zero
        self.step, self.mb = step, mb
        self.first_dep = first_dep
        self.stage = scenario.zero.stage
        self.ckpt = scenario.zero.activation_checkpointing
        self.k = scenario.zero.checkpoint_every
        self.e = PARAM_BYTES[scenario.precision.dtype]
        self.md = scenario.zero.defragment
        mods = workload.modules
        self.by_name = {m.name: m for m in mods}
        # A tied LM head computes with the word embedding: it uses the embedding's parameters too.
        tied = getattr(scenario.model, "tied_head", True)
        self.uses = {m.name: (m.name, mods[0].name) if m.name == "head" and tied else (m.name,) for m in mods}
        self.nd = scenario.layout.dp
        sizes = [m.params for m in mods]  # each module's bucket's elements (zsim.zero.buckets)
        self.bucket_elements_of = {mods[i].name: sum(sizes[j] for j in b)
                                   for b in plan_buckets(sizes, scenario.zero.reduce_bucket_elements) for i in b}
        self.segment_gather: dict[int, int] = {}  # segment -> its checkpoint all-gather (Pa), on compute

    # ---- naming and small helpers -------------------------------------------------------------
    def _tags(self, kind: str, name: str) -> str:
        return f"{kind}.{name}.s{self.step}.m{self.mb}"

    def _add(self, **fields) -> int:
        return self.b.add(step=self.step, micro_batch=self.mb, **fields)

    def _checkpointed(self, m: Module) -> bool:
        return self.ckpt and m.layer is not None

    def _segment(self, m: Module) -> int:
        return m.layer // self.k

    def _segment_layers(self, seg: int) -> list[Module]:
        blocks = self.w.blocks
        return list(blocks[seg * self.k:min((seg + 1) * self.k, len(blocks))])

    def _activations(self, m: Module, kind: str) -> tuple[Alloc, ...]:
        """The module's saved activations, one allocation per tensor (tags `<kind>.<module>.<i>`)."""
        return tuple(Alloc("activations", n, self._tags(f"{kind}{i}", m.name)) for i, n in enumerate(m.saved_tensors))

    def _activation_tags(self, m: Module, kind: str) -> tuple[str, ...]:
        return tuple(self._tags(f"{kind}{i}", m.name) for i in range(len(m.saved_tensors)))

    def _mp_allreduces(self, m: Module, count: int, extra: tuple[int, ...] = ()) -> None:
        for nbytes in (m.mp_allreduce_bytes,) * count + extra:
            self._add(name=f"all_reduce/mp.{m.name}", stream="compute", collective="all_reduce", group="mp",
                      nbytes=nbytes)

    # ---- the schedule ---------------------------------------------------------------------------
    def run(self, reduce: bool) -> None:
        mods = list(self.w.modules)
        self._run_items([_Item("fwd", m) for m in mods], phase="fwd", reduce=False)
        self._run_items(self._backward_items(mods), phase="bwd", reduce=reduce)

    def _backward_items(self, mods: list[Module]) -> list[_Item]:
        """Backward in reverse module order; a checkpointed segment is recomputed in forward order
        first, then its layers' backward runs in reverse (Megatron-LM CheckpointFunction)."""
        items: list[_Item] = []
        done: set[int] = set()
        for m in reversed(mods):
            if not self._checkpointed(m):
                items.append(_Item("bwd", m))
                continue
            seg = self._segment(m)
            if seg in done:
                continue
            done.add(seg)
            layers = self._segment_layers(seg)
            items += [_Item("recompute", x) for x in layers]
            items += [_Item("bwd", x) for x in reversed(layers)]
        return items

    def _uses_of(self, items: list[_Item]) -> tuple[dict[str, int], dict[str, int]]:
        """Stage 3: the position of the item where each module's parameters are first needed and of
        the item after whose compute they can be freed."""
        first_use: dict[str, int] = {}
        last_use: dict[str, int] = {}
        for pos, item in enumerate(items):
            for used in self.uses[item.module.name]:
                first_use.setdefault(used, pos)
                last_use[used] = pos
        return first_use, last_use

    def _run_items(self, items: list[_Item], phase: str, reduce: bool) -> None:
        first_use, last_use = self._uses_of(items) if self.stage == 3 else ({}, {})
        self.gather_op: dict[str, int] = {}
        self.frees_after: dict[int, list[str]] = {}
        for name, pos in last_use.items():
            self.frees_after.setdefault(pos, []).append(self._tags(f"gathered.{phase}", name))
        self.gather_queue = sorted(first_use, key=first_use.get)
        self.gathered: list[str] = []  # modules whose gather this phase has issued, in order
        self.first_use = first_use
        self.phase_dep = (self.b.last_compute,) if self.b.last_compute is not None else self.first_dep
        self.compute_ops: list[int] = []  # last compute op index per item position
        self.bucket_index = 0
        self.bucket: list[Module] = []
        self.bucket_elems = 0
        for pos, item in enumerate(items):
            if self.stage == 3:
                self._issue_gathers_up_to(pos, phase)
            deps = tuple(self.gather_op[u] for u in self.uses[item.module.name] if u in self.gather_op)
            if pos == 0:
                deps = deps + self.first_dep
            frees = tuple(self.frees_after.get(pos, ()))
            if item.kind == "fwd":
                op = self._forward(item.module, deps, frees)
            elif item.kind == "recompute":
                op = self._recompute(item.module, deps, frees)
            else:
                op = self._backward(item.module, deps, frees, reduce)
            self.compute_ops.append(op)
        if reduce and self.bucket:
            self._reduce(self.bucket, self.compute_ops[-1])

    def _issue_gathers_up_to(self, pos: int, phase: str) -> None:
        """Gather modules in the order of their first use, `prefetch_layers` modules ahead (ZeRO §5.3):
        the gather of the j-th module is issued when the item that first uses module j - prefetch
        starts, i.e. once the compute before that item has finished (at the phase's start: once the
        previous phase's compute has). The runtime does the same: before a unit computes it waits
        for the unit's own gather, then issues the next one's (runtime/zero/stage3.py)."""
        ahead = self.z.prefetch_layers
        while self.gather_queue:
            j = len(self.gathered)
            trigger = self.first_use[(self.gathered + self.gather_queue)[j - ahead]] if j >= ahead else 0
            if trigger > pos:
                break
            name = self.gather_queue.pop(0)
            self.gathered.append(name)
            deps = (self.compute_ops[trigger - 1],) if trigger > 0 else self.phase_dep
            nbytes = self.e * padded_tensors(self.by_name[name].tensors, self.nd)  # each tensor padded to Nd
            self.gather_op[name] = self._add(
                name=f"all_gather/params.{name}", stream="comm", deps=deps, collective="all_gather", group="dp",
                nbytes=nbytes, allocs=(Alloc("params", nbytes, self._tags(f"gathered.{phase}", name)),))

    # ---- forward --------------------------------------------------------------------------------
    def _forward(self, m: Module, deps: tuple[int, ...], frees: tuple[str, ...]) -> int:
        """A module's forward. Without checkpointing it keeps its saved activations for backward;
        with it, a segment's first layer keeps its input (the checkpoint; 1/mp of it under Pa) and
        every layer holds its activations only while it runs."""
        if not self._checkpointed(m):
            allocs = list(self._activations(m, "act"))
        else:
            allocs = list(self._activations(m, "work"))
            frees = frees + self._activation_tags(m, "work")
            if m.layer % self.k == 0:
                allocs.append(Alloc("activations", self._checkpoint_bytes(m), self._tags("ckpt", m.name),
                                    arena="checkpoints" if self.md else ""))
        op = self._add(name=f"fwd/{m.name}", stream="compute", deps=deps, flops=m.fwd_flops, hbm_bytes=m.fwd_hbm_bytes,
                       allocs=tuple(allocs), frees=frees)
        self._mp_allreduces(m, m.mp_allreduces_fwd, m.mp_loss_allreduce_bytes)
        if self._checkpointed(m) and m.layer % self.k == 0 and self.z.cpu_offload_activations:
            self._offload_out(m, op)
        return op

    def _checkpoint_bytes(self, m: Module) -> int:
        return checkpoint_bytes_per_rank(m.checkpoint_bytes, self.s.layout.mp, self.z.partition_activations)

    def _offload_out(self, m: Module, after: int) -> None:
        """Pa+cpu: copy the checkpoint partition to host memory; the GPU copy is freed when it lands."""
        nbytes = self._checkpoint_bytes(m)
        self._add(name=f"offload/activations.{m.name}", stream="offload", deps=(after,), transfer="d2h", nbytes=nbytes,
                  allocs=(Alloc("activations", nbytes, self._tags("host", m.name), where="host"),),
                  frees=(self._tags("ckpt", m.name),))

    # ---- backward -------------------------------------------------------------------------------
    def _recompute(self, m: Module, deps: tuple[int, ...], frees: tuple[str, ...]) -> int:
        """Recompute a checkpointed layer's forward, keeping its activations for its backward. The
        segment's first layer first brings its checkpoint back (Pa+cpu) and all-gathers it (Pa); the
        checkpoint is freed once that recompute has rebuilt the layer's input among its activations."""
        if m.layer % self.k == 0:
            ckpt = self._tags("ckpt", m.name)
            if self.z.partition_activations:
                deps = deps + (self._gather_checkpoint(m),)
                ckpt = self._tags("ckpt.full", m.name)
            frees = frees + (ckpt,)
        op = self._add(name=f"recompute/{m.name}", stream="compute", deps=deps, flops=m.fwd_flops,
                       hbm_bytes=m.fwd_hbm_bytes, allocs=self._activations(m, "act"), frees=frees)
        self._mp_allreduces(m, m.mp_allreduces_fwd)
        return op

    def _gather_checkpoint(self, m: Module) -> int:
        """Pa: all-gather the segment's checkpoint over the MP group, in line on the compute stream
        (ZeRO §6.1, §8: one all-gather of the layer input per checkpoint before recompute)."""
        part = self._tags("ckpt", m.name)
        deps: tuple[int, ...] = ()
        if self.z.cpu_offload_activations:
            deps = (self._offload_in(m),)
        op = self._add(name=f"all_gather/activations.{m.name}", stream="compute", deps=deps, collective="all_gather",
                       group="mp", nbytes=m.checkpoint_bytes,
                       allocs=(Alloc("activations", m.checkpoint_bytes, self._tags("ckpt.full", m.name)),),
                       frees=(part,))
        self.segment_gather[self._segment(m)] = op
        return op

    def _offload_in(self, m: Module) -> int:
        """Pa+cpu: copy the partition back to the GPU one segment ahead: the copy may start once the
        previous segment (in backward order) has gathered its own checkpoint; the first one once
        backward has begun."""
        previous = self.segment_gather.get(self._segment(m) + 1)
        if previous is not None:
            deps: tuple[int, ...] = (previous,)
        else:
            deps = (self.compute_ops[-1],) if self.compute_ops else self.first_dep
        nbytes = self._checkpoint_bytes(m)
        return self._add(name=f"prefetch/activations.{m.name}", stream="offload", deps=deps, transfer="h2d",
                         nbytes=nbytes, allocs=(Alloc("activations", nbytes, self._tags("ckpt", m.name)),),
                         frees=(self._tags("host", m.name),))

    def _backward(self, m: Module, deps: tuple[int, ...], frees: tuple[str, ...], reduce: bool) -> int:
        """A module's backward: frees its activations, holds its input and output gradients while
        it runs (2 tensors of shape (s, b, h)), and from stage 2 produces its gradient tensor (into
        MD's arena when on); gradients join the reduction bucket."""
        work = self._tags("dgrad", m.name)
        allocs = [Alloc("activations", 2 * m.checkpoint_bytes, work)] if m.layer is not None else []
        if self.stage >= 2:
            allocs.append(Alloc("grads", self.e * m.params, self._tags("grad", m.name), arena="grads" if self.md else ""))
        frees = frees + self._activation_tags(m, "act") + ((work,) if m.layer is not None else ())
        if self.stage == 3 and reduce:
            # Stage 3 copies each module's gradient into its bucket's buffer as soon as it is complete
            # and frees it (DeepSpeed contiguous_gradients: __add_grad_to_ipg_bucket; the runtime's
            # ReduceScatterBuckets): the buffer is taken by the bucket's first module.
            if not self.bucket:
                elements = self.bucket_elements_of[m.name]
                allocs.append(Alloc("buffers", bucket_buffer_bytes(self.z.reduce_bucket_elements, elements, self.e),
                                    self._tags("bucket", m.name)))
            frees = frees + (self._tags("grad", m.name),)
        op = self._add(name=f"bwd/{m.name}", stream="compute", deps=deps, flops=m.bwd_flops,
                       hbm_bytes=2 * m.fwd_hbm_bytes, allocs=tuple(allocs), frees=frees)
        self._mp_allreduces(m, m.mp_allreduces_bwd)
        if reduce:
            self.bucket.append(m)
            self.bucket_elems += m.params
            fused = self.stage < 3 and not self.z.constant_buffers  # one fused reduction after backward
            # zsim.zero.buckets.plan_buckets's rule, which the runtime uses too (stage 3 included).
            if not fused and self.bucket_elems >= self.z.reduce_bucket_elements:
                self._reduce(self.bucket, op)
                self.bucket, self.bucket_elems = [], 0
        return op

    def _reduce(self, bucket: list[Module], after: int) -> None:
        """Reduce a bucket of gradients once the backward that completes it (`after`) is done."""
        e = self.e
        elements = sum(m.params for m in bucket)
        # Bytes as the runtime moves them (zsim.zero.buckets): stage 0 the bucket itself, stages 1-2
        # the bucket padded to a multiple of 2·Nd, stage 3 each tensor padded to a multiple of Nd.
        if self.stage == 3:
            nbytes = e * sum(padded_tensors(m.tensors, self.nd) for m in bucket)
        else:
            nbytes = e * (padded_bucket(elements, self.nd) if self.stage else elements)
        what = f"grads.bucket.{self.bucket_index}"
        self.bucket_index += 1
        tag = self._tags("bucket", bucket[0].name)
        op = "all_reduce" if self.stage == 0 else "reduce_scatter"
        size = bucket_buffer_bytes(self.z.reduce_bucket_elements, elements, e) if self.z.constant_buffers \
            else fused_gradient_buffer_bytes(elements)
        staging = (Alloc("buffers", size, tag),) if self.stage < 3 else ()  # stage 3: taken in backward
        frees = [tag]
        if self.stage == 2:
            frees += [self._tags("grad", m.name) for m in bucket]
        self.b.add(name=f"{op}/{what}", stream="comm", deps=(after,), collective=op, group="dp", nbytes=nbytes,
                   allocs=staging, frees=tuple(frees), step=self.step, micro_batch=self.mb)


def _optimizer(b: _Builder, s: Scenario, w: Workload, step: int) -> None:
    """The Adam step on this rank's partition, after every reduction, holding the fp32 copy of the
    gradients it reads (zsim.zero.residual.optimizer_gradient_bytes); stages 1/2 then all-gather the
    updated parameters in buckets, or all at once without CB (ZeRO §7.2.1)."""
    z, nd, dtype = s.zero, s.layout.dp, s.precision.dtype
    psi = w.params_per_mp_rank
    elements = stage_partition(psi, nd, z.stage, w.tensors)
    deps = (b.last_comm,) if b.last_comm is not None else ()
    last_mb = s.grad_accum - 1  # the runtime stamps what follows the last micro-batch with its index
    deps = _checks(b, s, elements, step, last_mb, deps)
    upcast = optimizer_gradient_bytes(z.stage, elements, dtype, z.constant_buffers, z.reduce_bucket_elements)
    tag = f"optimizer.fp32_grads.s{step}"
    opt = b.add(name="optimizer/step", stream="compute", deps=deps, hbm_bytes=ADAM_BYTES_PER_ELEMENT * elements,
                allocs=(Alloc("buffers", upcast, tag),), frees=(tag,), step=step, micro_batch=last_mb,
                elements=elements)
    if z.stage in (1, 2):
        # The updated parameters are all-gathered bucket by bucket: the reduction buckets, each padded
        # to a multiple of 2·Nd (zsim.zero.buckets; the runtime does the same). DeepSpeed all-gathers
        # its flat partition in allgather_bucket_size shards instead (docs/runtime.md).
        e = PARAM_BYTES[dtype]
        sizes = [m.params for m in w.modules]
        buckets = plan_buckets(sizes, z.reduce_bucket_elements) if z.constant_buffers else [list(range(len(sizes)))]
        for j, members in enumerate(buckets):
            n = padded_bucket(sum(sizes[i] for i in members), nd)
            b.add(name=f"all_gather/params.bucket.{j}", stream="comm", deps=(opt,), collective="all_gather",
                  group="dp", nbytes=e * n, step=step, micro_batch=last_mb)


# Bytes per element of the checks before Adam (zsim/compute/kernels.py optimizer_kernels on branch
# issue-9, from DeepSpeed's 2020 ZeRO optimizer): the overflow check casts to fp32 and sums (2 + 4 + 4),
# the gradient norm converts to double and reduces (2 + 8 + 8; fp32 training 4 + 8 + 8).
CHECK_BYTES_PER_ELEMENT = {"overflow": 10, "norm": 18}


def _checks(b: _Builder, s: Scenario, elements: int, step: int, mb: int, deps: tuple[int, ...]) -> tuple[int, ...]:
    """The optimizer's checks before Adam, as DeepSpeed's ZeRO optimizer runs them and the runtime
    does: the overflow check (mixed precision) and the gradient norm, each a pass over this rank's
    partition (`optimizer/overflow`, `optimizer/norm`) and a 4-byte all-reduce over the DP group and,
    with MP, over the MP group, in line on the compute stream (the step waits for the answer).
    Returns the optimizer's dependencies."""
    checks = ("norm",) if s.precision.dtype == "fp32" else ("overflow", "norm")
    groups = ("dp", "mp") if s.layout.mp > 1 else ("dp",)
    for check in checks:
        per = CHECK_BYTES_PER_ELEMENT[check] + (2 if check == "norm" and s.precision.dtype == "fp32" else 0)
        b.add(name=f"optimizer/{check}", stream="compute", deps=deps, hbm_bytes=per * elements, step=step,
              micro_batch=mb)
        deps = ()
        for group in groups:
            b.add(name=f"all_reduce/{check}.{group}", stream="compute", collective="all_reduce", group=group,
                  nbytes=4, step=step, micro_batch=mb)
    return deps
