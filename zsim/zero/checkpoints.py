"""ZeRO-R's activation checkpoints in the plan (§6.1, §6.3): MD's checkpoint slots, Pa's all-gather
over the MP group before recompute, Pa+cpu's copies to and from the host. A mixin of
zsim.zero.step_pass.StepPass (it uses the pass's builder, tags and segments)."""

from __future__ import annotations

from zsim.config.schema import ZeroSection
from zsim.workload.transformer import Module
from zsim.zero.ops import Alloc
from zsim.zero.residual import checkpoint_bytes_per_rank, list_collective_staging_bytes


def md_checkpoints(z: ZeroSection) -> str:
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



class Checkpoints:
    """The checkpoint ops of one forward-backward pass (mixed into StepPass)."""

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
        self._cp_exchanges(m, ("all_gather",))
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
