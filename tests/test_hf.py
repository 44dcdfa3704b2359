"""`model.from_hf`: Hugging Face config.json files give exact parameter counts, scenario keys override
them, and every way the import can fail is a one-line ConfigError naming the file and key."""

import json
import subprocess
import sys

import pytest
import yaml

from tests.conftest import ROOT, small_dict
from zsim.config.hf import read_hf_config, resolve_from_hf
from zsim.scenario.scenario import build_scenario, load_scenario
from zsim.config.model_section import ModelSection
from zsim.errors import ConfigError
from zsim.workload.parameters import total_params
from zsim.workload.shape import Shape
from zsim.workload.transformer import build_workload
from zsim.config.struct import dump, replace
from zsim.config.validation import validate

HF = ROOT / "scenarios" / "hf"

# Published parameter counts of the released checkpoints: the sum of the tensor sizes in each
# model's Hugging Face safetensors files, as the Hub shows it and as GGUF conversions record it in
# general.parameter_count; GPT-NeoX-20B's is also in its model card ("n_parameters 20554567680").
# Each is derived by hand from the architecture in docs/models.md. (GPT-2's paper says "1542M" for
# GPT-2 XL; the released checkpoint holds 1,557,611,200: the paper's figure is not the checkpoint's.)
PUBLISHED = {
    "llama-2-7b.json": 6_738_415_616,  # meta-llama/Llama-2-7b-hf
    "llama-3-70b.json": 70_553_706_496,  # meta-llama/Meta-Llama-3-70B
    "mistral-7b.json": 7_241_732_096,  # mistralai/Mistral-7B-v0.1
    "gpt2-xl.json": 1_557_611_200,  # openai-community/gpt2-xl
    "gpt-neox-20b.json": 20_554_567_680,  # EleutherAI/gpt-neox-20b
    "qwen2-7b.json": 7_615_616_512,  # Qwen/Qwen2-7B (the same shape as Qwen2.5-7B)
    "qwen2-0.5b.json": 494_032_768,  # Qwen/Qwen2-0.5B (tied head)
    "llama-3.1-8b.json": 8_030_261_248,  # meta-llama/Llama-3.1-8B
    "phi-3-mini.json": 3_821_079_552,  # microsoft/Phi-3-mini-4k-instruct (untied)
}
# Shapes the runtime's GPT does not build (heads × head_dim ≠ hidden; OLMo's norm without weights; OPT's
# offset position rows): the simulator's counts only (tests/runtime/test_shapes.py checks PUBLISHED).
PUBLISHED_SIMULATOR_ONLY = {
    "mistral-nemo-12b.json": 12_247_782_400,  # mistralai/Mistral-Nemo-Base-2407 (head_dim 128 × 32 ≠ 5120)
    "gemma-7b.json": 8_537_680_896,  # google/gemma-7b (head_dim 256 × 16 ≠ 3072; tied head)
    "olmo-7b.json": 6_888_095_744,  # allenai/OLMo-7B-hf (no norm parameters)
    "opt-1.3b.json": 1_315_758_080,  # facebook/opt-1.3b (2050 position rows; tied head)
    "bloom-560m.json": 559_214_592,  # bigscience/bloom-560m (ALiBi, embedding LayerNorm; tied head)
}


@pytest.mark.parametrize("name, count", PUBLISHED_SIMULATOR_ONLY.items())
def test_simulator_only_families_match_the_released_checkpoint(name, count):
    assert total_params(imported(name)) == count


def imported(name: str, **keys) -> ModelSection:
    return ModelSection(**(read_hf_config(HF / name) | {"micro_batch": 1} | keys))


@pytest.mark.parametrize("name,count", PUBLISHED.items())
def test_parameter_count_matches_the_released_checkpoint(name, count):
    psi = total_params(imported(name))
    assert abs(psi - count) <= 0.001 * count  # the bar: within 0.1%
    assert psi == count  # and in fact exact
    # The simulator's workload holds the same Ψ (no Megatron padding for an imported vocabulary).
    assert build_workload(imported(name), mp=1).total_params == count


