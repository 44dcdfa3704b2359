"""Pipeline parallelism in the runtime (issue 27): real gloo processes train a tiny model over 2 stages
(1F1B, GPipe, interleaved), the losses and the updated parameters equal one process running the whole
model on the same global batch, and every rank's trace holds its stage's schedule
(zsim.parallel.pipeline.stage_schedule) op for op; bad pipeline options are refused by name, exit 2."""

from __future__ import annotations

import json

import pytest
import torch

from tests.runtime.conftest import run_config, tiny_model
from zsim import cli
from zsim.errors import ConfigError
from zsim.parallel.pipeline import SCHEDULES, split_layers, stage_schedule

# fp32 sums in another order differ in the last bits (a tied embedding's gradient is two partial sums
# added across stages, the loss a mean of per-stage floats): relative 1e-5 on the losses and gradient
# norms, as tests/runtime/test_parity.py. Parameters after Adam: its step lr·m/(√v + ε) divides by the
# gradient's own size, so where a gradient is (nearly) zero its rounding noise becomes a step of up to lr.
# Attention's key bias has an exactly zero gradient (softmax is invariant to adding one number to a row
# of scores) and its query/key weights small ones at initialisation: measured, DP 2 against 1 process
# (a split the parity tests already accept) differs there by up to 3.1e-5 after 4 steps, the same as
# these pipelines. So 1e-4 absolute (1% of lr 1e-2) on qkv, 1e-5 on every other parameter.
LOSS_RTOL = 1e-5
PARAM_ATOL, QKV_ATOL = 1e-5, 1e-4
STEPS = 4
FOUR = tiny_model(layers=4, grad_accum=4)  # 4 layers: 2 stages x 2 chunks for the interleaved schedule

RUNS = {  # name: (config changes, the 1-process run it must match)
    "pp2_1f1b": (dict(pp=2, world_size=2, model=tiny_model(grad_accum=4)), "pp_base"),
    "pp2_gpipe": (dict(pp=2, world_size=2, pipeline_schedule="gpipe", model=tiny_model(grad_accum=4)), "pp_base"),
    "pp2_gpipe_ckpt_untied": (dict(pp=2, world_size=2, pipeline_schedule="gpipe", checkpointing=True,
                                   model=tiny_model(grad_accum=4, tied_head=False)), "pp_base_untied"),
    "pp2_interleaved": (dict(pp=2, world_size=2, pipeline_schedule="interleaved", virtual_stages=2, model=FOUR),
                        "pp_base_four"),
    # ZeRO-1 over DP 2 on each of 2 stages (4 ranks), an uneven split of 4 layers (3 + 1)
    "pp2_dp2_s1_uneven": (dict(pp=2, world_size=4, stage=1, pp_layers=(3, 1), model=FOUR), "pp_base_four_dp2"),
    # Megatron MP 2 x PP 2 (4 ranks): the tied copy split by vocabulary as the embedding is (vocab 256:
    # MP pads to 128 x MP, so the 1-process run needs the same vocabulary)
    "pp2_mp2": (dict(pp=2, mp=2, world_size=4, model=tiny_model(vocab=256, grad_accum=4)), "pp_base_v256"),
}
BASES = {
    "pp_base": dict(world_size=1, model=tiny_model(grad_accum=4)),
    "pp_base_untied": dict(world_size=1, model=tiny_model(grad_accum=4, tied_head=False)),
    "pp_base_four": dict(world_size=1, model=FOUR),
    "pp_base_four_dp2": dict(world_size=2, model=FOUR),
    "pp_base_v256": dict(world_size=1, model=tiny_model(vocab=256, grad_accum=4)),
}


def run(traced, name: str):
    changes = RUNS[name][0] if name in RUNS else BASES[name]
    return traced(name, steps=STEPS, save_params=True, **changes)


def params(out, ranks: list[int]) -> dict[str, torch.Tensor]:
    found: dict[str, torch.Tensor] = {}
    for rank in ranks:
        for key, value in torch.load(out / f"rank{rank}.params.pt").items():
            assert key not in found or key == "head.lm_head.weight", key
            found[key] = value
    return found


