"""`zsim maxsize --scenario` with pipeline stages: it searches layer counts that split over the stages,
and its trials run few micro-batches without changing any stage's memory peak."""

from __future__ import annotations

import json

import pytest

from tests.test_pipeline_engine import UNIFORM, pipe
from zsim.cli import main
from zsim.commands.maxsize import layer_unit, max_layers, pipeline_micro_batches
from zsim.engine.simulation import simulate


def _data(**parallel):
    data = {k: dict(v) for k, v in UNIFORM.items()}
    data["model"] = {**data["model"], "hidden": 1024, "heads": 16, "grad_accum": 16}
    data["parallel"] = {**data["parallel"], **parallel}
    data["zero"] = {**data["zero"], "activation_checkpointing": False}
    return data


def test_trial_micro_batches():
    assert pipeline_micro_batches(_data(pp=1, dp=8)) == 1
    assert pipeline_micro_batches(_data()) == 5  # 1F1B: p + 1 of the 16
    assert pipeline_micro_batches(_data(pipeline_schedule="gpipe")) == 16
    assert layer_unit(_data()) == 4 and layer_unit(_data(pipeline_schedule="interleaved", virtual_stages=2)) == 8


@pytest.mark.parametrize("m", [8, 16])
def test_1f1b_with_p_plus_1_micro_batches_has_every_stages_peak(m):
    """The allocated peak of each stage is the same at m = p + 1 = 5 as at m = 8 or 16."""
    def peaks(accum):
        r = simulate(pipe(model={"grad_accum": accum}), trace=False)
        return [st["peak_bytes"] for st in r.pipeline["per_stage"]]

    assert peaks(5) == peaks(m)


def test_m_equal_to_p_would_miss_the_gradients_at_the_peak():
    """Why p + 1 and not p: LLaMA-3-70B's 3D layout (TP 8 with SP × PP 4, no recompute) peaks on stage 0
    when a forward brings it back to 4 micro-batches in flight after a backward made its gradients; at
    m = 4 no forward follows a backward and the peak is 4.3 GB lower; at 5 it is m = 8's."""
    from tests.conftest import ROOT
    from zsim.config.overrides import apply_overrides
    from zsim.config.yamlfile import read_yaml_mapping
    from zsim.scenario.scenario import build_scenario

    path = ROOT / "scenarios" / "llama-3-70b-3d-dgx-h100.yaml"

    def peaks(m):
        data = apply_overrides(read_yaml_mapping(path), [f"model.global_batch={16 * m}"])
        r = simulate(build_scenario(data, base_dir=path.parent, source=str(path)), trace=False)
        return [st["peak_bytes"] for st in r.pipeline["per_stage"]]

    four, five, eight = peaks(4), peaks(5), peaks(8)
    assert five == eight and four[0] < five[0]


def test_maxsize_searches_whole_stages(tmp_path, capsys):
    """The largest model is a multiple of pp × v layers, a stated uneven split is dropped, and the found
    count fits where one more unit does not."""
    import yaml

    data = _data(pp_layers=[1, 5, 5, 5])
    data["hardware"] = {"profile": "dgx-h100", "nodes": 1}
    spec = tmp_path / "pipe.yaml"
    spec.write_text(yaml.safe_dump({"name": "pipe", **data}))
    assert main(["maxsize", "--scenario", str(spec), "--gpu-mem", "30GB", "--json", str(tmp_path / "m.json")]) == 0
    found = json.loads((tmp_path / "m.json").read_text())
    assert found["layers"] % 4 == 0 and found["layers"] >= 4
    best = max_layers({k: v for k, v in data.items()}, gpu_bytes=30 * 10**9, limit=found["layers"] + 4)
    assert best.layers == found["layers"]
    # the boundary itself: the found count fits, one more stage's worth (4 layers) does not
    from zsim.commands.maxsize import fits

    assert fits(data, found["layers"], 30 * 10**9).fits
    assert not fits(data, found["layers"] + 4, 30 * 10**9).fits


def test_a_refused_layout_is_reported_not_read_as_too_big(capsys):
    """A stage the loader refuses (DeepSpeed's ZeRO-3 with experts, ZeRO-2 or 3 with a pipeline) is the
    user's mistake, named with its reason (exit 2); only model states that exceed the GPU count as "does not
    fit"."""
    from tests.conftest import ROOT

    path = str(ROOT / "scenarios" / "mixtral-8x7b-pp4-ep8-dgx-h100.yaml")
    for sets, words in ((("zero.stage=3", "zero.implementation=deepspeed-0.14"), "MoE not supported with Stage 3"),
                        (("zero.stage=3",), "deepspeed/runtime/pipe/engine.py"),
                        (("zero.stage=2",), "deepspeed/runtime/pipe/engine.py")):
        assert main(["maxsize", "--scenario", path, *[a for s in sets for a in ("--set", s)]]) == 2
        err = capsys.readouterr().err
        assert words in err and "not even" not in err


def test_a_pipelines_step_states_hold_every_stage_so_maxsize_settles_on_the_worst_too():
    """maxsize reports the worst stage's reserved peak, so "settled" (two equal step-end states) must
    cover every stage's allocator, not stage 0's alone; a run without stages keeps its one allocator's."""
    from zsim.engine.run_state import _step_free_tag

    r = simulate(pipe(run={"steps": 3}), trace=False)
    assert len(r.step_memory_states) == 3 and len(r.stage_ledgers) == 4
    assert r.step_memory_states[-1] == tuple(ledger.allocator.state(_step_free_tag) for ledger in r.stage_ledgers)
    flat = simulate(pipe(parallel={"pp": 1, "dp": 8}, run={"steps": 2}), trace=False)
    assert flat.step_memory_states[-1] == flat.ledger.allocator.state(_step_free_tag)
