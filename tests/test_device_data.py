"""The device-check data (data/device/, issue 26) replayed on CPU: provenance is complete, the runtime's
ledger is what the GPU allocated for the model states (no hidden copy), the GEMM model fitted on
DeepBench's shapes predicts the traced GPT shapes it never saw, zsim's allocator against the measured
peaks, and the price of an allocator flush. Skips when data/device/ holds no run.

The criteria were fixed before the data were read: model states within 1% of what setup allocated
(a hidden per-parameter copy of even 1 byte would be +6%); the GEMM model's held-out median within
10% (the criterion the V100 fit is held to, docs/compute.md); the reserved peak within 5% (issue 26)."""

from __future__ import annotations

import functools
import math
from pathlib import Path

import pytest

from zsim.calibrate import device_report as dr

ROOT = Path(__file__).resolve().parents[1]
RUNS = dr.device_runs(ROOT / "data" / "device")
TRACED = [r for r in RUNS if {"h1024", "h2048", "h4096"} <= set(r.parts)]  # the plain (profiler-free) runs
GEMM = [r for r in RUNS if "gemm" in r.parts and not r.manifest["provenance"]["dry_run"]]

pytestmark = pytest.mark.skipif(not RUNS, reason="no device-check data in data/device/ (make device-check)")


@pytest.mark.parametrize("run", RUNS, ids=lambda r: r.folder.name)
def test_provenance_names_the_machine_and_the_software(run):
    prov = run.manifest["provenance"]
    assert prov["date"] and prov["torch"] and prov["commit"]
    device = prov["device"]
    assert device["type"] == "cuda" and device["gpu"] and device["driver"] and device["nccl"] and device["cuda_build"]


@pytest.mark.parametrize("run", TRACED, ids=lambda r: r.folder.name)
def test_the_ledger_is_what_setup_allocated(run):
    for shape in ("h1024", "h2048", "h4096"):
        mem = dr.measured_memory(run, shape)
        extra = mem["setup_allocated"] - mem["ledger_model_states"]
        assert 0 <= extra <= 0.01 * mem["ledger_model_states"], (shape, extra)


@pytest.mark.parametrize("run", GEMM, ids=lambda r: r.folder.name)
@pytest.mark.parametrize("dtype", [
    pytest.param("bf16", marks=pytest.mark.xfail(strict=True, reason=(
        "a known out-of-sample miss: 11.5% median on the 15 GPT shapes (fp16 passes); docs/device-check.md"))),
    "fp16"])
def test_gemm_model_predicts_the_gpt_shapes_it_never_saw(run, dtype):
    if not run.folder.name.endswith("-gemm"):
        pytest.skip("eagerly timed table: host-bound below ~20 us (data/device/README.md)")
    report = dr.gemm_holdout(run, dtype, "h200-sxm-141gb")
    assert report["test_rows"] == 15 and report["train_rows"] == 160
    assert report["heldout_median_abs"] <= 0.10, report


@pytest.mark.parametrize("run", TRACED, ids=lambda r: r.folder.name)
def test_a_flush_is_priced_from_runs_that_retried_against_capped_controls(run):
    price = dr.flush_price(run)
    assert price["runs_with_retries"] >= 1 and price["controls"] >= 1
    assert math.isfinite(price["ms_per_retry"])
    assert any(r["exit"] != 0 for r in price["runs"]), "the tightest caps ran out of memory"


@functools.lru_cache(maxsize=None)
def _simulated(folder: Path, shape: str) -> dict:
    return dr.simulated_memory(dr.DeviceRun.read(folder), shape, "hgx-h200")


# zsim's caching allocator against the measured peaks, each run rebuilt as the runtime ran it (no dropout,
# fused attention on the GPU: zsim.calibrate.rebuild.runtime_model_options). Every point is kept; the
# ones that miss the 5% target are strict xfails with the measured error (docs/device-check.md).
def _miss(reason: str):
    return pytest.mark.xfail(strict=True, reason=reason)


@pytest.mark.parametrize("shape,quantity", [
    ("h1024", "allocated_peak"),  # -0.0% (2026-11-27: the runtime's loss, gradients and step temporaries)
    ("h1024", "reserved_peak"),  # -0.1%: autograd's cuBLAS workspace splits a freed 1.6 GB block, as measured
    ("h2048", "allocated_peak"),  # -0.8%: stage 3, the bucket taken after the module's backward
    ("h2048", "reserved_peak"),  # +0.0%: one fp32 gradient copy per unit
    ("h4096", "allocated_peak"),  # -0.0%: the runtime's after-step shards, three 1,020 MB buffers live
    ("h4096", "reserved_peak"),  # -0.0%: the norm's fp64 copy of a 604M-element segment sets it
])
@pytest.mark.parametrize("run", TRACED, ids=lambda r: r.folder.name)
def test_simulated_allocator_peaks_within_5_percent(run, shape, quantity):
    """Both as torch.cuda counts them: zsim's memory outside the allocator (the CUDA context, 0.77 GB on one
    GPU) is left out of its peaks, as torch.cuda.memory_stats() leaves it out (device_report.simulated_memory)."""
    measured = dr.measured_memory(run, shape)[quantity]
    simulated = _simulated(run.folder, shape)[quantity]
    assert simulated == pytest.approx(measured, rel=0.05)


