"""Shared fixtures: small scenarios built from dicts, and the path to the shared real data."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from zsim.scenario.scenario import Scenario, build_scenario

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"

SMALL = {
    "model": {"layers": 4, "hidden": 256, "heads": 8, "seq_len": 128, "vocab": 1000, "micro_batch": 2},
    "parallel": {"dp": 8, "mp": 4},
    "zero": {"stage": 3, "activation_checkpointing": True},
    "precision": {"dtype": "fp16"},
    "hardware": {"profile": "dgx2", "nodes": 2},
}


def with_sections(base: dict, **sections) -> dict:
    """A copy of the scenario mapping `base` with some sections' keys replaced: with_sections(SMALL, zero={"stage": 1})."""
    data = copy.deepcopy(base)
    for section, values in sections.items():
        if isinstance(values, dict) and isinstance(data.get(section), dict):
            data[section].update(values)
        else:
            data[section] = values
    return data


def small_dict(**sections) -> dict:
    """SMALL with some sections' keys replaced: small_dict(zero={"stage": 1})."""
    return with_sections(SMALL, **sections)


def scenario_from(base: dict, name: str, **sections) -> Scenario:
    """The scenario of `base` with some sections' keys replaced (with_sections), named `name`."""
    return build_scenario(with_sections(base, **sections), source="<test>", default_name=name)


def small_scenario(**sections) -> Scenario:
    return scenario_from(SMALL, "small", **sections)


def assert_shipped_is_point(shipped: str, point_id: str) -> None:
    """scenarios/`shipped` equals `zsim validate modern`'s point `point_id`, section for section (model, parallel, zero,
    precision, hardware): a shipped scenario said to be a published run is that run's declared scenario."""
    from zsim.scenario.scenario import load_scenario
    from zsim.validate import modern
    from zsim.validate.scale import _scenario, load_suite

    points, _ = load_suite(modern.default_suite())
    point = _scenario(next(p for p in points if p.id == point_id), modern.default_suite())
    scenario = load_scenario(ROOT / "scenarios" / shipped)
    for section in ("model", "parallel", "zero", "precision", "hardware"):
        assert getattr(scenario, section) == getattr(point, section), section


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real measurements not present: {SHARED_DATA} (see ../shared/data/README.md)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def this_host(tmp_path_factory) -> Path:
    """A host profile for the machine the tests run on: hwprofiles/hosts/dev-2core.yaml with its `cpu:` replaced by
    this machine's CPU model (zsim.calibrate.machines.this_cpu, what the runtime records). `zsim calibrate` refuses runs
    recorded on another CPU than its base profile's (zsim.calibrate.machines), and dev-2core was measured on one CPU
    model while the tests record real runs on whatever machine runs them. The file is named this-host.yaml."""
    import re

    from zsim.calibrate.machines import this_cpu

    text = (ROOT / "hwprofiles" / "hosts" / "dev-2core.yaml").read_text(encoding="utf-8")
    assert re.search(r"(?m)^cpu: ", text), "dev-2core.yaml states its CPU"
    path = tmp_path_factory.mktemp("this-host") / "this-host.yaml"
    path.write_text(re.sub(r"(?m)^cpu: .*$", lambda _: f"cpu: {this_cpu()}", text), encoding="utf-8")
    return path
