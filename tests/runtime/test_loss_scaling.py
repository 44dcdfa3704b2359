"""fp16 dynamic loss scaling inside the engine (a one-rank gloo group in this process): an overflowing
step is skipped on every stage — parameters and optimizer untouched, scale halved — and the
next step trains."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from zsim.runtime.comm import Collectives
from zsim.runtime.data import global_batch, micro_batch
from zsim.runtime.ledger import MemoryLedger
from zsim.runtime.model import GPT, GPTConfig
from zsim.runtime.tracer import Tracer
from zsim.runtime.zero import ENGINES
from zsim.runtime.zero.engine import EngineOptions
from tests.runtime.conftest import TINY


@pytest.fixture
def one_rank_group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_overflow_skips_the_step_and_halves_the_scale(one_rank_group, stage):
    torch.manual_seed(0)
    cfg = GPTConfig(**{k: v for k, v in TINY.items() if k != "micro_batch"})
    tracer = Tracer(0)
    engine = ENGINES[stage](GPT(cfg), options=EngineOptions(
        precision="fp16", checkpointing=False, bucket_elements=5000, prefetch_layers=1, lr=1e-2, micro_batch=2),
        comm=Collectives(tracer), tracer=tracer, ledger=MemoryLedger(), device=torch.device("cpu"))
    tokens = global_batch(seed=0, step=0, sequences=2, seq_len=cfg.seq_len, vocab=cfg.vocab)
    batch = [micro_batch(tokens, micro=0, dp_rank=0, dp=1, size=2)]

    def snapshot() -> list[torch.Tensor]:
        params = engine.param_shards if stage == 3 else [u.param.detach() for u in engine.units]
        return [t.clone() for t in params] + [engine.optimizer.master.clone(), engine.optimizer.exp_avg.clone()]

    engine.scaler.scale = 2.0 ** 40  # fp16 gradients overflow (max 65504)
    before = snapshot()
    engine.train_step(batch, reduce_every_micro_batch=stage >= 2)
    assert engine.skipped_steps == 1 and engine.scaler.scale == 2.0 ** 39
    assert all(torch.equal(a, b) for a, b in zip(before, snapshot()))
    engine.scaler.scale = 2.0 ** 8
    engine.train_step(batch, reduce_every_micro_batch=stage >= 2)
    assert engine.skipped_steps == 1
    assert not all(torch.equal(a, b) for a, b in zip(before, snapshot()))
    skipped = [e["args"]["skipped"] for e in tracer.events if e.get("name") == "optimizer/step"]
    assert skipped == [True, False]
