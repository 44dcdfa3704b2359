"""Bounded cost and no internal error on hostile input (issue 28, parts 4 and 5): each case is refused
before the work starts, in one line that names the limit and the variable that lifts it, as a real
process under a 1 GB address-space limit where memory is the danger."""

from __future__ import annotations

import gzip
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, SMALL
from zsim.cli import main
from zsim.config.limits import json_values_bound, limit
from zsim.errors import ConfigError
from zsim.sweep.points import plan_sweep
from zsim.sweep.runner import run_sweep
from zsim.sweep.spec import Range, sweep_from_mapping
from zsim.config.validation import validate

GB = 1 << 30


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (3 * GB // 2, 3 * GB // 2))  # python + numpy + an import or two


def zsim(*args: str, cwd: Path = ROOT, env: dict | None = None) -> tuple[subprocess.CompletedProcess, float]:
    """Run zsim as a process under the memory limit; (result, wall seconds)."""
    import os

    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "zsim.cli", *args], capture_output=True, text=True, cwd=cwd,
                          preexec_fn=_limited, timeout=120, env={**os.environ, **(env or {})})
    return done, time.monotonic() - started


@pytest.fixture
def base(tmp_path) -> Path:
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(SMALL))
    return path


# ---- sweeps ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("spec, message", [
    ({"from": 1, "to": 2, "num": 100_000_000}, "100,000,000 values: more than the limit of 10,000 (set "
                                                "ZSIM_MAX_SWEEP_POINTS to raise it)"),
    ({"from": 1, "to": 10**12, "step": 1}, "values: more than the limit"),
    ({"from": -1.0e308, "to": 1.7e308, "step": 1.0}, "too many values: more than the limit"),
    ({"from": 1, "to": 10**400, "step": 1}, "too many values"),
    ({"from": 1.0, "to": 1.0e308, "factor": 1.0000001}, "values: more than the limit"),
    ({"from": -1.0e308, "to": 1.7e308, "num": 3}, "the values overflow a double"),
    ({"from": -10**400, "to": 10**400, "num": 3}, "the values overflow a double"),
])
def test_huge_or_overflowing_ranges_are_refused_before_any_value_is_made(spec, message):
    started = time.monotonic()
    with pytest.raises(ConfigError, match=message.replace("(", "\\(").replace(")", "\\)")):
        validate(Range, spec, "<test>").values()
    assert time.monotonic() - started < 1


def test_extreme_but_finite_ranges_give_finite_values():
    assert validate(Range, {"from": 1.0e-300, "to": 1.0e300, "num": 3, "log": True}, "<t>").values() == \
        [1e-300, 1.0, 1e300]
    assert validate(Range, {"from": 1.0e-320, "to": 1.0e308, "factor": 2}, "<t>").values()[-1] < 1.0e308


def test_a_sweep_over_the_point_limit_is_refused_and_the_variable_lifts_it(base, monkeypatch):
    mapping = {"base": str(base), "axes": {"model.micro_batch": list(range(1, 101)), "zero.stage": [0, 1, 2, 3],
                                           "zero.reduce_bucket_elements": list(range(10**6, 10**6 + 30))}}
    with pytest.raises(ConfigError, match="100 × 4 × 30 = 12,000 points: more than the limit of 10,000 "
                                          "\\(set ZSIM_MAX_SWEEP_POINTS"):
        plan_sweep(sweep_from_mapping(mapping), "<test>", base.parent)
    monkeypatch.setenv("ZSIM_MAX_SWEEP_POINTS", "3")
    with pytest.raises(ConfigError, match="4 values: more than the limit of 3"):
        plan_sweep(sweep_from_mapping({"base": str(base), "axes": {"zero.stage": [0, 1, 2, 3]}}), "<t>", base.parent)
    monkeypatch.setenv("ZSIM_MAX_SWEEP_POINTS", "lots")
    with pytest.raises(ConfigError, match="ZSIM_MAX_SWEEP_POINTS = 'lots': expected a positive whole number"):
        limit("SWEEP_POINTS")


def test_num_1e8_is_refused_by_the_command_in_little_memory(tmp_path, base):
    sweep = tmp_path / "s.yaml"
    sweep.write_text(f"base: {base}\naxes:\n  model.micro_batch: {{from: 1, to: 2, num: 1e8}}\n")
    done, seconds = zsim("sweep", str(sweep), "-o", str(tmp_path / "o"))
    assert done.returncode == 2 and "100,000,000 values: more than the limit" in done.stderr and seconds < 20


def test_a_sweep_takes_a_from_hf_base_and_matches_zsim_run(tmp_path):
    from zsim.scenario.scenario import load_scenario
    from zsim.engine.simulation import simulate

    base = ROOT / "scenarios" / "llama-3-70b-dgx-h100.yaml"
    plan = plan_sweep(sweep_from_mapping({"base": str(base), "axes": {"zero.stage": [3]}}), "<test>", base.parent)
    sweep = run_sweep(plan, None, workers=1)
    result = simulate(load_scenario(base, ["zero.stage=3"]), trace=False)  # what `zsim run --set` simulates
    assert sweep.table.rows[0]["step_s"] == result.total_seconds / len(result.step_seconds)
    with pytest.raises(ConfigError, match="axes.model.from_hf: a sweep imports one Hugging Face config"):
        plan_sweep(sweep_from_mapping({"base": str(base), "axes": {"model.from_hf": ["a.json", "b.json"]}}),
                   "<test>", base.parent)


