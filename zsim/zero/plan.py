"""The ZeRO plan: the ops one rank executes per step, for each stage (Rajbhandari et al., ZeRO).

What each stage does, as DeepSpeed implements it:
  stage 0 (DP):     backward produces full gradients; buckets of them are all-reduced on the comm
                    stream while backward goes on; the optimizer updates all Ψ parameters.
  stage 1 (Pos):    after the last backward the gradients are reduce-scattered in DeepSpeed v0.2's
                    comm intervals; the optimizer updates this rank's 1/Nd of each; the updated
                    parameters are all-gathered after the step, interval by interval (§5.1, §7.2.1).
  stage 2 (Pos+g):  the buckets are reduce-scattered while backward goes on and a bucket's gradients
                    are freed once reduced: each rank keeps only its gradient partition (§5.2); after
                    the step the partition is all-gathered in DeepSpeed v0.2's shards.
The stage 1-2 layout (which rank owns what, what each collective moves) is zsim.zero.buckets', which
the runtime (runtime/zero/) follows too: one plan, op for op (docs/runtime.md, "One ZeRO plan").
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

import math
from collections.abc import Callable
from dataclasses import dataclass

from zsim.compute.kernels import (KernelList, Shape, host_adam_kernels, module_kernels, optimizer_kernels,
                                  with_bucket_copy)
from zsim.config.scenario import Scenario
from zsim.config.schema import ZeroSection
from zsim.memory.context import context_memory
from zsim.workload.transformer import Module, Workload, build_workload
from zsim.zero.buckets import allgather_shards, flat_pieces, padded_bucket, padded_tensors, plan_buckets
from zsim.zero.model_states import PARAM_BYTES, ModelStates, model_states, stage_partition
from zsim.zero.ops import Alloc, Op, Plan
from zsim.zero.residual import (
    bucket_buffer_bytes,
    checkpoint_bytes_per_rank,
    checkpoint_segments,
    fused_gradient_buffer_bytes,
    list_collective_staging_bytes,
    md_arena_bytes,
    stage1_comm_intervals,
    stage1_flat_gradient_bytes,
    step_gradient_bytes,
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
    zero = scenario.zero
    states = rank_model_states(scenario, workload)
    # Gradients are not persistent: DeepSpeed's fp16 gradients (all of them at stages 0/1, the
    # partition at 2/3) appear during backward and are freed in the optimizer step (_grads_tags).
    persistent = (
        Alloc("params", states.params, "model.params"),
        Alloc("optimizer", states.optimizer, "model.optimizer"),
    )
    lay = scenario.layout
    context = context_memory(lay.world, lay.dp, lay.mp, scenario.cluster.nvlink_links).items()
    b = _Builder()
    for step in range(scenario.run.steps):
        boundary = b.last()
        for mb in range(scenario.grad_accum):
            last_mb = mb == scenario.grad_accum - 1
            first_dep = (boundary,) if boundary is not None and mb == 0 else ()
            _StepPass(b, scenario, workload, step, mb, first_dep).run(reduce=zero.stage >= 2 or last_mb)
        _optimizer(b, scenario, workload, step)
    arenas = _arenas(scenario, workload) if zero.defragment else {}
    return Plan(persistent=persistent, ops=tuple(b.ops), steps=scenario.run.steps, arenas=tuple(arenas.items()),
                context=tuple(context))


def selective(scenario: Scenario) -> bool:
    """Selective activation recompute [K22 §5] in effect: checkpointing on at 'selective' granularity."""
    z = scenario.zero
    return z.activation_checkpointing and z.recompute_granularity == "selective"


def scenario_workload(scenario: Scenario) -> Workload:
    """The workload of `scenario`: its model under its MP degree, dtype, sequence parallelism and
    recompute granularity (zsim.workload.transformer.build_workload)."""
    return build_workload(scenario.model, scenario.parallel.mp, scenario.precision.dtype,
                          sequence_parallel=scenario.parallel.sequence_parallel, selective=selective(scenario),
                          ep=scenario.parallel.ep)


def rank_pieces(scenario: Scenario, workload: Workload) -> list[int] | None:
    """Stages 1-2: the pieces of the flat buffer (zsim.zero.buckets.flat_pieces); None otherwise."""
    z = scenario.zero
    if z.stage not in (1, 2):
        return None
    return flat_pieces(z.stage, [m.params for m in workload.modules], scenario.layout.dp, z.reduce_bucket_elements,
                       z.constant_buffers)


def rank_model_states(scenario: Scenario, workload: Workload) -> ModelStates:
    """Model-state bytes of one rank as the plan lays them out (padding included, as the runtime
    allocates them): zsim.zero.model_states with the plan's stage 1-2 pieces and stage 3 tensors."""
    dense = model_states(workload.params_per_mp_rank, scenario.layout.dp, scenario.zero.stage,
                         scenario.precision.dtype, tensors=workload.tensors, pieces=rank_pieces(scenario, workload))
    if not workload.expert_params_per_rank:
        return dense
    # a MoE model's local experts: ZeRO partitions them over the expert-data-parallel group (dp/ep ranks)
    experts = model_states(workload.expert_params_per_rank, expert_dp(scenario), scenario.zero.stage,
                           scenario.precision.dtype)
    return ModelStates(params=dense.params + experts.params, grads=dense.grads + experts.grads,
                       optimizer=dense.optimizer + experts.optimizer)


