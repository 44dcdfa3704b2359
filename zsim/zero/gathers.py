"""Stage 3's parameter all-gathers in the plan: which item first and last uses each module's
parameters, and the gathers issued `prefetch_layers` ahead (ZeRO §5.3). A mixin of
zsim.zero.step_pass.StepPass."""

from __future__ import annotations

from zsim.zero.buckets import padded_tensors
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
