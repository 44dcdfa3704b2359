"""`model.from_hf`: a Hugging Face `config.json` as the shape of a scenario's model section.

The keys imported from the config sit *under* the keys written in the scenario: anything written
there (or given with `--set model.key=value`) wins. zsim.config.hf_families maps each model_type's
keys (docs/models.md has the table); this module finds and reads the file and merges the keys.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from zsim.config.hf_families import FAMILIES, MOE_FAMILIES, MOE_KEYS, MOE_NEAREST, MOE_TYPES, NEAREST, HfConfig
from zsim.config.yamlfile import read_json
from zsim.errors import ConfigError

MAX_CONFIG_BYTES = 8 << 20  # a config.json is a few KB; 8 MiB bounds the read (issue 13)


# Every model key an import can set: a model section that already writes all of them (a model
# dumped from a resolved scenario, e.g. in a trace's metadata) takes nothing from the file.
IMPORTED_KEYS = frozenset({"layers", "hidden", "heads", "kv_heads", "seq_len", "vocab", "ffn_hidden", "gated_mlp",
                           "tied_head", "linear_bias", "qkv_bias", "norm", "position", "max_positions", "dropout",
                           "vocab_padding", "attention", "moe", "head_dim", "embedding_norm", "layer_norms",
                           "qk_norm", "mla", "sliding_window", "full_attention_every"})


def hf_config_path(ref: str, base_dir: str | Path | None = None) -> Path:
    """The config.json that `ref` names: a file, or a folder holding config.json; a relative path is
    taken from `base_dir` (default: the working directory)."""
    path = Path(ref).expanduser()
    if not path.is_absolute() and base_dir is not None:
        path = Path(base_dir) / path
    return path / "config.json" if path.is_dir() else path


def read_hf_config(path: str | Path) -> dict[str, Any]:
    """The model-section keys a Hugging Face config.json gives (see the module docstring).

    Raises:
        ConfigError: the file is missing, unreadable or not JSON; its model_type is not one zsim can
            import; a key the family needs is missing or has the wrong type (naming file and key).
    """
    path = Path(path)
    # the project's checked reader: a regular file (a FIFO or /dev/zero would hang or fill memory), at
    # most a few MB (a config.json is a few KB), UTF-8, JSON
    data = read_json(path, what="Hugging Face config.json", max_bytes=MAX_CONFIG_BYTES)
    if not isinstance(data, dict):
        raise ConfigError(f"expected a JSON object, got {type(data).__name__}", source=str(path))
    config = HfConfig(data, path)
    family = FAMILIES.get(config.model_type) if isinstance(config.model_type, str) else None
    experts = next((k for k in MOE_KEYS if isinstance(data.get(k), int) and data[k] > 1), None)
    if (isinstance(config.model_type, str) and config.model_type in MOE_TYPES) or (experts and family is None):
        what = f"{experts} {data[experts]}" if experts else f"model_type {config.model_type!r}"
        nearest = MOE_NEAREST.get(config.model_type) if isinstance(config.model_type, str) else None
        near = "" if nearest is None else f"; {nearest[1]}" if nearest[0] is None else \
            f"; nearest supported family {nearest[0]}, which lacks {nearest[1]}"
        raise config.fail("model_type" if not experts else experts,
                          f"a mixture-of-experts model ({what}) of a type zsim does not import{near}; the MoE "
                          f"families it imports are {', '.join(k for k in FAMILIES if k in MOE_FAMILIES)}: "
                          "write model.moe by hand (docs/moe.md) on the nearest of them")
    if family is None:
        got = "missing" if config.model_type is None else repr(config.model_type)
        near = NEAREST.get(config.model_type) if isinstance(config.model_type, str) else None
        why = f"; nearest supported family {near[0]}, which lacks {near[1]}" if near else ""
        raise config.fail("model_type", f"{got} is not a model type zsim can import "
                          f"(known: {', '.join(FAMILIES)}){why}")
    return family(config) | {"vocab_padding": 1}


def resolve_from_hf(data: dict[str, Any], *, source: str, base_dir: str | Path | None = None) -> dict[str, Any]:
    """`data` (a parsed scenario) with `model.from_hf`'s keys filled in under the keys written in the
    model section, and from_hf made the config's absolute path (so the result can be validated again
    from any folder: resolving twice gives the same mapping). Returns `data` itself when there is no
    from_hf, or when the model section writes every key an import could set (nothing would be taken
    from the file: a dumped, already resolved model replays on a machine without the file).

    Raises:
        ConfigError: from_hf is not a string, or its file cannot be imported; the message names the
            scenario, `model.from_hf`, the config file and its key.
    """
    model = data.get("model")
    if not isinstance(model, dict) or model.get("from_hf") is None or IMPORTED_KEYS <= model.keys():
        return data
    ref = model["from_hf"]
    if not isinstance(ref, str) or not ref.strip():
        raise ConfigError(f"expected the path of a Hugging Face config.json, got {ref!r}", source=source,
                          path="model.from_hf")
    path = hf_config_path(ref, base_dir)
    try:
        imported = read_hf_config(path)
    except ConfigError as exc:
        raise ConfigError(str(exc), source=source, path="model.from_hf") from None
    merged = imported | model | {"from_hf": str(path.absolute())}
    if isinstance(imported.get("moe"), dict) and isinstance(model.get("moe"), dict):  # moe keys written win one by one
        merged["moe"] = imported["moe"] | model["moe"]
    return {**data, "model": merged}
