"""Cost guards (issue 13): the closed-form model states equal the layer-by-layer ones, so "does not fit"
is decided without expanding a huge `layers`; runs too large for this machine or mode are refused."""

from __future__ import annotations

import time

import pytest

from tests.conftest import small_dict, small_scenario
from zsim.scenario.scenario import build_scenario
from zsim.config.model_section import ModelSection
from zsim.errors import ConfigError, ZsimError
from zsim.workload.transformer import build_workload
from zsim.zero.cost import check_cost, estimate, model_states_closed_form
from zsim.zero.model_states import model_states


@pytest.mark.parametrize("layers", [1, 3, 7])
@pytest.mark.parametrize("mp,dp", [(1, 1), (2, 8), (4, 64)])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_closed_form_equals_the_expanded_model(layers, mp, dp, stage):
    model = ModelSection(layers=layers, hidden=96, heads=8, seq_len=64, vocab=1001, micro_batch=2)
    for dtype in ("fp16", "fp32"):
        w = build_workload(model, mp, dtype)
        expanded = model_states(w.params_per_mp_rank, dp, stage, dtype, tensors=w.tensors)
        assert model_states_closed_form(model, mp, dp, stage, dtype) == expanded


def test_a_huge_model_is_rejected_without_expanding_its_layers():
    started = time.perf_counter()
    with pytest.raises(ConfigError, match="does not fit"):
        build_scenario(small_dict(model={"layers": 100_000, "hidden": 8192, "heads": 64}, zero={"stage": 0}))
    assert time.perf_counter() - started < 5  # closed form: no 100,000 Modules, no 1.2M tensor sizes


def test_runs_too_large_for_this_machine_or_mode_are_refused(monkeypatch):
    monkeypatch.setenv("ZSIM_MAX_SECONDS", "60")
    check_cost(small_scenario())  # the small scenario is cheap
    long = small_scenario(run={"steps": 1000}, model={"layers": 2000, "grad_accum": 1000})
    with pytest.raises(ZsimError, match="lower run.steps"):
        check_cost(long)
    per_rank = small_scenario(fabric={"mode": "per_rank"}, run={"steps": 1000}, model={"layers": 200})
    assert estimate(per_rank).sim_events > estimate(small_scenario(run={"steps": 1000}, model={"layers": 200})).sim_events
    with pytest.raises(ZsimError, match="fabric.mode: class"):
        check_cost(per_rank)
