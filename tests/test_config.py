"""Bad scenarios: each kind gives one clear message naming the file, key and value, and exit code 2."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, small_dict
from zsim.fabric.cluster import load_cluster
from zsim.scenario.scenario import build_scenario, load_scenario
from zsim.errors import ConfigError


def error_of(data) -> str:
    with pytest.raises(ConfigError) as info:
        build_scenario(data, source="s.yaml")
    return str(info.value)


def test_wrong_type_names_path_and_value():
    msg = error_of(small_dict(model={"layers": "four"}))
    assert msg.startswith("s.yaml: model.layers: ") and "'four'" in msg


def test_float_is_not_silently_an_int():
    assert "model.hidden" in error_of(small_dict(model={"hidden": 256.5}))


def test_unknown_key_suggests_the_close_one():
    data = small_dict()
    data["model"]["layer"] = 4
    assert "model.layer: unknown key; did you mean 'layers'?" in error_of(data)


def test_unknown_section_is_rejected():
    data = small_dict()
    data["zeroo"] = {"stage": 1}
    assert "zeroo: unknown key; did you mean 'zero'?" in error_of(data)


def test_missing_key():
    data = small_dict()
    del data["zero"]["stage"]
    assert "zero.stage: required key is missing" in error_of(data)


def test_impossible_layout_gives_the_product():
    msg = error_of(small_dict(parallel={"dp": 7, "mp": 4}))
    assert "parallel.dp: 7 × mp 4 = 28 GPUs, but the cluster has 32 (2 nodes × 16 GPUs)" in msg


def test_mp_must_divide_a_node_or_fill_whole_nodes():
    msg = error_of(small_dict(model={"heads": 24, "hidden": 384}, parallel={"dp": 3, "mp": 8},
                              hardware={"profile": "dgx2", "nodes": 2, "gpus_per_node": 12}))
    assert msg == ("s.yaml: parallel.mp: 8 must divide the 12 GPUs of a node, or be a multiple of them "
                   "(an MP group fills part of one node or whole nodes)")
    # MP 32 over two 16-GPU nodes is a valid layout (Megatron allows MP across nodes)
    build_scenario(small_dict(model={"heads": 32}, parallel={"dp": 1, "mp": 32}), source="s.yaml")


def test_heads_must_split_over_mp():
    assert "model.heads" in error_of(small_dict(model={"heads": 2}))


def test_missing_hardware_profile_suggests():
    msg = error_of(small_dict(hardware={"profile": "dgx-2", "nodes": 2}))
    assert "hardware.profile" in msg and "no system profile 'dgx-2'" in msg and "did you mean 'dgx2'" in msg


def test_bf16_on_volta_is_rejected():
    assert "precision.dtype: bf16 is not supported by V100-SXM3-32GB" in error_of(small_dict(precision={"dtype": "bf16"}))


def test_global_batch_must_be_a_multiple():
    msg = error_of(small_dict(model={"global_batch": 20}))
    assert "model.global_batch: 20 is not a multiple of micro_batch 2 × dp 8 = 16" in msg


def test_grad_accum_derived_from_global_batch():
    s = build_scenario(small_dict(model={"global_batch": 64}))
    assert s.grad_accum == 4


def test_model_that_cannot_fit_is_a_scenario_error():
    # Ψ = 36(12·4096² + 13·4096) + (1024 + 128)·4096 + 2·4096 = 7,254,401,024 on 32 GPUs:
    # stage 0 needs 16Ψ = 116.1 GB; stage 1 4Ψ + 12Ψ/32 = 31.7 GB fits in 34.4 GB
    b75 = {"layers": 36, "hidden": 4096, "heads": 32}
    msg = error_of(small_dict(model=b75, parallel={"dp": 32, "mp": 1}, zero={"stage": 0}))
    assert "zero.stage: 0: the model does not fit: model states alone need 116.1 GB per GPU" in msg
    assert "ZeRO stage 1 would need 31.7 GB" in msg
    # 175B-class on 32 GPUs: not even stage 3 (87 GB) fits
    msg = error_of(small_dict(model={"layers": 96, "hidden": 12288, "heads": 96}, parallel={"dp": 32, "mp": 1}))
    assert "zero.stage: 3: the model does not fit" in msg and "more GPUs (dp), more model parallelism (mp) or more pipeline stages (pp)" in msg


def test_zero_r_options_that_need_one_another():
    msg = error_of(small_dict(zero={"cpu_offload_activations": True}))
    assert "zero.cpu_offload_activations: true needs zero.partition_activations: true" in msg
    msg = error_of(small_dict(zero={"activation_checkpointing": False, "partition_activations": True}))
    assert "zero.partition_activations: true needs zero.activation_checkpointing: true" in msg
    assert "zero.checkpoint_every: 2 needs" in error_of(small_dict(zero={"activation_checkpointing": False,
                                                                          "checkpoint_every": 2}))
    assert "zero.checkpoint_every" in error_of(small_dict(zero={"checkpoint_every": 0}))
    assert "precision.dtype" in error_of(small_dict(precision={"dtype": "fp8"}))


def test_overrides_apply_and_are_validated(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(small_dict()))
    assert load_scenario(path, ["zero.stage=1", "run.steps=2"]).zero.stage == 1
    with pytest.raises(ConfigError, match="zero.stagee: unknown key; did you mean 'stage'"):
        load_scenario(path, ["zero.stagee=1"])
    with pytest.raises(ConfigError, match="expected dotted.key=value"):
        load_scenario(path, ["zero.stage"])


def test_a_bad_override_is_blamed_on_the_override_not_the_file(tmp_path):
    """The override is merged before validation; the message still names the --set that wrote the bad
    key (or its section), and the file only where the file is to blame."""
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(small_dict()))
    with pytest.raises(ConfigError) as info:
        load_scenario(path, ["run.steps=2", "zero.stagee=1"])
    assert str(info.value) == f"--set 'zero.stagee=1' (on {path}): zero.stagee: unknown key; did you mean 'stage'?"
    with pytest.raises(ConfigError, match=r"^--set 'zero=3' \(on .*s.yaml\): zero: must be a mapping"):
        load_scenario(path, ["zero=3"])
    data = small_dict()
    data["zero"]["stagee"] = 1  # the file's own typo, with an unrelated override
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=rf"^{path}: zero.stagee: unknown key"):
        load_scenario(path, ["run.steps=2"])


@pytest.mark.parametrize("override, message", [
    ("zero..stage=1", "'zero..stage': a key part is empty"),  # was zero['']: unknown key, blamed on the file
    ("zero.=1", "'zero.': a key part is empty"),
    # was "fabric.degrade: must be a list (got {'0': ...})", blamed on the file
    ("fabric.degrade.0.factor=0.5", "'fabric.degrade' is not in the scenario, so it has no item 0; set the whole list"),
])
def test_an_override_that_cannot_be_set_says_why(tmp_path, override, message):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(small_dict()))
    with pytest.raises(ConfigError) as info:
        load_scenario(path, [override])
    assert str(info.value).startswith(f"--set '{override}': {message}")


def test_the_api_blames_its_set_entries_like_the_cli_blames_set(tmp_path):
    """api.load(mapping, set=...) names the entry that wrote a bad key; the mapping's own mistake is
    named as the mapping's (`<api>`)."""
    from zsim import api

    with pytest.raises(ConfigError, match=r"^set\['zero.stage'\] \(on <api>\): zero.stage: must be an integer <= 3"):
        api.load(small_dict(), set={"run.steps": 1, "zero.stage": 7})
    data = small_dict()
    data["zero"]["stagee"] = 1
    with pytest.raises(ConfigError, match=r"^<api>: zero.stagee: unknown key"):
        api.load(data, set={"run.steps": 1})