# Shapes chosen before they were measured (runtime/device_check.py HOLDOUT_SETS). Set 1 came after the first
# round of the runtime mirror; its stage-3 miss then (+6.5/+12.0%) led to the second round, so it is in sample
# now. Set 2 came after the second round, and nothing was changed on seeing it: 5 of 6 within 5%, h2304's
# reserved peak -5.3%. Its history then showed why (the head's requests in another order: a second 1.24 GB
# segment in the runtime), and the order was mended (commit after ac0386f): set 2 is in sample now too, and
# set 3 (chosen before any run of it) waits for the next GPU. Before the mirror (commit fb3b672) zsim gave
# +2.0/+0.6% (h1536), +2.6/+17.9% (h2560), +13.1/+19.0% (h3072), +1.8/-0.3% (h1280), +6.7/+7.5% (h2304),
# -8.7/-9.7% (h3584).
@pytest.mark.parametrize("folder,shape,quantity", [
    ("holdout", "h1536", "allocated_peak"),  # stage 2: -0.3%
    ("holdout", "h1536", "reserved_peak"),  # -0.2%
    ("holdout", "h2560", "allocated_peak"),  # stage 3 with checkpointing: -1.4%
    ("holdout", "h2560", "reserved_peak"),  # -0.1%
    ("holdout", "h3072", "allocated_peak"),  # stage 1 with checkpointing: -0.3%
    ("holdout", "h3072", "reserved_peak"),  # -0.0%
    ("holdout2", "h1280", "allocated_peak"),  # stage 3: -0.6%
    ("holdout2", "h1280", "reserved_peak"),  # +0.5%
    ("holdout2", "h2304", "allocated_peak"),  # stage 1: -0.2%
    ("holdout2", "h2304", "reserved_peak"),  # -0.0% (-5.3% held out, before the head's order was mended)
    ("holdout2", "h3584", "allocated_peak"),  # stage 2 with checkpointing: -0.0%
    ("holdout2", "h3584", "reserved_peak"),  # -0.0%
])
def test_holdout_sets_peaks_within_5_percent(folder, shape, quantity):
    path = ROOT / "data" / "device" / f"20261127-h200-{folder}"
    if not path.is_dir():
        pytest.skip(f"no {path.name} in data/device/")
    run = dr.DeviceRun.read(path)
    measured = dr.measured_memory(run, f"{shape}-memhist")[quantity]
    simulated = dr.simulated_memory(run, f"{shape}-memhist", "hgx-h200")[quantity]
    assert simulated == pytest.approx(measured, rel=0.05)


@pytest.mark.parametrize("run", TRACED, ids=lambda r: r.folder.name)
@pytest.mark.parametrize("shape", ["h1024", "h2048", "h4096"])
def test_the_setup_residue_is_what_the_runtime_left_cached(run, shape):
    """zero.setup_residue 'runtime' (set by the rebuild of a runtime run on a GPU): the blocks the runtime's
    setup frees and torch keeps cached, reserved − allocated after setup, as measured (cuda_setup) within 5%:
    its fp32 initial values per module, and the fp32 flat copy at stages 1-2 (1.66, 2.07 and 8.17 GB here);
    measured on the setup alone (the step's first requests at the same instant would take cached blocks)."""
    from zsim.calibrate.rebuild import rebuild
    from zsim.engine.simulation import workload_and_plan
    from zsim.memory.allocator import CachingAllocator
    from zsim.trace.run_reader import read_run

    measured_run = read_run(run.run_dir(shape))
    scenario = rebuild(measured_run, "hgx-h200")
    assert scenario.zero.setup_residue == "runtime"
    plan = workload_and_plan(scenario)[1]
    allocator = CachingAllocator(capacity=1 << 62)  # setup alone, as the simulation runs it before step 0
    for a in plan.setup + plan.persistent:
        allocator.malloc(a.tag, a.nbytes)
    for a in plan.setup:
        allocator.free(a.tag)
    simulated = allocator.reserved - allocator.allocated  # after setup: the cached blocks
    setup = measured_run.metadata["cuda_setup"]
    assert simulated == pytest.approx(setup["reserved"] - setup["allocated"], rel=0.05)


@pytest.mark.parametrize("run", TRACED, ids=lambda r: r.folder.name)
def test_stage3_steps_leave_the_gpu_waiting_for_the_host(run):
    """Measured, not modelled yet (issue 25): the one-GPU stage-3 run's device-timed spans cover under
    60% of its steps; the stage-1/2 runs, over 75%."""
    assert max(dr.gpu_busy_share(run, "h2048")) < 0.6
    assert min(dr.gpu_busy_share(run, "h1024")) > 0.75 and min(dr.gpu_busy_share(run, "h4096")) > 0.75


