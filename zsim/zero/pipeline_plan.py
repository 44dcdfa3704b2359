"""The plan of a pipeline-parallel run: one representative rank per pipeline stage, its ops in one Plan.

Each stage holds the layers zsim.parallel.pipeline.split_layers gives its chunks (the embedding on
stage 0, the head on the last stage: Megatron-LM pre_process / post_process) and their model states,
which ZeRO-1 partitions over the stage's DP group (DeepSpeed's 3D parallelism: ZeRO-1 inside each
stage's DP group, deepspeed/runtime/pipe/engine.py; Megatron's distributed optimizer likewise). With a
tied head and pp > 1 the last stage keeps its own copy of the word embedding for the logits
(Megatron-LM: shared_embedding_or_output_weight); under ZeRO-0 the copies' gradients are summed by an
all-reduce between the first and last stage before the optimizer step (`all_reduce/embed`).

A stage runs the Work items of zsim.parallel.pipeline.stage_schedule in order. For each (the fixed
contract with the runtime, docs/parallel.md):
  fwd:  recv/pp.fwd (unless virtual stage 0), the chunk's forward ops, send/pp.fwd (unless the last);
  bwd:  recv/pp.bwd (unless the last virtual stage), its recompute and backward ops, send/pp.bwd
        (unless virtual stage 0).
A recv depends on its matching send on the other stage; both run in line on the compute stream, as
Megatron-LM's p2p_communication._communicate waits for its requests (wait_on_reqs) before the
schedule goes on. A micro-batch's activations are allocated by its forward and freed by its backward,
so the memory of in-flight micro-batches follows from the schedule (1F1B: p - s on stage s).
The DP reduction runs after a chunk's last backward of the step (Megatron-LM's finalize_model_grads;
DeepSpeed's reduce at the gradient-accumulation boundary); ZeRO-1's stage-1 comm intervals after the
stage's last backward, or under zero.implementation megatron-core each chunk's buckets as its last backward
fills them (zsim.zero.megatron_ddp). Every stage then runs its optimizer step on its own partition.
"""

from __future__ import annotations

import dataclasses

from zsim.zero.inputs import Scenario
from zsim.memory.context import context_memory
from zsim.parallel.pipeline import Work, split_layers, stage_schedule
from zsim.workload.transformer import Module, Workload
from zsim.zero.ep_overlap import overlap_passes
from zsim.zero.megatron_ddp import IMPLEMENTATION as MEGATRON, grad_bytes
from zsim.zero.model_states import PARAM_BYTES, ModelStates
from zsim.zero.ops import Alloc, Op, Plan, PlanBuilder
from zsim.zero.pass_copy import PassRecord, copy_pass
from zsim.zero.optimizer_step import optimizer_step
from zsim.zero.rank_states import fp8_cache_bytes, rank_model_states
from zsim.zero.step_pass import StepPass


@dataclasses.dataclass(frozen=True, slots=True)
class Stage:
    """One pipeline stage: its workload (every module of its chunks, in chunk order) and the modules of
    each chunk."""

    workload: Workload
    chunks: tuple[tuple[Module, ...], ...]


def pipeline_stages(scenario: Scenario, workload: Workload) -> list[Stage]:
    """The stages of `scenario`'s pipeline over `workload` (the whole model's modules of one MP rank).

    Raises ValueError from split_layers when the layers do not split (the scenario loader checked it)."""
    par = scenario.parallel
    p, v = par.pp, par.virtual_stages
    split = split_layers(len(workload.blocks), p, v, tuple(par.pp_layers or ()))
    embed, head = workload.modules[0], workload.modules[-1]
    mtp = [m for m in workload.modules if m.mtp]  # on the last stage, before the head
    if p > 1 and (getattr(scenario.model, "tied_head", True) or mtp):
        # the last stage's copy of the word embedding (V/t × h) for the tied logits, or for the multi-token
        # prediction modules' input (Megatron-Core gpt_model.py: an embedding where pre_process or mtp_process)
        head = dataclasses.replace(head, params=head.params + embed.tensors[0], tensors=head.tensors + embed.tensors[:1])
    stages = []
    for s in range(p):
        chunks = []
        for c, layers in enumerate(split.layers[s]):
            mods = [workload.blocks[i] for i in layers]
            if s == 0 and c == 0:
                mods.insert(0, embed)
            if s == p - 1 and c == v - 1:
                mods += [*mtp, head]
            chunks.append(tuple(mods))
        modules = tuple(m for chunk in chunks for m in chunk)
        w = Workload(modules=modules, total_params=workload.total_params, padded_vocab=workload.padded_vocab,
                     tokens_per_micro_batch=workload.tokens_per_micro_batch, shape=workload.shape)
        stages.append(Stage(w, tuple(chunks)))
    return stages


def stage_model_states(scenario: Scenario, workload: Workload) -> list[ModelStates]:
    """Each stage's model-state bytes per rank (its layers' parameters, ZeRO-partitioned over its DP group)."""
    return [rank_model_states(scenario, st.workload) for st in pipeline_stages(scenario, workload)]