def test_escape_sequences_in_sweep_names_never_reach_the_terminal(tmp_path, base, capsys):
    sweep = tmp_path / "s.yaml"
    sweep.write_text(f'name: "n\\e[31mred\\e]0;title\\a"\ndescription: "d\\e[2J"\nbase: {base}\n'
                     "axes:\n  zero.stage: [2, 3]\n")
    assert main(["sweep", str(sweep), "-o", str(tmp_path / "o"), "--no-plot", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "red" in out
    assert "\x1b" not in json.loads((tmp_path / "o" / "sweep.json").read_text())["name"]


# ---- JSON, gzip and tables ------------------------------------------------------------------------

def test_a_gzip_bomb_is_refused_while_it_is_decompressed(tmp_path):
    folder = tmp_path / "kineto"
    folder.mkdir()
    with gzip.open(folder / "rank0.pt.trace.json.gz", "wb", compresslevel=9) as fh:  # ~290 kB holding 300 MB
        fh.write(b'{"traceEvents": [' + b"{}," * 100_000_000 + b'{}], "distributedInfo": {"rank": 0}}')
    for command in (["calibrate", str(folder), "--profile", "dgx2", "-o", str(tmp_path / "p.yaml")],
                    ["replay", str(folder), "--profile", "dgx2", "--trace-driven", "-o", str(tmp_path / "r")]):
        done, seconds = zsim(*command)
        assert done.returncode == 2 and "bytes decompressed: not a trace this reader takes (set ZSIM_MAX_JSON_BYTES" \
            in done.stderr and seconds < 30, done.stderr


def test_a_json_of_many_tiny_values_is_refused_before_it_is_parsed(tmp_path):
    folder = tmp_path / "kineto"
    folder.mkdir()
    (folder / "rank0.pt.trace.json").write_text('{"traceEvents": [' + "[]," * 6_000_000 + '[]], '
                                                '"distributedInfo": {"rank": 0}}')  # 18 MB, ~0.7 GB parsed
    done, _ = zsim("calibrate", str(folder), "--profile", "dgx2", "-o", str(tmp_path / "p.yaml"))
    assert done.returncode == 2 and "JSON values (at most): more than the limit of 5,000,000" in done.stderr
    assert json_values_bound(b'{"a": [1, 2, {"b": "x,y"}]}') >= 5


def test_runtime_traces_are_held_to_the_json_limits(tmp_path):
    from tests.test_calibrate import measured_run

    folder = measured_run(tmp_path / "run")
    done, _ = zsim("replay", str(folder), "--profile", "dgx2", "-o", str(tmp_path / "o"),
                   env={"ZSIM_MAX_JSON_BYTES": "1000"})
    assert done.returncode == 2 and "larger than 1,000 bytes" in done.stderr and "ZSIM_MAX_JSON_BYTES" in done.stderr


def test_gemm_tables_are_held_to_the_row_limit_and_times_above_a_nanosecond(tmp_path):
    table = tmp_path / "gemm.csv"
    rows = [f"{m},{n},{k},{1e-3 * (1 + m * n * k / 1e9):.6f}" for m in range(64, 64 + 4001)
            for n, k in ((256, 512),)]
    table.write_text("M,N,K,time_ms\n" + "\n".join(rows) + "\n")
    started = time.monotonic()
    assert main(["gemm-fit", str(table), "--gpu", "v100-sxm2-32gb"]) == 2
    assert time.monotonic() - started < 5
    tiny = tmp_path / "tiny.csv"
    tiny.write_text("M,N,K,time_ms\n" + "\n".join(f"{2**i},{2**i},{2**i},1e-320" for i in range(6, 17)) + "\n")
    for command in (["gemm-fit", str(tiny), "--gpu", "v100-sxm2-32gb"],
                    ["calibrate", str(tiny), "--profile", "dgx2", "-o", str(tmp_path / "p.yaml")]):
        assert main(command) == 2


def test_gemm_row_limit_message(tmp_path, capsys):
    table = tmp_path / "gemm.csv"
    table.write_text("M,N,K,time_ms\n" + "\n".join(f"{m},256,512,0.01" for m in range(64, 64 + 4001)) + "\n")
    assert main(["gemm-fit", str(table), "--gpu", "v100-sxm2-32gb"]) == 2
    assert "4,001 rows: more than the limit of 4,000 (set ZSIM_MAX_TABLE_ROWS to raise it)" in capsys.readouterr().err


def test_an_nccl_tests_header_of_100k_ranks_is_refused_at_once(tmp_path, capsys):
    folder = tmp_path / "nccl"
    folder.mkdir()
    ranks = "\n".join(f"#  Rank {i:6d} Group  0 Pid {i} on node{i // 8} device {i % 8} [0x01] GPU" for i in range(100_000))
    (folder / "all_reduce.txt").write_text(
        "# nThread 1 nGpus 1 minBytes 8 maxBytes 128 step: 2(factor)\n#\n# Using devices\n" + ranks +
        "\n#       size         count      type   redop    root     time   algbw   busbw #wrong\n"
        "           8             2     float     sum      -1    30.00    0.00    0.00      0\n")
    started = time.monotonic()
    assert main(["calibrate", str(folder), "--profile", "dgx2", "-o", str(tmp_path / "p.yaml")]) == 2
    assert time.monotonic() - started < 10
    assert "4,097 ranks listed: more than the limit of 4,096 (set ZSIM_MAX_TABLE_RANKS" in capsys.readouterr().err


# ---- suites and the runtime -----------------------------------------------------------------------

def test_validate_refuses_more_steps_than_a_suite_judges(capsys):
    started = time.monotonic()
    assert main(["validate", "paper", "--set", "run.steps=1000"]) == 2
    assert time.monotonic() - started < 10
    assert "runs at most 2 steps per scenario (set ZSIM_MAX_SUITE_STEPS to raise it)" in capsys.readouterr().err


def test_zsim_trace_counts_activations_in_its_memory_guard(tmp_path, capsys):
    pytest.importorskip("torch")
    model = tmp_path / "model.yaml"
    # 3M parameters (~60 MB of states) but 65k tokens of a 50k vocabulary: ~40 GB of logits per rank
    model.write_text("layers: 2\nhidden: 64\nheads: 2\nseq_len: 1024\nvocab: 50000\nmicro_batch: 64\n")
    started = time.monotonic()
    assert main(["trace", "--model", str(model), "--ranks", "2", "--stage", "0", "--precision", "fp32",
                 "--steps", "1", "-o", str(tmp_path / "t")]) == 2
    err = capsys.readouterr().err
    assert "GB of activations per rank" in err and time.monotonic() - started < 10


def test_activation_estimate_grows_with_the_batch_and_shrinks_with_checkpointing():
    from runtime.config import RunConfig
    from runtime.launch import activation_bytes
    from zsim.config.model_section import ModelSection

    model = ModelSection(layers=4, hidden=128, heads=4, seq_len=64, vocab=512, micro_batch=2)
    plain = RunConfig(model=model, stage=0, precision="fp32", world_size=2, steps=1, out_dir="x")
    doubled = RunConfig(model=ModelSection(layers=4, hidden=128, heads=4, seq_len=64, vocab=512, micro_batch=4),
                        stage=0, precision="fp32", world_size=2, steps=1, out_dir="x")
    checkpointed = RunConfig(model=model, stage=0, precision="fp32", world_size=2, steps=1, out_dir="x",
                             checkpointing=True)
    assert activation_bytes(doubled) == 2 * activation_bytes(plain) > activation_bytes(checkpointed) > 0


def test_an_nccl_tests_header_with_a_huge_rank_index_is_refused(tmp_path):
    """One `Rank 99999` line lists one rank but names a run of 100,000: refused by the same limit."""
    from zsim.errors import ConfigError
    from zsim.trace.nccl_tests import header_of

    table = tmp_path / "all_reduce.txt"
    table.write_text("# Rank 99999 Group 0 Pid 1 on hostA device 0 [0x0] NVIDIA A100\n#  size count type\n")
    with pytest.raises(ConfigError, match="TABLE_RANKS"):
        header_of(table)


def test_pipeline_activation_estimate_holds_the_schedules_peak_in_flight_micro_batches():
    """Stage 0 of 2 with 4 micro-batches holds p - s = 2 micro-batches of its half of the layers under
    1F1B and all 4 under GPipe (Narayanan et al. SC'21 §2.2.1); neither holds the loss's tensors."""
    from runtime.config import RunConfig
    from runtime.launch import activation_bytes
    from zsim.config.model_section import ModelSection
    from zsim.workload.activations import layer_saved_tensors
    from zsim.workload.shape import Shape

    model = ModelSection(layers=4, hidden=128, heads=4, seq_len=64, vocab=512, micro_batch=2)

    def cfg(schedule):
        return RunConfig(model=model, stage=0, precision="fp32", world_size=2, steps=1, out_dir="x", pp=2,
                         pipeline_schedule=schedule, grad_accum=4)

    block = sum(layer_saved_tensors(Shape.of(model), 64, 2, 1, 4))
    assert activation_bytes(cfg("1f1b"), 0) == 2 * 2 * block
    assert activation_bytes(cfg("gpipe"), 0) == 4 * 2 * block
    # the last stage holds one micro-batch under 1F1B, plus the loss's logits and saved softmax
    assert 2 * block < activation_bytes(cfg("1f1b"), 1) < activation_bytes(cfg("gpipe"), 1)