KINETO = [r for r in RUNS if any(k.endswith("-kineto") for k in r.parts)]


def _kineto_files(run):
    return sorted((run.folder / "runs").glob("*-kineto/rank0.kineto.json.gz"))


@pytest.mark.parametrize("run", KINETO, ids=lambda r: r.folder.name)
def test_kineto_traces_carry_zsims_labels(run):
    """Every profiled run's GPU kernels fall under zsim's op names (record_function labels)."""
    import gzip
    import json

    for path in _kineto_files(run):
        events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
        names = {e.get("name") for e in events if e.get("cat") == "user_annotation"}
        assert {"fwd/layer.0", "bwd/layer.0", "optimizer/step"} <= names, path


def test_hta_breaks_down_a_gpu_kineto_trace(tmp_path):
    """Holistic Trace Analysis loads a profiled H200 run (ProfilerStep spans since commit 23cc782) and
    its temporal and kernel breakdowns run (issue 26); skipped where HTA is not installed."""
    import gzip

    hta = pytest.importorskip("hta.trace_analysis")
    traces = [p for r in KINETO for p in _kineto_files(r) if b"ProfilerStep#" in gzip.decompress(p.read_bytes())]
    if not traces:
        pytest.skip("no profiled run with ProfilerStep spans in data/device/")
    (tmp_path / "rank0.kineto.json").write_bytes(gzip.decompress(traces[0].read_bytes()))
    analysis = hta.TraceAnalysis(trace_dir=str(tmp_path))
    temporal = analysis.get_temporal_breakdown(visualize=False)
    assert float(temporal["compute_time_pctg"].iloc[0]) > 0
    kernels = analysis.get_gpu_kernel_breakdown(visualize=False)[0]
    assert "COMPUTATION" in set(kernels["kernel_type"])


# The GPU runs under the runtime mirror carry memory-only ops (`bwd/head.cast`, `bwd/head.logits`, stage 3's
# `bucket/<module>`) that launch no kernel and have no span: the Kineto calibration and the trace-driven
# replay line up every other op and leave those out. Until 2026-11-27 (fourth session) both refused the runs
# ("not labelled", "no measured counterpart"), from the day the mirror split the head's backward.
H200_RUNS = ROOT / "data" / "device" / "20261126-h200" / "runs"


def _zsim(*args):
    import subprocess
    import sys
    return subprocess.run([sys.executable, "-m", "zsim.cli", *args], capture_output=True, text=True, cwd=ROOT)


@pytest.mark.skipif(not (H200_RUNS / "h1024-kineto").is_dir(), reason="no Kineto runs in data/device/")
def test_the_kineto_calibration_reaches_its_fit_on_the_gpu_runs(tmp_path):
    """It fits and refuses the fit as poor, naming the cause (docs/device-check.md: reduce_kernel_us 9.4x the
    base's)."""
    out = _zsim("calibrate", str(H200_RUNS / "h1024-kineto"), str(H200_RUNS / "h4096-kineto"), "--profile", "hgx-h200",
                "-o", str(tmp_path / "p.yaml"))
    assert out.returncode == 2 and "poor fit" in out.stderr and "reduce_kernel_us" in out.stderr, out.stderr
    assert "not labelled" not in out.stderr


@pytest.mark.skipif(not (H200_RUNS / "h1024").is_dir(), reason="no device runs in data/device/")
def test_the_trace_driven_replay_lines_up_every_op_of_a_gpu_run(tmp_path):
    out = _zsim("replay", str(H200_RUNS / "h1024"), "--profile", "hgx-h200", "--trace-driven", "-o", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "measured only 0, simulated only 0" in out.stdout


@pytest.mark.skipif(not (H200_RUNS / "h2048-kineto").is_dir(), reason="no Kineto runs in data/device/")
def test_the_kineto_fit_held_out_on_h2048_is_what_the_docs_quote():
    """docs/device-check.md quotes the Kineto split (benchmarks/gpu_span_holdout.py): fitted on h1024 and h4096's
    kernels, no term on a bound; on h2048's, which the fit never saw, a median 12.4% per op and the ops' sum
    +10.5% with the runtime's own kernel lists (model.kernels pytorch-2 and its step; 12.4% and -1.3% with
    Megatron's and DeepSpeed's, whose per-tensor step checks had pinned reduce_kernel_us)."""
    from zsim.calibrate.gpu_phase_fit import kineto_heldout
    from zsim.fabric.cluster import load_cluster
    from zsim.trace.run_reader import read_run

    runs = [read_run(H200_RUNS / n) for n in ("h1024-kineto", "h4096-kineto", "h2048-kineto")]
    report = kineto_heldout(load_cluster("hgx-h200", 1), runs[:2], runs[2], "hgx-h200")
    assert not report["summary"].get("at_bounds") and report["ops"] == 72
    assert report["median_error"] == pytest.approx(0.124, abs=0.001)
    assert report["total_error"] == pytest.approx(0.105, abs=0.001)
