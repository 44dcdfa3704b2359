"""The ZeRO plan: the ops one rank executes per step, for each stage (Rajbhandari et al., ZeRO).

What each stage does, as DeepSpeed implements it:
  stage 0 (DP):     backward produces full gradients; buckets of them are all-reduced on the comm
                    stream while backward goes on; the optimizer updates all Ψ parameters.
  stage 1 (Pos):    the same buckets are reduce-scattered; the optimizer updates this rank's 1/Nd;
                    the updated fp16 parameters are all-gathered after the step (§5.1, §7.2.1).
  stage 2 (Pos+g):  as stage 1, but a bucket's gradients are freed once reduced: each rank keeps only
                    its gradient partition (§5.2).
  stage 3 (Pos+g+p): parameters are partitioned; each module's parameters are all-gathered before
                    its forward (prefetching `prefetch_layers` ahead) and again before its backward,
                    freed after use; its gradients are reduce-scattered right after its backward (§5.3,
                    §7.2.2: 3Ψ of traffic instead of 2Ψ).
Megatron MP all-reduces run in line on the compute stream (Shoeybi et al. 2019, §3). With gradient
accumulation, stages 0/1 reduce only on the last micro-batch (no_sync); stages 2/3 reduce every
micro-batch, as DeepSpeed does.
"""

from __future__ import annotations

from zsim.config.scenario import Scenario
from zsim.workload.transformer import Module, Workload
from zsim.zero.model_states import PARAM_BYTES, model_states, partition
from zsim.zero.ops import Alloc, Op, Plan

# Adam's update streams, per element: reads fp32 master, momentum, variance and the fp16 gradient
# (4+4+4+2 bytes) and writes master, momentum, variance and the fp16 parameter (4+4+4+2): memory-bound
# (DeepSpeed FusedAdam; counts from the update rule in Kingma & Ba 2015, Alg. 1).
ADAM_BYTES_PER_ELEMENT = 28


class _Builder:
    """Appends ops and hands out their indices."""

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self.last_comm: int | None = None

    def add(self, **fields) -> int:
        self.ops.append(Op(**fields))
        if fields["stream"] == "comm":
            self.last_comm = len(self.ops) - 1
        return len(self.ops) - 1

    def last(self) -> int | None:
        return len(self.ops) - 1 if self.ops else None


def build_plan(scenario: Scenario, workload: Workload) -> Plan:
    """The ops of `scenario.run.steps` optimizer steps for one rank (all ranks of a class are alike)."""
    zero, dtype = scenario.zero, scenario.precision.dtype
    nd = scenario.layout.dp
    psi = workload.params_per_mp_rank
    states = model_states(psi, nd, zero.stage, dtype)
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
        _optimizer(b, scenario, psi, step)
    return Plan(persistent=persistent, ops=tuple(b.ops), steps=scenario.run.steps)