def test_each_family_maps_to_its_shape():
    llama3, gpt2, neox, qwen = (Shape.of(imported(n)) for n in
                                ("llama-3-70b.json", "gpt2-xl.json", "gpt-neox-20b.json", "qwen2-7b.json"))
    assert (llama3.kv_heads, llama3.ffn, llama3.gated, llama3.norm, llama3.position, llama3.tied_head,
            llama3.linear_bias, llama3.qkv_bias) == (8, 28672, True, "rmsnorm", "rotary", False, False, False)
    assert (gpt2.ffn, gpt2.gated, gpt2.position, gpt2.positions, gpt2.tied_head, gpt2.norm) == \
        (6400, False, "learned", 1024, True, "layernorm")
    assert (neox.position, neox.tied_head, neox.linear_bias, neox.norm) == ("rotary", False, True, "layernorm")
    assert (qwen.qkv_bias, qwen.linear_bias, qwen.kv_heads) == (True, False, 4)
    assert imported("llama-3-70b.json").seq_len == 8192  # max_position_embeddings
    # Dropout: GPT-2 trained with p = 0.1; LLaMA (attention_dropout 0.0) and GPT-NeoX-20B (0) without.
    assert (gpt2.dropout, llama3.dropout, neox.dropout) == (True, False, False)


def test_gpt2_position_table_keeps_its_rows_when_training_shorter():
    """GPT-2's wpe has n_positions = 1024 rows whatever sequence length one trains at."""
    assert total_params(imported("gpt2-xl.json", seq_len=512)) == PUBLISHED["gpt2-xl.json"]
    with pytest.raises(ValueError, match="longer than the 1024 rows"):
        imported("gpt2-xl.json", seq_len=2048)


def test_vocab_is_padded_only_as_far_as_mp_needs():
    gpt2 = imported("gpt2-xl.json", heads=20)  # 20 heads so that MP 4 is possible
    assert build_workload(gpt2, mp=1).padded_vocab == 50257
    assert build_workload(gpt2, mp=4).padded_vocab == 50260  # a multiple of 4 for the vocab-parallel embedding
    # Megatron's padding on request: vocab_padding 128 gives 128·mp multiples.
    assert build_workload(imported("gpt2-xl.json", vocab_padding=128), mp=1).padded_vocab == 50304


def scenario_with(tmp_path, model: dict, name="s.yaml") -> dict:
    data = small_dict()
    data["model"] = model
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def test_scenario_keys_override_the_import_and_paths_are_relative_to_the_scenario(tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "config.json").write_text((HF / "llama-2-7b.json").read_text())
    path = scenario_with(tmp_path, {"from_hf": "models", "layers": 4, "seq_len": 256, "micro_batch": 1})
    s = load_scenario(path)
    full = imported("llama-2-7b.json")
    assert (s.model.layers, s.model.seq_len, s.model.hidden, s.model.kv_heads) == (4, 256, 4096, 32)
    assert total_params(s.model) == total_params(full) - 28 * Shape.of(full).layer_params


def test_set_override_reaches_an_imported_key(tmp_path):
    path = scenario_with(tmp_path, {"from_hf": str(HF / "mistral-7b.json"), "seq_len": 1024, "micro_batch": 1})
    s = load_scenario(path, ["model.kv_heads=32"])
    assert s.model.kv_heads == 32 and s.model.ffn_hidden == 14336


def test_shipped_llama3_scenario_loads_with_the_published_count():
    s = load_scenario(ROOT / "scenarios" / "llama-3-70b-dgx-h100.yaml")
    assert total_params(s.model) == PUBLISHED["llama-3-70b.json"]
    assert s.model.from_hf == str(HF / "llama-3-70b.json") and s.layout.mp == 8  # where it was read


def test_resolving_twice_from_another_folder_gives_the_same_model(tmp_path, monkeypatch):
    """A resolved mapping names its config absolutely, so code that validates it again elsewhere
    (zsim maxsize --scenario, the Python API) reads the same file."""
    data = yaml.safe_load((ROOT / "scenarios" / "llama-3-70b-dgx-h100.yaml").read_text())
    once = resolve_from_hf(data, source="s.yaml", base_dir=ROOT / "scenarios")
    monkeypatch.chdir(tmp_path)
    assert resolve_from_hf(once, source="s.yaml") == once


def hf_error(tmp_path, config, name="config.json") -> str:
    path = tmp_path / name
    path.write_text(config if isinstance(config, str) else json.dumps(config))
    with pytest.raises(ConfigError) as info:
        resolve_from_hf({"model": {"from_hf": str(path), "micro_batch": 1}}, source="s.yaml")
    return str(info.value)