@pytest.mark.parametrize("name", list(RUNS))
def test_pipeline_trains_like_one_process(traced, name):
    """Losses and every parameter after the last step equal the 1-process run's; a tied head's copy
    on the last stage stays equal to the embedding it copies (the `all_reduce/embed` keeps them one)."""
    pipe, base = run(traced, name), run(traced, RUNS[name][1])
    assert len(pipe.summary["losses"]) == STEPS
    assert pipe.summary["losses"] == pytest.approx(base.summary["losses"], rel=LOSS_RTOL)
    assert base.summary["losses"][-1] < base.summary["losses"][0]  # it trained: not a constant compared
    changes = RUNS[name][0]
    if changes.get("mp", 1) > 1:
        return  # MP ranks hold slices of the parameters: the losses above are the comparison
    # stage 0 is ranks [0, dp), the last stage the rest (pipeline_rank); DP rank 0 of each suffices
    dp = changes["world_size"] // 2
    got, want = params(pipe.out, [0, dp]), params(base.out, [0])
    tied = "head.lm_head.weight" in got and "head.lm_head.weight" not in want
    if tied:
        torch.testing.assert_close(got.pop("head.lm_head.weight"), want["embed.tokens.weight"], atol=PARAM_ATOL,
                                   rtol=0)
    assert sorted(got) == sorted(want)
    for key in want:
        atol = QKV_ATOL if key.endswith(("attn.qkv.weight", "attn.qkv.bias")) else PARAM_ATOL
        torch.testing.assert_close(got[key], want[key], atol=atol, rtol=0, msg=key)


def test_pipeline_gradient_norm_counts_every_parameter_once(traced):
    """The gradient norm is summed over the stages (`all_reduce/norm.pp`) and counts the tied word
    embedding once, though both end stages hold it: the 1-process run's norm, step by step."""
    pipe, base = run(traced, "pp2_1f1b"), run(traced, "pp_base")
    for rank in (0, 1):
        norms = json.loads((pipe.out / f"rank{rank}.summary.json").read_text())["grad_norms"]
        want = json.loads((base.out / "rank0.summary.json").read_text())["grad_norms"]
        assert norms == pytest.approx(want, rel=LOSS_RTOL)


def expected_order(changes: dict, stage: int) -> list[tuple[str, int]]:
    """The compute and transfer spans of one step on `stage`, from stage_schedule and split_layers
    (the contract of docs/runtime.md "Pipeline parallelism")."""
    model = changes["model"]
    p, v = changes["pp"], changes.get("virtual_stages", 1)
    split = split_layers(model.layers, p, v, changes.get("pp_layers", ()))
    ckpt = changes.get("checkpointing", False)
    out: list[tuple[str, int]] = []
    for w in stage_schedule(changes.get("pipeline_schedule", "1f1b"), p, stage, model.grad_accum, v):
        first, last = stage == 0 and w.chunk == 0, stage == p - 1 and w.chunk == v - 1
        units = (["embed"] if first else []) + [f"layer.{i}" for i in split.layers[stage][w.chunk]] + (
            ["head"] if last else [])
        if w.kind == "fwd":
            names = ([] if first else ["recv/pp.fwd"]) + [f"fwd/{u}" for u in units] + ([] if last else ["send/pp.fwd"])
        else:
            names = [] if last else ["recv/pp.bwd"]
            for u in reversed(units):
                names += ([f"recompute/{u}"] if ckpt and u.startswith("layer.") else []) + [f"bwd/{u}"]
            names += [] if first else ["send/pp.bwd"]
        out += [(n, w.mb) for n in names]
    return out


def in_contract_order(events: list[dict]) -> list[dict]:
    """Events in start order, a checkpointed block's `recompute/` span (which starts inside its
    `bwd/` span: the backward recomputes first) put before that backward, as the contract lists them."""
    out = list(events)
    for i in range(1, len(out)):
        before, here = out[i - 1], out[i]
        if here["name"].startswith("recompute/") and before["name"] == "bwd/" + here["name"].split("/", 1)[1]:
            assert before["ts"] <= here["ts"] and here["ts"] + here["dur"] <= before["ts"] + before["dur"]
            out[i - 1], out[i] = here, before
    return out


