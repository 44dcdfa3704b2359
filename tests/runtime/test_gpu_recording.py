"""Issue 26, GPU-correct recording, exercised on CPU: the clock chosen by device, CUDA-event spans
resolved after the step with their nesting (through a stand-in for torch.cuda that runs the work
later than the host launches it), torch's fused Adam against the chunked loop, no hidden fp32 copy in
mixed precision, and the older torch collective names."""

from __future__ import annotations

import weakref

import pytest
import torch
import torch.distributed as dist

from zsim.runtime import comm as comm_module
from zsim.runtime.clock import CudaEventClock, HostClock, clock_for
from zsim.runtime.comm import Collectives
from zsim.runtime.config import RunConfig
from zsim.runtime.data import global_batch, micro_batch
from zsim.runtime.device_facts import cuda_memory_stats, device_facts
from zsim.runtime.ledger import MemoryLedger
from zsim.runtime.model import GPT, GPTConfig
from zsim.runtime.tracer import Tracer
from zsim.runtime.zero import ENGINES
from zsim.runtime.zero.engine import EngineOptions
from zsim.runtime.zero.optimizer import FlatAdam, Segment
from zsim.errors import ConfigError
from tests.runtime.conftest import TINY


class FakeCuda:
    """torch.cuda's events and synchronize, on a device clock the test drives: an event fires at
    the device time set when it is recorded (`device_us`), not when the host records it."""

    def __init__(self):
        self.device_us = 0.0
        self.synchronized = 0

    def synchronize(self):
        self.synchronized += 1

    def Event(self, enable_timing=False):  # noqa: N802 - torch.cuda.Event's name
        cuda = self

        class Event:
            def record(self):
                self.t = cuda.device_us

            def synchronize(self):
                pass

            def elapsed_time(self, other):
                return (other.t - self.t) / 1000.0  # ms, as cudaEventElapsedTime
        return Event()


def test_the_clock_follows_the_device():
    now = iter(range(100)).__next__
    assert isinstance(clock_for("cpu", now), HostClock)
    assert isinstance(clock_for("cuda", now, cuda=FakeCuda()), CudaEventClock)


def test_cuda_spans_are_device_times_resolved_after_the_step_with_nesting():
    cuda = FakeCuda()
    tracer = Tracer(0, clock=lambda now_us: clock_for("cuda", now_us, cuda=cuda))
    anchors = cuda.synchronized
    cuda.device_us = 1000.0  # device time of the anchor (resolution is relative to it)
    tracer.begin_step(0)
    cuda.device_us = 1100.0
    outer = tracer.mark("bwd/layer.0")
    cuda.device_us = 1150.0
    with tracer.span("recompute/layer.0"):
        cuda.device_us = 1450.0  # the recompute ran 300 µs on the device
    cuda.device_us = 1500.0
    start = tracer.stamp()
    cuda.device_us = 1540.0
    tracer.complete("wait/all_gather/params.layer.0", "compute", start, tracer.stamp())
    cuda.device_us = 2100.0
    tracer.complete_span("bwd/layer.0", outer, flops=1)
    assert not [e for e in tracer.events if e.get("ph") == "X"], "nothing is resolved inside the step"
    syncs = cuda.synchronized
    tracer.flush()
    assert cuda.synchronized == syncs + 1, "one synchronize, after the step"
    spans = {e["name"]: e for e in tracer.events if e.get("ph") == "X"}
    bwd, rec, wait = spans["bwd/layer.0"], spans["recompute/layer.0"], spans["wait/all_gather/params.layer.0"]
    assert bwd["dur"] == pytest.approx(1000.0) and rec["dur"] == pytest.approx(300.0) and wait["dur"] == pytest.approx(40.0)
    assert bwd["args"]["nested_us"] == pytest.approx(340.0)  # its own compute: 660 µs
    assert rec["ts"] - bwd["ts"] == pytest.approx(50.0)
    assert all(e["args"]["timing"] == "cuda_event" for e in spans.values())
    assert "host_us" in bwd["args"] and "host_us" not in wait["args"]
    assert anchors >= 1


def test_host_clock_events_keep_their_order_and_nested_time():
    tracer = Tracer(0)
    with tracer.span("fwd/layer.0"):
        start = tracer.stamp()
        tracer.complete("all_reduce/mp.layer.0", "compute", start, start + 5.0)
    spans = [e for e in tracer.events if e.get("ph") == "X"]
    assert [e["name"] for e in spans] == ["all_reduce/mp.layer.0", "fwd/layer.0"]
    assert spans[1]["args"]["nested_us"] == pytest.approx(5.0)
    assert "timing" not in spans[1]["args"]


