"""`zsim schema`: the JSON Schema of scenario files is a valid schema that accepts every shipped
scenario and rejects what the loader rejects for the same reason (unknown keys, wrong types, a model
with neither its shape nor from_hf)."""

import json
import subprocess
import sys

import pytest
import yaml

from tests.conftest import ROOT, small_dict
from zsim.scenario.scenario import build_scenario
from zsim.errors import ConfigError

jsonschema = pytest.importorskip("jsonschema")
_ALL_YAML = sorted((ROOT / "scenarios").rglob("*.yaml"))
# sweep files (a top-level `base:`) are not scenarios: zsim sweep validates them (docs/sweep.md)
SCENARIOS = [p for p in _ALL_YAML if "base" not in (yaml.safe_load(p.read_text()) or {})]


def zsim(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "zsim.cli", *args], capture_output=True, text=True, cwd=cwd)


@pytest.fixture(scope="module")
def schema():
    proc = zsim("schema")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module", params=[jsonschema.Draft7Validator, jsonschema.Draft202012Validator],
                ids=["draft-07", "2020-12"])
def validator(request, schema):
    request.param.check_schema(schema)  # the schema itself is valid under both drafts
    return request.param(schema)


def test_schema_documents_every_model_key(schema):
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    model = schema["$defs"]["ModelSection"]["properties"]
    for key in ("from_hf", "kv_heads", "ffn_hidden", "gated_mlp", "tied_head", "norm", "position", "dropout"):
        assert model[key]["description"], key
    assert model["norm"]["enum"] == ["layernorm", "nonparametric", "rmsnorm"]
    assert model["position"]["enum"] == ["alibi", "learned", "rotary"]


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.relative_to(ROOT / "scenarios").as_posix() for p in SCENARIOS])
def test_every_shipped_scenario_is_valid(validator, path):
    assert list(validator.iter_errors(yaml.safe_load(path.read_text()))) == []


def bad_cases():
    typo = small_dict()
    typo["model"]["kv_head"] = 2
    wrong_type = small_dict(model={"gated_mlp": "yes"})
    no_shape = small_dict()
    del no_shape["model"]["layers"]
    bad_norm = small_dict(model={"norm": "batchnorm"})
    return {"unknown key": typo, "wrong type": wrong_type, "no shape and no from_hf": no_shape,
            "not an allowed value": bad_norm}


@pytest.mark.parametrize("name,data", bad_cases().items())
def test_schema_rejects_what_the_loader_rejects(validator, name, data):
    assert list(validator.iter_errors(data)), name
    with pytest.raises(ConfigError):
        build_scenario(data, source="s.yaml")


def test_from_hf_makes_the_shape_keys_optional(validator):
    data = small_dict()
    data["model"] = {"from_hf": "hf/llama-2-7b.json", "micro_batch": 1}
    assert list(validator.iter_errors(data)) == []


def test_json_option_writes_the_file_and_prints_the_editor_setting(tmp_path):
    out = tmp_path / "schema" / "scenario.schema.json"
    proc = zsim("schema", "--json", str(out))  # like every --json: into a folder that exists, as a redirect
    assert proc.returncode == 2 and "argument --json: no folder" in proc.stderr and not out.parent.exists()
    out.parent.mkdir()
    proc = zsim("schema", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text())["title"] == "zsim scenario"
    assert f"# yaml-language-server: $schema={out.resolve().as_posix()}" in proc.stdout
    assert '"yaml.schemas"' in proc.stdout