def test_missing_file_names_the_scenario_key_and_the_file(tmp_path):
    with pytest.raises(ConfigError) as info:
        resolve_from_hf({"model": {"from_hf": "nope/config.json"}}, source="s.yaml", base_dir=tmp_path)
    assert str(info.value) == f"s.yaml: model.from_hf: {tmp_path / 'nope' / 'config.json'}: no such file"


def test_bad_json_unknown_type_missing_and_wrong_keys(tmp_path):
    assert "config.json: not valid JSON (line 1, column 2)" in hf_error(tmp_path, "{oops")
    assert "config.json: expected a JSON object, got list" in hf_error(tmp_path, "[1]")
    msg = hf_error(tmp_path, {"model_type": "bert", "hidden_size": 768})
    assert "config.json: model_type: 'bert' is not a model type zsim can import (known: gpt2, gpt_neox, llama" in msg
    assert "model_type: missing is not a model type" in hf_error(tmp_path, {"hidden_size": 8})
    llama = json.loads((HF / "llama-2-7b.json").read_text())
    del llama["intermediate_size"]
    assert "config.json: intermediate_size: required for model_type 'llama', but missing" in hf_error(tmp_path, llama)
    llama["intermediate_size"] = "11008"
    assert "intermediate_size: expected a positive integer, got '11008'" in hf_error(tmp_path, llama)
    llama.update(intermediate_size=11008, tie_word_embeddings="no")
    assert "tie_word_embeddings: expected true or false, got 'no'" in hf_error(tmp_path, llama)
    llama.update(tie_word_embeddings=False, head_dim=0)
    assert "head_dim: expected a positive integer, got 0" in hf_error(tmp_path, llama)


def test_head_dim_times_heads_other_than_hidden_imports_and_prices_its_widths():
    # Mistral-Nemo: 32 heads × 128 = 4096 ≠ hidden 5120; Q and the output projection are 4096 wide.
    nemo = imported("mistral-nemo-12b.json")
    assert nemo.head_dim == 128 and total_params(nemo) == PUBLISHED_SIMULATOR_ONLY["mistral-nemo-12b.json"]
    gemma = imported("gemma-7b.json")
    assert gemma.head_dim == 256 and gemma.tied_head and total_params(gemma) == PUBLISHED_SIMULATOR_ONLY["gemma-7b.json"]
    from zsim.workload.shape import Shape, layer_tensors
    assert layer_tensors(Shape.of(nemo))[:2] == (5120 * (4096 + 2 * 1024), 4096 * 5120)
    assert "head_dim" not in read_hf_config(HF / "llama-2-7b.json")  # 128 × 32 = 4096: the default, not written
    # the kernels the compute model prices do the workload's FLOPs: 2bsh(q + 2kv) + 4bs²q + 2bsqh + 6bshf
    from zsim.compute.kernel_shape import Shape as KShape
    from zsim.compute.kernels import block_forward
    from zsim.workload.transformer import layer_fwd_flops
    small = imported("mistral-nemo-12b.json", seq_len=256, attention="standard")
    s, h, q, kv, f = 256, 5120, 4096, 1024, 14336
    closed = 2 * s * h * (q + 2 * kv) + 4 * s * s * q + 2 * s * q * h + 6 * s * h * f
    assert layer_fwd_flops(Shape.of(small), s, 1) == closed
    assert sum(k.flops for k in block_forward(KShape.of(small, 1, 131072, "bf16"))) == closed


def test_a_config_that_is_not_text_or_not_a_file_is_refused(tmp_path):
    """Read as every input is (zsim.config.yamlfile.read_json): not UTF-8, a model_type that is not a
    name, and a device that never ends are each one message, not a crash or a read of /dev/zero."""
    bad = tmp_path / "bin.json"
    bad.write_bytes(b'{"a": "\xe0"}')
    with pytest.raises(ConfigError, match=r"bin.json: not UTF-8 text \(byte 7"):
        read_hf_config(bad)
    assert "model_type: ['gpt2'] is not a model type zsim can import" in hf_error(tmp_path, {"model_type": ["gpt2"]})
    with pytest.raises(ConfigError, match="/dev/zero: not a regular file, expected a Hugging Face config.json"):
        read_hf_config("/dev/zero")
    huge = tmp_path / "huge.json"
    huge.write_text('{"vocab_size": ' + "9" * 5000 + "}")  # past Python's 4300-digit int limit: a ValueError
    with pytest.raises(ConfigError, match=r"huge.json: not valid JSON: Exceeds the limit \(4300 digits\)"):
        read_hf_config(huge)


