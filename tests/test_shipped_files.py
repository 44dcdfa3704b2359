"""Shipped scenarios and sweeps by name, from any folder (issue 28, part 1): package data is found through
the package, never through the source tree; sweeps are listed and resolved apart from scenarios, and each
command given the other kind of file says which command takes it."""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import ROOT
from zsim.cli import main
from zsim.config.profiles import builtin_folder
from zsim.config.shipped import find_file, shipped_name, shipped_scenarios, shipped_sweeps
from zsim.errors import ConfigError

SHIPPED_SWEEPS = {"whatif/ib-bandwidth-1T", "whatif/layout-1T", "whatif/slow-nic", "whatif/stage-vs-dp-7.5B",
                  "whatif/gpudirect-1T", "whatif/recompute-qwen3-235b-16k", "whatif/ep-overlap-qwen3-235b", "whatif/sm-contention-llama-3-70b",
                  "whatif/fp8-llama-3-70b-3d"}


def test_sweeps_and_scenarios_are_told_apart():
    sweeps, scenarios = shipped_sweeps(), shipped_scenarios()
    assert set(sweeps) == SHIPPED_SWEEPS
    assert not set(sweeps) & set(scenarios)
    assert {"1T-1024gpu", "whatif/7.5B-64gpu-slow-nic", "paper/7.5B-64gpu-stage3"} <= set(scenarios)
    assert len(sweeps) + len(scenarios) == len(list(builtin_folder("zsim.scenarios").rglob("*.yaml")))


def test_profiles_lists_sweeps_apart_from_scenarios(capsys):
    assert main(["profiles", "--json", "-"]) == 0
    table = json.loads(capsys.readouterr().out)
    assert {r["name"] for r in table["sweeps"]} == SHIPPED_SWEEPS
    assert not {r["name"] for r in table["scenarios"]} & SHIPPED_SWEEPS
    assert main(["profiles"]) == 0
    text = capsys.readouterr().out
    scenarios, sweeps = text.index("scenarios (zsim run NAME)"), text.index("sweeps (zsim sweep NAME)")
    assert scenarios < sweeps
    assert "whatif/ib-bandwidth-1T" not in text[scenarios:sweeps] and "whatif/ib-bandwidth-1T" in text[sweeps:]


def test_a_sweep_by_name_from_another_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ib = builtin_folder("zsim.scenarios") / "whatif" / "ib-bandwidth-1T.yaml"
    for text in ("whatif/ib-bandwidth-1T", "ib-bandwidth-1T", "scenarios/whatif/ib-bandwidth-1T.yaml"):
        assert find_file(text, "sweep") == ib
    assert shipped_name(ib) == "whatif/ib-bandwidth-1T"
    with pytest.raises(ConfigError, match=r"not a shipped sweep \(did you mean 'ib-bandwidth-1T'"):
        find_file("ib-bandwith-1T", "sweep")


def test_zsim_sweep_and_api_sweep_take_a_shipped_name(tmp_path, monkeypatch, capsys):
    from zsim import api

    monkeypatch.chdir(tmp_path)
    table = api.sweep("whatif/stage-vs-dp-7.5B")  # 20 points of a 7.5B model: a few seconds
    assert len(table) == 20 and {"zero.stage", "parallel.dp", "step_s"} <= set(table.columns)
    assert main(["sweep", "whatif/stage-vs-dp-7.5B", "--workers", "1", "--no-plot", "-o", "s"]) == 0
    assert len((tmp_path / "s" / "sweep.csv").read_text().splitlines()) == 21


def test_run_on_a_sweep_file_says_to_use_sweep(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["run", "whatif/ib-bandwidth-1T"]) == 2
    err = capsys.readouterr().err
    assert "a sweep file (it has `base:`), not a scenario: run it with `zsim sweep whatif/ib-bandwidth-1T`" in err
    assert "unknown key" not in err
    mine = tmp_path / "mine.yaml"
    mine.write_text(f"base: {ROOT / 'scenarios' / '1T-1024gpu.yaml'}\naxes: {{zero.stage: [2, 3]}}\n")
    assert main(["run", str(mine)]) == 2
    assert f"run it with `zsim sweep {mine}`" in capsys.readouterr().err


def test_sweep_on_a_scenario_says_to_use_run(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["sweep", "1T-1024gpu"]) == 2
    assert "a scenario file, not a sweep (no `base:`): run it with `zsim run 1T-1024gpu`" in capsys.readouterr().err


def test_validate_replay_dry_run_checks_the_suite_without_recording(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["validate", "replay", "--dry-run", "--json", "plan.json"]) == 0
    out = capsys.readouterr().out
    assert "the suite checks out; nothing recorded" in out and "would record 24 runs of 2 ranks" in out
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["dry_run"] and len(plan["calibrate"]) == 4 and len(plan["replay"]) == 4
    assert all(str(builtin_folder("zsim.scenarios")) in path for path in plan["models"].values())
    assert not (tmp_path / "out").exists()  # nothing recorded
    bad = tmp_path / "suite.yaml"
    bad.write_text(re.sub(r"gpt-tiny-b\.yaml", "gpt-tiny-c.yaml",
                          (ROOT / "zsim" / "validate" / "suites" / "replay-cpu.yaml").read_text()))
    assert main(["validate", "replay", "--dry-run", "--suite-file", str(bad)]) == 2
    assert "scenario 'calibrate/gpt-tiny-c.yaml' is neither beside the suite" in capsys.readouterr().err
    assert main(["validate", "megatron", "--dry-run"]) == 2
    assert "--dry-run applies to the replay suite" in capsys.readouterr().err


def test_validate_replay_without_torch_says_what_to_install(tmp_path, monkeypatch, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    assert main(["validate", "replay", "-o", str(tmp_path / "o")]) == 2
    assert "needs torch: pip install 'zsim[runtime]'" in capsys.readouterr().err
    assert not list((tmp_path / "o").glob("*/rank*.trace.json"))


def test_package_code_never_reaches_into_the_source_tree():
    """Package data is found through the package (importlib / builtin_folder): a path climbing from a
    module's __file__ out of zsim/ works in a checkout and fails from a wheel (issue 28)."""
    climbing = re.compile(r"__file__\)[^\n]*\.parents\[[1-9]\]|__file__\)[^\n]*(\.parent){2,}")
    offenders = [f"{p.relative_to(ROOT)}:{n}" for p in (ROOT / "zsim").rglob("*.py")
                 for n, line in enumerate(p.read_text().splitlines(), 1) if climbing.search(line)]
    assert offenders == []
