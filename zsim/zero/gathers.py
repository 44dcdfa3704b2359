"""Stage 3's parameter all-gathers in the plan: which item first and last uses each module's
parameters, the gathers issued `prefetch_layers` ahead (ZeRO §5.3; DeepSpeed v0.14's coalesced
fetches, with their unflatten), and DeepSpeed v0.3.13-v0.5.10's per-tensor gathers in line with
compute (zsim.zero.implementation cites the code). A mixin of zsim.zero.step_pass.StepPass."""

from __future__ import annotations

from zsim.zero.buckets import padded_tensors, partition
from zsim.zero.implementation import (Coordination, coordinator, list_copy_launches, list_copy_tail, fetch_host,
                                     fetched_tensors, fetch_prologue, unflatten)
from zsim.zero.ops import Alloc
from zsim.zero.residual import list_collective_staging_bytes


class Gathers:
    """Stage 3's gathers of one phase (mixed into StepPass)."""

    def _uses_of(self, items: list) -> tuple[dict[str, int], dict[str, int]]:
        """Stage 3: the position of the item where each module's parameters are first needed and of
        the item after whose compute they can be freed."""
        first_use: dict[str, int] = {}
        last_use: dict[str, int] = {}
        for pos, item in enumerate(items):
            for used in self.uses[item.module.name]:
                first_use.setdefault(used, pos)
                last_use[used] = pos
        return first_use, last_use

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
            tensors = fetched_tensors(self.by_name[name].tensors, self.z.implementation)
            nbytes = self.e * padded_tensors(tensors, self.nd)  # each tensor padded to Nd
            # DeepSpeed v0.3.13 partition_parameters.py _allgather_param: the full parameter buffer, and
            # PyTorch's flat staging of the list all_gather until the copy-out; both made on the
            # coordinator's comm stream (stage3.py _all_gather: `with torch.cuda.stream(self.comm_stream)`,
            # a stream of its own under overlap_comm, stage 3's default), so in that stream's pool.
            staging = Alloc("buffers", list_collective_staging_bytes(sum(tensors), self.e),
                            self._tags(f"ag_list.{phase}", name))
            self.gather_op[name] = self._add(
                name=f"all_gather/params.{name}", stream="comm", deps=deps, collective="all_gather", group="dp",
                nbytes=nbytes, allocs=(Alloc("params", nbytes, self._tags(f"gathered.{phase}", name)), staging),
                frees=(staging.tag,))
            if trigger == 0 and phase == "fwd":
                self._entry_user(self.gather_op[name])
            if self.expert_gathers and self.by_name[name].expert_params:
                self._gather_experts(name, phase)

    def _gather_experts(self, name: str, phase: str) -> None:
        """FSDP with expert parallelism (zero.implementation 'paper' at stage 3 with MoE): a MoE block's local
        experts, sharded over their expert-data-parallel group, are all-gathered over that group after the
        block's dense parameters, on the same stream (torchtitan's and NeMo AutoModel's fully_shard of the
        experts on the dp_shard_mod_ep mesh: one more FSDP unit, gathered in the block's pre-forward). The
        compute waits for this gather, which follows the dense one in stream order; the gathered experts are
        freed with the block's dense parameters (docs/moe.md, "ZeRO")."""
        m, edp = self.by_name[name], self.edp
        nbytes = self.e * padded_tensors(m.expert_tensors, edp)  # each tensor padded to the group, as the dense
        self.gather_op[name] = self._add(
            name=f"all_gather/params.experts.{name}", stream="comm", deps=(self.gather_op[name],),
            collective="all_gather", group=self.expert_group, nbytes=nbytes,
            allocs=(Alloc("params", nbytes, self._tags(f"gathered.experts.{phase}", name)),))

    # ---- forward --------------------------------------------------------------------------------

    def _padded(self, name: str) -> tuple[int, ...]:
        """The padded elements of each tensor a fetch of module `name` gathers (zsim.zero.implementation)."""
        return tuple(self.nd * partition(n, self.nd)
                     for n in fetched_tensors(self.by_name[name].tensors, self.z.implementation))

    def _unflatten(self, used: tuple[str, ...]) -> None:
        """deepspeed-0.14: once a module's coalesced gather is waited for, each of its parameters is
        rebuilt by a cat of its Nd pieces before the compute that uses it (zsim.zero.implementation)."""
        for name in used:
            if name in self.gather_op and name not in self.unflattened:
                self.unflattened.add(name)
                kernels = unflatten(self._padded(name), self.nd, self.e)
                self.gather_op[name] = self._add(name=f"unflatten/params.{name}", stream="compute",
                                                 deps=(self.gather_op[name],), kernels=kernels,
                                                 hbm_bytes=kernels.bytes)

    def _coordination(self, name: str, phase: str) -> Coordination:
        """deepspeed-0.5: what DeepSpeed's coordinator holds and gathers again of module `name` in `phase`
        (zsim.zero.implementation.coordinator; its prefetch, live and reuse limits from the scenario)."""
        m = self.by_name[name]
        return coordinator(self._padded(name), phase == "bwd" and self._checkpointed(m), phase == "bwd",
                           self.z.prefetch_bucket_elements, self.z.max_live_elements, self.z.max_reuse_elements)

    def _fetch_in_line(self, pos: int, used: tuple[str, ...], phase: str, kind: str) -> None:
        """deepspeed-0.5: fetch each module the item uses and this phase has not, when the item is
        reached: the zero-fill of every tensor, then (the device idle after the synchronise) the host's
        narrows and Python around each gather, one all-gather per tensor in line on the compute stream,
        then the list copies (zsim.zero.implementation). The module's gathered memory is the most its
        sub-modules hold at once (Coordination.peak_elements), held from the fetch to the last use. At a
        checkpointed module's backward item, the tensors the coordinator released after the recompute
        are gathered again the same way."""
        for name in used:
            if name in self.gather_op:
                if kind == "bwd" and name in self.recompute_fetched:
                    self.recompute_fetched.discard(name)
                    padded = self._padded(name)
                    again = tuple(padded[i] for i in sorted(self._coordination(name, phase).refetched))
                    if again:
                        self.gather_op[name] = self._gather_in_line(name, again, phase, (), again=True)
                continue
            padded = self._padded(name)
            peak = self._coordination(name, phase).peak_elements if padded else 0
            deps = self.phase_dep + self.first_dep if pos == 0 else ()
            gathered = Alloc("params", self.e * peak, self._tags(f"gathered.{phase}", name))
            first = len(self.b.ops)
            self.gather_op[name] = self._gather_in_line(name, padded, phase, deps, gathered)
            if pos == 0 and phase == "fwd":
                self._entry_user(first)
            if kind == "recompute":
                self.recompute_fetched.add(name)

    def _gather_in_line(self, name: str, padded: tuple[int, ...], phase: str, deps: tuple[int, ...],
                        gathered: Alloc | None = None, again: bool = False) -> int:
        """deepspeed-0.5: the ops of one fetch of `padded` tensors of module `name` in line on the compute
        stream (zero-fill, host work, then per tensor its all-gather and the GPU side of its list copies, whose
        launches run on the 'host' lane beside the transfer), `again` for a re-gather in backward (op names end
        in `.again`); returns the last op."""
        what, suffix = (f"{phase}.again", ".again") if again else (phase, "")
        prologue = fetch_prologue(padded, self.nd, self.e)
        op = self._add(name=f"fetch/params.{name}{suffix}", stream="compute", deps=deps, kernels=prologue,
                       hbm_bytes=prologue.bytes, allocs=(gathered,) if gathered is not None else ())
        if padded:  # the host's work after the synchronise, the device idle (zsim.zero.implementation)
            op = self._add(name=f"fetch_host/params.{name}{suffix}", stream="compute", kernels=fetch_host(padded, self.nd))
        launched: tuple[int, ...] = ()
        for i, n in enumerate(padded):
            # c10d launches the copy-out in the gather's post hook, while the transfer runs (zsim.zero.implementation):
            # the launches on the host lane from the gather's issue, the copies' GPU time after the transfer; the
            # host issues nothing else (the next gather, the compute after the fetch) until it has launched them.
            issued = op
            staging = Alloc("buffers", list_collective_staging_bytes(n, self.e), self._tags(f"ag_list.{what}.{i}", name))
            self._add(name=f"all_gather/params.{name}{suffix}.{i}", stream="compute", deps=launched,
                      collective="all_gather", group="dp", nbytes=self.e * n, allocs=(staging,), frees=(staging.tag,))
            launched = (self._add(name=f"launch/params.{name}{suffix}.{i}", stream="host", deps=(issued,),
                                  kernels=list_copy_launches(n, self.nd)),)
            tail = list_copy_tail(n, self.nd, self.e)
            op = self._add(name=f"copy/params.{name}{suffix}.{i}", stream="compute", kernels=tail, hbm_bytes=tail.bytes)
        if launched:  # no GPU work: the compute stream resumes when the host has launched the last copies
            op = self._add(name=f"launched/params.{name}{suffix}", stream="compute", deps=launched)
        return op