def test_from_hf_must_be_a_path():
    with pytest.raises(ConfigError, match="model.from_hf: expected the path of a Hugging Face config.json, got 7"):
        resolve_from_hf({"model": {"from_hf": 7}}, source="s.yaml")


def test_cli_reports_a_bad_import_in_one_line_with_exit_2(tmp_path):
    path = scenario_with(tmp_path, {"from_hf": "missing.json", "micro_batch": 1})
    proc = subprocess.run([sys.executable, "-m", "zsim.cli", "run", str(path), "--no-plot", "-o", str(tmp_path)],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"zsim: {path}: model.from_hf: {tmp_path / 'missing.json'}: no such file"


def test_imported_shape_is_validated_like_a_written_one():
    # Megatron splits K/V by query groups: 8 KV heads cannot go over MP 16.
    data = small_dict(parallel={"dp": 2, "mp": 16})
    data["model"] = {"from_hf": str(HF / "llama-3-70b.json"), "layers": 2, "seq_len": 128, "micro_batch": 1}
    with pytest.raises(ConfigError, match=r"model.kv_heads: 8 KV heads cannot be split evenly across mp 16"):
        build_scenario(data, source="s.yaml")


def test_a_dumped_resolved_model_validates_without_its_config_file():
    """Trace metadata and result.json carry the resolved section as data (dump): every importable key
    is written, so rebuilding a scenario from it does not need the config.json (replay elsewhere)."""
    dumped = dump(load_scenario(ROOT / "scenarios" / "llama-3-70b-dgx-h100.yaml").model)
    moved = dict(dumped, from_hf="/nowhere/config.json")
    assert resolve_from_hf({"model": moved}, source="trace.json") == {"model": moved}
    assert validate(ModelSection, moved, "t") == replace(validate(ModelSection, dumped, "t"), from_hf="/nowhere/config.json")


@pytest.mark.parametrize("name", PUBLISHED)
def test_imports_set_only_keys_listed_as_importable(name):
    from zsim.config.hf import IMPORTED_KEYS

    assert read_hf_config(HF / name).keys() <= IMPORTED_KEYS


def test_mixture_of_experts_not_modelled_is_refused_naming_moe(tmp_path):
    qwen = tmp_path / "qwen.json"
    qwen.write_text('{"model_type": "some_new_moe", "num_experts": 60}')
    with pytest.raises(ConfigError) as err:
        read_hf_config(qwen)
    assert err.value.path == "num_experts" and "mixture-of-experts" in str(err.value)
    dbrx = tmp_path / "config.json"
    dbrx.write_text('{"model_type": "dbrx", "d_model": 6144}')
    with pytest.raises(ConfigError, match="mixture-of-experts model .model_type 'dbrx'. of a type zsim does not "
                       "import; nearest supported family mixtral, which lacks DBRX's key names .*; the MoE families "
                       "it imports are mixtral"):
        read_hf_config(dbrx)


def test_a_dense_family_not_imported_names_the_nearest_and_what_it_lacks(tmp_path):
    phi = tmp_path / "config.json"
    phi.write_text('{"model_type": "phi", "hidden_size": 2560}')
    with pytest.raises(ConfigError, match="nearest supported family gpt_neox, which lacks a parallel attention"):
        read_hf_config(phi)


def test_opt_variants_zsim_does_not_model_are_refused(tmp_path):
    opt = json.loads((HF / "opt-1.3b.json").read_text())
    for key, value, words in (("word_embed_proj_dim", 512, "project_in/project_out"),
                              ("do_layer_norm_before", False, "post-LayerNorm")):
        with pytest.raises(ConfigError, match=words) as err:
            path = tmp_path / f"{key}.json"
            path.write_text(json.dumps({**opt, key: value}))
            read_hf_config(path)
        assert err.value.path == key
    assert imported("opt-1.3b.json").max_positions == 2050 and imported("olmo-7b.json").norm == "nonparametric"
