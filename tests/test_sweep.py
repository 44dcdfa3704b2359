"""zsim sweep: sweep files, point expansion and validation, answers, caching, engines, the CLI."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, SMALL
from zsim.errors import ConfigError
from zsim.sweep.answers import fastest, fastest_with_room, knee_of, knees
from zsim.sweep.points import plan_sweep
from zsim.sweep.runner import run_sweep
from zsim.sweep.spec import Range, sweep_from_mapping
from zsim.config.validation import validate


def zsim(*args, cwd=ROOT, **kw):
    return subprocess.run([sys.executable, "-m", "zsim.cli", *args], capture_output=True, text=True, cwd=cwd, **kw)


@pytest.fixture
def base(tmp_path) -> Path:
    """The small test scenario (2 DGX-2 nodes, DP 8 × MP 4) as a file."""
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(SMALL))
    return path


def plan_of(mapping: dict, base: Path):
    return plan_sweep(sweep_from_mapping({"base": str(base), **mapping}), "<test>", base.parent)


# --- ranges and axes -------------------------------------------------------------------------

def test_ranges_inclusive_geometric_log_and_integer():
    assert validate(Range, {"from": 25, "to": 1600, "factor": 2}, "test").values() == [25, 50, 100, 200, 400, 800, 1600]
    assert validate(Range, {"from": 25, "to": 1600, "num": 13, "log": True}, "test").values() == \
        [25, 35, 50, 71, 100, 141, 200, 283, 400, 566, 800, 1131, 1600]
    assert validate(Range, {"from": 0.1, "to": 1.0, "step": 0.1}, "test").values() == \
        [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
    assert validate(Range, {"from": 1, "to": 10, "step": 4}, "test").values() == [1, 5, 9]
    assert validate(Range, {"from": 0, "to": 4, "num": 3}, "test").values() == [0, 2, 4]
    assert validate(Range, {"from": 1, "to": 2, "num": 4}, "test").values() == [1, 2]  # integers, duplicates dropped
    assert validate(Range, {"from": 0.0, "to": 1.0, "num": 5}, "test").values() == [0.0, 0.25, 0.5, 0.75, 1.0]


@pytest.mark.parametrize("spec, message", [
    ({"from": 1, "to": 8}, "exactly one of step, num, factor"),
    ({"from": 1, "to": 8, "step": 1, "num": 3}, "exactly one of step, num, factor"),
    ({"from": 8, "to": 1, "step": 1}, "below from"),
    ({"from": 0, "to": 8, "factor": 2}, "> 0"),
    ({"from": 1, "to": 8, "num": 4, "lo": True}, "did you mean 'log'"),
    ({"from": 1, "too": 8, "step": 1}, "did you mean 'to'"),  # the key in the file, not the attribute (stop)
])
def test_bad_ranges_name_the_key(base, spec, message):
    with pytest.raises(ConfigError, match="axes.zero.stage") as err:
        plan_of({"axes": {"zero.stage": spec}}, base)
    assert message in str(err.value)


def test_cartesian_product_and_zip_move_together(base):
    plan = plan_of({"axes": {"zero.stage": [1, 2, 3]},
                    "zip": [{"parallel.dp": [4, 8, 16], "hardware.nodes": [1, 2, 4]}]}, base)
    assert plan.total == len(plan.points) == 9
    assert plan.keys == ["zero.stage", "parallel.dp", "hardware.nodes"]
    for p in plan.points:
        assert p.scenario.layout.dp == p.values["parallel.dp"] and p.scenario.cluster.nodes == p.values["hardware.nodes"]
        assert p.scenario.layout.world == 16 * p.values["hardware.nodes"]
    assert len({p.key for p in plan.points}) == 9


def test_list_items_are_addressable(tmp_path):
    scenario = {**SMALL, "fabric": {"degrade": [{"link": "nic", "node": 1, "index": 0, "factor": 0.5}]}}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(scenario))
    plan = plan_of({"axes": {"fabric.degrade.0.factor": [1.0, 0.5]}}, path)
    assert [p.scenario.fabric.degrade[0].factor for p in plan.points] == [1.0, 0.5]
    with pytest.raises(ConfigError, match=r"fabric.degrade.3.*has 1 items"):
        plan_of({"axes": {"fabric.degrade.3.factor": [1.0]}}, path)


def test_a_list_valued_key_sweeps_lists_and_prints_them_as_written(tmp_path):
    """zero.recompute_modules takes a list: each axis value is one list, set whole on its point, written in the table
    and sweep.json as the sweep file writes it (`[layernorm, moe_act]`), and quoted in the rerun line (a shell would
    read the brackets); a list of lists or a mapping is refused naming the key."""
    from zsim.sweep.summary import rerun_command

    moe = {**SMALL["model"], "gated_mlp": True, "linear_bias": False, "moe": {"experts": 8, "top_k": 2}}
    scenario = {**SMALL, "model": moe, "parallel": {**SMALL["parallel"], "sequence_parallel": True},
                "zero": {**SMALL["zero"], "stage": 1, "recompute_granularity": "selective"}}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(scenario))
    plan = plan_of({"axes": {"zero.recompute_modules": [[], ["core_attn"], ["layernorm", "moe_act"]]}}, path)
    assert [p.scenario.zero.recompute_modules for p in plan.points] == [[], ["core_attn"], ["layernorm", "moe_act"]]
    assert [str(p.values["zero.recompute_modules"]) for p in plan.points] == ["[]", "[core_attn]", "[layernorm, moe_act]"]
    line = rerun_command(path, plan.points[2].values, {})
    assert line.endswith("--set 'zero.recompute_modules=[layernorm, moe_act]'")
    for bad in ([[["a"]]], [{"a": 1}]):  # a value that is a list of lists, or a mapping
        with pytest.raises(ConfigError, match="lists of them") as err:
            plan_of({"axes": {"zero.recompute_modules": bad}}, path)
        assert err.value.path == "axes.zero.recompute_modules"


# --- validation before anything runs -----------------------------------------------------------

def test_unknown_sweep_key_is_rejected_with_a_hint(base):
    with pytest.raises(ConfigError, match="axis: unknown key; did you mean 'axes'"):
        plan_of({"axis": {"zero.stage": [1]}}, base)


def test_bad_scenario_key_names_the_point_and_the_key(base):
    with pytest.raises(ConfigError) as err:
        plan_of({"axes": {"zero.stag": [1, 2]}}, base)
    text = str(err.value)
    assert "point 0 (zero.stag=1)" in text and "zero.stag: unknown key; did you mean 'stage'" in text


def test_bad_value_names_the_point_and_the_value(base):
    with pytest.raises(ConfigError) as err:
        plan_of({"axes": {"zero.stage": [3, 4]}}, base)
    assert "point 1 (zero.stage=4)" in str(err.value) and "zero.stage" in str(err.value)


def test_zipped_lengths_must_match_and_keys_not_repeat(base):
    with pytest.raises(ConfigError, match=r"zip\[0\].*parallel.dp: 2, hardware.nodes: 3"):
        plan_of({"zip": [{"parallel.dp": [4, 8], "hardware.nodes": [1, 2, 4]}]}, base)
    with pytest.raises(ConfigError, match="is both set and swept"):
        plan_of({"set": {"zero.stage": 2}, "axes": {"zero.stage": [1, 2]}}, base)


def test_invalid_layouts_stop_the_sweep_unless_skipped_and_counted(base):
    axes = {"parallel.dp": [8, 16], "parallel.mp": [2, 4]}  # 32 GPUs: only 8×4 and 16×2 are layouts
    with pytest.raises(ConfigError, match=r"point 0 \(parallel.dp=8, parallel.mp=2\).*parallel.dp"):
        plan_of({"axes": axes}, base)
    plan = plan_of({"axes": axes, "skip_invalid": True}, base)
    assert plan.total == 4 and len(plan.points) == 2
    assert sum(plan.skipped.values()) == 2 and all(r.startswith("parallel.dp:") for r in plan.skipped)
    # each counted reason keeps its first point with the numbers, for the summary's "e.g." line
    assert all(e.startswith("point 0 (parallel.dp=8, parallel.mp=2): ") and "8 × mp 2 = 16" in e
               for e in plan.skip_examples.values())
    with pytest.raises(ConfigError, match="every one of the 1 points is invalid"):
        plan_of({"axes": {"parallel.dp": [5]}, "skip_invalid": True}, base)


def test_planning_reports_progress_over_every_point_skipped_ones_included(base):
    """`zsim sweep` draws its "plan" bar from these calls: (points planned, points in the grid)."""
    calls = []
    axes = {"parallel.dp": [8, 16], "parallel.mp": [2, 4], "zero.stage": [1, 2, 3]}  # 12, 6 of them layouts
    spec = sweep_from_mapping({"base": str(base), "axes": axes, "skip_invalid": True})
    plan = plan_sweep(spec, "<test>", base.parent, progress=lambda done, total: calls.append((done, total)))
    assert len(plan.points) == 6 and calls == [(n, 12) for n in range(1, 13)]


def test_a_missing_profile_is_never_skipped(base):
    with pytest.raises(ConfigError, match="hardware.profile"):
        plan_of({"axes": {"hardware.profile": ["dgx2", "dgx22"]}, "skip_invalid": True}, base)


# --- answers -------------------------------------------------------------------------------------

def test_knee_is_where_doubling_stops_paying():
    xs = [25, 50, 100, 200, 400, 800, 1600]
    ys = [1000 / x + 1.0 for x in xs]  # 1 s of compute + 1000/x of comm: doubling x gains
    index, gains = knee_of(xs, ys)      # (500/x) / (1000/x + 1), < 5% only beyond x = 9000; with 10/x beyond 90
    assert index is None and gains[-1] == pytest.approx((500 / 800) / (1000 / 800 + 1))
    ys = [10 / x + 1.0 for x in xs]
    index, gains = knee_of(xs, ys)
    assert xs[index] == 100 and gains == pytest.approx([(5 / x) / (10 / x + 1) for x in xs[:-1]])
    assert all(g < 0.05 for g in gains[index:]) and gains[index - 1] >= 0.05
    assert knee_of([1, 2, 4, 8], [8.0, 4.0, 2.0, 1.0])[0] is None  # still halving: no knee in range
    assert knee_of([1, 2, 4], [1.0, 2.0, 3.0], higher_is_better=True)[0] is None
    assert knee_of([1, 2, 4], [1.0, 1.01, 1.02], higher_is_better=True)[0] == 0


def test_knee_interpolates_between_log_spaced_points():
    xs = [1, 1.5, 3, 6]  # 2 × 1 = 2 lies between 1.5 and 3: interpolated in log2(x)
    ys = [10.0, 9.0, 5.0, 4.9]
    _, gains = knee_of(xs, ys)
    y2 = 9.0 + (5.0 - 9.0) * (math.log2(2) - math.log2(1.5)) / (math.log2(3) - math.log2(1.5))
    assert gains[0] == pytest.approx((10 - y2) / 10)


def test_fastest_only_among_points_that_fit():
    rows = [{"point": 0, "status": "oom", "step_s": 1.0}, {"point": 1, "status": "fits", "step_s": 2.0},
            {"point": 2, "status": "fits", "step_s": 3.0}]
    assert fastest(rows, "step_s")["point"] == 1
    assert fastest([{"point": 0, "status": "fits", "tflops_per_gpu": 1.0},
                    {"point": 1, "status": "fits", "tflops_per_gpu": 2.0}], "tflops_per_gpu")["point"] == 1
    assert fastest(rows[:1], "step_s") is None
    groups = knees([{"x": x, "g": g, "m": 1 / x + g} for x in (1, 2, 4, 8) for g in (0, 10)], "x", "m", ["g"])
    assert {k.group["g"]: k.x for k in groups} == {0: None, 10: 1}
    assert isinstance(groups[1].x, int)  # an integer axis's knee is an integer, in sweep.json too


def test_fastest_with_room_skips_points_whose_allocator_flushes():
    """Only an allocator flush (time the step leaves out) disqualifies a point; memory pressure alone no
    longer does (issue 25: the misses are not the allocator)."""
    rows = [{"point": 0, "status": "fits", "step_s": 1.0, "allocator_flushes": 3},
            {"point": 1, "status": "fits", "step_s": 2.0, "allocator_flushes": 0},
            {"point": 2, "status": "oom", "step_s": 0.5, "allocator_flushes": 0}]
    assert fastest(rows, "step_s")["point"] == 0
    assert fastest_with_room(rows, "step_s")["point"] == 1
    assert fastest_with_room(rows[:1], "step_s") is None


def test_sweep_rows_carry_the_error_band_and_no_margin_caution(base):
    """The small scenario reserves 1.38 GiB at its peak: on a 1.6 GiB GPU it fits with 13.5% free, on a
    4 GiB one with 65%. Neither is cautioned about (the memory-margin caution is gone); both rows carry the
    band of their regime, the same for both (memory is not a regime)."""
    from zsim.sweep.summary import sweep_summary

    sweep = run_sweep(plan_of({"axes": {"hardware.gpu_memory_GiB": [1.6, 4.0]}}, base), None, workers=1)
    tight, roomy = sweep.table.rows
    assert tight["status"] == roomy["status"] == "fits" and tight["step_s"] == roomy["step_s"]
    assert "near_capacity" not in tight
    assert tight["band_match"] == roomy["band_match"] != "outside"
    assert tight["band_low_s"] == roomy["band_low_s"] and tight["band_high_s"] == roomy["band_high_s"]
    assert tight["band_low_s"] < tight["band_high_s"] and tight["band_regime"]
    text = sweep_summary(sweep)
    assert "caution" not in text and "slower than zsim" not in text


# --- running: OOM kept, cache, engines --------------------------------------------------------------

SWEEP = {"axes": {"model.micro_batch": [1, 2], "zero.stage": [0, 3]}, "set": {"model.layers": 2}}


def test_oom_points_are_kept_marked_and_timed(base):
    # Stage 0 of a big-enough model: the model states alone exceed the GPU → kept, timed on a roomy GPU.
    plan = plan_of({"set": {"model.layers": 24, "model.hidden": 8192, "model.heads": 64, "parallel.mp": 1,
                            "parallel.dp": 32}, "axes": {"zero.stage": [0, 3]}}, base)
    sweep = run_sweep(plan, None, workers=1)
    oom, fits = sweep.table.rows
    assert oom["status"] == "oom" and oom["bottleneck_kind"] == "memory" and "model states alone need" in oom["bottleneck"]
    assert oom["model_states_bytes"] > oom["capacity_bytes"] == fits["capacity_bytes"]
    assert oom["step_s"] > 0 and fits["status"] == "fits"
    assert sweep.best["point"] == 1


def test_table_files_and_plot(base, tmp_path):
    out = tmp_path / "out"
    sweep = run_sweep(plan_of(SWEEP, base), out, workers=2)
    assert sweep.ran == 4 and sweep.cached == 0
    assert {"csv", "jsonl", "png", "svg"} <= set(sweep.files)
    assert Path(sweep.files["png"]).stat().st_size > 5_000 and "<svg" in Path(sweep.files["svg"]).read_text()[:500]
    lines = (out / "sweep.csv").read_text().splitlines()
    assert lines[0].startswith("point,model.micro_batch,zero.stage,status,step_s,") and len(lines) == 5
    rows = [json.loads(line) for line in (out / "sweep.jsonl").read_text().splitlines()]
    assert [r["point"] for r in rows] == [0, 1, 2, 3] and all(isinstance(r["step_s"], float) for r in rows)
    meta = json.loads((out / "sweep.json").read_text())
    assert meta["points"]["ran"] == 4 and meta["fastest_that_fits"]["point"] in (0, 1, 2, 3)
    assert meta["fastest_with_room"] == sweep.best_with_room
    again = run_sweep(plan_of(SWEEP, base), out, workers=2)
    assert again.ran == 0 and again.cached == 4 and again.table.rows == sweep.table.rows


def test_cache_key_changes_with_the_scenario_not_the_name(base):
    a = plan_of({"axes": {"zero.stage": [3]}}, base).points[0]
    b = plan_of({"name": "other", "axes": {"zero.stage": [3]}}, base).points[0]
    c = plan_of({"axes": {"zero.stage": [2]}}, base).points[0]
    assert a.key == b.key != c.key


def test_per_point_folders_only_when_asked(base, tmp_path):
    out = tmp_path / "o"
    run_sweep(plan_of({"axes": {"zero.stage": [2, 3]}}, base), out, workers=1)
    assert not (out / "points").exists()
    sweep = run_sweep(plan_of({"axes": {"zero.stage": [2, 3]}}, base), out, workers=1, per_point=True)
    key = sweep.table.rows[1]["key"]  # keyed by the point's hash, not its index (issue 28)
    facts = json.loads((out / "points" / key / "result.json").read_text())
    assert facts["zero"]["stage"] == 3 and facts["schema"] == "zsim-result/1"


@pytest.mark.slow
def test_local_and_dask_give_identical_tables(base, tmp_path):
    pytest.importorskip("dask.distributed", reason="the dask extra is not installed (pip install 'zsim[dask]')")
    run_sweep(plan_of(SWEEP, base), tmp_path / "local", workers=2)
    dask = run_sweep(plan_of(SWEEP, base), tmp_path / "dask", engine="dask", workers=2)
    assert dask.ran == 4 and dask.engine == "dask"
    assert (tmp_path / "dask" / "sweep.csv").read_bytes() == (tmp_path / "local" / "sweep.csv").read_bytes()
    assert (tmp_path / "dask" / "sweep.jsonl").read_bytes() == (tmp_path / "local" / "sweep.jsonl").read_bytes()


# --- the command line -----------------------------------------------------------------------------

def test_cli_bad_key_exits_2_naming_it(base, tmp_path):
    sweep = tmp_path / "bad.yaml"
    sweep.write_text(yaml.safe_dump({"base": base.name, "axes": {"hardware.nodez": [1, 2]}}))
    proc = zsim("sweep", str(sweep), "-o", str(tmp_path / "o"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "hardware.nodez: unknown key; did you mean 'nodes'" in proc.stderr and "point 0" in proc.stderr
    assert not (tmp_path / "o").exists()  # nothing ran


def entries(cache: Path) -> list[Path]:
    """The cache's entries, `<key>.json`: not a write's temporary `.<key>.json.tmp-<pid>-<hex>.json`, which a
    SIGKILL between its write and its rename leaves behind (zsim.sweep.files.write_text)."""
    return [p for p in cache.glob("*.json") if not p.name.startswith(".")]


@pytest.mark.slow
def test_killed_sweep_reruns_only_the_missing_points(base, tmp_path):
    """Kill a real `zsim sweep` half-way (SIGKILL), rerun it: the finished points are not run again."""
    import os
    import signal
    import time

    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump({"base": base.name, "set": {"model.layers": 8},
                                     "axes": {"model.micro_batch": [1, 2, 3, 4, 5, 6], "zero.stage": [1, 2, 3]}}))
    out = tmp_path / "o"
    cache = out / "cache"
    proc = subprocess.Popen([sys.executable, "-m", "zsim.cli", "sweep", str(sweep), "-o", str(out), "--workers", "1"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if cache.is_dir() and len(entries(cache)) >= 6:
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the sweep finished before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = {p.name: p.stat().st_mtime_ns for p in entries(cache)}
    assert 6 <= len(before) < 18
    rerun = zsim("sweep", str(sweep), "-o", str(out), "--workers", "1", "--json", "-")
    assert rerun.returncode == 0, rerun.stderr
    meta = json.loads(rerun.stdout)
    assert meta["points"]["cached"] == len(before) and meta["points"]["ran"] == 18 - len(before)
    after = {p.name: p.stat().st_mtime_ns for p in entries(cache)}
    assert len(after) == 18 and all(after[name] == mtime for name, mtime in before.items())
    assert not list(cache.glob(".*.tmp-*"))  # the killed write's temporary, if any, is gone
    fresh = zsim("sweep", str(sweep), "-o", str(tmp_path / "fresh"), "--workers", "2")
    assert fresh.returncode == 0, fresh.stderr
    assert (tmp_path / "fresh" / "sweep.csv").read_text() == (out / "sweep.csv").read_text()


def _children(pid: int) -> set[int]:
    """The processes whose parent is `pid` (Linux /proc)."""
    out = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.add(int(stat.parent.name))
    return out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_terminated_sweep_leaves_no_workers(base, tmp_path):
    """SIGTERM to the sweep (a scheduler's job kill) takes its worker processes with it: each asked
    Linux to be signalled when its parent dies (zsim.sweep.engines.die_with_parent)."""
    import signal
    import time

    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump({"base": str(base), "set": {"model.layers": 8},
                                     "axes": {"model.micro_batch": list(range(1, 41)), "zero.stage": [1, 2, 3]}}))
    proc = subprocess.Popen([sys.executable, "-m", "zsim.cli", "sweep", str(sweep), "-o", str(tmp_path / "o"),
                             "--workers", "2", "--no-plot"], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    workers: set[int] = set()
    while time.monotonic() < deadline and proc.poll() is None and len(workers) < 2:
        workers = _children(proc.pid)
        time.sleep(0.05)
    assert proc.poll() is None and len(workers) >= 2, "the sweep finished before its workers were seen"
    proc.send_signal(signal.SIGTERM)
    proc.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(Path(f"/proc/{w}").exists() for w in workers):
        time.sleep(0.05)
    assert not [w for w in workers if Path(f"/proc/{w}").exists()]


def test_cli_output_must_be_a_folder(base, tmp_path):
    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump({"base": base.name, "axes": {"zero.stage": [2, 3]}}))
    (tmp_path / "file").write_text("x")
    proc = zsim("sweep", str(sweep), "-o", str(tmp_path / "file"))
    assert proc.returncode == 2 and "is a file" in proc.stderr and "Traceback" not in proc.stderr
    proc = zsim("sweep", str(sweep), "--address", "tcp://x:1")
    assert proc.returncode == 2 and "--address needs --engine dask" in proc.stderr


def test_a_sweep_name_cannot_write_outside_out_and_workers_are_bounded(base, tmp_path):
    """`name: /abs/x` or `../../x` becomes one safe folder under out/, as a scenario's name does; a
    worker count past any machine is refused before anything forks."""
    escape = tmp_path / "escaped"
    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump({"name": str(escape), "base": str(base), "axes": {"zero.stage": [2, 3]}}))
    proc = zsim("sweep", str(sweep), "--no-plot", "--workers", "1", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert not escape.exists() and (tmp_path / "out" / str(escape).replace("/", "_") / "sweep.csv").is_file()
    proc = zsim("sweep", str(sweep), "--workers", "100000", cwd=tmp_path)
    assert proc.returncode == 2 and "at most 1024 worker processes" in proc.stderr


def test_a_point_zsim_run_would_refuse_as_too_long_stops_the_sweep(base, monkeypatch):
    """The cost check of `zsim run` (ZSIM_MAX_SECONDS) holds for every point, before any runs: a point
    estimated past it is an error naming the point, not a silent hour."""
    monkeypatch.setenv("ZSIM_MAX_SECONDS", "1")
    with pytest.raises(ConfigError, match=r"point 1 \(run.steps=1000\).*too large for class mode"):
        plan_of({"axes": {"run.steps": [1, 1000]}}, base)


def test_metric_and_plot_keys_are_checked_before_running(base):
    with pytest.raises(ConfigError, match="metric: 'step_time' is not a numeric result column"):
        plan_of({"axes": {"zero.stage": [2, 3]}, "metric": "step_time"}, base)
    with pytest.raises(ConfigError, match="plot.x: 'zero.stages' is not a swept key"):
        plan_of({"axes": {"zero.stage": [2, 3]}, "plot": {"x": "zero.stages"}}, base)


def test_local_engine_with_another_thread_alive_uses_forkserver(base, tmp_path):
    import threading

    from zsim.sweep.engines import start_method

    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        assert start_method() == "forkserver"
        threaded = run_sweep(plan_of(SWEEP, base), None, workers=2)
    finally:
        stop.set()
        thread.join()
    assert threaded.table.rows == run_sweep(plan_of(SWEEP, base), None, workers=2).table.rows


@pytest.mark.slow
def test_cli_on_a_dask_cluster_started_by_the_test(base, tmp_path):
    """`zsim sweep --engine dask --address` against a real local Dask cluster: the same table as local."""
    distributed = pytest.importorskip("dask.distributed", reason="the dask extra is not installed")
    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump({"base": base.name, **SWEEP}))
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster:
        proc = zsim("sweep", str(sweep), "-o", str(tmp_path / "dask"), "--engine", "dask",
                    "--address", cluster.scheduler_address, "--json", "-")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["engine"]["name"] == "dask"
    local = zsim("sweep", str(sweep), "-o", str(tmp_path / "local"), "--workers", "2")
    assert local.returncode == 0, local.stderr
    assert (tmp_path / "dask" / "sweep.csv").read_bytes() == (tmp_path / "local" / "sweep.csv").read_bytes()
    unreachable = zsim("sweep", str(sweep), "-o", str(tmp_path / "x"), "--engine", "dask", "--address",
                       "tcp://127.0.0.1:9")
    assert unreachable.returncode == 2 and "cannot reach a Dask scheduler" in unreachable.stderr


def test_an_absurd_product_is_refused_before_expanding(base):
    axis = {"from": 1, "to": 1000, "step": 1}
    with pytest.raises(ConfigError, match=r"axes: 1000 × 1000 × 1000 = 1,000,000,000 points"):
        plan_of({"axes": {"model.layers": axis, "model.micro_batch": axis, "run.steps": axis}}, base)


def test_a_rerun_drops_what_killed_writes_left(tmp_path):
    """A temporary of write_text left by a SIGKILL (`.<name>.tmp-<pid>-<hex>.json`) is removed under the lock."""
    from zsim.sweep.files import drop_temporaries, write_text

    (tmp_path / "cache").mkdir()
    entry = write_text(tmp_path / "cache" / "abc.json", "{}\n")
    stale = tmp_path / "cache" / ".abc.json.tmp-123-deadbeef.json"
    stale.write_text("{")
    (tmp_path / "points" / "abc").mkdir(parents=True)
    half = tmp_path / "points" / "abc" / ".result.json.tmp-9-00.json"
    half.write_text("")
    assert drop_temporaries(tmp_path) == 2
    assert entry.is_file() and not stale.exists() and not half.exists()
    assert drop_temporaries(tmp_path / "nowhere") == 0


def test_the_cli_drops_a_killed_writes_temporary(base, tmp_path):
    """A `.<key>.json.tmp-<pid>-<hex>.json` that a SIGKILL left between write and rename is removed by the next `zsim
    sweep` into the folder, which holds its lock (the CLI takes the lock itself: the runner's cleanup used to run only
    when the runner took it, so a rare kill in the window left the file for good)."""
    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump({"base": base.name, "axes": {"zero.stage": [1, 2]}}))
    out = tmp_path / "o"
    stale = out / "cache" / ".0123abcd.json.tmp-999999-deadbeef.json"
    stale.parent.mkdir(parents=True)
    stale.write_text("{")
    result = zsim("sweep", str(sweep), "-o", str(out), "--workers", "1")
    assert result.returncode == 0, result.stderr
    assert not stale.exists() and len(entries(out / "cache")) == 2
