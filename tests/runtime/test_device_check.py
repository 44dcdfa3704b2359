"""`make device-check --dry-run` (issue 26): the device check's own code runs on this CPU with tiny
shapes and writes everything a GPU run writes, with provenance; CI runs it so that the script is known
to work before a GPU is lent."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest

from zsim.runtime import device_check


@pytest.mark.slow
def test_dry_run_writes_every_part(tmp_path):
    shapes = tmp_path / "shapes.csv"
    shapes.write_text("source,M,N,K,transA,transB,time_ms,tflops\nDeepSpeech,1760,16,1760,N,T,0.02,1\n")
    out = tmp_path / "dc"
    proc = subprocess.run([sys.executable, "-m", "zsim.runtime.device_check", "--dry-run", "-o", str(out),
                           "--gemm-shapes", str(shapes)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    prov = manifest["provenance"]
    assert prov["dry_run"] is True and prov["held_out"] == device_check.HELD_OUT and prov["date"]
    parts = manifest["parts"]
    for shape in device_check.DRY_SHAPES:
        assert parts[shape.name]["exit"] == 0
        assert len(parts[shape.name]["step_seconds"]) == device_check.STEPS
        assert (out / "runs" / shape.name / "rank0.trace.json").is_file()
    assert (out / "runs" / f"{device_check.DRY_SHAPES[0].name}-kineto" / "rank0.kineto.json").is_file()
    assert any(k.startswith("flush-") and v["exit"] == 0 for k, v in parts.items())
    for shape in device_check.DRY_SHAPES:  # (b'): on a CPU the runs go through, the history is not recorded
        assert parts[f"{shape.name}-memhist"]["exit"] == 0
    summary = json.loads((out / "runs" / f"{device_check.DRY_SHAPES[0].name}-memhist" / "rank0.summary.json").read_text())
    assert summary["memory_history"] == "not recorded: no caching allocator on CPU"
    with (out / "attention.csv").open() as fh:  # (e): the math backend on a CPU, every row timed
        rows = list(csv.DictReader(fh))
    assert len(rows) == parts["attention"]["rows"] > 0
    assert all(r["backend"] == "math" and float(r["time_ms"]) > 0 and float(r["tflops"]) > 0 and not r["error"]
               for r in rows)  # tflops to 6 significant digits: a slow CPU run is not rounded to 0
    for dtype in device_check.GEMM_DTYPES:
        with (out / f"gemm_{dtype}.csv").open() as fh:
            rows = list(csv.DictReader(fh))
        expected = parts["gemm"]["shapes"] - (parts["gemm"]["fp8_unaligned"] if dtype == "fp8" else 0)
        assert len(rows) == expected and float(rows[-1]["time_ms"]) > 0
        assert rows[-1]["transB"] == "T" and rows[-1]["source"] == "DeepSpeech"
    with (out / "gemm_fp8.csv").open() as fh:  # FP8: every row timed K-major (TN), as cuBLASLt takes E4M3 operands
        assert {(r["transA"], r["transB"]) for r in csv.DictReader(fh)} == {("N", "T")}


def test_without_a_gpu_the_real_check_refuses(tmp_path, capsys):
    import torch
    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    assert device_check.main(["-o", str(tmp_path / "x")]) == 2
    assert "no CUDA device" in capsys.readouterr().err


def test_gpt_gemms_are_the_block_and_head_products():
    model = dict(layers=2, hidden=64, heads=4, seq_len=32, vocab=128, micro_batch=2)
    assert device_check.gpt_gemms(model) == [(64, 192, 64), (64, 64, 64), (64, 256, 64), (64, 64, 256), (64, 128, 64)]
