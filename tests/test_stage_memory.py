"""The closed-form pipeline stage memory (zsim.zero.stage_memory, issue 27 part 1) against the
simulator's per-stage peaks (result.pipeline.per_stage): model states byte for byte, the in-flight
micro-batch chunks exactly, the activation peak from below within what the simulator adds."""

from __future__ import annotations

import pytest

from tests.test_pipeline_engine import pipe
from zsim.engine.simulation import simulate
from zsim.zero.stage_memory import binding_stage, stage_memory

# What the simulator holds beside the closed form's saved tensors at a stage's peak: the working tensors
# of the pass that runs then (a received activation, the gradient being sent, a recomputed layer's
# temporaries) and, on the last stage, the head's. Measured on these scenarios (h 8192, s 1024, b 1,
# bf16: e·s·b·h = 16 MiB): 2 to 9 of e·s·b·h per stage, 0.2-6% of the stage's activations.
WORKING = 10


@pytest.mark.parametrize("changes", [
    {},
    {"parallel": {"pipeline_schedule": "gpipe"}},
    {"zero": {"activation_checkpointing": True}},
    {"parallel": {"pipeline_schedule": "interleaved", "virtual_stages": 2}},
])
def test_calculator_matches_the_simulated_stage_peaks(changes):
    scenario = pipe(**changes)
    simulated = simulate(scenario, trace=False).pipeline["per_stage"]
    calc = stage_memory(scenario)
    m = scenario.model
    unit = 2 * m.seq_len * m.micro_batch * m.hidden
    for sim, c in zip(simulated, calc, strict=True):
        assert c.states.as_dict() == sim["model_states"]
        assert c.in_flight == sim["in_flight_chunks"] and c.layers == sim["layers"]
        assert 0 <= sim["activations_peak_bytes"] - c.activations <= WORKING * unit, (sim, c)


def test_1f1b_first_stage_binds_and_holds_p_micro_batches():
    calc = stage_memory(pipe())
    assert [c.in_flight for c in calc] == [4, 3, 2, 1]
    assert binding_stage(calc).stage == 0


def test_maxsize_searches_layer_counts_that_split_into_the_stages():
    """With pp 4 the search tries multiples of 4 layers (Megatron-LM's even split), keeps the
    scenario's 8 micro-batches (the in-flight count sets the peak), and the next multiple does not fit."""
    import copy

    from tests.test_pipeline_engine import UNIFORM
    from zsim.commands.maxsize import fits, max_layers

    data = copy.deepcopy(UNIFORM)
    best = max_layers(data, gpu_bytes=int(40e9))
    assert best.layers % 4 == 0 and best.layers >= 4
    assert not fits(data, best.layers + 4, int(40e9)).fits


def test_zsim_memory_scenario_prints_every_stage_and_the_binding_one(capsys):
    from tests.conftest import ROOT
    from zsim.cli import main
    from zsim.scenario.scenario import load_scenario

    path = ROOT / "scenarios" / "llama-3-70b-3d-dgx-h100.yaml"
    assert main(["memory", "--scenario", str(path)]) == 0
    out = capsys.readouterr().out
    calc = stage_memory(load_scenario(path))
    assert f"Binding stage {binding_stage(calc).stage}:" in out
    for c in calc:
        assert f"{c.total / 1e9:.2f}" in out
    assert main(["memory", "--dp", "4"]) == 2
    assert "give --params and --dp, or --scenario FILE" in capsys.readouterr().err


def test_calculator_matches_the_simulated_stage_peaks_with_experts():
    """A MoE pipeline: each stage's model states (its local experts over d/ep) byte for byte, and its
    activations (the MoE MLPs' own saved tensors) from below within the working allowance."""
    from tests.test_moe_pipeline import moe_pipe

    scenario = moe_pipe()
    simulated = simulate(scenario, trace=False).pipeline["per_stage"]
    m = scenario.model
    unit = 2 * m.seq_len * m.micro_batch * m.hidden
    for sim, c in zip(simulated, stage_memory(scenario), strict=True):
        assert c.states.as_dict() == sim["model_states"]
        assert 0 <= sim["activations_peak_bytes"] - c.activations <= WORKING * unit, (sim, c)


def test_memory_scenario_mode_refuses_the_params_modes_flags(capsys):
    from tests.conftest import ROOT
    from zsim.cli import main

    path = str(ROOT / "scenarios" / "llama-3-70b-3d-dgx-h100.yaml")
    assert main(["memory", "--scenario", path, "--dp", "4"]) == 2
    assert "--dp belongs to the --params mode" in capsys.readouterr().err
    assert main(["memory", "--scenario", path, "--json", "-"]) == 0
    assert '"binding_stage": 0' in capsys.readouterr().out
