"""Exact bytes (issue 5): per-rank model-state bytes in the trace equal the ZeRO paper's partition
formulas (Table 1, §5) for the model's Ψ, and each step's collectives move the paper's volume (§7),
with Ψ padded as DeepSpeed and the simulator pad it (zsim.zero.buckets): to whole comm intervals in
stage 1, per bucket to 2·Nd in stage 2, per tensor to Nd in stage 3."""

from __future__ import annotations

import pytest

from zsim.runtime.flat import FlatLayout
from zsim.runtime.model import GPT, gpt_config
from zsim.runtime.zero.partition import BucketPartition
from tests.runtime.conftest import TINY, tiny_model

BUCKET = 10_000  # tests/runtime/conftest.py run_config


def sizes(stage: int, nd: int) -> tuple[int, int, int]:
    """(Ψ, elements of a whole buffer as allocated, elements of one rank's partition) of the tiny
    model at `stage` on Nd = `nd` ranks."""
    units = GPT(gpt_config(tiny_model())).units
    numels = [sum(p.numel() for p in u.parameters()) for u in units]
    psi = sum(numels)
    if stage == 0:
        return psi, psi, psi
    if stage in (1, 2):  # stage 1: DeepSpeed v0.2's comm intervals; stage 2: padded buckets
        part = (BucketPartition.intervals if stage == 1 else BucketPartition.of)(numels, BUCKET, nd)
        return psi, part.total, part.shard
    layouts = [FlatLayout.of(u, nd) for u in units]
    return psi, sum(lay.padded for lay in layouts), sum(lay.shard for lay in layouts)


def paper_bytes(stage: int, precision: str, nd: int) -> dict[str, float]:
    """Per-rank model states, ZeRO paper Table 1: params es·Ψ, grads es·Ψ, optimizer K·Ψ (es = 2 and
    K = 12 mixed precision, es = 4 and K = 8 in fp32), each a partition of the padded Ψ once
    partitioned (Pos: optimizer; Pos+g: + grads; Pos+g+p: + params). Stage 1's gradients are
    autograd's, unpadded (DeepSpeed v0.2 pads only a transient flat copy for the reduction)."""
    es, k = (4, 8) if precision == "fp32" else (2, 12)
    psi, whole, part = sizes(stage, nd)
    split = {"optimizer": stage >= 1, "grads": stage >= 2, "params": stage >= 3}
    per_elem = {"params": es, "grads": es, "optimizer": k}
    unsplit = {"params": whole, "grads": psi if stage == 1 else whole, "optimizer": whole}
    return {c: per_elem[c] * (part if split[c] else unsplit[c]) for c in per_elem}


def setup_counter(trace: dict) -> dict:
    """The memory counter at the end of setup: the first one with the optimizer state allocated."""
    return next(e["args"] for e in trace["traceEvents"] if e["ph"] == "C" and e["name"] == "memory"
                and e["args"].get("optimizer", 0) > 0)


RUNS = [(s, 4, "fp32") for s in (0, 1, 2, 3)] + [(s, 2, "fp16") for s in (1, 3)] + [(2, 2, "bf16")]


def run_for(traced, stage: int, ranks: int, precision: str):
    if precision == "fp32":
        return traced(f"s{stage}r{ranks}", stage=stage, world_size=ranks)
    return traced(f"s{stage}r{ranks}{precision}", stage=stage, world_size=ranks, precision=precision)


@pytest.mark.parametrize("stage,ranks,precision", RUNS)
def test_model_state_bytes_match_paper(traced, stage, ranks, precision):
    run = run_for(traced, stage, ranks, precision)
    want = paper_bytes(stage, precision, ranks)
    for rank in range(ranks):
        counted = setup_counter(run.trace(rank))
        assert {c: counted[c] for c in want} == want, f"rank {rank}"
        recorded = run.summary["model_states"][str(rank)]
        assert {c: recorded[c]["bytes"] for c in want} == want


@pytest.mark.parametrize("stage,ranks,precision", RUNS)
def test_real_bytes_cover_psi_once(traced, stage, ranks, precision):
    """Without padding, the partitioned states of all ranks add up to exactly es·Ψ (each real
    parameter is owned once); the padding at Nd = 4 makes the padded figure larger."""
    run = run_for(traced, stage, ranks, precision)
    psi, whole, _ = sizes(stage, ranks)
    es, k = (4, 8) if precision == "fp32" else (2, 12)
    per_elem = {"params": es, "grads": es, "optimizer": k}
    split = {"optimizer": stage >= 1, "grads": stage >= 2, "params": stage >= 3}
    for category, nbytes in per_elem.items():
        reals = [run.summary["model_states"][str(r)][category]["real"] for r in range(ranks)]
        assert sum(reals) == nbytes * psi * (1 if split[category] else ranks)
    if stage and ranks == 4:
        assert whole > psi  # the tiny model really is padded at Nd = 4