@pytest.mark.parametrize("zero, message", [
    ({"reduce_bucket_elements": {"": float("nan")}}, "zero.reduce_bucket_elements: must be an integer (got {'': nan})"),
    ({"stage": 1, "a.b": 2}, "zero['a.b']: unknown key"),  # not `zero.a.b`, a key that is not there
])
def test_a_value_of_the_wrong_type_is_named_before_a_nan_inside_it(zero, message):
    """The type is checked first (a .nan nested in a value that is wrong anyway was reported as
    `zero.reduce_bucket_elements.: must be a finite number`); a key with a dot or none is quoted."""
    from zsim.config.schema import ScenarioFile
    from zsim.config.validation import validate

    data = small_dict()
    data["zero"] = zero
    with pytest.raises(ConfigError) as info:
        validate(ScenarioFile, data, "s.yaml")
    assert str(info.value).startswith(f"s.yaml: {message}")
    from zsim.sweep.spec import Range

    with pytest.raises(ConfigError, match=r"^s.yaml: from: must be a finite number \(got nan\)"):
        validate(Range, {"from": float("nan"), "to": 4, "step": 1}, "s.yaml")  # an unbounded float: still refused


def test_whole_numbers_in_scientific_notation_are_integers(tmp_path):
    """Bucket sizes are written 5e7, which PyYAML reads as a string: an integer key takes it when the
    number is whole. A float (5.0e+7) is still refused, values are not coerced, with the way to write it."""
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(small_dict()).replace("zero:\n", "zero:\n  reduce_bucket_elements: 5e7\n"))
    assert load_scenario(path).zero.reduce_bucket_elements == 50_000_000
    for text in ("5E+7", "50000000"):
        assert load_scenario(path, [f"zero.reduce_bucket_elements={text}"]).zero.reduce_bucket_elements == 50_000_000
    with pytest.raises(ConfigError, match=r"must be an integer \(got 50000000.0; write 50000000 or 5e7\)"):
        load_scenario(path, ["zero.reduce_bucket_elements=5.0e+7"])
    with pytest.raises(ConfigError, match=r"zero.reduce_bucket_elements: must be an integer \(got '5.5e0'\)"):
        load_scenario(path, ["zero.reduce_bucket_elements=5.5e0"])
    with pytest.raises(ConfigError, match="model.hidden: must be an integer"):
        load_scenario(path, ["model.hidden=256.5"])
    assert "must be a string" in error_of(small_dict(name=5e7))  # only integer keys convert