def expert_dp(scenario: Scenario) -> int:
    """Ranks of the expert-data-parallel group: dp / ep (Megatron-Core; DeepSpeed-MoE's expert data parallel)."""
    return scenario.layout.dp // scenario.layout.ep


def expert_partition(scenario: Scenario, workload: Workload) -> int:
    """Elements of this rank's partition of its local experts' states (zsim.zero.model_states)."""
    return stage_partition(workload.expert_params_per_rank, expert_dp(scenario), scenario.zero.stage)


def rank_partition(scenario: Scenario, workload: Workload) -> int:
    """Elements of this rank's model-state partition (Ψ at stage 0), as rank_model_states lays it out."""
    dense = stage_partition(workload.params_per_mp_rank, scenario.layout.dp, scenario.zero.stage, workload.tensors,
                            rank_pieces(scenario, workload))
    return dense + (expert_partition(scenario, workload) if workload.expert_params_per_rank else 0)


def _md_checkpoints(z: ZeroSection) -> str:
    """How MD holds the checkpoints that stay on the GPU (docs/memory.md, "MD"): "slots", DeepSpeed's one
    allocator tensor per checkpoint, only with Pa (DeepSpeed copies a checkpoint into its contiguous
    buffer inside `if PARTITION_ACTIVATIONS:` and configure() asserts Pa for it; v0.2.0
    deepspeed/pt/deepspeed_checkpointing.py); "arena", the paper's one buffer reserved for the run
    (md_checkpoints: reserved); "" for none (no MD, no checkpointing, or Pa+cpu's host buffer)."""
    if not (z.defragment and z.activation_checkpointing) or z.cpu_offload_activations:
        return ""
    if z.md_checkpoints == "reserved":
        return "arena"
    return "slots" if z.partition_activations else ""


