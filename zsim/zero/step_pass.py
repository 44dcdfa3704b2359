"""One micro-batch's forward and backward in the plan: the schedule of compute items (forward,
recompute, backward per module) and the ops each makes; the stage 3 gathers, the checkpoints, the
gradient reductions and the TP overlap are mixins of their own files (zsim.zero.gathers, .checkpoints,
.reductions, .tp_overlap)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from zsim.compute.kernel_list import KernelList

from zsim.compute.kernel_shape import Shape

from zsim.compute.kernels import module_kernels, with_bucket_copy
from zsim.zero.inputs import Scenario
from zsim.workload.transformer import Module, Workload
from zsim.zero.buckets import padded_tensors, plan_buckets
from zsim.zero.checkpoints import Checkpoints, md_checkpoints
from zsim.zero.gathers import Gathers
from zsim.zero.implementation import live_grads
from zsim.zero.megatron_ddp import IMPLEMENTATION as MEGATRON, chunk_buckets, grad_bytes
from zsim.zero.model_states import PARAM_BYTES
from zsim.zero.ops import Alloc, PlanBuilder
from zsim.zero.rank_states import (ep_dispatch, expert_dp, full_grad_tag, param_bytes_per_element, recompute_modules,
                                   selective)
from zsim.zero.reductions import Reductions
from zsim.zero.tp_overlap import TpOverlap
from zsim.zero.residual import bucket_buffer_bytes


@dataclass(frozen=True, slots=True)
class Item:
    """One compute step of a pass: `kind` fwd, recompute or bwd, of `module`."""

    kind: str
    module: Module



class StepPass(Gathers, Checkpoints, Reductions, TpOverlap):
    """Forward and backward of one micro-batch."""

    def __init__(self, b: PlanBuilder, scenario: Scenario, workload: Workload, step: int, mb: int,
                 first_dep: tuple[int, ...]):
        self.b, self.s, self.w = b, scenario, workload
        self.z = scenario.zero
        self.step, self.mb = step, mb
        self.first_dep = first_dep
        self.start = len(b.ops)  # the pass's first op
        # Ops that wait for the pass's entry, the last compute op before it (the forward's phase_dep), by
        # index in the pass: what zsim.zero.pass_copy moves when it makes the next micro-batch's pass
        self.entry_users: list[int] = []
        self.stage = scenario.zero.stage
        # Full recompute keeps one input per segment; selective keeps the layer's activations but the
        # attention core's (zsim.workload.activations.layer_saved_tensors) and recomputes the core in the
        # block's backward kernels (zsim.compute.kernels.block_backward) [K22 §5].
        self.ckpt = scenario.zero.activation_checkpointing and scenario.zero.recompute_granularity == "full"
        self.k = scenario.zero.checkpoint_every
        self.e = PARAM_BYTES[scenario.precision.dtype]
        # megatron-core keeps its gradients in their own dtype (zsim.zero.megatron_ddp.grad_bytes)
        self.megatron = scenario.zero.implementation == MEGATRON
        self.ge = grad_bytes(scenario.precision.dtype, scenario.zero.grad_reduce_in_fp32) if self.megatron else self.e
        self.megatron_closes: dict[str, list[int]] = {}  # module -> the buckets its backward completes (elements)
        self.param_gather_of: dict[str, tuple[int, ...]] = {}  # module -> the parameter all-gathers it waits for
        self.gathers_params = False  # this pass issued megatron-core's parameter all-gathers (not copied from)
        self.md = scenario.zero.defragment
        self.md_checkpoints = md_checkpoints(scenario.zero)  # "slots", "arena" or ""
        mods = workload.modules
        self.by_name = {m.name: m for m in mods}
        # A tied LM head computes with the word embedding: it uses the embedding's parameters too.
        tied = getattr(scenario.model, "tied_head", True)
        self.uses = {m.name: (m.name, mods[0].name) if m.name == "head" and tied else (m.name,) for m in mods}
        self.nd = scenario.layout.dp
        sizes = [m.params for m in mods]  # each module's bucket's elements (zsim.zero.buckets)
        self.bucket_elements_of = {}
        self.bucket_padded_of: dict[str, int] = {}  # stage 3 under the runtime: each tensor padded, uncapped
        for b in plan_buckets(sizes, scenario.zero.reduce_bucket_elements):
            total = sum(sizes[j] for j in b)  # once per bucket: summing it per member was quadratic (issue 28)
            self.bucket_elements_of.update((mods[i].name, total) for i in b)
            if scenario.zero.stage == 3 and scenario.zero.setup_residue == "runtime":  # the runtime's whole buffer
                padded = sum(padded_tensors(mods[j].tensors, self.nd) for j in b)
                self.bucket_padded_of.update((mods[i].name, padded) for i in b)
        self.segment_gather: dict[int, int] = {}  # segment -> its checkpoint all-gather (Pa), on compute
        self.shape = Shape.of(scenario.model, scenario.layout.mp, workload.padded_vocab, scenario.precision.dtype,
                              arch=scenario.cluster.gpu.compute_capability, selective=selective(scenario),
                              sp=scenario.parallel.sequence_parallel, ep=scenario.layout.ep,
                              etp=scenario.layout.expert_mp, recompute=recompute_modules(scenario),
                              cp=scenario.parallel.cp, fp8=scenario.precision.linear_recipe,
                              fp8_attention=scenario.precision.fp8_attention)
        self.expert_group = "edp"  # = the DP group's ranks when ep is 1
        # where the EP all-to-alls run and what they send across nodes against an even spread (DeepEP's
        # dispatch: Moe.nic_share; over the TP × EP group with split experts: rank_states.ep_dispatch)
        self.ep_group, _, self.ep_nic_share = ep_dispatch(scenario)
        # Stage 3 with MoE (FSDP-style, zsim.zero.gathers._gather_experts): the local experts are gathered over
        # their expert-data-parallel group before use, unless that group is one rank (its experts whole on it).
        self.edp = expert_dp(scenario)
        self.expert_gathers = self.stage == 3 and bool(workload.expert_params_per_rank) and self.edp > 1

    # ---- naming and small helpers -------------------------------------------------------------
    def _tags(self, kind: str, name: str) -> str:
        return f"{kind}.{name}.s{self.step}.m{self.mb}"

    def _add(self, **fields) -> int:
        return self.b.add(step=self.step, micro_batch=self.mb, **fields)

    def _entry_user(self, op: int) -> None:
        """Note that op `op` waits for the pass's entry (the forward's phase_dep), or would if it had one."""
        self.entry_users.append(op - self.start)

    def _checkpointed(self, m: Module) -> bool:
        return self.ckpt and m.layer is not None

    def _segment(self, m: Module) -> int:
        return m.layer // self.k

    def _segment_layers(self, seg: int) -> list[Module]:
        blocks = self.w.blocks
        first = blocks[0].layer  # 0, or a pipeline stage's first layer (zsim.zero.pipeline_plan)
        if blocks[-1].layer - first == len(blocks) - 1:  # consecutive layers: the model's, or one stage's
            return list(blocks[max(0, seg * self.k - first):min((seg + 1) * self.k - first, len(blocks))])
        return [b for b in blocks if b.layer // self.k == seg]  # an interleaved stage's chunks

    def _activations(self, m: Module, kind: str) -> tuple[Alloc, ...]:
        """The module's saved activations, one allocation per tensor (tags `<kind>.<module>.<i>`)."""
        return tuple(Alloc("activations", n, self._tags(f"{kind}{i}", m.name)) for i, n in enumerate(m.saved_tensors))

    def _activation_tags(self, m: Module, kind: str) -> tuple[str, ...]:
        return tuple(self._tags(f"{kind}{i}", m.name) for i in range(len(m.saved_tensors)))

    def _kernels(self, m: Module, phase: str) -> KernelList:
        """The kernels module `m` launches in `phase` (zsim.compute.kernels; shared per shape and phase)."""
        if m.layer is not None:
            kind = "moe_block" if m.moe else "block"
        else:  # embed, head, or a multi-token prediction module (zsim.workload.transformer._mtp_module)
            kind = ("mtp_moe" if m.moe else "mtp") if m.mtp else m.name
        # a sliding-window block's FlashAttention kernel prices its window (zsim.compute.kernels Shape.window)
        return module_kernels(kind, phase, replace(self.shape, window=m.window) if m.window else self.shape)

    def _all_to_alls(self, m: Module) -> None:
        """A MoE block's dispatch and combine all-to-alls over the EP group, in line on the compute
        stream (Megatron-Core's alltoall token dispatcher); backward runs their two mirrors."""
        for what in ("dispatch", "combine") if m.ep_all_to_all_bytes else ():
            self._add(name=f"all_to_all/ep.{m.name}.{what}", stream="compute", collective="all_to_all",
                      group=self.ep_group, nbytes=m.ep_all_to_all_bytes, nic_share=self.ep_nic_share)

    def _cp_exchanges(self, m: Module, collectives: tuple[str, ...]) -> None:
        """Context parallelism: a block's attention passes each rank's keys and values around its CP ring, cp − 1
        steps (Transformer Engine's AttnFuncWithCPAndKVP2P, Megatron-Core's default --cp-comm-type p2p); its
        backward passes them again with their gradients, accumulated around the ring: per rank the bytes and steps
        of a ring all-gather and reduce-scatter of the whole sequence's K and V (m.cp_kv_bytes), priced as those, in
        line on the compute stream (the ring's overlap with the attention chunks is not modelled)."""
        for op in collectives if m.cp_kv_bytes else ():
            self._add(name=f"{op}/cp.{m.name}", stream="compute", collective=op, group="cp", nbytes=m.cp_kv_bytes)

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
        self.forward(mods)
        self.backward(mods, reduce)

    def forward(self, mods: list[Module]) -> None:
        """The forward of `mods` (all modules, or a pipeline stage's chunk: zsim.zero.pipeline_plan)."""
        if self.megatron and self.z.overlap_param_gather and self.mb == 0:
            self._gather_params(mods)
        self._run_items([Item("fwd", m) for m in mods], phase="fwd", reduce=False)

    def backward(self, mods: list[Module], reduce: bool) -> None:
        """The backward of `mods` (recompute included), reducing the gradients when `reduce`."""
        if self.megatron and reduce:
            self.megatron_closes = {}
            for bucket in chunk_buckets(self.s, mods):
                self.megatron_closes.setdefault(bucket.closer, []).append(bucket.elements)
        self._run_items(self._backward_items(mods), phase="bwd", reduce=reduce)

    def _gather_params(self, mods: list[Module]) -> None:
        """megatron-core under overlap_param_gather: the last step's updated parameters all-gathered under this
        step's first forward of the chunk, bucket by bucket in forward order on the comm stream, each module
        waiting for the buckets that hold its parameters (Megatron-Core's forward pre-hook,
        distrib_optimizer.py @ core_r0.8.0 L1413-1475; zsim.zero.megatron_ddp). The host dispatches each next
        gather when a pre-hook waits on the one before, well ahead of the GPU: the gathers run back to back."""
        self.gathers_params = True
        deps = self.first_dep
        pe = param_bytes_per_element(self.s, self.w)  # e, less with FP8 parameters (precision.fp8_params)
        for j, bucket in enumerate(reversed(chunk_buckets(self.s, mods))):
            op = self._add(name=f"all_gather/params.bucket.{j}", stream="comm", deps=deps, collective="all_gather",
                           group="dp", nbytes=round(pe * bucket.elements))
            deps = ()
            for name in bucket.modules:
                self.param_gather_of[name] = self.param_gather_of.get(name, ()) + (op,)

    def _backward_items(self, mods: list[Module]) -> list[Item]:
        """Backward in reverse module order; a checkpointed segment is recomputed in forward order
        first, then its layers' backward runs in reverse (Megatron-LM CheckpointFunction)."""
        items: list[Item] = []
        done: set[int] = set()
        for m in reversed(mods):
            if not self._checkpointed(m):
                items.append(Item("bwd", m))
                continue
            seg = self._segment(m)
            if seg in done:
                continue
            done.add(seg)
            layers = self._segment_layers(seg)
            items += [Item("recompute", x) for x in layers]
            items += [Item("bwd", x) for x in reversed(layers)]
        return items

    def _run_items(self, items: list[Item], phase: str, reduce: bool) -> None:
        first_use, last_use = self._uses_of(items) if self.stage == 3 else ({}, {})
        self.gather_op: dict[str, int] = {}
        self.frees_after: dict[int, list[str]] = {}
        for name, pos in last_use.items():
            self.frees_after.setdefault(pos, []).append(self._tags(f"gathered.{phase}", name))
            if self.expert_gathers and self.by_name[name].expert_params:
                self.frees_after[pos].append(self._tags(f"gathered.experts.{phase}", name))
        # what the training loop holds until backward() returns (Module.held_tensors): freed by the pass's last item
        held = [self._tags(f"held{i}", it.module.name) for it in items if it.kind == "bwd"
                for i in range(len(it.module.held_tensors))]
        if held:
            self.frees_after.setdefault(len(items) - 1, []).extend(held)
        self.gather_queue = sorted(first_use, key=first_use.get)
        self.gathered: list[str] = []  # modules whose gather this phase has issued, in order
        self.unflattened: set[str] = set()  # deepspeed-0.14: modules rebuilt from their gather this phase
        self.recompute_fetched: set[str] = set()  # deepspeed-0.5: modules fetched for their recompute this phase
        self.first_use = first_use
        self.phase_dep = (self.b.last_compute,) if self.b.last_compute is not None else self.first_dep
        self.compute_ops: list[int] = []  # last compute op index per item position
        self.bucket_index = 0
        self.last_reduce: int | None = None  # deepspeed-0.5: the previous bucket's last reduce-scatter
        self.reduced_elements = 0  # deepspeed-0.2, stage 2: gradient elements reduced so far this pass
        self.bucket: list[Module] = []
        self.bucket_elems = 0
        for pos, item in enumerate(items):
            if self.stage == 3 and self.z.implementation == "deepspeed-0.5":
                self._fetch_in_line(pos, self.uses[item.module.name], phase, item.kind)
            elif self.stage == 3:
                self._issue_gathers_up_to(pos, phase)
                if self.z.implementation == "deepspeed-0.14":
                    self._unflatten(self.uses[item.module.name])
            deps = tuple(self.gather_op[u] for u in self.uses[item.module.name] if u in self.gather_op)
            if item.kind == "fwd":
                deps += self.param_gather_of.get(item.module.name, ())
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

    def _forward(self, m: Module, deps: tuple[int, ...], frees: tuple[str, ...]) -> int:
        """A module's forward. Without checkpointing it keeps its saved activations for backward;
        with it, a segment's first layer keeps its input (the checkpoint; 1/mp of it under Pa) and
        every layer holds its activations only while it runs."""
        if not self._checkpointed(m):
            allocs = list(self._activations(m, "act"))
            held = [Alloc("activations", n, self._tags(f"held{i}", m.name)) for i, n in enumerate(m.held_tensors)]
            work = [Alloc("activations", n, self._tags(f"fwork{i}", m.name)) for i, n in enumerate(m.fwd_work_tensors)]
            if held or work:
                # The head (saved_tensors: its input, then the loss's; zsim.workload.transformer), in program
                # order: its input, the logits and the loss's copies of them (held to the pass's end, or only
                # while forward runs), then what the loss saves, computed from those copies last (Megatron-LM @ 5426d18a mpu/cross_entropy.py: the clone, then
                # `exp_logits = logits.exp()` saved; F.cross_entropy(logits.float()): log_softmax's output
                # after the fp32 copy; the H200 history h2304, data/device/20261127-h200-holdout2).
                allocs = allocs[:1] + held + work + allocs[1:]
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
        if self._tp_overlapped(m, "fwd"):
            op = self._overlapped(m, "fwd", self._kernels(m, "fwd"), deps, tuple(allocs), frees, m.hw_fwd_flops,
                                  m.fwd_hbm_bytes)
        else:
            op = self._add(name=f"fwd/{m.name}", stream="compute", deps=deps, flops=m.hw_fwd_flops,
                           hbm_bytes=m.fwd_hbm_bytes, allocs=tuple(allocs), frees=frees, kernels=self._kernels(m, "fwd"))
            self._mp_allreduces(m, m.mp_allreduces_fwd, m.mp_loss_allreduce_bytes, m.mp_collectives_fwd)
        self._cp_exchanges(m, ("all_gather",))
        self._all_to_alls(m)
        if self._checkpointed(m) and m.layer % self.k == 0 and self.z.cpu_offload_activations:
            self._offload_out(m, op)
        return op


    # ---- backward (recompute: zsim.zero.checkpoints.Checkpoints._recompute) ------------------------
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
        if m.name == "head" or m.mtp:  # a multi-token prediction module ends in the loss too
            model = self.s.model
            return sbh + self.e * model.seq_len * model.micro_batch * self.w.padded_vocab // self.s.layout.mp
        return sbh

    def _backward(self, m: Module, deps: tuple[int, ...], frees: tuple[str, ...], reduce: bool) -> int:
        """A module's backward: frees its activations, holds its input and output gradients while
        it runs (_backward_work_bytes), and from stage 2 produces its gradient tensor (into
        MD's arena when on); gradients join the reduction bucket."""
        bucket_op: Alloc | None = None  # zero.setup_residue runtime, stage 3: the bucket, after the backward
        tail: tuple[Alloc, ...] = ()  # zero.setup_residue runtime: the head's requests after its loss gradients
        if m.bwd_work_tensors and self.z.setup_residue == "runtime" and self.s.cluster.host is None:
            # The runtime's order (data/device/20261127-h200-memhist, h1024; the same in every history of
            # the holdout sets): nll_loss's fp32 gradient, log_softmax's, the first freed with the saved
            # log-softmax; the bf16 cast of the logits' gradient, then the second freed; then the head
            # weight's gradient (a new tensor that autograd adds into the flat gradient buffer; the tied
            # embedding's V×h) and the input's gradient, beside which autograd's thread takes its cuBLAS
            # workspace (allocator_workspaces).
            work = tuple(self._tags(f"dgrad{i}", m.name) for i in range(2))
            allocs = [Alloc("activations", n, tag) for n, tag in zip(m.bwd_work_tensors[:2], work)]
            # The weight's gradient is a transient where it is added into a buffer that holds it: a tied head's
            # into the embedding's, and at stages 0-1 any head's; an untied head at stages 2-3 makes it as its
            # own `grad` tensor below. The cast is e bytes a logit, a quarter of the fp32 gradient's.
            tied = len(self.uses[m.name]) > 1
            weight = self.w.padded_vocab * self.s.model.hidden // self.s.layout.mp if tied or self.stage <= 1 else 0
            tail = (Alloc("activations", self.e * m.bwd_work_tensors[0] // 4, self._tags("dgrad.cast", m.name)),
                    Alloc("buffers", self.e * weight, self._tags("wgrad", m.name)),
                    Alloc("activations", m.bwd_work_tensors[2], self._tags("dgrad2", m.name)))
        elif m.bwd_work_tensors:  # known one by one (the head under model.loss torch-fp32)
            work = tuple(self._tags(f"dgrad{i}", m.name) for i in range(len(m.bwd_work_tensors)))
            allocs = [Alloc("activations", n, tag) for n, tag in zip(m.bwd_work_tensors, work)]
        else:
            work = (self._tags("dgrad", m.name),)
            allocs = [Alloc("activations", self._backward_work_bytes(m), work[0])]
        if m.recompute_bytes:  # what module-level recompute brings back, held while the block's backward runs
            work += (self._tags("recomputed", m.name),)
            allocs.append(Alloc("activations", m.recompute_bytes, work[-1]))
        if self.stage == 3 and reduce and self.z.implementation == "deepspeed-0.5":
            # each parameter's gradient leaves for the bucket buffer as its hook runs (zsim.zero.implementation)
            allocs.append(Alloc("grads", self.e * live_grads(m.tensors, self.z.reduce_bucket_elements),
                                self._tags("grad", m.name), arena="grads" if self.md else ""))
        elif self.stage >= 2:
            allocs.append(Alloc("grads", self.e * m.params, self._tags("grad", m.name), arena="grads" if self.md else ""))
        elif self.mb == 0:  # stages 0/1: autograd's .grad tensors (megatron-core: its buffer's), accumulated
            allocs.append(Alloc("grads", self.ge * m.params, full_grad_tag(m.name, self.step)))
        frees = frees + self._activation_tags(m, "act") + (() if tail else work)
        if m.expert_params and (self.stage >= 2 or self.mb == 0):  # the local experts' gradients (_expert_grads)
            allocs.append(Alloc("grads", self.ge * m.expert_params, self._expert_grad_tag(m)))
        if self.stage == 3 and reduce:
            # Stage 3 copies each module's gradient into its bucket's buffer as soon as it is complete
            # and frees it (DeepSpeed contiguous_gradients: __add_grad_to_ipg_bucket; the runtime's
            # ReduceScatterBuckets): the buffer is taken by the bucket's first module.
            if not self.bucket:
                elements = self.bucket_elements_of[m.name]
                taken = Alloc("buffers", bucket_buffer_bytes(self.z.reduce_bucket_elements, elements, self.e),
                              self._tags("bucket", m.name))
                if self.z.setup_residue == "runtime":  # zsim's runtime: taken by the hook, after the backward ran,
                    # the bucket's whole rank-major buffer (runtime/zero/buckets.py ReduceScatterBuckets)
                    bucket_op = taken._replace(nbytes=self.e * self.bucket_padded_of[m.name])
                else:
                    allocs.append(taken)
            frees = frees + (self._tags("grad", m.name),)
        kernels, nbytes = self._kernels(m, "bwd"), 2 * m.fwd_hbm_bytes
        if (self.stage == 2 and self.z.constant_buffers) or (self.stage == 3 and reduce):
            # the gradient is copied into its bucket in the backward hook (zsim.compute.kernels.with_bucket_copy)
            kernels = with_bucket_copy(kernels, m.params, self.e)
            nbytes += 2 * self.e * m.params
        if tail:  # the loss's backward, then zero-cost steps in the runtime's order (above)
            saved = self._activation_tags(m, "act")
            loss_saved = saved[1:]  # after the head's input (transformer.py: the head's saved_tensors)
            op = self._add(name=f"bwd/{m.name}", stream="compute", deps=deps, flops=m.hw_bwd_flops,
                           hbm_bytes=nbytes, allocs=tuple(allocs), frees=(work[0],) + loss_saved, kernels=kernels)
            op = self._add(name=f"bwd/{m.name}.cast", stream="compute", deps=(op,), allocs=tail[:1], frees=work[1:],
                           memory_only=True)
            frees = tuple(t for t in frees if t not in loss_saved) + tuple(a.tag for a in tail)
            op = self._add(name=f"bwd/{m.name}.logits", stream="compute", deps=(op,), allocs=tail[1:], frees=frees,
                           memory_only=True)
        elif self._tp_overlapped(m, "bwd"):
            op = self._overlapped(m, "bwd", kernels, deps, tuple(allocs), frees, m.hw_bwd_flops, nbytes)
        else:
            op = self._add(name=f"bwd/{m.name}", stream="compute", deps=deps, flops=m.hw_bwd_flops,
                           hbm_bytes=nbytes, allocs=tuple(allocs), frees=frees, kernels=kernels)
        if bucket_op is not None:
            # The runtime's ReduceScatterBuckets.grad_ready takes a bucket's buffer when the first gradient
            # of the bucket is handed to it, once the module's backward has run (its loss gradients freed):
            # a zero-cost op of its own (data/device/20261127-h200-memhist, h2048: not beside the head's
            # 1.6 GB loss gradients)
            op = self._add(name=f"bucket/{m.name}", stream="compute", deps=(op,), allocs=(bucket_op,), memory_only=True)
        if not self._tp_overlapped(m, "bwd"):
            self._mp_allreduces(m, m.mp_allreduces_bwd, collectives=m.mp_collectives_bwd)
        self._cp_exchanges(m, ("all_gather", "reduce_scatter"))
        self._all_to_alls(m)
        # a recomputed MLP or MoE layer (--recompute-modules mlp, moe) issues its forward's collectives again
        for op_name, nbytes in m.recompute_collectives:
            self._add(name=f"{op_name}/mp.{m.name}.recompute", stream="compute", collective=op_name, group="mp",
                      nbytes=nbytes)
        if m.recompute_all_to_alls:
            self._all_to_alls(m)
        if m.expert_params:
            self._expert_grads(m, op, reduce)
        if reduce and self.megatron:
            for elements in self.megatron_closes.get(m.name, ()):
                self._reduce_bucket(elements, op)
        elif reduce:
            self.bucket.append(m)
            self.bucket_elems += m.params
            # one fused reduction after backward: without CB (§3.2), and stage 1 as DeepSpeed v0.2 ran it
            fused = self.stage < 3 and (not self.z.constant_buffers or self.stage == 1)
            # zsim.zero.buckets.plan_buckets's rule, which the runtime uses too (stage 3 included).
            if not fused and self.bucket_elems >= self.z.reduce_bucket_elements:
                self._reduce(self.bucket, op)
                self.bucket, self.bucket_elems = [], 0
        return op
