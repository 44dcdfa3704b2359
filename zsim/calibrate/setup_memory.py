"""What a GPU run's setup leaves allocated beyond the ledger's model states (`metadata.cuda_setup` of a
runtime trace on CUDA: `torch.cuda.memory_allocated()` after setup against the ledger's bytes).

The ledger counts tensor bytes; `memory_allocated` counts the caching allocator's blocks. A request of
10 MiB or more gets a segment of its size rounded up to 2 MiB (kRoundLarge), and the block is split only
when more than 1 MiB (kSmallSize) would be left (should_split): a tensor whose size leaves at most 1 MiB
to the next 2 MiB keeps the whole segment, and memory_allocated counts it
(c10/cuda/CUDACachingAllocator.cpp; zsim.memory.allocator models these rules). On the 2026-11-26 H200
runs (data/device/20261126-h200) that rounding is the whole excess but 512 bytes:

| run | excess | rounding | which tensors |
|---|---|---|---|
| h1024 (stage 1) | 2,777,600 B | 2,777,088 B | the three fp32 optimizer tensors (master, exp_avg, exp_avg_sq), 925,696 B each |
| h2048 (stage 3) | 541,184 B | 540,672 B | the same three, 180,224 B each |
| h4096 (stage 2) | 1,212,928 B | 1,212,416 B | the bf16 parameters and gradients, 606,208 B each |

The 512 bytes left are one smallest block (kMinBlockSize: any tensor of at most 512 B) that is already
allocated at the first ledger change, before the engine allocates anything: a tensor made between the
process group's start and the model's setup that stays referenced. Candidates are the clock-offset
exchange's 8-byte tensors (runtime/worker.py `_clock_offset_us`) and the 4-byte tensor c10d's NCCL
barrier all-reduces; these data do not tell them apart.
"""

from __future__ import annotations

from typing import Any

from zsim.memory.allocator import CachingAllocator


def model_state_tensors(meta: dict[str, Any]) -> list[int]:
    """Bytes of each model-state tensor the runtime allocates in setup, from a trace's metadata: the
    flat parameters (stage 3: one shard per unit, from `unit_shard_bytes`), the flat gradients and the
    optimizer's flat fp32 states (master, exp_avg, exp_avg_sq in mixed precision; two in fp32)."""
    ledger = meta["cuda_setup"]["ledger"]
    states = 3 if meta.get("precision", "fp32") != "fp32" else 2
    params = meta.get("unit_shard_bytes") or [ledger["params"]]
    return [*params, ledger["grads"], *[ledger["optimizer"] // states] * states]


def unit_shard_bytes(events: list[dict[str, Any]], world: int) -> list[int]:
    """Stage 3: each unit's parameter shard in bytes, from the first step's parameter all-gathers (one per
    unit: `all_gather/params.<unit>`, each gathering `world` shards)."""
    seen: dict[str, int] = {}
    for e in events:
        if e.get("ph") == "X" and e["name"].startswith("all_gather/params.") and e.get("args", {}).get("step") == 0:
            seen.setdefault(e["name"], int(e["args"]["bytes"]) // world)
    return list(seen.values())


def rounding_excess(tensors: list[int]) -> int:
    """Bytes torch.cuda.memory_allocated counts beyond `tensors` (bytes each) when each is allocated
    from a fresh segment (zsim.memory.allocator.CachingAllocator: 512-byte rounding, 2 MiB segment
    rounding, no split when at most 1 MiB would be left)."""
    allocator = CachingAllocator(capacity=1 << 62)
    for i, nbytes in enumerate(tensors):
        allocator.malloc(f"t{i}", nbytes)
    return allocator.allocated - sum(tensors)


def setup_excess(doc: dict[str, Any]) -> dict[str, int]:
    """{'excess': what setup left allocated beyond the ledger, 'rounding': the caching allocator's share
    of it (rounding_excess of the model-state tensors), 'rest': the difference}, bytes, for a runtime
    trace document of a CUDA run (its metadata's cuda_setup)."""
    meta = dict(doc["metadata"])
    setup = meta["cuda_setup"]
    if meta.get("zero", {}).get("stage") == 3:
        meta["unit_shard_bytes"] = unit_shard_bytes(doc["traceEvents"], int(meta.get("dp", 1)))
    excess = int(setup["allocated"]) - int(setup["ledger_total"])
    rounding = rounding_excess(model_state_tensors(meta))
    return {"excess": excess, "rounding": rounding, "rest": excess - rounding}
