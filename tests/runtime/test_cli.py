"""`zsim trace` options: user mistakes are one-line errors with exit code 2; a scenario file gives
the run its defaults."""

from __future__ import annotations

import argparse

import pytest

from zsim.runtime.cli import add_run_arguments, config_from_args
from tests.runtime.conftest import TINY
from zsim import cli
from zsim.errors import ConfigError


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "model.yaml"
    path.write_text("\n".join(f"{k}: {v}" for k, v in TINY.items()))
    return path


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_run_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.mark.parametrize("extra,message", [
    (["--ranks", "3", "--mp", "2"], "mp: 2 must be >= 1 and divide the 3 ranks"),
    (["--ranks", "6", "--mp", "3"], "model.heads: 2 heads cannot be split evenly across mp 3"),
    (["--steps", "0"], "--steps '0': expected a positive integer"),
    (["--lr", "nan"], "--lr 'nan': expected a finite number"),
    (["--grad-accum", "0"], "--grad-accum '0': expected a positive integer"),
    (["--fail-rank", "1"], "--fail-rank and --fail-at-step go together"),
    (["--fail-rank", "0", "--fail-at-step", "10", "--steps", "3"], "must be a step of the run, 0 to 2 (got 10)"),
])
def test_bad_options_exit_2_with_one_line(model_file, tmp_path, capsys, extra, message):
    code = cli.main(["trace", "--model", str(model_file), "--stage", "1", "-o", str(tmp_path / "o"), *extra])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") <= 2 and "Traceback" not in err


def test_missing_file_and_bad_key(tmp_path, capsys):
    assert cli.main(["trace", "--model", str(tmp_path / "nope.yaml"), "--stage", "0", "-o", str(tmp_path)]) == 2
    assert "nope.yaml: no such file" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("layers: 2\nlayerz: 2\nhidden: 32\nheads: 2\nseq_len: 16\nvocab: 64\nmicro_batch: 2\n")
    assert cli.main(["trace", "--model", str(bad), "--stage", "0", "-o", str(tmp_path)]) == 2
    assert "did you mean 'layers'" in capsys.readouterr().err


def test_model_only_file_needs_a_stage(model_file, tmp_path):
    with pytest.raises(ConfigError, match="give --stage"):
        config_from_args(parse("--model", str(model_file), "-o", str(tmp_path)))
    cfg = config_from_args(parse("--model", str(model_file), "--stage", "2", "-o", str(tmp_path)))
    assert (cfg.stage, cfg.precision, cfg.checkpointing, cfg.world_size, cfg.accum) == (2, "fp32", False, 2, 1)


def test_scenario_file_gives_defaults(tmp_path):
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text("""
model: {layers: 2, hidden: 32, heads: 2, seq_len: 16, vocab: 64, micro_batch: 2, global_batch: 16}
parallel: {dp: 8}
zero: {stage: 3, activation_checkpointing: true, reduce_bucket_elements: 1000, prefetch_layers: 1}
precision: {dtype: bf16}
hardware: {profile: dgx2, nodes: 1}
""")
    cfg = config_from_args(parse("--model", str(scenario), "--ranks", "4", "-o", str(tmp_path)))
    assert (cfg.stage, cfg.precision, cfg.checkpointing, cfg.bucket_elements) == (3, "bf16", True, 1000)
    assert cfg.accum == 2  # global_batch 16 = micro_batch 2 x 4 ranks x 2
    with pytest.raises(ConfigError, match="model.global_batch: 16 is not a multiple"):
        config_from_args(parse("--model", str(scenario), "--ranks", "3", "-o", str(tmp_path)))
    override = config_from_args(parse("--model", str(scenario), "--ranks", "4", "--stage", "1", "--precision",
                                      "fp32", "--no-checkpointing", "-o", str(tmp_path)))
    assert (override.stage, override.precision, override.checkpointing) == (1, "fp32", False)
    scenario.write_text(scenario.read_text() + "foo: 1\n")  # as zsim run reads it: an unknown section is an error
    with pytest.raises(ConfigError, match="foo: unknown key"):
        config_from_args(parse("--model", str(scenario), "--ranks", "4", "-o", str(tmp_path)))


