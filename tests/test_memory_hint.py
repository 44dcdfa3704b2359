"""The summary's `hint` line for a run that does not fit (zsim.report.memory_hint): the keys that cut what makes
the peak, activations or model states, that the scenario does not use yet; none for a run that fits."""

import copy

from tests.conftest import ROOT
from zsim import api
from zsim.report.facts import facts
from zsim.report.memory_hint import activation_options, memory_hint, state_options
from zsim.report.summary import summary


def _facts(path, modules=None):
    return facts(api.simulate(api.load(ROOT / path, None if modules is None else {"zero.recompute_modules": modules})))


def test_a_moe_run_short_of_memory_is_pointed_at_the_moe_recompute():
    """Qwen3-235B at 16k with the 4k runs' "norm, act" does not fit (activations 80% of the peak): the hint names
    the MoE layer's recompute, which whatif/recompute-qwen3-235b-16k shows is what fits."""
    f = _facts("scenarios/qwen3-235b-a22b-16k-tp4-h100.yaml", ["layernorm", "moe_act"])
    assert not f["fits"]
    (line,) = memory_hint(f)
    assert line.startswith("  hint      activations are") and "zero.recompute_modules with moe" in line
    assert "not simulated here" in line and line in summary(f)
    fits = _facts("scenarios/qwen3-235b-a22b-16k-tp4-h100.yaml")
    assert fits["fits"] and memory_hint(fits) == [] and "  hint" not in summary(fits)


def test_model_states_short_of_memory_are_pointed_at_the_zero_stage():
    f = _facts("scenarios/paper/7.5B-64gpu-stage1.yaml")
    (line,) = memory_hint(f)
    assert line.startswith("  hint      model states are") and "zero.stage above 1" in line


def test_the_options_follow_what_the_scenario_already_uses():
    base = _facts("scenarios/qwen3-235b-a22b-16k-tp4-h100.yaml", ["layernorm", "moe_act"])
    f = copy.deepcopy(base)
    f["zero"]["recompute_modules"] = ["moe"]  # already recomputing the MoE layer: only full granularity is left
    assert activation_options(f) == ["zero.recompute_granularity: full"]
    f["zero"]["activation_checkpointing"] = False
    assert activation_options(f)[0] == "zero.activation_checkpointing: true"
    f["layout"]["sequence_parallel"], f["model"]["micro_batch"] = False, 4
    assert "parallel.sequence_parallel: true" in activation_options(f)
    assert activation_options(f)[-1] == "model.micro_batch below 4"
    f["memory"]["attention"]["share_of_peak_activations"] = 0.5
    assert any(o.startswith("model.attention: auto") for o in activation_options(f))
    f["zero"]["activation_checkpointing"] = True  # selective of [moe] only, scores half the activations
    assert activation_options(f)[0] == "zero.recompute_modules with core_attn"
    # a pipeline keeps ZeRO at stage 0-1 (DeepSpeed's refusal): no higher stage offered there
    assert state_options(base) == ["parallel.mp above 4 (or parallel.pp)"]