def _arenas(s: Scenario, w: Workload) -> dict[str, int]:
    """MD's arenas for this scenario (zsim.zero.residual.md_arena_bytes), and with md_checkpoints:
    reserved, the checkpoints' arena: every checkpoint of one micro-batch that lives on the GPU."""
    z = s.zero
    arenas = md_arena_bytes(z.stage, PARAM_BYTES[s.precision.dtype], w.params_per_mp_rank, z.reduce_bucket_elements,
                            z.constant_buffers, z.overlap_comm)
    if _md_checkpoints(z) == "arena" and w.blocks:
        per = checkpoint_bytes_per_rank(w.blocks[0].checkpoint_bytes, s.layout.mp, z.partition_activations)
        arenas = {"checkpoints": per * checkpoint_segments(len(w.blocks), z.checkpoint_every), **arenas}
    return arenas


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
        # Full recompute keeps one input per segment; selective keeps the layer's activations but the
        # attention core's (zsim.workload.transformer.layer_saved_tensors) and recomputes the core in the
        # block's backward kernels (zsim.compute.kernels.block_backward) [K22 §5].
        self.ckpt = scenario.zero.activation_checkpointing and scenario.zero.recompute_granularity == "full"
        self.k = scenario.zero.checkpoint_every
        self.e = PARAM_BYTES[scenario.precision.dtype]
        self.md = scenario.zero.defragment
        self.md_checkpoints = _md_checkpoints(scenario.zero)  # "slots", "arena" or ""
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
        self.shape = Shape.of(scenario.model, scenario.layout.mp, workload.padded_vocab, scenario.precision.dtype,
                              arch=scenario.cluster.gpu.compute_capability, selective=selective(scenario),
                              sp=scenario.parallel.sequence_parallel, ep=scenario.layout.ep)
        self.expert_group = "edp"  # = the DP group's ranks when ep is 1

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

    def _kernels(self, m: Module, phase: str) -> KernelList:
        """The kernels module `m` launches in `phase` (zsim.compute.kernels; shared per shape and phase)."""
        kind = ("moe_block" if m.moe else "block") if m.layer is not None else m.name
        return module_kernels(kind, phase, self.shape)

    def _all_to_alls(self, m: Module) -> None:
        """A MoE block's dispatch and combine all-to-alls over the EP group, in line on the compute
        stream (Megatron-Core's alltoall token dispatcher); backward runs their two mirrors."""
        for what in ("dispatch", "combine") if m.ep_all_to_all_bytes else ():
            self._add(name=f"all_to_all/ep.{m.name}.{what}", stream="compute", collective="all_to_all", group="ep",
                      nbytes=m.ep_all_to_all_bytes)

    def _mp_allreduces(self, m: Module, count: int, extra: tuple[int, ...] = (),
                       collectives: tuple[tuple[str, int], ...] = ()) -> None:
        """The module's MP collectives in line on the compute stream: its all-reduces, or under sequence
        parallelism its all-gathers and reduce-scatters (`collectives`), then `extra` all-reduces."""
        ops = (("all_reduce", m.mp_allreduce_bytes),) * count + collectives + tuple(("all_reduce", n) for n in extra)
        for op, nbytes in ops:
            self._add(name=f"{op}/mp.{m.name}", stream="compute", collective=op, group="mp", nbytes=nbytes)

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
            # DeepSpeed v0.3.13 partition_parameters.py _allgather_param: the full parameter buffer, and
            # PyTorch's flat staging of the list all_gather until the copy-out; both made on the
            # coordinator's comm stream (stage3.py _all_gather: `with torch.cuda.stream(self.comm_stream)`,
            # a stream of its own under overlap_comm, stage 3's default), so in that stream's pool.
            staging = Alloc("buffers", list_collective_staging_bytes(self.by_name[name].params, self.e),
                            self._tags(f"ag_list.{phase}", name))
            self.gather_op[name] = self._add(
                name=f"all_gather/params.{name}", stream="comm", deps=deps, collective="all_gather", group="dp",
                nbytes=nbytes, allocs=(Alloc("params", nbytes, self._tags(f"gathered.{phase}", name)), staging),
                frees=(staging.tag,))

    # ---- forward --------------------------------------------------------------------------------
    def _forward(self, m: Module, deps: tuple[int, ...], frees: tuple[str, ...]) -> int:
        """A module's forward. Without checkpointing it keeps its saved activations for backward;
        with it, a segment's first layer keeps its input (the checkpoint; 1/mp of it under Pa) and
        every layer holds its activations only while it runs."""
        if not self._checkpointed(m):
            allocs = list(self._activations(m, "act"))
            if m.fwd_work_tensors:  # the head's loss: held while the forward runs
                work = [Alloc("activations", n, self._tags(f"fwork{i}", m.name)) for i, n in enumerate(m.fwd_work_tensors)]
                allocs += work
                frees = frees + tuple(w.tag for w in work)
        else:
            allocs = list(self._activations(m, "work"))
            frees = frees + self._activation_tags(m, "work")
            if m.layer % self.k == 0 and self.md_checkpoints != "slots":
                allocs.append(Alloc("activations", self._checkpoint_bytes(m), self._tags("ckpt", m.name),
                                    arena="checkpoints" if self.md_checkpoints == "arena" else ""))
            elif m.layer == 0 and self.md_checkpoints == "slots":
                # MD: the first checkpointed forward of a micro-batch allocates every checkpoint's slot at
                # once, `num_layers` tensors of the partition's size, and each slot is freed with its
                # layer's saved tensors in backward (v0.2.0 deepspeed_checkpointing.py: the
                # contiguous_data_buffers list is made when empty, then dropped in the first backward).
                allocs += [Alloc("activations", self._checkpoint_bytes(b), self._tags("ckpt", b.name))
                           for b in self.w.blocks if b.layer % self.k == 0]
        op = self._add(name=f"fwd/{m.name}", stream="compute", deps=deps, flops=m.hw_fwd_flops, hbm_bytes=m.fwd_hbm_bytes,
                       allocs=tuple(allocs), frees=frees, kernels=self._kernels(m, "fwd"))
        self._mp_allreduces(m, m.mp_allreduces_fwd, m.mp_loss_allreduce_bytes, m.mp_collectives_fwd)
        self._all_to_alls(m)
        if self._checkpointed(m) and m.layer % self.k == 0 and self.z.cpu_offload_activations:
            self._offload_out(m, op)
        return op

    def _checkpoint_bytes(self, m: Module) -> int:
        return checkpoint_bytes_per_rank(m.checkpoint_bytes, self.s.layout.mp, self.z.partition_activations)

    def _offload_stream(self) -> str:
        """Pa+cpu's copies: in line on the compute stream as DeepSpeed makes them (`.cpu()`, `.to(device)`),
        or on a stream of their own with zero.cpu_offload_overlap."""
        return "offload" if self.z.cpu_offload_overlap else "compute"

    def _offload_out(self, m: Module, after: int) -> None:
        """Pa+cpu: copy the checkpoint partition to host memory; the GPU copy is freed when it lands."""
        nbytes = self._checkpoint_bytes(m)
        self._add(name=f"offload/activations.{m.name}", stream=self._offload_stream(), deps=(after,), transfer="d2h",
                  nbytes=nbytes, allocs=(Alloc("activations", nbytes, self._tags("host", m.name), where="host"),),
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
        op = self._add(name=f"recompute/{m.name}", stream="compute", deps=deps, flops=m.hw_fwd_flops,
                       hbm_bytes=m.fwd_hbm_bytes, allocs=self._activations(m, "act"), frees=frees,
                       kernels=self._kernels(m, "recompute"))
        self._mp_allreduces(m, m.mp_allreduces_fwd, collectives=m.mp_collectives_fwd)
        self._all_to_alls(m)
        return op

    def _gather_checkpoint(self, m: Module) -> int:
        """Pa: all-gather the segment's checkpoint over the MP group, in line on the compute stream
        (ZeRO §6.1, §8: one all-gather of the layer input per checkpoint before recompute)."""
        part = self._tags("ckpt", m.name)
        deps: tuple[int, ...] = ()
        if self.z.cpu_offload_activations:
            deps = (self._offload_in(m),)
        # DeepSpeed checkpointing.py get_full_inputs: a zeroed full-size tensor whose mp slices are passed
        # to dist.all_gather as a list, which PyTorch stages through one more flat buffer of the same size.
        staging = Alloc("buffers", list_collective_staging_bytes(m.checkpoint_bytes, 1),
                        self._tags("ag_list.ckpt", m.name))
        op = self._add(name=f"all_gather/activations.{m.name}", stream="compute", deps=deps, collective="all_gather",
                       group="mp", nbytes=m.checkpoint_bytes,
                       allocs=(Alloc("activations", m.checkpoint_bytes, self._tags("ckpt.full", m.name)), staging),
                       frees=(part, staging.tag))
        self.segment_gather[self._segment(m)] = op
        return op

    def _offload_in(self, m: Module) -> int:
        """Pa+cpu: copy the partition back to the GPU. As DeepSpeed does (`get_full_inputs(...,
        device=cuda_device)` in the recompute), `fetch/` in line on the compute stream just before the
        segment's all-gather; with zero.cpu_offload_overlap, `prefetch/` one segment ahead on the offload
        stream: it may start once the previous segment (in backward order) has gathered its own
        checkpoint, the first one once backward has begun."""
        previous = self.segment_gather.get(self._segment(m) + 1)
        if previous is not None:
            deps: tuple[int, ...] = (previous,)
        else:
            deps = (self.compute_ops[-1],) if self.compute_ops else self.first_dep
        nbytes = self._checkpoint_bytes(m)
        kind = "prefetch" if self.z.cpu_offload_overlap else "fetch"
        return self._add(name=f"{kind}/activations.{m.name}", stream=self._offload_stream(), deps=deps,
                         transfer="h2d", nbytes=nbytes,
                         allocs=(Alloc("activations", nbytes, self._tags("ckpt", m.name)),),
                         frees=(self._tags("host", m.name),))

    def _backward_work_bytes(self, m: Module) -> int:
        """The gradients a module's backward holds while it runs, beyond its saved activations: a block,
        the gradients of its input and output (2·e·sbh); the embedding, the gradient of its output
        (e·sbh); the head, the gradient of its input (e·sbh) and the e-byte logit gradient
        (e·sbV/t) that the cast back from the fp32 cross-entropy makes for the logits GEMM's backward
        (Megatron-LM pretrain_gpt2.py: vocab_parallel_cross_entropy(output.float(), ...);
        mpu/cross_entropy.py computes the fp32 gradient in place of its saved softmax)."""
        sbh = self.w.blocks[0].checkpoint_bytes if self.w.blocks else 0  # e·sbh: one layer input
        if m.layer is not None:
            return 2 * m.checkpoint_bytes
        if m.name == "head":
            model = self.s.model
            return sbh + self.e * model.seq_len * model.micro_batch * self.w.padded_vocab // self.s.layout.mp
        return sbh

    def _backward(self, m: Module, deps: tuple[int, ...], frees: tuple[str, ...], reduce: bool) -> int:
        """A module's backward: frees its activations, holds its input and output gradients while
        it runs (_backward_work_bytes), and from stage 2 produces its gradient tensor (into
        MD's arena when on); gradients join the reduction bucket."""
        work = self._tags("dgrad", m.name)
        allocs = [Alloc("activations", self._backward_work_bytes(m), work)]
        if self.stage >= 2:
            allocs.append(Alloc("grads", self.e * m.params, self._tags("grad", m.name), arena="grads" if self.md else ""))
        elif self.mb == 0:  # stages 0/1: autograd's .grad tensors, accumulated in place until the step
            allocs.append(Alloc("grads", self.e * m.params, _full_grad_tag(m.name, self.step)))
        frees = frees + self._activation_tags(m, "act") + (work,)
        if m.expert_params and (self.stage >= 2 or self.mb == 0):  # the local experts' gradients (_expert_grads)
            allocs.append(Alloc("grads", self.e * m.expert_params, self._expert_grad_tag(m)))
        if self.stage == 3 and reduce:
            # Stage 3 copies each module's gradient into its bucket's buffer as soon as it is complete
            # and frees it (DeepSpeed contiguous_gradients: __add_grad_to_ipg_bucket; the runtime's
            # ReduceScatterBuckets): the buffer is taken by the bucket's first module.
            if not self.bucket:
                elements = self.bucket_elements_of[m.name]
                allocs.append(Alloc("buffers", bucket_buffer_bytes(self.z.reduce_bucket_elements, elements, self.e),
                                    self._tags("bucket", m.name)))
            frees = frees + (self._tags("grad", m.name),)
        kernels, nbytes = self._kernels(m, "bwd"), 2 * m.fwd_hbm_bytes
        if (self.stage == 2 and self.z.constant_buffers) or (self.stage == 3 and reduce):
            # the gradient is copied into its bucket in the backward hook (zsim.compute.kernels.with_bucket_copy)
            kernels = with_bucket_copy(kernels, m.params, self.e)
            nbytes += 2 * self.e * m.params
        op = self._add(name=f"bwd/{m.name}", stream="compute", deps=deps, flops=m.hw_bwd_flops,
                       hbm_bytes=nbytes, allocs=tuple(allocs), frees=frees, kernels=kernels)
        self._mp_allreduces(m, m.mp_allreduces_bwd, collectives=m.mp_collectives_bwd)
        self._all_to_alls(m)
        if m.expert_params:
            self._expert_grads(m, op, reduce)
        if reduce:
            self.bucket.append(m)
            self.bucket_elems += m.params
            # one fused reduction after backward: without CB (§3.2), and stage 1 as DeepSpeed v0.2 ran it
            fused = self.stage < 3 and (not self.z.constant_buffers or self.stage == 1)
            # zsim.zero.buckets.plan_buckets's rule, which the runtime uses too (stage 3 included).
            if not fused and self.bucket_elems >= self.z.reduce_bucket_elements:
                self._reduce(self.bucket, op)
                self.bucket, self.bucket_elems = [], 0
        return op

    def _expert_grads(self, m: Module, after: int, reduce: bool) -> None:
        """A MoE block's local expert gradients: made by its backward (stages 0/1: kept, accumulated,
        until the step; stage 2: until reduced), reduced on the reduction stream over the
        expert-data-parallel group right after the backward that makes them: an all-reduce at stage 0,
        a reduce-scatter at stages 1-2 (Megatron-Core's expert gradient buffers; DeepSpeed-MoE's
        expert_data_parallel_group)."""
        e, n = self.e, m.expert_params
        tag = self._expert_grad_tag(m)
        if not reduce:
            return
        edp = expert_dp(self.s)
        op = "all_reduce" if self.stage == 0 else "reduce_scatter"
        nbytes = e * (n if self.stage == 0 else padded_bucket(n, edp))
        self.b.add(name=f"{op}/grads.experts.{m.name}", stream=self._reduction_stream(), deps=(after,),
                   collective=op, group=self.expert_group, nbytes=nbytes, frees=(tag,) if self.stage >= 2 else (),
                   step=self.step, micro_batch=self.mb)

    def _expert_grad_tag(self, m: Module) -> str:
        return self._tags("egrad", m.name) if self.stage >= 2 else _full_grad_tag(f"{m.name}.experts", self.step)

    def _reduction_stream(self) -> str:
        """The stream of the DP gradient reductions: their own ('comm') with overlap_comm; without it the
        compute stream, which waits for each (DeepSpeed v0.2 reduce_ipg_grads/average_tensor and
        allreduce_and_copy use torch.cuda.current_stream() unless overlap_comm)."""
        return "comm" if self.z.overlap_comm else "compute"

    def _reduce(self, bucket: list[Module], after: int) -> None:
        """Reduce a bucket of gradients once the backward that completes it (`after`) is done. The
        staging buffers are DeepSpeed's of the paper's time: stage 0 flattens each bucket (v0.2 engine
        allreduce_bucket) on the compute stream; stage 2 without MD flattens it on the reduction stream
        (v0.2 allreduce_and_copy under overlap_comm), with MD it reduces the ipg bucket in place (the
        'grads' arena); stage 3 reduces in place. Stage 1 has its own path (_reduce_stage1). Stages 2/3
        also create the rank's fp16 gradient partition with the step's first reduction
        (grads_in_partition, freed in the step)."""
        if self.stage == 1 and self.z.constant_buffers:
            self._reduce_stage1(after)
            return
        e = self.e
        elements = sum(m.params for m in bucket)
        # Bytes as the runtime moves them (zsim.zero.buckets): stage 0 the bucket itself, stage 2 (and
        # stage 1 without CB, one bucket of all) the bucket padded to a multiple of 2·Nd, i.e. its piece
        # of the flat buffer (flat_pieces), stage 3 each tensor padded to a multiple of Nd.
        if self.stage == 3:
            nbytes = e * sum(padded_tensors(m.tensors, self.nd) for m in bucket)
        else:
            nbytes = e * (padded_bucket(elements, self.nd) if self.stage else elements)
        what = f"grads.bucket.{self.bucket_index}"
        self.bucket_index += 1
        tag = self._tags("bucket", bucket[0].name)
        if self.stage == 3:
            op, staging = "reduce_scatter", ()  # stage 3: the bucket's buffer was taken in backward
            frees = [tag]
        else:
            op = "all_reduce" if self.stage == 0 else "reduce_scatter"
            size = bucket_buffer_bytes(self.z.reduce_bucket_elements, elements, e) if self.z.constant_buffers \
                else fused_gradient_buffer_bytes(elements)
            in_place = self.stage == 2 and self.md and self.z.constant_buffers
            staging = () if in_place else (Alloc("buffers", size, tag, stream="compute" if self.stage == 0 else ""),)
            frees = [a.tag for a in staging]
        if self.stage >= 2 and self.mb == 0 and self.bucket_index == 1:
            part = rank_partition(self.s, self.w)
            staging = staging + (Alloc("grads", e * part, _partition_grad_tag(self.step)),)
        if self.stage == 2:
            frees += [self._tags("grad", m.name) for m in bucket]
        self.b.add(name=f"{op}/{what}", stream=self._reduction_stream(), deps=(after,), collective=op, group="dp",
                   nbytes=nbytes,
                   allocs=staging, frees=tuple(frees), step=self.step, micro_batch=self.mb)

    def _reduce_stage1(self, after: int) -> None:
        """Stage 1 as DeepSpeed v0.2 runs it (zero_optimizer_stage1.py reduce_scatter_gradients, called
        after backward by the engine's allreduce_gradients): it first flattens every rank's
        sub-partition of every comm interval into new tensors, a second padded copy of all gradients
        that lives until the last interval is reduced; then each interval of min(bucket, Ψ) elements
        is reduce-scattered from a list, which PyTorch stages through one more flat buffer of the
        interval. All on the compute stream (no overlap with backward)."""
        e, nd, psi = self.e, self.s.layout.dp, self.w.params_per_mp_rank
        bucket = self.z.reduce_bucket_elements
        intervals, sub = stage1_comm_intervals(psi, nd, bucket)  # zsim.zero.buckets.flat_pieces, stage 1
        flat = _stage1_flat_copy(e, sub, nd, intervals, lambda piece: self._tags(f"flat_grads.{piece}", "all"))
        assert sum(a.nbytes for a in flat) == stage1_flat_gradient_bytes(psi, nd, bucket, e)
        deps = (after,)
        for j in range(intervals):
            stage = Alloc("buffers", list_collective_staging_bytes(sub * nd, e), self._tags(f"rs_list{j}", "all"),
                          stream="compute")
            allocs = flat + (stage,) if j == 0 else (stage,)
            frees = (stage.tag,) + tuple(a.tag for a in flat) if j == intervals - 1 else (stage.tag,)
            deps = (self.b.add(name=f"reduce_scatter/grads.bucket.{j}", stream=self._reduction_stream(), deps=deps,
                               collective="reduce_scatter", group="dp", nbytes=e * sub * nd, allocs=allocs,
                               frees=frees, step=self.step, micro_batch=self.mb),)


# At most this many tensors for stage 1's gradient copy per step: DeepSpeed makes Nd × intervals of them
# (150,000 at DP 1024 with 5e7-element buckets, which made one simulated step 15× slower); beyond the
# cap, consecutive sub-partitions are allocated together. The paper's runs (Nd 25: 1,900) stay exact.
STAGE1_COPY_TENSORS = 4096


def _stage1_flat_copy(e: int, sub: int, nd: int, intervals: int, tag: Callable[[str], str]) -> tuple[Alloc, ...]:
    """DeepSpeed v0.2 stage 1's second copy of the gradients: one tensor per (rank, interval)
    sub-partition of `sub` elements, rank by rank, as get_flat_sub_partitions flattens them
    (`_flatten_dense_tensors` per sub-partition). Their sizes, not only their sum, decide which cached
    holes the allocator can fill. Past STAGE1_COPY_TENSORS pieces, each tensor holds a run of `per`
    consecutive sub-partitions (the last run the rest). `tag(piece)` names each."""
    pieces = nd * intervals
    per = -(-pieces // STAGE1_COPY_TENSORS)
    return tuple(Alloc("buffers", e * sub * min(per, pieces - first), tag(f"p{first}"), stream="compute")
                 for first in range(0, pieces, per))


def _full_grad_tag(module: str, step: int) -> str:
    """Stages 0/1: a module's full fp16 gradient, from its first backward of the step to the step."""
    return f"grad.{module}.s{step}"


def _partition_grad_tag(step: int) -> str:
    """Stages 2/3: the rank's fp16 gradient partition (DeepSpeed grads_in_partition)."""
    return f"grads.partition.s{step}"


def _optimizer(b: _Builder, s: Scenario, w: Workload, step: int) -> None:
    """The Adam step on this rank's partition, after every reduction, holding the copy of the
    gradients it reads (zsim.zero.residual.step_gradient_bytes); stages 1/2 then all-gather the
    updated parameters: stage 1 per comm interval, stage 2 in shards, all at once without CB (§7.2.1)."""
    z, nd, dtype = s.zero, s.layout.dp, s.precision.dtype
    elements = rank_partition(s, w)
    deps = (b.last_comm,) if b.last_comm is not None else ()
    last_mb = s.grad_accum - 1  # the runtime stamps what follows the last micro-batch with its index
    # The step's checks before Adam (DeepSpeed ZeRO optimizer of 2020, step()): the fp16 overflow check
    # and the gradient norm, each a kernel pass over the partition, then a 4-byte all-reduce (MAX,
    # SUM) over the DP group and, with MP, over the MP group; in line on the compute stream, as the
    # optimizer waits for the result (zsim.compute.kernels.optimizer_kernels has the kernels).
    tensors = math.ceil(len(w.tensors) / nd) if z.stage >= 1 else len(w.tensors)
    kernels = optimizer_kernels(elements, tensors, dtype)
    for check in ("overflow", "norm"):
        if not kernels[check].kernels:
            continue
        # hbm_bytes: what the kernels stream, for a model that prices bytes, not kernels (a CPU host).
        b.add(name=f"optimizer/{check}", stream="compute", deps=deps, kernels=kernels[check],
              hbm_bytes=kernels[check].bytes, step=step, micro_batch=last_mb)
        deps = ()
        for group in ("dp", "mp") if s.layout.mp > 1 else ("dp",):
            b.add(name=f"all_reduce/{check}.{group}", stream="compute", collective="all_reduce", group=group,
                  nbytes=4, step=step, micro_batch=last_mb)
    # The gradients' copy the update reads (zsim.zero.residual.step_gradient_bytes): made by one cast
    # pass, which then frees the fp16 gradients; held until the update has run.
    sub_group = z.sub_group_elements if z.constant_buffers else elements
    grads = step_gradient_bytes(z.stage, elements, dtype, sub_group)
    e = PARAM_BYTES[dtype]
    held, transient = f"optimizer.grads_copy.s{step}", f"optimizer.grads_pieces.s{step}"
    grad_tags = tuple(_full_grad_tag(m.name, step) for m in w.modules) if z.stage <= 1 else (_partition_grad_tag(step),)
    if z.stage <= 1:  # a MoE model's expert gradients (_StepPass._expert_grads)
        grad_tags += tuple(_full_grad_tag(f"{m.name}.experts", step) for m in w.modules if m.expert_params)
    converted = min(elements, sub_group) if z.stage == 3 else elements
    # fp32 training holds no copy (Adam reads the gradients in place): no pass, no bytes.
    copy_bytes = (e + grads.held / max(1, converted)) * converted if grads.held else 0.0
    b.add(name="optimizer/grads_copy", stream="compute", deps=deps, hbm_bytes=copy_bytes,
          allocs=(Alloc("buffers", grads.held, held), Alloc("buffers", grads.transient, transient)),
          frees=(transient,) + grad_tags, step=step, micro_batch=last_mb)
    # A CPU host runs the runtime's chunked update, not the fused kernel: its launches are its aten ops.
    adam = host_adam_kernels(elements, tensors) if s.cluster.fabric == "host" else kernels["adam"]
    opt = b.add(name="optimizer/step", stream="compute", hbm_bytes=ADAM_BYTES_PER_ELEMENT * elements,
                frees=(held,), step=step, kernels=adam, micro_batch=last_mb, elements=elements)
    if z.stage in (1, 2):
        # Stage 1 (v0.2) all-gathers each comm interval, stage 2 (v0.2) its partition in shards
        # (zsim.zero.buckets: flat_pieces, allgather_shards); both pass a list, which PyTorch stages
        # through one flat buffer of the whole gather.
        if z.stage == 1:
            gathers = rank_pieces(s, w)
        else:
            shard_bucket = z.allgather_bucket_elements if z.constant_buffers else nd * elements
            gathers = [nd * n for n in allgather_shards(elements, nd, shard_bucket)]
        if w.expert_params_per_rank:  # the experts' partitions, over the expert-data-parallel group
            edp = expert_dp(s)
            b.add(name="all_gather/params.experts", stream="comm", deps=(opt,), collective="all_gather", group="edp",
                  nbytes=e * edp * expert_partition(s, w), step=step, micro_batch=last_mb)
        for j, n in enumerate(gathers):
            stage_buf = Alloc("buffers", list_collective_staging_bytes(n, e), f"ag_list.step.{j}.s{step}",
                              stream="compute")
            b.add(name=f"all_gather/params.bucket.{j}", stream="comm", deps=(opt,), collective="all_gather",
                  group="dp", nbytes=e * n, allocs=(stage_buf,), frees=(stage_buf.tag,), step=step,
                  micro_batch=last_mb)