def test_stage3_params_include_the_gathered_layers_while_live(traced):
    """Stage 3 params = es·Ψ/Nd plus the gathered units while they are live. With prefetch and the
    tied head (the embedding stays gathered from its forward to the head's, and from the head's
    backward to its own), the peak is base + es·(embedding + both blocks) (2 layers); after each
    step the gathered units are all released."""
    run = traced("s3r4", stage=3, world_size=4)
    layouts = [FlatLayout.of(u, 4) for u in GPT(gpt_config(tiny_model())).units]
    base = 4 * sum(lay.shard for lay in layouts)
    embed, block, _, head = (lay.padded for lay in layouts)
    for rank in range(4):
        events = run.trace(rank)["traceEvents"]
        params = [e["args"]["params"] for e in events if e["ph"] == "C" and e["name"] == "memory"]
        assert max(params) == base + 4 * (embed + 2 * block)
        assert params[-1] == base
        gathered = {p - base for p in params} - {0}
        assert 4 * embed in gathered and 4 * (embed + head) in gathered  # the tied head computes with it


@pytest.mark.parametrize("stage,ranks,precision", RUNS)
def test_collective_volume_per_step_matches_paper(traced, stage, ranks, precision):
    """ZeRO paper §7: 2Ψ per step for stages 0-2 (all-reduce = reduce-scatter + all-gather, or
    reduce-scatter of gradients + all-gather of parameters), 3Ψ for stage 3 (all-gather in forward
    and in backward, reduce-scatter of gradients), in (padded) elements x element size; plus the
    optimizer's 4-byte agreement all-reduces (gradient norm; overflow flag in mixed precision)."""
    run = run_for(traced, stage, ranks, precision)
    es = 4 if precision == "fp32" else 2
    psi = sizes(stage, ranks)[1]
    volume = es * psi * (3 if stage == 3 else 2)
    expected_ops = {0: {"all_reduce": es * psi}, 1: {"reduce_scatter": es * psi, "all_gather": es * psi},
                    2: {"reduce_scatter": es * psi, "all_gather": es * psi},
                    3: {"reduce_scatter": es * psi, "all_gather": 2 * es * psi}}[stage]
    expected_ops["checks"] = 4 if precision == "fp32" else 8
    for rank, steps in run.summary["collective_bytes"].items():
        assert len(steps) == 10
        for step, ops in steps.items():
            assert ops.pop("paper_bytes") == volume, f"rank {rank} step {step}"
            assert ops == expected_ops


def test_volume_scales_with_grad_accum_where_gradients_are_partitioned(traced):
    """With 2 micro-batches, stage 3 gathers and reduce-scatters per micro-batch: 2 x 3Ψ."""
    run = traced("accum_s3_ckpt", stage=3, world_size=2, model=tiny_model(grad_accum=2), checkpointing=True)
    psi = sizes(3, 2)[1]
    for steps in run.summary["collective_bytes"].values():
        assert {ops["paper_bytes"] for ops in steps.values()} == {2 * 3 * 4 * psi}


def local_unit_sizes(mp: int, parts: int) -> list[int]:
    """Padded elements per unit on one MP rank (Megatron split): the vocab-parallel embedding
    V·h/mp + s·h (V padded to 128·mp), block 12h²/mp + 7h/mp + 6h (QKV and fc split with their
    biases; proj weights split; the two proj biases and the two layer norms whole), the tied head's
    layer norm 2h; in stage 3 every tensor padded to a multiple of `parts`."""
    units = GPT(gpt_config(tiny_model(), mp)).units
    h, s, v = TINY["hidden"], TINY["seq_len"], gpt_config(tiny_model(), mp).vocab
    tensors = [[v * h // mp, s * h], [3 * h * h // mp, 3 * h // mp, h * h // mp, h, 4 * h * h // mp, 4 * h // mp,
                                      4 * h * h // mp, h, h, h, h, h], [h, h]]
    assert len(units) == 4
    return [sum(-(-n // parts) * parts for n in t) for t in (tensors[0], tensors[1], tensors[1], tensors[2])]


@pytest.mark.parametrize("stage", [0, 3])
def test_tensor_parallel_model_states_and_volume(traced, stage):
    """With MP 2 x DP 2, each rank's model states follow Table 1 for its own Ψ_mp, and the ZeRO
    volume per step is 2Ψ_mp (stage 0) or 3Ψ_mp (stage 3), apart from the MP all-reduces."""
    run = traced(f"mp2s{stage}r4", stage=stage, world_size=4, mp=2)
    psi = sum(local_unit_sizes(2, 2 if stage else 1))
    nd = 2 if stage == 3 else 1
    want = {"params": 4 * psi / nd, "grads": 4 * psi / nd, "optimizer": 8 * psi / nd}
    bsh = 2 * 16 * 30 * 4  # B·s·h fp32
    # per step: blocks 2 x (2 forward + 2 backward), the embedding 1 and the head 1 of B·s·h, and the
    # vocab-parallel cross-entropy's 3 all-reduces of one fp32 per token (B·s)
    mp_bytes = 2 * 4 * bsh + 2 * bsh + 3 * 2 * 16 * 4
    for rank in range(4):
        assert {c: setup_counter(run.trace(rank))[c] for c in want} == want
        for ops in run.summary["collective_bytes"][str(rank)].values():
            assert ops["paper_bytes"] == 4 * psi * (3 if stage == 3 else 2)
            assert ops["mp_all_reduce"] == mp_bytes
