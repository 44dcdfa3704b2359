"""Which ZeRO implementation a plan follows (`zero.implementation`), and the extra work DeepSpeed's
stage 3 of each version does around every parameter fetch and gradient reduction, as kernel lists.

What each version does, read from DeepSpeed's code at its tag (deepspeed/runtime/zero/):

  paper (default): zsim's schedule of the ZeRO paper (§5.3, §7.2.2): one all-gather per module on the
      comm stream, `prefetch_layers` ahead, one reduce-scatter per gradient bucket, no host work
      priced beyond each kernel's launch; stages 0-2 as DeepSpeed v0.2.0 ran them (zsim.zero.plan).
  deepspeed-0.2 (v0.2.0, the code of the paper's runs; stages 0-2 only, stage 3 is refused at load):
    - stage 2 reduces each gradient bucket not by a reduce-scatter but by one dist.reduce to each rank
      whose partition the bucket overlaps (deepspeed/pt/deepspeed_zero_optimizer.py @ v0.2.0
      average_tensor L603-668), about B·Nd/Ψ + 1 reduces of up to Ψ/Nd elements per bucket of B;
    - after the step, stage 2 all-gathers the partition in shards (step() L1145-1175), each from a list the
      host builds, a narrow and a detach per rank (`shard_list`), handed to c10d, which launches the Nd
      copy-outs in its post hook while the transfer runs (as deepspeed-0.5's gathers: `list_copy_launches`,
      `list_copy_tail`); the host goes on to the next shard's list meanwhile (a blocking all_gather waits
      on the stream, not the host);
    - that is the path of contiguous_gradients (zsim: MD, `zero.defragment`). Without it (v0.2.0's
      default, ZERO_OPTIMIZATION_CONTIGUOUS_GRADIENTS_DEFAULT = False in deepspeed_zero_config.py, and
      the public Megatron-LM example of the release, DeepSpeedExamples @ 5426d18a
      scripts/ds_zero2_config.json, which sets only "stage": 2) reduce_ipg_grads calls
      buffered_reduce_fallback(None, ...) (L696-702), whose rank None makes allreduce_bucket **all-reduce**
      the flattened bucket (L796-822) and allreduce_and_copy copy each gradient back (L824-841): twice
      a reduce-scatter's bytes, a cat, a divide and a copy kernel per tensor (`bucket_allreduce_copies`);
    - not modelled: under overlap_comm, the torch.cuda.synchronize() before each bucket (L604-605) and
      after the last (L424-425); the paper's configurations leave overlap_comm off.
  deepspeed-0.5 (v0.3.13 to v0.5.10, the ZeRO-3 of 2021; PyTorch without dist._all_gather_base, which
      v0.5.x used when present: partition_parameters.py @ v0.5.10 L506-509):
    - every parameter tensor is all-gathered on its own (partition_parameters.py @ v0.3.13
      _allgather_param L596-635, called per parameter by _all_gather L473-494; the blocking path of
      v0.5.10, _allgather_params_coalesced L919-986, also issues one dist.all_gather per parameter);
    - before each one the host synchronises the device (`torch.cuda.synchronize()`, @ v0.3.13 L611,
      @ v0.5.10 L882), and after a sub-module's fetch again (stage3.py @ v0.5.10
      _synchronize_communication L534-545: comm_stream.synchronize(); torch.cuda.synchronize()):
      "the async version is not async at all, because each all_gather calls torch.cuda.synchronize()"
      (DeepSpeed PR #1188, 2021-06). zsim therefore runs these gathers in line on the compute stream:
      no overlap with compute (the last prefetched tensor's gather, which could overlap, is not
      modelled);
    - each gather first zero-fills the full tensor (`torch.zeros`, @ v0.3.13 L607), then narrows it
      into Nd views on the host (L622-627) and passes them as a list: PyTorch's ProcessGroupNCCL
      all_gather gathers into a flat buffer and copies out each of the Nd views, one copy kernel each
      (torch/lib/c10d/ProcessGroupNCCL.cpp allgather, `outputTensors[i][j].copy_(outputFlattened[i][j])`).
      c10d launches those copies in its post hook, right after enqueueing the gather and before the call
      returns, so the host issues them while the transfer runs: a gather costs the transfer or the Nd
      launches, whichever is longer, then the copies' GPU time (`list_copy_launches` on the plan's 'host'
      lane beside the gather, `list_copy_tail` after it);
    - gradients: one reduce-scatter per parameter tensor of a bucket (partition_parameters.py @ v0.5.10
      _reduce_scatter_gradients L1050-1079), each from a list of Nd narrowed views (L1081-) that
      PyTorch first copies into a flat buffer, Nd copy kernels launched in c10d's pre hook before the
      collective. Tensor by tensor: the host builds and launches the next tensor's list while the
      previous reduce-scatter runs (one list op per tensor, each reduce-scatter after its own).
    - the parameter coordinator (stage3.py @ v0.3.13 L281-470) fetches per sub-module, prefetches up to
      stage3_prefetch_bucket_size while under stage3_max_live_parameters, and releases what is not used
      again within stage3_max_reuse_distance: zsim's block holds the most its sub-modules hold at once,
      and the tensors released after the recompute are gathered again for backward (`coordinator`);
      each gradient leaves for the bucket buffer in its hook (`live_grads`).
  deepspeed-0.14 (v0.14.0, coalesced fetches):
    - one all_gather_into_tensor per fetched module (partitioned_param_coordinator.py @ v0.14.0
      __all_gather_params_ L436-470: all_gather_coalesced), on its own stream, prefetched by
      `stage3_prefetch_bucket_size` (zsim: prefetch_layers); no device synchronise (the compute stream
      waits on the gather stream, L318 wait_stream);
    - when the module waits for it, each parameter is rebuilt by torch.cat of its Nd pieces
      (partition_parameters.py @ v0.14.0 AllGatherCoalescedHandle.wait L680-700: Nd narrows on the host,
      one cat kernel reading and writing the parameter);
    - gradients as `paper` (one reduce-scatter per bucket, reduce_scatter_coalesced).
Both versions keep tensors under `stage3_param_persistence_threshold` (1e5 elements by default,
constants.py @ v0.3.13 L99-100; the same default at v0.14.0) gathered for the whole run
(stage3.py @ v0.3.13 persistent_parameters L1048-1056): they are never fetched.

Host costs are priced with the GPU profile's `host_op_us` (PyTorch's per-op CPU cost) per host
operation (a narrow, a launch): one rank's entry of a list collective, DeepSpeed's Python loop and c10d's
select, recordStream and copy_, measures 2.03-2.07 such ops on the trace host_op_us comes from, where zsim
charges 2 (benchmarks/list_loop_host.py, docs/zero-implementations.md). On top of them: deepspeed-0.5's host work around each gather as
DeepSpeed's issue #1069 measured it (GATHER_PYTHON_HOST_OPS), run with the device idle after the
synchronise, and its host wait on the reduction stream before each bucket (zsim.zero.reductions);
deepspeed-0.14's per-tensor fetch/release bookkeeping counted from its code (V014_HOST_OPS_PER_TENSOR).
Stages 0-2 follow DeepSpeed v0.2.0's schedule for every value.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from zsim.compute.kernel_list import Kernel, KernelList

IMPLEMENTATIONS = ("paper", "deepspeed-0.2", "deepspeed-0.5", "deepspeed-0.14", "megatron-core")

# stage3_param_persistence_threshold's default (DeepSpeed runtime/zero/constants.py @ v0.3.13 L100; the
# same in config.py @ v0.14.0): tensors with fewer elements stay gathered and are never fetched.
PERSISTENCE_THRESHOLD = 100_000


def fetched_tensors(tensors: tuple[int, ...], implementation: str) -> tuple[int, ...]:
    """The tensors (elements) of a module that a stage 3 fetch gathers: all of them under `paper`,
    those at or above the persistence threshold under a DeepSpeed version."""
    if implementation == "paper":
        return tensors
    return tuple(n for n in tensors if n >= PERSISTENCE_THRESHOLD)


# deepspeed-0.5: the host's own work around each per-tensor gather, beyond the ops zsim already counts, in
# host ops (`host_op_us` each, so a calibrated host scales it). Measured by DeepSpeed's issue #1069
# (zarzen, 2021-06-21; DeepSpeed 0.3.16, PyTorch 1.8, p4d.24xlarge, 8 A100, profiled per gather): "The
# pre_launch typically takes 130us, the launch takes 250us about, and there is a torch.cuda.synchronize()
# sync point when pre_launch next all_gather" (tensors of 320 elements per partition: host time, not data).
# At that Nd = 8 zsim's list already charges 1 zero-fill launch + 8 narrows (fetch_prologue) + 8 copy
# launches (list_copy_launches) = 17 ops; at the A100 profile's 10 µs per op the other (130 + 250) / 10 − 17
# = 21 ops are the Python (param bookkeeping, print_rank_0's f-strings, the stream context, c10d's
# argument checks and flat-buffer allocation) that the measurement contains and the lists do not.
# Paid once per gathered tensor, with the device idle: the synchronise before each gather (v0.3.13
# partition_parameters.py L611) keeps the host from running ahead of it.
GATHER_PYTHON_HOST_OPS = 21


@dataclass(frozen=True, slots=True)
class Coordination:
    """deepspeed-0.5: what the parameter coordinator does with one module's fetched tensors in one phase
    (`coordinator`): the most elements it holds gathered at once, and the tensors (indices into the
    module's fetched tensors) released after the recompute and gathered again for backward."""

    peak_elements: int
    refetched: tuple[int, ...]


@functools.lru_cache(maxsize=4096)
def coordinator(padded: tuple[int, ...], recompute: bool, backward: bool, prefetch: int, max_live: int,
                max_reuse: int) -> Coordination:
    """deepspeed-0.5's PartitionedParameterCoordinator (stage3.py @ v0.3.13) over one module's fetched tensors
    (`padded` elements, in forward order; each a Linear's weight, a sub-module of its own) in one phase: the
    forward (`backward` false), or the backward in reverse order, after the checkpointed recompute in forward
    order when `recompute`. At each sub-module (stage3.py L1135-1185):
      - fetch_sub_module gathers its tensor (L357-411);
      - prefetch_next_sub_modules (L312-331), only while fewer than `max_live` elements are gathered
        (stage3_max_live_parameters), gathers the next tensors of the trace not yet gathered until they add up
        to `prefetch` elements (get_params_to_prefetch L188-216, stage3_prefetch_bucket_size);
      - release_sub_module (L413-458) frees it unless it is used again within `max_reuse` elements of the
        trace (_keep_for_later L464-470, _distance_in_numel L262-270, stage3_max_reuse_distance).
    A tensor released after the recompute is gathered again for backward. Within one module only: a prefetch
    that reaches into the next module is not counted (it is bounded by the same `prefetch` elements). The limits
    are compared with padded sizes where DeepSpeed uses ds_numel: at most Nd − 1 elements a tensor apart."""
    n = len(padded)
    trace = list(range(n)) if not backward else (list(range(n)) if recompute else []) + list(reversed(range(n)))
    gathered: set[int] = set()
    peak, fetched, refetched = 0, set(), []

    def gather(j: int) -> None:
        if j in fetched:  # released since its last gather (by fetch or prefetch): gathered again
            refetched.append(j)
        gathered.add(j)
        fetched.add(j)

    for step, i in enumerate(trace):
        if i not in gathered:
            gather(i)
        if sum(padded[j] for j in gathered) < max_live:
            ahead = 0
            for j in trace[step + 1:]:
                if j not in gathered:
                    gather(j)
                    ahead += padded[j]
                    if ahead >= prefetch:
                        break
        peak = max(peak, sum(padded[j] for j in gathered))
        reuse = next((k for k in range(step + 1, len(trace)) if trace[k] == i), None)
        if reuse is None or sum(padded[trace[k]] for k in range(step + 1, reuse)) >= max_reuse:
            gathered.discard(i)
    return Coordination(peak, tuple(refetched))


def live_grads(tensors: tuple[int, ...], bucket: int) -> int:
    """deepspeed-0.5, stage 3: the most gradient elements of one module live at once in its backward. Each
    parameter's gradient is copied into the contiguous bucket buffer by its hook and its own storage dropped
    (reduce_independent_p_g_buckets_and_remove_grads, stage3.py @ v0.3.13 L1431-1467: `param.grad.data =
    new_grad_tensor.data`), except one larger than the bucket (`extra_large_param_to_reduce`), which is kept
    until the next gradient's arrival reduces it (L1433-1440): a gradient, plus the one before it when that
    one exceeded the bucket. `tensors` in forward order; backward produces them in reverse."""
    order = tuple(reversed(tensors))
    return max((t + (order[k - 1] if k and order[k - 1] > bucket else 0) for k, t in enumerate(order)), default=0)


def _host(name: str, count: int) -> Kernel:
    """`count` host-only operations (a narrow, a view): no GPU time, one host op each."""
    return Kernel(name, "host", count=count)


@functools.lru_cache(maxsize=4096)
def fetch_prologue(padded: tuple[int, ...], nd: int, e: int) -> KernelList:
    """deepspeed-0.5: before each tensor's all-gather, the zero-fill of its full buffer (e bytes per
    padded element written). The host then synchronises the device (partition_parameters.py @ v0.3.13
    L607-611), so its own work (fetch_host) cannot overlap this: the two are separate lists."""
    kernels = tuple(Kernel("fetch.zeros", "mem", bytes=e * n) for n in padded)
    return KernelList(f"fetch_prologue.{padded}.{nd}.{e}", kernels)


@functools.lru_cache(maxsize=4096)
def fetch_host(padded: tuple[int, ...], nd: int) -> KernelList:
    """deepspeed-0.5: the host's work before each tensor's all-gather, with the device idle after the
    synchronise: the Nd narrows of the output list (L622-627) and the rest of its Python and c10d work
    (GATHER_PYTHON_HOST_OPS, measured). Host ops only: launches × host_op_s."""
    kernels: tuple[Kernel, ...] = ()
    for _ in padded:
        kernels += (_host("fetch.narrow", nd), _host("fetch.python", GATHER_PYTHON_HOST_OPS))
    return KernelList(f"fetch_host.{padded}.{nd}", kernels)


@functools.lru_cache(maxsize=4096)
def list_copy_launches(n: int, nd: int) -> KernelList:
    """The host's launches of PyTorch's copy-out of one list all-gather of `n` elements (deepspeed-0.5's
    per-tensor gathers, deepspeed-0.2's shards after the step), Nd copies.
    c10d launches them in the collective's post hook right after enqueueing ncclAllGather
    (ProcessGroupNCCL.cpp allgather, torch 1.8: the third lambda of `collective()`,
    `outputTensors[i][j].copy_(outputFlattened[i][j], true)` per view), so the host issues them while the
    transfer runs: host ops only, on the plan's 'host' lane beside the gather (`n` keys the list)."""
    return KernelList(f"list_copy_launches.{n}.{nd}", (_host("list.copy_launch", nd),))


@functools.lru_cache(maxsize=4096)
def shard_list(nd: int) -> KernelList:
    """deepspeed-0.2, stage 2: the host's list of one all-gather shard of the updated parameters, a narrow and
    a detach per rank (deepspeed_zero_optimizer.py @ v0.2.0 step() L1165-1171:
    `partitioned_params[dp_id].narrow(0, shard_id * shard_size, num_elements).detach()`): 2·Nd host ops."""
    return KernelList(f"shard_list.{nd}", (_host("shard.narrow", nd), _host("shard.detach", nd)))


@functools.lru_cache(maxsize=4096)
def list_copy_tail(n: int, nd: int, e: int) -> KernelList:
    """The GPU's side of one list all-gather's copy-out, Nd copy kernels that read and write the tensor
    once (2·e bytes per padded element), queued behind the transfer on its stream; launched by
    `list_copy_launches`, so no host op here."""
    return KernelList(f"list_copy_tail.{n}.{nd}.{e}",
                      (Kernel("list.copy", "mem", bytes=2 * e * n, count=nd, prelaunched=True),))


# deepspeed-0.14: host ops per fetched tensor besides the unflatten's narrows, counted from the code
# (each priced at `host_op_us`, an assumption: no measurement of v0.14's hooks was found):
#   fetch_sub_module's wait loop records one CUDA event per tensor on the gather stream
#     (partitioned_param_coordinator.py @ v0.14.0 L312-314: event.record());
#   release_sub_module -> __release_param -> param.partition() -> free_param: record_stream and the
#     torch.empty(0) that replaces the data (partition_parameters.py @ v0.14.0 L277-287).
# Where they land: the host keeps at most 2 fetch events outstanding and synchronises on the oldest
# beyond that (coordinator L306-307, __max_ongoing_fetch_events = 2, L128), so it cannot run more than
# a module's gather ahead: zsim prices them with the unflatten that follows each gather on the compute
# stream, in that list's host/GPU pipeline (a host-bound fetch pays them, a large cat hides them).
V014_HOST_OPS_PER_TENSOR = 3


@functools.lru_cache(maxsize=4096)
def unflatten(padded: tuple[int, ...], nd: int, e: int) -> KernelList:
    """deepspeed-0.14: each parameter rebuilt from the coalesced gather: Nd narrows on the host and one
    torch.cat reading and writing it (2·e bytes per padded element), and the fetch and release
    bookkeeping of the hooks (V014_HOST_OPS_PER_TENSOR host ops)."""
    kernels: tuple[Kernel, ...] = ()
    for n in padded:
        kernels += (_host("fetch.narrow", nd), _host("fetch.hooks", V014_HOST_OPS_PER_TENSOR),
                    Kernel("fetch.cat", "mem", bytes=2 * e * n))
    return KernelList(f"unflatten.{padded}.{nd}.{e}", kernels)


@functools.lru_cache(maxsize=4096)
def bucket_flatten(tensors: tuple[int, ...], e: int) -> KernelList:
    """deepspeed-0.2, stage 2 without contiguous gradients: the bucket flattened by a torch.cat of its
    gradients (`flatten`, deepspeed_zero_optimizer.py @ v0.2.0 allreduce_bucket L797) and divided by Nd in
    place (`div_`, L808): two kernels, each reading and writing the bucket (2·e bytes an element)."""
    n = sum(tensors)
    return KernelList(f"bucket_flatten.{tensors}.{e}", (Kernel("reduce.flatten", "mem", bytes=2 * e * n),
                                                       Kernel("reduce.divide", "mem", bytes=2 * e * n)))


@functools.lru_cache(maxsize=4096)
def bucket_copy_back(tensors: tuple[int, ...], e: int) -> KernelList:
    """deepspeed-0.2, stage 2 without contiguous gradients: each gradient copied back from the all-reduced
    flat bucket (allreduce_and_copy L838-840: `buf.copy_(synced)` per tensor of the bucket), a copy kernel
    per tensor reading and writing it (2·e bytes an element)."""
    kernels = tuple(Kernel("reduce.copy_back", "mem", bytes=2 * e * n) for n in tensors)
    return KernelList(f"bucket_copy_back.{tensors}.{e}", kernels)


@functools.lru_cache(maxsize=4096)
def reduce_lists(padded: tuple[int, ...], nd: int, e: int) -> KernelList:
    """deepspeed-0.5: each gradient tensor's reduce-scatter input list, Nd narrows on the host, which
    PyTorch copies into a flat buffer, Nd copy kernels (2·e bytes per padded element)."""
    kernels: tuple[Kernel, ...] = ()
    for n in padded:
        kernels += (_host("reduce.narrow", nd), Kernel("reduce.list_copy", "mem", bytes=2 * e * n, count=nd))
    return KernelList(f"reduce_lists.{padded}.{nd}.{e}", kernels)
