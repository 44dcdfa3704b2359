"""Bounded cost of the pipeline keys (issue 28): what the loader, `zsim memory --scenario`, `zsim maxsize`
and `zsim trace`'s memory guard do with many virtual stages, modules or micro-batches stays linear or is
refused before it starts, and the refusal names the limit. The command-line cases are in
tests/bad_inputs.py (pipeline/*); these check the pieces they rest on."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pytest

from runtime.cli import add_run_arguments, config_from_args
from zsim.config.limits import limit
from zsim.errors import ConfigError
from zsim.parallel.pipeline import check_schedule_size, split_layers


def naive_split(layers: int, stages: int, chunks: int, counts: tuple[int, ...]) -> list[list[range]]:
    """The split written out by hand: virtual stage c·p + s is chunk c of stage s."""
    virtual = stages * chunks
    counts = counts or (layers // virtual,) * virtual
    ranges, start = [], 0
    for n in counts:
        ranges.append(range(start, start + n))
        start += n
    return [[ranges[c * stages + s] for c in range(chunks)] for s in range(stages)]


@pytest.mark.parametrize("layers,stages,chunks,counts", [
    (8, 2, 1, ()), (12, 2, 3, ()), (7, 2, 1, (3, 4)), (10, 2, 2, (1, 4, 2, 3)), (5, 1, 1, ())])
def test_split_layers_is_the_split_written_out(layers, stages, chunks, counts):
    got = split_layers(layers, stages, chunks, counts).layers
    assert [list(s) for s in got] == naive_split(layers, stages, chunks, counts)


def test_split_layers_is_linear_in_the_virtual_stages():
    """100,000 one-layer chunks: a sum per prefix was ~5·10⁹ additions (the loader, memory, maxsize and
    the runtime's config all hung on it)."""
    started = time.perf_counter()
    split = split_layers(100_000, 2, 50_000)
    assert time.perf_counter() - started < 2.0
    assert split.layers[1][-1] == range(99_999, 100_000) and split.layers[0][1] == range(2, 3)


def test_schedule_walks_past_the_limit_are_refused_naming_it(monkeypatch):
    cap = limit("SCHEDULE_ITEMS")
    check_schedule_size(4, cap // 8)  # 2·4·m = cap: at the limit
    with pytest.raises(ConfigError, match="SCHEDULE_ITEMS") as err:
        check_schedule_size(4, cap // 8 + 1, source="s.yaml")
    assert str(err.value).startswith("s.yaml: parallel.pp:")
    monkeypatch.setenv("ZSIM_MAX_SCHEDULE_ITEMS", str(cap * 2))
    check_schedule_size(4, cap // 8 + 1)


def _trace_config(tmp_path, *argv: str):
    model = tmp_path / "model.yaml"
    model.write_text(f"layers: {1024 if '--pp' in argv else 4}\nhidden: 32\nheads: 2\nseq_len: 8\nvocab: 64\n"
                     "micro_batch: 1\n")
    parser = argparse.ArgumentParser()
    add_run_arguments(parser)
    return config_from_args(parser.parse_args(["--model", str(model), "--stage", "1", "--device", "cpu",
                                               "-o", str(tmp_path / "out"), *argv]))


def test_trace_guard_counts_each_rank_process(tmp_path, monkeypatch):
    """1024 ranks of a 4-layer, 32-wide model passed the guard (~0 bytes of model each) and the launcher
    began forking 1024 torch interpreters of ~57 MB each; now the process is counted."""
    from runtime import launch

    monkeypatch.setattr("zsim.zero.cost.available_bytes", lambda: 16e9)
    with pytest.raises(ConfigError, match="1024 ranks .* GB of process"):
        launch._check_memory(_trace_config(tmp_path, "--ranks", "1024"))
    launch._check_memory(_trace_config(tmp_path, "--ranks", "2"))  # the tests' own traces still pass


def test_trace_guard_bounds_its_schedule_walk_first(tmp_path, monkeypatch):
    """pp 1024 with 10⁶ micro-batches: the guard walked 2·10⁹ schedule items before refusing anything."""
    from runtime import launch

    monkeypatch.setattr("zsim.zero.cost.available_bytes", lambda: float("inf"))
    cfg = _trace_config(tmp_path, "--ranks", "1024", "--pp", "1024", "--grad-accum", "1000000")
    started = time.perf_counter()
    with pytest.raises(ConfigError, match="SCHEDULE_ITEMS") as err:
        launch._check_memory(cfg)
    assert err.value.path == "pp" and time.perf_counter() - started < 1.0


def test_a_bucket_of_many_modules_is_summed_once(tmp_path):
    """One reduction bucket holding 20,000 small layers: each member summed the whole bucket (4·10⁸
    additions per micro-batch pass); each member still gets its bucket's total."""
    from zsim.scenario.scenario import build_scenario
    from zsim.zero.ops import PlanBuilder
    from zsim.zero.rank_states import scenario_workload
    from zsim.zero.step_pass import StepPass

    scenario = build_scenario({
        "model": {"layers": 20_000, "hidden": 8, "heads": 2, "seq_len": 8, "vocab": 64, "micro_batch": 1},
        "parallel": {"dp": 16}, "zero": {"stage": 1}, "hardware": {"profile": "dgx2", "nodes": 1}})
    workload = scenario_workload(scenario)
    started = time.perf_counter()
    step = StepPass(PlanBuilder(), scenario, workload, 0, 0, ())
    assert time.perf_counter() - started < 2.0
    total = sum(m.params for m in workload.modules)  # 20k small layers: one bucket of 5e8 elements
    assert set(step.bucket_elements_of.values()) == {total}


def _replay_suite(tmp_path, **changes) -> "Path":
    from tests.conftest import ROOT

    suite = {"base_profile": "dev-2core", "ranks": 2, "steps": 3,
             "calibrate": [{"scenario": str(ROOT / "scenarios/calibrate/gpt-tiny-a.yaml"), "stage": 0}],
             "replay": [{"scenario": str(ROOT / "scenarios/calibrate/gpt-tiny-b.yaml"), "stage": 0}],
             "criteria": {"median_step_error": 0.1, "max_step_error": 0.25}}
    for key, value in changes.items():
        suite[key] = value
    path = tmp_path / "suite.yaml"
    import yaml

    path.write_text(yaml.safe_dump(suite))
    return path


@pytest.mark.parametrize("changes,message", [
    # 100,000 steps and 10⁹ micro-batches per entry were accepted and recorded (issue 28)
    (dict(steps=100_000), "steps"),
    (dict(replay=[{"scenario": "calibrate/gpt-tiny-b.yaml", "stage": 0, "grad_accum": 10**9}]), "grad_accum"),
])
def test_a_replay_suite_is_refused_before_its_first_recording(tmp_path, monkeypatch, changes, message):
    from zsim.validate import replay

    def recorded(*args, **kwargs):
        raise AssertionError("a run was recorded before the suite was checked")

    monkeypatch.setattr(replay, "record", recorded)
    with pytest.raises(ConfigError, match=message):
        replay.run_suite(_replay_suite(tmp_path, **changes), tmp_path / "out")


def test_a_replay_entry_the_runtime_refuses_is_named(tmp_path):
    """An entry whose run the runtime's RunConfig refuses (a global batch that 2 ranks cannot split) was
    found only when its turn to record came, after the entries before it had run (issue 28)."""
    from zsim.validate.replay import load_suite

    model = tmp_path / "odd.yaml"
    model.write_text("layers: 2\nhidden: 32\nheads: 2\nseq_len: 8\nvocab: 64\nmicro_batch: 1\nglobal_batch: 3\n")
    path = _replay_suite(tmp_path, replay=[{"scenario": str(model), "stage": 0}])
    with pytest.raises(ConfigError, match=r"odd-s0-ga1 .*global_batch") as err:
        load_suite(path)
    assert str(err.value).startswith(str(path))


def test_a_layer_count_below_one_is_named_even_when_the_counts_add_up():
    """[10³⁰, 4 − 10³⁰] adds to 4 layers: it was refused as counts 'adding to 4 for 2 virtual stages of 4'."""
    with pytest.raises(ValueError, match="layer count -1e\\+30 of a virtual stage is less than 0"):
        split_layers(4, 2, 1, (10**30, 4 - 10**30))