def test_labels_wrap_every_span():
    opened = []

    class Label:
        def __init__(self, name):
            self.name = name

        def __enter__(self):
            opened.append(("enter", self.name))

        def __exit__(self, *exc):
            opened.append(("exit", self.name))
    tracer = Tracer(0, label=Label)
    with tracer.span("fwd/embed"):
        pass
    mark = tracer.mark("bwd/head")
    tracer.complete_span("bwd/head", mark)
    assert opened == [("enter", "fwd/embed"), ("exit", "fwd/embed"), ("enter", "bwd/head"), ("exit", "bwd/head")]


def test_fused_adam_is_the_chunked_loop():
    torch.manual_seed(0)
    n = 70_000  # more than one chunk
    init = torch.randn(n)

    def run(fused: bool) -> torch.Tensor:
        param = init.to(torch.bfloat16)
        grad = torch.zeros(n, dtype=torch.bfloat16)
        opt = FlatAdam([Segment(param[:50_000], grad[:50_000], init[:50_000].clone()),
                        Segment(param[50_000:], grad[50_000:], init[50_000:].clone())],
                       ledger=MemoryLedger(), mixed=True, lr=1e-2, fused=fused)
        gen = torch.Generator().manual_seed(1)
        for _ in range(3):
            grad.copy_(torch.randn(n, generator=gen))
            opt.step()
        return opt.master
    torch.testing.assert_close(run(True), run(False), rtol=1e-6, atol=1e-7)


@pytest.fixture
def one_rank_group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("stage", [1, 2])
def test_mixed_precision_keeps_no_hidden_fp32_copy(one_rank_group, monkeypatch, stage):
    """The fp32 initial values of stages 1-2 (4 bytes a parameter beyond the ledger) are freed once
    the optimizer's master holds them."""
    from zsim.runtime.zero import stage1, stage2
    made = []
    real = stage1.flat_params

    def recording(*args, **kwargs):
        out = real(*args, **kwargs)
        made.append(weakref.ref(out))
        return out
    monkeypatch.setattr(stage1 if stage == 1 else stage2, "flat_params", recording)
    torch.manual_seed(0)
    cfg = GPTConfig(**{k: v for k, v in TINY.items() if k != "micro_batch"})
    tracer = Tracer(0)
    engine = ENGINES[stage](GPT(cfg), options=EngineOptions(
        precision="bf16", checkpointing=False, bucket_elements=5000, prefetch_layers=1, lr=1e-2, micro_batch=2),
        comm=Collectives(tracer), tracer=tracer, ledger=MemoryLedger(), device=torch.device("cpu"))
    tokens = global_batch(seed=0, step=0, sequences=2, seq_len=cfg.seq_len, vocab=cfg.vocab)
    engine.train_step([micro_batch(tokens, micro=0, dp_rank=0, dp=1, size=2)], reduce_every_micro_batch=stage >= 2)
    assert made and made[0]() is None, "the fp32 initial values outlive setup"
    assert all(s.init32 is None for s in engine.optimizer.segments)


def test_older_torch_collective_names_are_used_where_the_new_ones_are_missing():
    assert comm_module._ALL_GATHER in (getattr(dist, "all_gather_single", None), dist.all_gather_into_tensor)
    assert comm_module._REDUCE_SCATTER in (getattr(dist, "reduce_scatter_single", None), dist.reduce_scatter_tensor)


def test_memory_fraction_is_checked():
    base = dict(model=GPTConfigModel(), stage=0, world_size=1, out_dir="x", precision="fp32")
    assert RunConfig(**base, cuda_memory_fraction=0.5).cuda_memory_fraction == 0.5
    for bad in (0.0, 1.5, float("nan"), True):
        with pytest.raises(ConfigError, match="cuda_memory_fraction"):
            RunConfig(**base, cuda_memory_fraction=bad)


def GPTConfigModel():  # noqa: N802 - a model section as the runtime reads it
    from zsim.config.model_section import ModelSection
    return ModelSection(**TINY)


def test_device_facts_and_memory_stats_subset():
    facts = device_facts(torch.device("cpu"))
    assert facts["type"] == "cpu" and "cuda_build" in facts
    kept = cuda_memory_stats({"num_alloc_retries": 3, "reserved_bytes.all.peak": 10, "unrelated": 1})
    assert kept == {"num_alloc_retries": 3, "reserved_bytes.all.peak": 10}