def test_torchrun_world_size_wins(model_file, tmp_path):
    args = parse("--model", str(model_file), "--stage", "0", "-o", str(tmp_path))
    assert config_from_args(args, world_size=8).world_size == 8
    with pytest.raises(ConfigError, match="disagrees with WORLD_SIZE"):
        config_from_args(parse("--model", str(model_file), "--stage", "0", "--ranks", "2", "-o", str(tmp_path)),
                         world_size=8)


def test_trace_command_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, zsim.cli; zsim.cli.build_parser(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


@pytest.mark.parametrize("changes,key", [
    (dict(position="alibi"), "model.position"),
    (dict(layer_norms=4), "model.layer_norms"),
    (dict(qk_norm="head"), "model.qk_norm"),
    (dict(sliding_window=16), "model.sliding_window"),
    (dict(loss="fused"), "model.loss"),
    (dict(loss="torch"), "model.loss"),
    (dict(mtp_layers=1), "model.mtp_layers"),
])
def test_model_options_the_runtime_does_not_build_are_refused(tmp_path, changes, key):
    """A model the simulator prices but the runtime's GPT does not build is refused by key, never traced as
    a plain GPT in its place."""
    from tests.runtime.conftest import run_config, tiny_model

    with pytest.raises(ConfigError) as err:
        run_config(tmp_path, model=tiny_model(**changes))
    assert err.value.path == key and "does not build" in str(err.value)


SCENARIO_HEAD = "name: t\nmodel: {layers: 2, hidden: 64, heads: 4, seq_len: 32, vocab: 128, micro_batch: 1}\nparallel: {dp: 2}\n"


@pytest.mark.parametrize("sections, key", [
    # precision.master_weights false is simulated, but the runtime keeps an fp32 master
    ("zero: {stage: 1}\nprecision: {dtype: bf16, master_weights: false}\n", "precision.master_weights"),
    # selective recompute (any recompute_modules) is simulated, but the runtime checkpoints whole blocks
    ("zero: {stage: 1, recompute_granularity: selective}\n", "zero.recompute_granularity"),
    # context parallelism is simulated, but the runtime's ranks run whole sequences
    ("zero: {stage: 1}\n", "parallel.cp"),
    # Megatron-Core's --use-tp-pp-dp-mapping is simulated, but the runtime's pipeline takes the default rank order
    ("zero: {stage: 1}\n", "parallel.rank_order"),
])
def test_a_scenario_the_runtime_would_train_otherwise_is_refused_by_key(tmp_path, sections, key):
    """Refused, naming the key, rather than traced as something else (mixed precision, full recompute, no CP)."""
    from runtime.config import read_model_file

    path = tmp_path / "run.yaml"
    head = {"parallel.cp": SCENARIO_HEAD.replace("{dp: 2}", "{dp: 1, cp: 2}"),
            "parallel.rank_order": SCENARIO_HEAD.replace("{dp: 2}", "{dp: 1, pp: 2, rank_order: tp-cp-pp-dp}")
            }.get(key, SCENARIO_HEAD)
    path.write_text(head + sections + "hardware: {profile: dgx2, nodes: 1, gpus_per_node: 2}\n")
    with pytest.raises(ConfigError) as err:
        read_model_file(path)
    assert err.value.path == key and "cannot be traced yet" in str(err.value)
    if key == "zero.recompute_granularity":  # full granularity is what the runtime traces
        path.write_text(path.read_text().replace("recompute_granularity: selective", "recompute_granularity: full"))
        assert read_model_file(path).checkpointing is True
    if key == "parallel.rank_order":  # the default order is what the runtime traces
        path.write_text(path.read_text().replace(", rank_order: tp-cp-pp-dp", ""))
        assert read_model_file(path).stage == 1