def block_ops(kind: str, modules: tuple[Module, ...]) -> frozenset[str]:
    """The names of a chunk's block compute ops in a forward or backward pass (StepPass: 'fwd/<module>')."""
    return frozenset(f"{kind}/{m.name}" for m in modules if m.layer is not None)


def p2p_bytes(scenario: Scenario) -> int:
    """Bytes one rank sends per point-to-point transfer: the (s, b, h) activation or its gradient in the
    activation dtype, e·s·b·h, divided by mp when mp > 1: under sequence parallelism each MP rank holds
    s/mp of the tokens, and without it Megatron's scatter/gather optimisation sends 1/mp of the
    replicated tensor and all-gathers it over the MP group on the other side (Narayanan et al. 2021 §4.1,
    Megatron-LM --scatter-gather-tensors-in-pipeline; the all-gather is gather_bytes')."""
    m = scenario.model
    e = 4 if scenario.precision.dtype == "fp32" else 2
    return e * m.seq_len * m.micro_batch * m.hidden // scenario.layout.mp


def gather_bytes(scenario: Scenario) -> int:
    """Bytes of the MP all-gather that follows each receive under Megatron's scatter/gather optimisation
    (mp > 1 without sequence parallelism: the receiver gathers the mp slices back into the whole e·s·b·h
    activation, mpu.gather_split_1d_tensor, in line before the compute that uses it); 0 otherwise."""
    if scenario.layout.mp == 1 or scenario.parallel.sequence_parallel:
        return 0
    return p2p_bytes(scenario) * scenario.layout.mp


