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


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real measurements not present: {SHARED_DATA} (see ../shared/data/README.md)")
    return SHARED_DATA