class _StepPass:
    """Forward and backward of one micro-batch."""

    def __init__(self, b: _Builder, scenario: Scenario, workload: Workload, step: int, mb: int,
                 first_dep: tuple[int, ...]):
        self.b, self.s, self.w = b, scenario, workload
        self.step, self.mb = step, mb
        self.first_dep = first_dep
        self.stage = scenario.zero.stage
        self.ckpt = scenario.zero.activation_checkpointing
        self.e = PARAM_BYTES[scenario.precision.dtype]
        mods = workload.modules
        # The LM head computes with the tied word embedding: it uses the embedding's parameters too.
        self.uses = {m.name: (m.name, mods[0].name) if m.name == "head" else (m.name,) for m in mods}

    def _tags(self, kind: str, name: str) -> str:
        return f"{kind}.{name}.s{self.step}.m{self.mb}"

    def _mp_allreduces(self, m: Module, count: int) -> None:
        for _ in range(count):
            self.b.add(name=f"all_reduce/mp.{m.name}", stream="compute", collective="all_reduce", group="mp",
                       nbytes=m.mp_allreduce_bytes, step=self.step, micro_batch=self.mb)

    def _uses(self, order: list[Module]) -> tuple[dict[str, int], dict[str, str]]:
        """Stage 3: for one pass over `order`, the position where each module's parameters are first
        needed and the module after whose compute they can be freed."""
        first_use: dict[str, int] = {}
        last_use: dict[str, str] = {}
        for pos, m in enumerate(order):
            for used in self.uses[m.name]:
                first_use.setdefault(used, pos)
                last_use[used] = m.name
        return first_use, last_use

    def run(self, reduce: bool) -> None:
        mods = list(self.w.modules)
        self.compute_done: dict[str, int] = {}
        self._pass(mods, forward=True)
        self._pass(list(reversed(mods)), forward=False, reduce=reduce)

    def _pass(self, order: list[Module], forward: bool, reduce: bool = False) -> None:
        b, s, e = self.b, self.s, self.e
        phase = "fwd" if forward else "bwd"
        by_name = {m.name: m for m in self.w.modules}
        gather_op: dict[str, int] = {}
        first_use, last_use = self._uses(order) if self.stage == 3 else ({}, {})
        frees_after: dict[str, list[str]] = {}
        for name, user in last_use.items():
            frees_after.setdefault(user, []).append(self._tags(f"gathered.{phase}", name))
        gather_queue = sorted(first_use, key=first_use.get)
        compute_ops: list[int] = []  # last compute op index per position in `order`
        self.bucket_index = 0
        bucket: list[Module] = []
        bucket_elems = 0

        def issue_gathers_up_to(pos: int) -> None:
            # Gather every module first used at or before pos + prefetch; a gather may start once the
            # compute `prefetch + 1` positions earlier has finished (bounded prefetch, ZeRO §5.3).
            while gather_queue and first_use[gather_queue[0]] <= pos + s.zero.prefetch_layers:
                name = gather_queue.pop(0)
                use = first_use[name]
                wait = use - s.zero.prefetch_layers - 1
                deps = (compute_ops[wait],) if 0 <= wait < len(compute_ops) else self.first_dep
                nbytes = e * by_name[name].params
                gather_op[name] = b.add(
                    name=f"all_gather/params.{name}", stream="comm", deps=deps, collective="all_gather",
                    group="dp", nbytes=nbytes, allocs=(Alloc("params", nbytes, self._tags(f"gathered.{phase}", name)),),
                    step=self.step, micro_batch=self.mb)

        for pos, m in enumerate(order):
            if self.stage == 3:
                issue_gathers_up_to(pos)
            deps = tuple(gather_op[u] for u in self.uses[m.name] if u in gather_op)
            if pos == 0 and not deps:
                deps = self.first_dep
            elif pos == 0:
                deps = deps + self.first_dep
            ckpt = self.ckpt and m.layer is not None
            if forward:
                act = m.checkpoint_bytes if ckpt else m.saved_bytes
                op = b.add(name=f"fwd/{m.name}", stream="compute", deps=deps, flops=m.fwd_flops,
                           hbm_bytes=m.fwd_hbm_bytes, allocs=(Alloc("activations", act, self._tags("act", m.name)),),
                           frees=tuple(frees_after.get(m.name, ())), step=self.step, micro_batch=self.mb)
                self._mp_allreduces(m, m.mp_allreduces_fwd)
            else:
                frees = [self._tags("act", m.name)]
                if ckpt:
                    b.add(name=f"recompute/{m.name}", stream="compute", deps=deps, flops=m.fwd_flops,
                          hbm_bytes=m.fwd_hbm_bytes,
                          allocs=(Alloc("activations", m.saved_bytes, self._tags("recompute", m.name)),),
                          step=self.step, micro_batch=self.mb)
                    self._mp_allreduces(m, m.mp_allreduces_fwd)
                    frees.append(self._tags("recompute", m.name))
                    deps = ()
                grad_allocs = (Alloc("grads", e * m.params, self._tags("grad", m.name)),) if self.stage >= 2 else ()
                op = b.add(name=f"bwd/{m.name}", stream="compute", deps=deps, flops=m.bwd_flops,
                           hbm_bytes=2 * m.fwd_hbm_bytes, allocs=grad_allocs,
                           frees=tuple(frees + frees_after.get(m.name, [])), step=self.step, micro_batch=self.mb)
                self._mp_allreduces(m, m.mp_allreduces_bwd)
                if reduce:
                    bucket.append(m)
                    bucket_elems += m.params
                    if self.stage == 3 or bucket_elems >= s.zero.reduce_bucket_elements or pos == len(order) - 1:
                        self._reduce(bucket, op)
                        bucket, bucket_elems = [], 0
            compute_ops.append(op)

    def _reduce(self, bucket: list[Module], after: int) -> None:
        """Reduce a bucket of gradients once the backward that completes it (`after`) is done."""
        e = self.e
        nbytes = e * sum(m.params for m in bucket)
        what = f"grads.{bucket[0].name}" if self.stage == 3 else f"grads.bucket.{self.bucket_index}"
        self.bucket_index += 1
        if self.stage == 0:
            op, staging = "all_reduce", (Alloc("buffers", nbytes, self._tags("bucket", bucket[0].name)),)
        elif self.stage in (1, 2):
            op, staging = "reduce_scatter", (Alloc("buffers", nbytes, self._tags("bucket", bucket[0].name)),)
        else:
            op, staging = "reduce_scatter", ()  # stage 3 reduce-scatters the module's gradient in place
        frees = [a.tag for a in staging]
        if self.stage >= 2:
            frees += [self._tags("grad", m.name) for m in bucket]
        self.b.add(name=f"{op}/{what}", stream="comm", deps=(after,), collective=op, group="dp", nbytes=nbytes,
                   allocs=staging, frees=tuple(frees), step=self.step, micro_batch=self.mb)


def _optimizer(b: _Builder, s: Scenario, psi: int, step: int) -> None:
    """The Adam step on this rank's partition, after every reduction; stages 1/2 then all-gather the
    updated fp16 parameters in buckets (ZeRO §7.2.1)."""
    stage, nd = s.zero.stage, s.layout.dp
    elements = psi if stage == 0 else partition(psi, nd)
    deps = (b.last_comm,) if b.last_comm is not None else ()
    opt = b.add(name="optimizer/step", stream="compute", deps=deps, hbm_bytes=ADAM_BYTES_PER_ELEMENT * elements,
                step=step)
    if stage in (1, 2):
        e = PARAM_BYTES[s.precision.dtype]
        bucket = s.zero.reduce_bucket_elements
        for j, start in enumerate(range(0, psi, bucket)):
            n = min(bucket, psi - start)
            b.add(name=f"all_gather/params.bucket.{j}", stream="comm", deps=(opt,), collective="all_gather",
                  group="dp", nbytes=e * n, step=step)
