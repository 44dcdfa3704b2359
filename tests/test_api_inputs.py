"""zsim.api called with wrong types and values (issue 28, second adversarial pass): each raises the documented
ConfigError naming the argument, never an AttributeError, TypeError or RecursionError from inside."""

from __future__ import annotations

import copy

import pytest

from tests.bad_inputs import BASE
from zsim import api
from zsim.errors import ConfigError


def _self_referring() -> dict:
    doc = copy.deepcopy(BASE)
    doc["model"]["again"] = doc
    return doc


def _shared_bomb() -> dict:
    """31 levels of ten references to one list: 10³¹ values once expanded, a few hundred bytes held."""
    value: list = [1] * 10
    for _ in range(30):
        value = [value] * 10
    return {**BASE, "description": value}


SWEEP = {"base": "scenarios/1T-1024gpu.yaml", "axes": {"zero.stage": [3]}}
CASES = {
    "load_none": (lambda: api.load(None), "source: expected"),
    "load_int": (lambda: api.load(3), "source: expected"),
    "load_bytes": (lambda: api.load(b"x.yaml"), "source: expected"),
    "load_nul": (lambda: api.load("a\0b.yaml"), "NUL"),
    "load_set_not_mapping": (lambda: api.load(BASE, set=[("zero.stage", 1)]), "set: expected a mapping"),
    "load_set_key_int": (lambda: api.load(BASE, set={1: 2}), "set: key 1"),
    "load_self_referring": (lambda: api.load(_self_referring()), "holds itself"),
    "load_shared_bomb": (lambda: api.load(_shared_bomb()), "more than 100,000 values"),
    "run_set_string": (lambda: api.run(BASE, set="zero.stage=1"), "set: expected a mapping"),
    "simulate_mapping": (lambda: api.simulate(BASE), "scenario: expected a Scenario"),
    "simulate_mode": (lambda: api.simulate(api.load(BASE), mode="fast"), "mode: 'fast'"),
    "facts_scenario": (lambda: api.facts(api.load(BASE)), "result: expected a Result"),
    "sweep_none": (lambda: api.sweep(None), "source: expected"),
    "sweep_workers_zero": (lambda: api.sweep(SWEEP, workers=0), "workers: expected"),
    "sweep_workers_string": (lambda: api.sweep(SWEEP, workers="2"), "workers: expected"),
    "sweep_workers_float": (lambda: api.sweep(SWEEP, workers=1.5), "workers: expected"),
    "sweep_out_int": (lambda: api.sweep(SWEEP, out=3), "out: expected"),
    "sweep_address_int": (lambda: api.sweep(SWEEP, address=8786), "address: expected"),
    "sweep_per_point_string": (lambda: api.sweep_run(SWEEP, per_point="yes"), "per_point: expected"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_wrong_argument_is_a_config_error(name, monkeypatch):
    monkeypatch.chdir(BASE_DIR)
    call, words = CASES[name]
    with pytest.raises(ConfigError) as caught:
        call()
    assert words in str(caught.value)


def test_a_mapping_from_another_scenario_is_not_a_cycle():
    """A section object taken from another scenario mapping (the same dict held by two documents) is accepted."""
    other = copy.deepcopy(BASE)
    scenario = api.load({**BASE, "model": other["model"], "zero": other["zero"]})
    assert scenario.layout.world == 16


BASE_DIR = __import__("pathlib").Path(__file__).resolve().parents[1]
