"""Invariants of whole simulations (property tests) and the paper's communication volumes."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import small_scenario
from zsim.engine.simulation import simulate
from zsim.report.facts import dp_volume_bytes
from zsim.zero.model_states import model_states
from zsim.zero.plan import rank_pieces

scenarios = st.fixed_dictionaries({
    "stage": st.integers(0, 3),
    "layers": st.integers(1, 4),
    "micro_batch": st.integers(1, 4),
    "mp": st.sampled_from([1, 2, 4]),
    "ckpt": st.booleans(),
    "accum": st.integers(1, 3),
    "steps": st.integers(1, 2),
    "bucket": st.sampled_from([10_000, 10**9]),
})


def build(p):
    dp = 32 // p["mp"]
    return small_scenario(
        model={"layers": p["layers"], "micro_batch": p["micro_batch"], "grad_accum": p["accum"]},
        parallel={"dp": dp, "mp": p["mp"]},
        zero={"stage": p["stage"], "activation_checkpointing": p["ckpt"], "reduce_bucket_elements": p["bucket"]},
        run={"steps": p["steps"]},
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(p=scenarios)
def test_simulation_invariants(p):
    s = build(p)
    r = simulate(s)
    # Step time is at least the pure compute time (communication can only add).
    assert r.total_seconds >= r.compute_seconds * (1 - 1e-12)
    assert all(t > 0 for t in r.step_seconds)
    # Memory never goes negative, and every allocation but the parameters, the optimizer states and the
    # context is freed by the end (DeepSpeed frees the fp16 gradients in the step).
    times, rows = r.ledger.timeline()
    assert (rows >= 0).all() and (np.diff(times) > 0).all()
    states = r.model_states  # the plan's layout (stage 1-2 pieces, zsim.zero.buckets.flat_pieces)
    if s.zero.stage in (0, 3):
        assert states == model_states(r.workload.params_per_mp_rank, s.layout.dp, s.zero.stage, "fp16",
                                      tensors=r.workload.tensors)
    assert dict(zip(("params", "grads", "optimizer", "activations", "buffers", "context"), rows[-1].tolist())) == {
        "params": states.params, "grads": 0, "optimizer": states.optimizer,
        "activations": 0, "buffers": 0, "context": r.ledger.totals["context"]}
    assert r.ledger.peak >= states.total
    # DP traffic per step, in the paper's convention (ZeRO §7): 2Ψ for stages 0-2, 3Ψ for stage 3,
    # per micro-batch where the stage reduces every micro-batch.
    # Plus the optimizer's two 4-byte all-reduces (overflow flag, gradient norm), 2 × 4 bytes each.
    psi_bytes = 2 * r.workload.params_per_mp_rank
    if s.zero.stage in (1, 2):  # whole padded pieces: stage 1 comm intervals, stage 2 buckets
        psi_bytes = 2 * sum(rank_pieces(s, r.workload))
    per_step = {0: 2, 1: 2, 2: 1 + p["accum"], 3: 3 * p["accum"]}[s.zero.stage]
    assert dp_volume_bytes(r) == per_step * psi_bytes + 2 * 2 * 4


@settings(max_examples=20, deadline=None)
@given(layers=st.integers(1, 4), mp=st.sampled_from([1, 2, 4]))
def test_model_state_peaks_fall_with_stage(layers, mp):
    totals = []
    for stage in range(4):
        r = simulate(small_scenario(model={"layers": layers}, parallel={"dp": 32 // mp, "mp": mp}, zero={"stage": stage}))
        totals.append(r.model_states.total)
        # at the end: parameters and optimizer states (the step freed the gradients) and the context
        states = r.model_states
        assert sum(r.ledger.rows[-1]) == states.params + states.optimizer + r.ledger.totals["context"]
    assert totals[0] >= totals[1] >= totals[2] >= totals[3]


def test_stage3_frees_gathered_parameters_and_prefetches_one_layer():
    r = simulate(small_scenario(model={"layers": 4}, zero={"stage": 3, "prefetch_layers": 1}))
    gathers = [e for e in r.events if e["name"].startswith("all_gather/params.layer")]
    forwards = {e["name"]: e for e in r.events if e["name"].startswith("fwd/layer")}
    assert len(gathers) == 2 * 4  # before forward and again before backward
    # Layer 2's gather starts only after layer 0's forward ends (one layer of prefetch).
    g2 = next(e for e in gathers if e["name"] == "all_gather/params.layer.2")
    assert g2["ts"] >= forwards["fwd/layer.0"]["ts"] + forwards["fwd/layer.0"]["dur"] - 1e-6


def test_compute_and_dp_communication_overlap():
    """Stage 3 gathers of the next layer run while the current layer computes, and gradient buckets
    of about a layer are reduce-scattered while backward goes on: the step is shorter than its
    compute, MP all-reduces (in line) and DP collectives one after another."""
    r = simulate(small_scenario(model={"layers": 4, "hidden": 1024, "heads": 16},
                                zero={"stage": 3, "reduce_bucket_elements": 3_000_000}))
    serial = r.compute_seconds + sum(c.seconds for c in r.comm.values())
    assert r.total_seconds < serial


def test_steps_repeat_identically():
    r = simulate(small_scenario(run={"steps": 3}))
    assert r.step_seconds[1] == pytest.approx(r.step_seconds[2], rel=1e-9)


def test_oom_names_time_category_and_allocation():
    r = simulate(small_scenario(model={"layers": 36, "hidden": 4096, "heads": 32, "micro_batch": 72},
                                parallel={"dp": 32, "mp": 1}, zero={"stage": 1}))
    oom = r.ledger.oom
    assert oom is not None and not r.fits
    assert oom.total_bytes > oom.capacity_bytes == r.scenario.cluster.gpu.memory_bytes
    assert oom.category in ("activations", "buffers", "grads", "params") and oom.time_s > 0


def test_the_one_progress_display_is_a_tqdm_bar_in_class_mode_too(capsys):
    """issue 28 part 7: zsim run's threaded ticker is gone; simulate's tqdm bar (stderr) serves both modes."""
    from pathlib import Path

    from zsim.scenario.scenario import load_scenario

    simulate(load_scenario(Path(__file__).resolve().parents[1] / "scenarios" / "1T-1024gpu.yaml"), mode="class", progress=True)
    err = capsys.readouterr().err
    assert "simulating 1024 ranks" in err and "ops" in err
    simulate(load_scenario(Path(__file__).resolve().parents[1] / "scenarios" / "1T-1024gpu.yaml"), mode="class")
    assert capsys.readouterr().err == ""