def build_pipeline_plan(scenario: Scenario, workload: Workload, copy_passes: bool = True) -> Plan:
    """The ops of `scenario.run.steps` optimizer steps for one rank of every pipeline stage, in one Plan
    whose ops carry their stage (Op.stage); each recv depends on its matching send. A chunk's forward (or
    backward) is copied from its previous one where zsim.zero.pass_copy's rule applies (`copy_passes=False`
    builds every one, the tests' reference)."""
    par = scenario.parallel
    p, v, m = par.pp, par.virtual_stages, scenario.grad_accum
    stages = pipeline_stages(scenario, workload)
    nbytes, gathered = p2p_bytes(scenario), gather_bytes(scenario)
    z = scenario.zero
    megatron = z.implementation == MEGATRON
    # a tied head's word-embedding gradient (V/t × h elements), summed over the embedding group; DeepSpeed's
    # ZeRO-1 sums it inside its reduction, which is not planned apart (docs/parallel.md); megatron-core's
    # gradient buffer is fp32 for bf16 (zsim.zero.megatron_ddp.grad_bytes)
    tied = p > 1 and getattr(scenario.model, "tied_head", True)
    grad_e = (grad_bytes(scenario.precision.dtype, z.grad_reduce_in_fp32) if megatron
              else PARAM_BYTES[scenario.precision.dtype])
    embed_bytes = grad_e * workload.modules[0].tensors[0]
    # DeepSpeed v0.2's stage 1 reduces the whole stage at once (_reduce_stage1); megatron-core each chunk's buckets
    stage1_fused = z.stage == 1 and z.constant_buffers and not megatron
    ops: list[Op] = []
    sends: dict[tuple[str, int, int, int], int] = {}  # (kind, step, mb, sending virtual stage) -> plan index
    recvs: list[tuple[int, tuple[str, int, int, int]]] = []  # (plan index, the send it waits for)
    persistent = []
    for s, stage in enumerate(stages):
        states = rank_model_states(scenario, stage.workload)
        own = (Alloc("params", states.params, "model.params"), Alloc("optimizer", states.optimizer, "model.optimizer"))
        if cache := fp8_cache_bytes(scenario, stage.workload):  # Transformer Engine's FP8 weights (zsim.compute.fp8)
            own += (Alloc("params", cache, "model.fp8_weights"),)
        persistent.append(own)
        items = stage_schedule(par.pipeline_schedule, p, s, m, v, ep_overlap=par.ep_overlap)
        last_bwd = max(k for k, w in enumerate(items) if w.kind == "bwd")
        b, base = PlanBuilder(), len(ops)

        def gather(what: str, step: int, mb: int, b: PlanBuilder = b) -> None:
            """The MP all-gather of a received slice (gather_bytes), after its receive, in line."""
            if gathered:
                b.add(name=f"all_gather/{what}", stream="compute", collective="all_gather", group="mp",
                      nbytes=gathered, step=step, micro_batch=mb, deps=(b.last(),))
        for step in range(scenario.run.steps):
            boundary = b.last()
            passes: dict[tuple[str, int], PassRecord | None] = {}  # (kind, chunk) -> its last pass this step

            def run_pass(kind: str, chunk: int, mb: int, dep: tuple[int, ...], reduce: bool, b: PlanBuilder = b,
                         stage: Stage = stage, step: int = step, passes: dict = passes, copy: bool = True) -> None:
                """The chunk's forward or backward of micro-batch `mb`: copied from the chunk's last one of that
                kind (zsim.zero.pass_copy), else built; `dep`, the step's boundary for its first item (a pass
                that waits for an earlier step is not copied from). `copy` False: built, and no later pass is
                copied from it (a merged pass, whose ops zsim.zero.ep_overlap reorders)."""
                previous = passes.get((kind, chunk))
                copied = copy_pass(b, previous, reduce, mb) if copy and copy_passes and previous is not None else None
                if copied is None:
                    entry, built = b.last_compute, StepPass(b, scenario, stage.workload, step, mb, dep)
                    mods = list(stage.chunks[chunk])
                    if kind == "fwd":
                        built.forward(mods)
                    else:
                        built.backward(mods, reduce)
                    # (a pass that gathers megatron-core's parameters, a chunk's first this step, is not copied)
                    fresh = dep or not copy or built.gathers_params
                    copied = None if fresh else PassRecord(built.start, len(b.ops), step, mb, entry,
                                                           frozenset(built.entry_users), reduce)
                passes[(kind, chunk)] = copied

            def receive(w: Work, dep: tuple[int, ...], b: PlanBuilder = b, step: int = step, s: int = s) -> None:
                """The receive a forward or backward waits for (none on the first or last virtual stage)."""
                vs = w.chunk * p + s
                fields = dict(stream="compute", group="pp", nbytes=nbytes, step=step, micro_batch=w.mb)
                if w.kind == "fwd" and vs > 0:
                    recvs.append((base + b.add(name="recv/pp.fwd", collective="recv", deps=dep, **fields),
                                  ("fwd", step, w.mb, vs - 1)))
                    gather("pp.fwd", step, w.mb)
                elif w.kind == "bwd" and vs < p * v - 1:
                    recvs.append((base + b.add(name="recv/pp.bwd", collective="recv", deps=dep, **fields),
                                  ("bwd", step, w.mb, vs + 1)))
                    gather("pp.bwd", step, w.mb)

            def send(w: Work, b: PlanBuilder = b, step: int = step, s: int = s) -> None:
                """The send of a forward's output or a backward's input gradient to the next virtual stage."""
                vs = w.chunk * p + s
                fields = dict(stream="compute", group="pp", nbytes=nbytes, step=step, micro_batch=w.mb)
                if w.kind == "fwd" and vs < p * v - 1:
                    sends[("fwd", step, w.mb, vs)] = base + b.add(name="send/pp.fwd", collective="send", **fields)
                elif w.kind == "bwd" and vs > 0:
                    sends[("bwd", step, w.mb, vs)] = base + b.add(name="send/pp.bwd", collective="send", **fields)

            for k, w in enumerate(items):
                dep = (boundary,) if boundary is not None and k == 0 else ()
                reduce = w.kind == "bwd" and w.mb == m - 1 and (not stage1_fused or k == last_bwd)
                if w.merged and w.kind == "fwd":
                    continue  # run with the backward after it (parallel.ep_overlap)
                if w.merged:  # a steady-state forward and this backward, merged (zsim.zero.ep_overlap)
                    wf = items[k - 1]
                    assert k >= 1 and wf.merged and wf.kind == "fwd" and k - 1 > 0, "a merged pair follows the warm-up"
                    receive(wf, ())
                    receive(w, ())
                    start = len(b.ops)
                    run_pass("fwd", wf.chunk, wf.mb, (), False, copy=False)
                    mid = len(b.ops)
                    run_pass("bwd", w.chunk, w.mb, (), reduce, copy=False)
                    overlap_passes(b, start, mid, len(b.ops), block_ops("fwd", stage.chunks[wf.chunk]),
                                   block_ops("bwd", stage.chunks[w.chunk]))
                    send(wf)
                    send(w)
                    continue
                receive(w, dep)
                run_pass(w.kind, w.chunk, w.mb, dep, reduce)
                send(w)
            if tied and s in (0, p - 1) and (z.stage == 0 or megatron):
                # the tied word embedding's two copies summed between the first and last stage once the
                # step's gradients are reduced (Megatron-LM finalize_model_grads ->
                # _allreduce_word_embedding_grads over _EMBEDDING_GROUP; the runtime's all_reduce/embed);
                # megatron-core's distributed optimizer too, the whole fp32 main_grad after its reduce-scatter
                # (finalize_model_grads.py @ core_r0.8.0 L13-41)
                b.add(name="all_reduce/embed", stream="compute", collective="all_reduce", group="embed",
                      nbytes=embed_bytes, step=step, micro_batch=m - 1, deps=(b.last(),))
            optimizer_step(b, scenario, stage.workload, step, stage.chunks)
        ops += [op._replace(stage=s, deps=tuple(d + base for d in op.deps)) for op in b.ops]
    for i, key in recvs:
        ops[i] = ops[i]._replace(deps=ops[i].deps + (sends[key],))
    lay = scenario.layout
    context = context_memory(lay.world, lay.dp, lay.mp, scenario.cluster.nvlink_links).items()
    return Plan(persistent=persistent[0], ops=tuple(ops), steps=scenario.run.steps, context=tuple(context),
                stage_persistent=tuple(persistent))
