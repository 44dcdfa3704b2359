"""The DP gradient reductions in the plan: stage 0's all-reduces, stage 1's comm intervals, stage 2-3's
bucketed reduce-scatters, a MoE block's expert gradients. A mixin of zsim.zero.step_pass.StepPass."""

from __future__ import annotations

from collections.abc import Callable

from zsim.workload.transformer import Module
from zsim.zero.buckets import padded_bucket, padded_tensors, partition
from zsim.zero.implementation import bucket_copy_back, bucket_flatten, reduce_lists
from zsim.zero.ops import Alloc
from zsim.zero.rank_states import expert_dp, full_grad_tag, partition_grad_tag, rank_partition
from zsim.zero.residual import (
    bucket_buffer_bytes,
    fused_gradient_buffer_bytes,
    list_collective_staging_bytes,
    stage1_comm_intervals,
    stage1_flat_gradient_bytes,
)


class Reductions:
    """The gradient reductions of one backward (mixed into StepPass)."""

    def _expert_grads(self, m: Module, after: int, reduce: bool) -> None:
        """A MoE block's local expert gradients: made by its backward (stages 0/1: kept, accumulated,
        until the step; stage 2: until reduced), reduced on the reduction stream over the
        expert-data-parallel group right after the backward that makes them: an all-reduce at stage 0,
        a reduce-scatter at stages 1-2 (Megatron-Core's expert gradient buffers; DeepSpeed-MoE's
        expert_data_parallel_group)."""
        n = m.expert_params
        tag = self._expert_grad_tag(m)
        if not reduce:
            return
        edp = expert_dp(self.s)
        op = "all_reduce" if self.stage == 0 else "reduce_scatter"
        nbytes = self.ge * (n if self.stage == 0 else padded_bucket(n, edp))
        self.b.add(name=f"{op}/grads.experts.{m.name}", stream=self._reduction_stream(), deps=(after,),
                   collective=op, group=self.expert_group, nbytes=nbytes, frees=(tag,) if self.stage >= 2 else (),
                   step=self.step, micro_batch=self.mb)

    def _expert_grad_tag(self, m: Module) -> str:
        return self._tags("egrad", m.name) if self.stage >= 2 else full_grad_tag(f"{m.name}.experts", self.step)

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
            staging = staging + (Alloc("grads", e * part, partition_grad_tag(self.step)),)
        if self.stage == 2:
            frees += [self._tags("grad", m.name) for m in bucket]
        if self.stage == 3 and self.z.implementation == "deepspeed-0.5":
            self._reduce_per_tensor(bucket, after, what, staging, tuple(frees))
            return
        if self.stage == 2 and self.z.implementation == "deepspeed-0.2":
            if self.md:  # contiguous_gradients: average_tensor's reduces to the owners
                self._reduce_to_owners(elements, after, what, staging, tuple(frees))
            else:  # v0.2.0's default: buffered_reduce_fallback's all-reduce (zsim.zero.implementation)
                self._allreduce_and_copy(bucket, after, what, staging, tuple(frees))
            return
        self.b.add(name=f"{op}/{what}", stream=self._reduction_stream(), deps=(after,), collective=op, group="dp",
                   nbytes=nbytes,
                   allocs=staging, frees=tuple(frees), step=self.step, micro_batch=self.mb)

    def _reduce_bucket(self, elements: int, after: int) -> None:
        """megatron-core: one bucket of the contiguous gradient buffer (zsim.zero.megatron_ddp) reduced in place
        once the backward that completes it (`after`) is done: a reduce-scatter at stage 1 (the distributed
        optimizer), an all-reduce at stage 0, in the buffer's dtype, on the reduction stream
        (param_and_grad_buffer.py @ core_r0.8.0 start_grad_sync L96-152)."""
        op = "reduce_scatter" if self.stage == 1 else "all_reduce"
        what = f"grads.bucket.{self.bucket_index}"
        self.bucket_index += 1
        self.b.add(name=f"{op}/{what}", stream=self._reduction_stream(), deps=(after,), collective=op, group="dp",
                   nbytes=self.ge * elements, step=self.step, micro_batch=self.mb)

    def _reduce_to_owners(self, elements: int, after: int, what: str, allocs: tuple[Alloc, ...],
                          frees: tuple[str, ...]) -> None:
        """deepspeed-0.2, stage 2: a bucket is not reduce-scattered but reduced to each owner in turn,
        one dist.reduce per rank whose partition the bucket's slice of the flat gradients overlaps
        (deepspeed/pt/deepspeed_zero_optimizer.py @ v0.2.0 average_tensor L603-668: rank_and_offsets,
        `dist.reduce(grad_slice, dst=dst_rank, async_op=True)`). The flat fp16 group is in forward
        order and split into Nd equal partitions (flatten_dense_tensors_aligned, get_data_parallel_
        partitions); backward fills buckets from its end (zsim.zero.implementation)."""
        psi = self.w.params_per_mp_rank
        part = -(-psi // self.nd)
        end = psi - self.reduced_elements
        start = max(0, end - elements)
        self.reduced_elements += elements
        slices = [min(end, (r + 1) * part) - max(start, r * part) for r in range(start // part, -(-end // part))]
        for i, n in enumerate(slices):
            self.b.add(name=f"reduce/{what}.{i}", stream=self._reduction_stream(), deps=(after,) if i == 0 else (),
                       collective="reduce", group="dp", nbytes=self.e * n, allocs=allocs if i == 0 else (),
                       frees=frees if i == len(slices) - 1 else (), step=self.step, micro_batch=self.mb)

    def _allreduce_and_copy(self, bucket: list[Module], after: int, what: str, allocs: tuple[Alloc, ...],
                            frees: tuple[str, ...]) -> None:
        """deepspeed-0.2, stage 2 without contiguous gradients (DeepSpeed v0.2.0's default): the bucket's
        gradients flattened and divided, the flat bucket all-reduced over DP, each gradient copied back
        (deepspeed_zero_optimizer.py @ v0.2.0 reduce_ipg_grads L696-702 -> buffered_reduce_fallback(None)
        -> allreduce_no_retain -> allreduce_and_copy -> allreduce_bucket, L796-870), all on the reduction
        stream. The flatten takes the bucket's allocations, the copy-back frees what the bucket frees."""
        tensors = tuple(n for m in bucket for n in m.tensors)
        stream = self._reduction_stream()
        flat = bucket_flatten(tensors, self.e)
        op = self.b.add(name=f"flatten/{what}", stream=stream, deps=(after,), kernels=flat, hbm_bytes=flat.bytes,
                        allocs=allocs, step=self.step, micro_batch=self.mb)
        op = self.b.add(name=f"all_reduce/{what}", stream=stream, deps=(op,), collective="all_reduce", group="dp",
                        nbytes=self.e * sum(tensors), step=self.step, micro_batch=self.mb)
        back = bucket_copy_back(tensors, self.e)
        self.b.add(name=f"copy/{what}", stream=stream, deps=(op,), kernels=back, hbm_bytes=back.bytes, frees=frees,
                   step=self.step, micro_batch=self.mb)

    def _reduce_per_tensor(self, bucket: list[Module], after: int, what: str, allocs: tuple[Alloc, ...],
                           frees: tuple[str, ...]) -> None:
        """deepspeed-0.5, stage 3: the bucket's tensors reduce-scattered one by one, each from a list of
        Nd views that PyTorch first copies into a flat buffer; the host builds each list (narrows) and
        launches its copies in the backward hook, on the compute stream's host thread, then the tensor's
        reduce-scatter, and goes on to the next tensor's list while it runs (zsim.zero.implementation).
        The first list waits for the backward (and the previous bucket, below); the first reduce-scatter
        takes the bucket's allocations, the last frees what the bucket frees.

        Under overlap_comm (stage 3's default, constants.py @ v0.3.13 L55) reduce_ipg_grads first
        blocks the host on the reduction stream (stage3.py @ v0.3.13 L1689-1691:
        `self.reduction_stream.synchronize()`): a bucket's lists, and every compute op the host launches
        after them, wait for the previous bucket's last reduce-scatter of this pass."""
        padded = tuple(self.nd * partition(n, self.nd) for m in bucket for n in m.tensors)
        waits = (self.last_reduce,) if self.last_reduce is not None and self._reduction_stream() != "compute" else ()
        deps = (after,) + waits
        for i, n in enumerate(padded):
            # tensor by tensor: its list built and copied (c10d's pre hook), then its reduce-scatter, while the
            # host goes on to the next tensor's list (zsim.zero.implementation)
            lists = reduce_lists((n,), self.nd, self.e)
            copy = self.b.add(name=f"copy/{what}.{i}", stream="compute", deps=deps, kernels=lists,
                              hbm_bytes=lists.bytes, step=self.step, micro_batch=self.mb)
            last = i == len(padded) - 1
            op = self.b.add(name=f"reduce_scatter/{what}.{i}", stream=self._reduction_stream(), deps=(copy,),
                            collective="reduce_scatter", group="dp", nbytes=self.e * n, allocs=allocs if i == 0 else (),
                            frees=frees if last else (), step=self.step, micro_batch=self.mb)
            deps = ()
            self.last_reduce = op

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
