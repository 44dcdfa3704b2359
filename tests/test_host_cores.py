"""A CPU host's cores shared by compute and gloo (zsim/engine/cores.py): an op overlapping a
collective slows down, and so does the collective, by the max-min fair shares of the rank's cores."""

from __future__ import annotations

import shutil

import pytest
import yaml

from tests.conftest import ROOT
from zsim.scenario.scenario import build_scenario
from zsim.engine.cores import speeds
from zsim.engine.simulation import simulate

SCENARIO = {"model": {"layers": 2, "hidden": 64, "heads": 4, "seq_len": 32, "vocab": 256, "micro_batch": 2},
            "parallel": {"dp": 2, "mp": 1}, "zero": {"stage": 3, "activation_checkpointing": False},
            "precision": {"dtype": "fp32"}, "hardware": {"profile": "dev-2core", "nodes": 1}, "run": {"steps": 2}}


@pytest.mark.parametrize(("share", "threads", "want"), [
    (1.0, 1, (0.5, 0.5)),   # 2 ranks on 2 cores: compute and gloo halve each other
    (2.0, 1, (1.0, 1.0)),   # a core each: no sharing
    (3.0, 2, (1.0, 1.0)),
    (2.0, 2, (0.5, 1.0)),   # gloo's thread takes its core, compute keeps the other
    (0.5, 1, (0.5, 0.5)),   # oversubscribed alone already: still halved
])
def test_speeds_are_max_min_fair_shares(share, threads, want):
    assert speeds(share, threads) == pytest.approx(want)


def _intervals(result, cat):
    return [(e["ts"], e["ts"] + e["dur"]) for e in result.events if e.get("ph") == "X" and e.get("cat") == cat]


def _overlap(lo, hi, others):
    return sum(max(0.0, min(hi, b) - max(lo, a)) for a, b in others)


@pytest.mark.parametrize(("share", "threads", "gloo", "want"), [
    (1.0, 1, 0.2, (0.8, 0.2)),   # gloo gets a fifth of the contended core (the runtime's traces: ~0.16-0.23)
    (2.0, 2, 0.2, (0.8, 0.4)),   # 0.4 of 2 cores for gloo (under its one thread), 1.6 for two compute threads
    (2.0, 1, 0.2, (1.0, 1.0)),   # a core each: no sharing, whatever the share
])
def test_speeds_give_gloo_its_share_of_a_contended_core(share, threads, gloo, want):
    assert speeds(share, threads, gloo) == pytest.approx(want)


def _host(tmp_path, monkeypatch, cores, gloo=None):
    """The shipped dev-2core host, with `cores` cores (and `gloo_core_share`), as a user profile folder."""
    shutil.copytree(ROOT / "hwprofiles", tmp_path / "hwprofiles")
    path = tmp_path / "hwprofiles/hosts/dev-2core.yaml"
    spec = yaml.safe_load(path.read_text())
    spec["cores"] = cores
    if gloo is not None:
        spec["gloo_core_share"] = gloo
    path.write_text(yaml.safe_dump(spec))
    monkeypatch.setenv("ZSIM_PROFILE_PATH", str(tmp_path / "hwprofiles"))
    return spec


@pytest.mark.parametrize("gloo", [None, 0.2])
def test_a_collective_overlapping_compute_takes_its_work_at_its_share(tmp_path, monkeypatch, gloo):
    """2 ranks on 2 cores: a gloo call's duration is its time alone plus (1 − share) of the time it ran
    beside compute (its speed there: half by default, the profile's gloo_core_share when given), measured
    on the trace itself."""
    spec = _host(tmp_path, monkeypatch, 2, gloo)
    g = 0.5 if gloo is None else gloo
    r = simulate(build_scenario(SCENARIO))
    compute = _intervals(r, "compute")
    comm = [e for e in r.events if e.get("ph") == "X" and e.get("cat") == "comm"]
    overlapped = 0
    for e in comm:
        terms = spec["collectives"][e["args"]["op"]][2]
        alone_us = terms["latency_us"] + e["args"]["bytes"] / (terms["GBps"] * 1e9) * 1e6
        o = _overlap(e["ts"], e["ts"] + e["dur"], compute)
        overlapped += o > 0
        assert e["dur"] == pytest.approx(alone_us + o * (1 - g), rel=1e-6)
    assert overlapped, "stage 3 prefetches gathers during compute: some must overlap"


def test_enough_cores_leave_every_op_at_its_own_speed(tmp_path, monkeypatch):
    """4 cores for 2 ranks of 1 thread: nothing shares, and the step is shorter than on 2 cores."""
    spec = _host(tmp_path, monkeypatch, 4)
    r4 = simulate(build_scenario(SCENARIO))
    for e in (e for e in r4.events if e.get("ph") == "X" and e.get("cat") == "comm"):
        terms = spec["collectives"][e["args"]["op"]][2]
        assert e["dur"] == pytest.approx(terms["latency_us"] + e["args"]["bytes"] / (terms["GBps"] * 1e9) * 1e6,
                                         rel=1e-9)
    _host(tmp_path / "two", monkeypatch, 2)
    r2 = simulate(build_scenario(SCENARIO))
    assert r2.step_seconds[-1] > r4.step_seconds[-1]
    assert r2.compute_seconds > r4.compute_seconds  # compute stretched where it ran beside gloo


def test_per_rank_mode_shares_each_ranks_cores_as_class_mode_does():
    """Per-rank mode gives every rank its own share and a collective crosses all its members': with
    symmetric ranks that is class mode's timing, to the bit."""
    scenario = build_scenario(SCENARIO)
    assert simulate(scenario, mode="per_rank").step_seconds == simulate(scenario).step_seconds