@pytest.mark.parametrize("name", list(RUNS))
def test_trace_follows_the_stage_schedule(traced, name):
    """Each rank's fwd/bwd/recompute and send/recv spans of every step, in the order they start, are
    its stage's schedule; a transfer's bytes are s·b·h·4 (fp32) and its peer the neighbouring stage's
    rank."""
    changes = RUNS[name][0]
    pipe = run(traced, name)
    world, p = changes["world_size"], changes["pp"]
    model = changes["model"]
    for rank in range(world):
        stage = rank // (world // p)
        want = expected_order(changes, stage)
        events = [e for e in pipe.trace(rank)["traceEvents"] if e.get("ph") == "X"
                  and e["name"].split("/")[0] in ("fwd", "bwd", "recompute", "send", "recv")]
        assert pipe.trace(rank)["metadata"]["pipeline"]["stage"] == stage
        for step in range(STEPS):
            mine = sorted((e for e in events if e["args"]["step"] == step), key=lambda e: e["ts"])
            assert [(e["name"], e["args"]["micro_batch"]) for e in in_contract_order(mine)] == want, (rank, step)
            for e in mine:
                if e["name"].startswith(("send/", "recv/")):
                    assert e["cat"] == "comm" and e["args"]["group"] == "pp"
                    # fp32 activations; under MP each rank sends its 1/mp slice (Megatron's scatter/gather)
                    mp = changes.get("mp", 1)
                    assert e["args"]["bytes"] == model.seq_len * model.micro_batch * model.hidden * 4 // mp
                    assert e["args"]["peer"] in (rank + world // p, rank - world // p)


def test_transfers_pair_up_across_ranks(traced):
    """Every send has its receive on the peer: same name but for the verb, step, micro-batch, bytes
    and seq (the transfer's index on that link)."""
    pipe = run(traced, "pp2_1f1b")

    def transfers(rank: int, verb: str) -> list[tuple]:
        return sorted((e["name"].split("/", 1)[1], e["args"]["step"], e["args"]["micro_batch"], e["args"]["bytes"],
                       e["args"]["seq"]) for e in pipe.trace(rank)["traceEvents"]
                      if e.get("ph") == "X" and e["name"].startswith(verb + "/"))
    for a, b in ((0, 1), (1, 0)):
        assert transfers(a, "send") == transfers(b, "recv") and transfers(a, "send")


@pytest.mark.parametrize("changes,key,message", [
    (dict(pp=2, stage=2), "stage", "pipeline parallelism runs with ZeRO stage 0 or 1 only"),
    (dict(pp=2, stage=3), "stage", "DeepSpeed's pipeline engine refuses stages 2 and 3"),
    (dict(pp=2, model=tiny_model(layers=3)), "pp", "3 layers do not divide into 2 virtual stages"),
    (dict(pp=2, pp_layers=(2, 2)), "pp_layers", "2 layer counts adding to 4 for 2 virtual stages of 2 layers"),
    (dict(pp=2, pipeline_schedule="interleaved", virtual_stages=2, model=tiny_model(layers=4, grad_accum=3)),
     "grad_accum", "micro-batches per step (3) to be a multiple of pp 2"),
    (dict(pp=2, virtual_stages=2, model=tiny_model(layers=4)), "virtual_stages", "needs --pipeline-schedule interleaved"),
    (dict(pp=2, world_size=3), "pp", "ranks 3 must be mp 1 x dp x pp 2"),
    (dict(pp=2, mp=2, world_size=6, model=tiny_model(heads=2)), "pp", "ranks 6 must be mp 2 x dp x pp 2"),
    (dict(pipeline_schedule="zb-v"), "pipeline_schedule", "must be one of gpipe, 1f1b, interleaved"),
])
def test_bad_pipeline_options_are_refused_by_name(tmp_path, changes, key, message):
    with pytest.raises(ConfigError) as err:
        run_config(tmp_path, **changes)
    assert err.value.path == key and message in str(err.value)


def test_refusal_exits_2_with_one_line(tmp_path, capsys):
    model = tmp_path / "model.yaml"
    model.write_text("layers: 2\nhidden: 30\nheads: 2\nseq_len: 16\nvocab: 63\nmicro_batch: 2\n")
    code = cli.main(["trace", "--model", str(model), "--stage", "2", "--pp", "2", "--ranks", "2",
                     "-o", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "stage" in err and "pp 2" in err


def test_cli_schedules_are_the_pipeline_modules():
    from zsim.runtime import cli as runtime_cli
    assert sorted(runtime_cli.PIPELINE_SCHEDULES) == sorted(SCHEDULES)
    args = runtime_cli.argparse.ArgumentParser()
    runtime_cli.add_run_arguments(args)
    parsed = args.parse_args(["--model", "m.yaml", "-o", "o", "--pp", "2", "--pp-layers", "3,1"])
    assert parsed.pp == 2 and parsed.pp_layers == (3, 1)


def test_pipeline_config_survives_config_json(tmp_path):
    """A run folder's config.json gives back the same pipeline run (the uneven split a list in JSON)."""
    from zsim.runtime.config import RunConfig
    cfg = run_config(tmp_path, pp=2, world_size=4, stage=1, pp_layers=(3, 1), model=FOUR,
                     pipeline_schedule="gpipe")
    assert RunConfig.from_json(cfg.to_json()) == cfg and cfg.dp == 1 * 2


def test_a_stage_holds_the_activations_of_its_micro_batches_in_flight(traced):
    """Stage s's peak activation bytes scale with the micro-batches whose forward has run and backward
    not (zsim.parallel.pipeline.peak_in_flight): GPipe holds all m = 4, 1F1B p - s (2 on stage 0, 1 on
    stage 1), so GPipe's peak over 1F1B's is 2 on stage 0 and 4 on stage 1 (the ledger counts autograd's
    saved tensors per unit and micro-batch; 1% for the few bytes that do not scale)."""
    from zsim.parallel.pipeline import peak_in_flight
    runs = {name: run(traced, name) for name in ("pp2_1f1b", "pp2_gpipe")}
    for rank in (0, 1):
        peak = {name: json.loads((r.out / f"rank{rank}.summary.json").read_text())["peak_bytes"]["activations"]
                for name, r in runs.items()}
        ratio = peak_in_flight(stage_schedule("gpipe", 2, rank, 4)) / peak_in_flight(stage_schedule("1f1b", 2, rank, 4))
        assert ratio == (2, 4)[rank]
        assert peak["pp2_gpipe"] / peak["pp2_1f1b"] == pytest.approx(ratio, rel=0.01)


def test_mixed_precision_pipeline_tracks_fp32(traced):
    """fp16 with loss scaling and checkpointing over 2 stages trains like the fp32 process (within 0.05,
    as tests/runtime/test_parity.py's mixed-precision runs), and the stages agree on the overflow check
    (`all_reduce/overflow.pp`): no step skipped on either."""
    base = run(traced, "pp_base").summary["losses"]
    pipe = traced("pp2_fp16_ckpt", steps=STEPS, pp=2, world_size=2, precision="fp16", checkpointing=True,
                  model=tiny_model(grad_accum=4))
    assert pipe.summary["losses"] == pytest.approx(base, abs=0.05)
    for rank in (0, 1):
        summary = json.loads((pipe.out / f"rank{rank}.summary.json").read_text())
        assert summary["skipped_steps"] == 0
        names = {e["name"] for e in pipe.trace(rank)["traceEvents"] if e.get("ph") == "X"}
        assert {"all_reduce/overflow.pp", "all_reduce/norm.pp", "all_reduce/embed"} <= names


def test_replay_rebuilds_a_pipeline_run_with_its_layout(traced, capsys):
    """zsim replay's rebuild reads a pipeline trace's layout (pp, schedule, chunks, the stated uneven split
    3 + 1) from its metadata; on a GPU profile the scenario builds, on this CPU host the simulator's
    refusal of pipelines is what the user reads (exit 2, naming the key), not a wrong dp × mp count."""
    from zsim.calibrate.rebuild import rebuild, scenario_dict
    from zsim.trace.run_reader import read_run

    out = run(traced, "pp2_dp2_s1_uneven").out
    measured = read_run(out)
    par = scenario_dict(measured, "dgx-h100")["parallel"]
    assert par == {"dp": 2, "mp": 1, "pp": 2, "pipeline_schedule": "1f1b", "virtual_stages": 1, "pp_layers": [3, 1]}
    scenario = rebuild(measured, "dgx-h100")
    assert (scenario.parallel.pp, tuple(scenario.parallel.pp_layers)) == (2, (3, 1))
    two = run(traced, "pp2_1f1b").out  # 2 ranks: one host of the 2-core profile
    assert cli.main(["replay", str(two), "--profile", "dev-2core"]) == 2
    err = capsys.readouterr().err
    assert "hardware.profile" in err and "pipeline parallelism with a CPU host" in err