def test_overrides_reach_list_items(tmp_path):
    """`--set fabric.degrade.0.factor=0.5`, the line `zsim sweep` prints to reproduce a point."""
    data = small_dict(fabric={"degrade": [{"link": "nic", "node": 1, "index": 0, "factor": 0.25}]})
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    assert load_scenario(path, ["fabric.degrade.0.factor=0.5"]).fabric.degrade[0].factor == 0.5
    with pytest.raises(ConfigError, match=r"'fabric.degrade.1': the list at 'fabric.degrade' has 1 items"):
        load_scenario(path, ["fabric.degrade.1.factor=0.5"])
    with pytest.raises(ConfigError, match="'model.layers' is a value in the scenario, not a section"):
        load_scenario(path, ["model.layers.x=1"])


def test_bad_yaml_and_missing_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: not valid YAML \(line"):
        load_scenario(bad)
    with pytest.raises(ConfigError, match="no such file"):
        load_scenario(tmp_path / "nope.yaml")
    listy = tmp_path / "list.yaml"
    listy.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_scenario(listy)


@pytest.mark.parametrize(("mutation", "expected"), [
    ({"model": {"layers": "x"}}, "model.layers"),
    ({"parallel": {"dp": 63, "mp": 16}}, "parallel.dp: 63 × mp 16 = 1008 GPUs, but the cluster has 32"),
    ({"hardware": {"profile": "nope", "nodes": 2}}, "hardware.profile"),
    ({"zero": {"stage": 7}}, "zero.stage"),
])
def test_cli_prints_one_line_and_exits_2(tmp_path, mutation, expected):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(small_dict(**mutation)))
    proc = subprocess.run([sys.executable, "-m", "zsim.cli", "run", str(path)], capture_output=True, text=True,
                          cwd=ROOT)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) <= 2 and lines[0].startswith("zsim: ") and expected in proc.stderr, proc.stderr


def test_every_shipped_scenario_loads():
    for path in sorted((ROOT / "scenarios").rglob("*.yaml")):
        if "base" in yaml.safe_load(path.read_text()):
            continue  # a sweep file (docs/sweep.md), tested in tests/test_whatif_sweeps.py
        if path.name.endswith("stage0.yaml"):
            with pytest.raises(ConfigError, match="does not fit"):  # the paper's point: baseline DP cannot
                load_scenario(path)
        else:
            assert load_scenario(path).name == path.stem


@pytest.mark.parametrize("name", ["../hwprofiles/dgx2", "/etc/passwd", "dgx2\n"])
def test_a_profile_path_is_refused_at_the_key_in_one_readable_sentence(name):
    """Containment (issue 13): a scenario names profiles, never paths; Python's `$` matching before a
    final line break does not let "dgx2\\n" through the schema's pattern."""
    rule = "a profile name (letters, digits, '.', '_', '+', '-'), not a path"
    assert f"hardware.profile: {rule} (got " in error_of(small_dict(hardware={"profile": name, "nodes": 2}))
    with pytest.raises(ConfigError) as info:
        load_cluster(name, 1)
    assert str(info.value).endswith(f": {rule}")  # one sentence, not the repr of a tuple


def test_a_folder_or_a_device_named_as_the_scenario_says_what_it_is(tmp_path):
    from zsim.scenario.scenario import find_scenario

    with pytest.raises(ConfigError, match="is a folder, expected a scenario file"):
        find_scenario(tmp_path)
    with pytest.raises(ConfigError, match="/dev/null: not a regular file, expected a scenario file"):
        find_scenario("/dev/null")
    with pytest.raises(ConfigError, match="no such file, and not a shipped scenario"):
        find_scenario(tmp_path / "nope.yaml")
