"""In-process unit tests of the runtime's pieces (no process group needed)."""

from __future__ import annotations

import json

import pytest
import torch

from zsim.runtime.data import global_batch, micro_batch
from zsim.runtime.flat import FlatLayout
from zsim.runtime.zero.partition import BucketPartition
from zsim.zero.buckets import padded_bucket, padded_tensors
from zsim.runtime.ledger import MemoryLedger
from zsim.runtime.merge import fill_last_arrival, step_volumes
from zsim.runtime.model import GPT, GPTConfig, forward_flops
from zsim.runtime.zero.activations import SavedTensors
from zsim.runtime.zero.buckets import plan_buckets
from zsim.runtime.zero.loss_scaler import DynamicLossScaler
from zsim.runtime.zero.optimizer import FlatAdam, Segment

CFG = GPTConfig(layers=2, hidden=32, heads=2, seq_len=16, vocab=63)


def test_buckets_cover_units_once_in_backward_order():
    elements = [5, 40, 40, 40, 7]
    buckets = plan_buckets(elements, capacity=50)
    assert buckets == [[2, 3, 4], [0, 1]]
    assert sorted(u for b in buckets for u in b) == list(range(5))
    assert plan_buckets(elements, capacity=10**9) == [[0, 1, 2, 3, 4]]


def test_flat_layout_pads_and_shards_exactly():
    """Stage 3's layout pads every tensor to a multiple of Nd on its own (DeepSpeed ZeRO-3,
    zsim.zero.buckets.padded_tensors); rank-major rows hold each rank's chunk of every tensor."""
    block = GPT(CFG).units[1]
    layout = FlatLayout.of(block, parts=5)
    assert layout.numel == 12 * 32 * 32 + 13 * 32 == sum(p.numel() for p in block.parameters())
    assert layout.padded == padded_tensors([p.numel() for p in block.parameters()], 5)
    assert all(n % 5 == 0 for n in layout.padded_numels) and layout.padded % 5 == 0
    assert sum(layout.shard_real(r) for r in range(5)) == layout.numel
    flat = layout.flatten(block)
    views = layout.views(flat)
    for name, p in block.named_parameters():
        assert torch.equal(views[name], p.detach())
    assert flat.count_nonzero() == sum(p.count_nonzero() for p in block.parameters())
    rows = layout.rank_major(flat)
    assert rows.shape == (5, layout.shard)
    back = torch.empty_like(flat)
    layout.from_rank_major(rows, back)
    assert torch.equal(back, flat)


def test_bucket_partition_pads_each_bucket_to_2nd():
    part = BucketPartition.of([4320, 11190, 11190, 60], capacity=10_000, nd=4)
    assert part.buckets == [[2, 3], [1], [0]]
    assert part.bucket_padded == [padded_bucket(n, 4) for n in (11250, 11190, 4320)]
    assert all(n % 8 == 0 for n in part.bucket_padded) and part.total == sum(part.bucket_padded)
    assert part.unit_offset[0] == 0 and part.unit_offset[1] == part.bucket_padded[2]
    assert sum(part.shard_real(r) for r in range(4)) == 4320 + 2 * 11190 + 60


def test_rank_slices_partition_the_global_batch():
    tokens = global_batch(seed=3, step=7, sequences=12, seq_len=16, vocab=63)
    assert torch.equal(tokens, global_batch(seed=3, step=7, sequences=12, seq_len=16, vocab=63))
    rows = [micro_batch(tokens, micro=m, dp_rank=d, dp=3, size=2)[0] for m in range(2) for d in range(3)]
    assert torch.equal(torch.cat(rows), tokens[:, :-1])
    inputs, targets = micro_batch(tokens, micro=0, dp_rank=1, dp=3, size=2)
    assert torch.equal(inputs[:, 1:], targets[:, :-1])


@pytest.mark.parametrize("chunk", (65536, 16, 7), ids=("one-chunk", "chunks-of-16", "chunks-of-7"))
def test_flat_adam_matches_torch_adam(chunk):
    """Bit for bit, whether a segment is updated in one pass or in chunks (runtime/zero/optimizer.py)."""
    torch.manual_seed(0)
    n = 150
    init = torch.randn(n)
    param, ref = init.clone(), torch.nn.Parameter(init.clone())
    grad = torch.zeros(n)
    opt = FlatAdam([Segment(param[:20], grad[:20], init[:20]), Segment(param[20:], grad[20:], init[20:])],
                   ledger=MemoryLedger(), mixed=False, lr=1e-2, chunk=chunk)
    torch_opt = torch.optim.Adam([ref], lr=1e-2, foreach=False)
    for _ in range(5):
        g = torch.randn(n)
        grad.copy_(g)
        ref.grad = g.clone()
        opt.step()
        torch_opt.step()
    assert torch.equal(param, ref.detach())


