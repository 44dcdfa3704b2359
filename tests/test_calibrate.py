"""`zsim calibrate` and the importers it reads: real data where it is (skips without ../shared/data),
small synthetic runs for every way an input can be wrong (one clear error, exit 2, nothing written)."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from zsim.calibrate.nccl_fit import values_of
from zsim.cli import main
from zsim.fabric.cluster import load_cluster
from zsim.config.profiles import Profiles
from zsim.errors import ConfigError
from zsim.calibrate.inputs import kind_of, read_inputs
from zsim.trace.kineto_run import read_kineto
from zsim.trace.run_reader import read_run
from zsim.trace.run_samples import collective_samples
from zsim.trace.schema import SCHEMA, complete

DGX2 = "nccl-tests/dgx2-v100-12gpu"
DLRM = "kineto/dlrm-8xv100"


def measured_run(folder: Path, world: int = 2, steps: int = 2, backend: str = "gloo", **meta) -> Path:
    """A small measured run in the runtime's trace schema: per step a forward, a backward, an
    all_reduce of 4 MB whose last member arrives 100 µs after rank 0, and the optimizer step."""
    folder.mkdir(parents=True, exist_ok=True)
    for rank in range(world):
        events = []
        for step in range(steps):
            t = step * 10_000.0
            events.append(complete("fwd/layer.0", rank, "compute", t, 1000.0, step=step, micro_batch=0, flops=1e9))
            events.append(complete("bwd/layer.0", rank, "compute", t + 1000, 2000.0, step=step, micro_batch=0, flops=2e9))
            arrive = t + 3000 + 100 * rank
            events.append(complete("all_reduce/grads.bucket.0", rank, "comm", arrive, t + 5000 - arrive, op="all_reduce",
                                   bytes=4_000_000, dtype="fp32", group=list(range(world)), seq=step, step=step,
                                   micro_batch=0, last_arrival_ts=t + 3000 + 100 * (world - 1)))
            events.append(complete("optimizer/step", rank, "compute", t + 5000, 500.0, step=step, micro_batch=0,
                                   elements=1000))
        metadata = {"source": "measured", "rank": rank, "world_size": world, "dp": world, "mp": 1,
                    "model": {"layers": 1}, "zero": {"stage": 0}, "precision": "fp32", "backend": backend,
                    "clock_offset_us": 0.0, **meta}
        (folder / f"rank{rank}.trace.json").write_text(json.dumps({"schema": SCHEMA, "metadata": metadata,
                                                                   "traceEvents": events}))
    return folder


# ---- runtime traces: accepted whole, or one clear error -------------------------------------------

def test_run_reader_separates_waiting_from_transfer(tmp_path):
    run = read_run(measured_run(tmp_path / "run"))
    samples = collective_samples(run)
    assert len(samples) == 4 and {s.backend for s in samples} == {"gloo"}
    # transfer = end - last arrival = 5000 - 3100 on both ranks; rank 0's extra 100 µs was waiting
    assert all(s.seconds == pytest.approx(1900e-6) for s in samples)


@pytest.mark.parametrize("damage, message", [
    (lambda d: (d / "rank1.trace.json").write_text((d / "rank1.trace.json").read_text()[:200]), "truncated"),
    (lambda d: (d / "rank1.trace.json").unlink(), "ranks 1 of world size 2 have no trace file"),
    (lambda d: (d / "rank1.trace.json").write_text(json.dumps({"schema": "other/2", "traceEvents": []})),
     "unknown trace format"),
])
def test_run_reader_rejects_damaged_runs(tmp_path, damage, message):
    folder = measured_run(tmp_path / "run")
    damage(folder)
    with pytest.raises(ConfigError, match=message):
        read_run(folder)


def test_run_reader_rejects_mixed_runs(tmp_path):
    a = measured_run(tmp_path / "a")
    measured_run(tmp_path / "b", zero={"stage": 3})
    shutil.copy(tmp_path / "b" / "rank1.trace.json", a / "rank1.trace.json")
    with pytest.raises(ConfigError, match=r"rank1.trace.json: metadata.zero.stage is 3 here but \d in "
                                          r"rank0.trace.json: files of different runs"):
        read_run(a)


def test_run_reader_rejects_a_rank_that_stopped_early(tmp_path):
    full = measured_run(tmp_path / "run", steps=3)
    short = measured_run(tmp_path / "short", steps=2)
    shutil.copy(short / "rank1.trace.json", full / "rank1.trace.json")
    with pytest.raises(ConfigError, match="rank 1 recorded steps"):
        read_run(full)


def test_unknown_input_format_is_named(tmp_path):
    odd = tmp_path / "notes.txt"
    odd.write_text("hello\n")
    with pytest.raises(ConfigError, match="notes.txt: unknown input format"):
        kind_of(odd)
    assert main(["calibrate", str(odd), "--profile", "dgx2", "-o", str(tmp_path / "x.yaml")]) == 2
    assert not (tmp_path / "x.yaml").exists()


def test_gloo_timings_do_not_fit_the_gpu_model(tmp_path, capsys):
    """Issue 10 item 5: fitting the GPU/NCCL model to gloo timings must refuse, not 'succeed'."""
    run = measured_run(tmp_path / "run")
    assert main(["calibrate", str(run), "--profile", "dgx2", "-o", str(tmp_path / "p.yaml")]) == 2
    err = capsys.readouterr().err
    assert "ran on gloo" in err and "models nccl" in err
    assert not (tmp_path / "p.yaml").exists()


# ---- Kineto traces ----------------------------------------------------------------------------

def test_kineto_old_format_sizes_and_waiting(shared_data):
    run = read_kineto([shared_data / DLRM])
    assert run.world_size == 8 and len(run.ranks) == 8
    samples = run.samples()
    assert [s.op for s in samples].count("all_reduce") == 3
    big = [s for s in samples if s.op == "all_reduce"][0]
    assert big.nbytes == 394241 * 4 and big.group == 8  # Input Dims [[394241]] float
    # the last rank to arrive waits for nobody: its kernel is the transfer; the first waits for it
    waits = run.waiting_us()[0]
    assert min(waits) == 0.0 and max(waits) > 1000


def test_kineto_new_format_reads_record_param_comms(shared_data):
    from zsim.trace.kineto import read_rank

    rank = read_rank(shared_data / "kineto/a100-2rank-nccl-metadata/rank0.pt.trace.json.gz")
    ops = {c.op for c in rank.collectives}
    assert ops == {"all_reduce", "broadcast"} and rank.world_size == 2
    assert all(c.group == 2 and c.nbytes > 0 for c in rank.collectives)


def test_kineto_missing_ranks_are_refused_unless_allowed(shared_data):
    with pytest.raises(ConfigError, match="ranks 1 of 2 missing"):
        read_kineto([shared_data / "kineto/a100-2rank-nccl-metadata"])
    run = read_kineto([shared_data / "kineto/a100-2rank-nccl-metadata"], allow_missing_ranks=True)
    assert len(run.samples()) == 21


def test_kineto_truncated_and_mixed(shared_data, tmp_path):
    folder = tmp_path / "dlrm"
    shutil.copytree(shared_data / DLRM, folder)
    raw = gzip.decompress((folder / "rank3.pt.trace.json.gz").read_bytes())
    (folder / "rank3.pt.trace.json.gz").write_bytes(gzip.compress(raw[: len(raw) // 2]))
    with pytest.raises(ConfigError, match=r"rank3.pt.trace.json.gz: not valid JSON .* truncated"):
        read_kineto([folder])
    shutil.copy(shared_data / DLRM / "rank3.pt.trace.json.gz", folder / "rank3.pt.trace.json.gz")
    shutil.copy(shared_data / DLRM / "rank3.pt.trace.json.gz", folder / "rank3-again.pt.trace.json.gz")
    with pytest.raises(ConfigError, match="rank 3 also in"):
        read_kineto([folder])


def test_one_step_of_dlrm_cannot_determine_the_nccl_terms(shared_data, tmp_path, capsys):
    assert main(["calibrate", str(shared_data / DLRM), "--profile", "dgx1", "-o", str(tmp_path / "p.yaml")]) == 2
    assert "cannot determine" in capsys.readouterr().err


# ---- nccl-tests tables: a profile that loads, with provenance -----------------------------------

def test_calibrate_nccl_tests_writes_a_loadable_profile(shared_data, tmp_path, capsys):
    out = tmp_path / "dgx2-calibrated.yaml"
    assert main(["calibrate", str(shared_data / DGX2), "--profile", "dgx2", "-o", str(out), "--json", "-"]) == 0
    report = json.loads(capsys.readouterr().out)
    profiles, name = Profiles.from_environment().with_system_file(out)  # as `--profile FILE` does
    cluster = load_cluster(name, 2, profiles)  # the written file is a normal system profile
    got = values_of(cluster.nccl)
    for key, value in report["collectives"]["values"].items():
        assert got[key] == pytest.approx(value, rel=1e-3), key
    # broadcast's LL128 ends on the protocol's 120/128 ceiling: a physical bound, a real answer, not a refusal
    assert report["collectives"]["values"]["efficiency.LL128.broadcast"] == pytest.approx(120 / 128)
    import yaml

    prov = yaml.safe_load(out.read_text())["provenance"]
    assert prov["base"] == "dgx2" and prov["inputs"][0]["kind"] == "nccl-tests" and prov["date"]
    assert prov["collectives"]["residuals"]["all_gather"]["median_error"] < 0.05


def test_inputs_mix(shared_data):
    data = read_inputs([shared_data / DGX2, shared_data / "deepbench-v100/gemm_fp32.csv"])
    assert [s["kind"] for s in data.sources] == ["nccl-tests", "gemm-table"]
    assert len(data.compute) == 160 and data.compute[0].flops == 2 * 1760 * 16 * 1760


def test_a_gemm_table_of_one_shape_repeated_fits_nothing(tmp_path, capsys):
    """30 timings of one shape are one sample of the five GEMM terms: gemm-fit and calibrate refuse
    (exit 2) instead of printing terms the data cannot determine."""
    table = tmp_path / "one.csv"
    table.write_text("source,M,N,K,transA,transB,time_ms,tflops\n" + "x,1760,16,1760,N,N,0.038,1\n" * 30)
    assert main(["gemm-fit", str(table), "--gpu", "v100-sxm3-32gb", "--dtype", "fp32"]) == 2
    assert "1 distinct GEMM shapes in 30 rows; a fit of 5 terms needs at least 10" in capsys.readouterr().err
    assert main(["calibrate", str(table), "--profile", "dgx2", "-o", str(tmp_path / "c.yaml")]) == 2
    assert "1 distinct fp32 GEMM shapes (30 samples)" in capsys.readouterr().err
    assert not (tmp_path / "c.yaml").exists()