def test_mixed_precision_adam_keeps_fp32_master():
    init = torch.linspace(-1, 1, 8)
    param, grad = init.to(torch.float16), torch.full((8,), 1024.0, dtype=torch.float16)
    ledger = MemoryLedger()
    opt = FlatAdam([Segment(param, grad, init)], ledger=ledger, mixed=True, lr=1e-4)
    assert ledger.bytes["optimizer"] == 12 * 8  # master + exp_avg + exp_avg_sq, fp32
    opt.step(inv_scale=1 / 1024)
    assert opt.master.dtype == torch.float32
    assert torch.allclose(opt.master, init - 1e-4, atol=1e-7)  # Adam's first step moves lr x sign(g)
    assert torch.equal(param, opt.master.to(torch.float16))
    grad[3] = float("inf")
    assert opt.found_overflow()


def test_loss_scaler_halves_on_overflow_and_grows_after_a_window():
    scaler = DynamicLossScaler(scale=8.0, window=2)
    scaler.update(overflow=True)
    assert scaler.scale == 4.0
    scaler.update(overflow=False)
    scaler.update(overflow=False)
    assert scaler.scale == 8.0


def test_saved_tensor_hooks_count_activations_not_parameters():
    weight = torch.randn(8, 8, requires_grad=True)
    saved = SavedTensors(lambda ptr: 0 if ptr == weight.untyped_storage().data_ptr() else None)
    saved.current = 0
    x = torch.randn(4, 8, requires_grad=True)
    with saved.hooks():
        y = torch.tanh(x @ weight)  # saves x, weight (a parameter) and tanh's output
    assert saved.total == x.nbytes + y.nbytes
    saved.release(0)
    assert saved.total == 0


def test_ledger_tracks_peaks_and_refuses_negative():
    seen = []
    ledger = MemoryLedger(on_change=seen.append)
    ledger.add("params", 10)
    ledger.add("buffers", 5)
    ledger.add("buffers", -5)
    assert ledger.peak_total == 15 and ledger.bytes["buffers"] == 0 and len(seen) == 3
    with pytest.raises(AssertionError):
        ledger.add("grads", -1)


def test_forward_flops_cite_megatron_formula():
    assert forward_flops(CFG, 0, micro_batch=2) == 24 * 2 * 16 * 32 * 32 + 4 * 2 * 16 * 16 * 32
    assert forward_flops(CFG, "head", micro_batch=2) == 2 * 2 * 16 * 32 * 63
    assert forward_flops(CFG, "embed", micro_batch=2) == 0


def test_merge_fills_last_arrival_on_each_ranks_clock():
    def doc(rank, offset, ts):
        event = {"ph": "X", "cat": "comm", "pid": rank, "name": "all_reduce/grads.bucket.0", "ts": ts, "dur": 50.0,
                 "args": {"op": "all_reduce", "bytes": 8, "group": [0, 1], "seq": 0, "step": 0, "micro_batch": 0}}
        return {"metadata": {"rank": rank, "clock_offset_us": offset}, "traceEvents": [event]}
    traces = {0: doc(0, 0.0, 100.0), 1: doc(1, 1000.0, -880.0)}  # rank 1 arrives at 120 on rank 0's clock
    assert fill_last_arrival(traces) == 2
    assert traces[0]["traceEvents"][0]["args"]["last_arrival_ts"] == 120.0
    assert traces[1]["traceEvents"][0]["args"]["last_arrival_ts"] == -880.0
    # rank 0 waited 20 µs for rank 1: its own event; rank 1 arrived last and did not wait
    assert [(e["name"], e["ts"], e["dur"]) for e in traces[0]["traceEvents"][1:]] == [
        ("wait/arrival/all_reduce/grads.bucket.0", 100.0, 20.0)]
    assert len(traces[1]["traceEvents"]) == 1
    assert fill_last_arrival(traces) == 2 and len(traces[0]["traceEvents"]) == 2  # merging twice adds nothing
    assert step_volumes(traces[0]) == {0: {"all_reduce": 8, "paper_bytes": 16}}
    json.dumps(traces)  # still plain JSON


def test_host_adam_kernel_list_counts_the_runtimes_aten_ops():
    """The simulator prices a CPU host's update by the runtime's chunked ops
    (zsim.compute.optimizer_kernels.host_adam_kernels): count the compute ops FlatAdam.step really dispatches
    (views and slices are free) against the kernel list's launches."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from zsim.compute.optimizer_kernels import HOST_ADAM_CHUNK, host_adam_kernels

    free = {"slice", "view", "alias", "detach", "empty", "as_strided", "_to_copy", "lift_fresh"}

    class Count(TorchDispatchMode):
        ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.__name__.split(".")[0] not in free:
                Count.ops += 1
            return func(*args, **(kwargs or {}))

    sizes = [HOST_ADAM_CHUNK * 2 + 100, 1000]  # two segments: 3 chunks and 1
    segments = [Segment(torch.zeros(n), torch.ones(n), torch.zeros(n)) for n in sizes]
    adam = FlatAdam(segments, ledger=MemoryLedger(), mixed=False, lr=1e-3)
    grads = [s.grad for s in segments]
    with Count():
        adam.step(grads=grads)
    kernels = host_adam_kernels(sum(sizes), len(sizes))
    assert Count.ops == kernels.launches == 7 * 4
