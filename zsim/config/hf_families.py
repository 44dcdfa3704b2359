"""The model families `model.from_hf` imports: one function per Hugging Face `model_type` reading its
config.json into model-section keys, and what each refused type lacks (zsim.config.hf reads the file and
merges the keys under the scenario's). The mapping follows the modeling code of each
family in Hugging Face transformers (models/<type>/configuration_<type>.py for the defaults,
modeling_<type>.py for which tensors exist); docs/models.md has the table.

  gpt2      n_embd, n_layer, n_head, n_inner (None: 4h), vocab_size, n_positions; learned positions,
            LayerNorm, biases everywhere, tie_word_embeddings (default true).
  gpt_neox  hidden_size, num_hidden_layers, num_attention_heads, intermediate_size, vocab_size,
            max_position_embeddings; rotary, LayerNorm, biases, untied embed_out (default false).
  llama, mistral, qwen2, phi3, gemma, mixtral (+ its experts: docs/moe.md)
            hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads (default the
            heads), intermediate_size, vocab_size, max_position_embeddings; gated MLP (gate_proj,
            up_proj, down_proj whatever hidden_act is), RMSNorm, rotary, tie_word_embeddings
            (default false). Biases: llama's attention_bias / mlp_bias (default false), none in
            mistral, q/k/v only in qwen2 (Qwen2Attention: bias=True on q, k, v; o_proj without).
            Dropout only when attention_dropout > 0 (default 0.0).

  gemma2, gemma3_text  the Gemma layout with four norms per block, sliding-window blocks, (Gemma-3) QK-norm.
  olmo2     the LLaMA layout with QK-norm over all heads.
  falcon    GPT shape with multi-query (7B) or grouped (40B, 180B) attention and one or two LayerNorms.
  qwen3     the LLaMA layout with per-head QK-norm, no biases.
  qwen2_moe, qwen3_moe, deepseek_v2, deepseek_v3
            their MoE MLPs (shared experts, gate, router bias) and, for DeepSeek, multi-head latent
            attention (zsim.workload.mla). docs/models.md has each mapping and its checked counts.

Every import sets `vocab_padding: 1` (the checkpoint's vocabulary as it is, padded only as far as
MP needs) and `seq_len` to the longest context the model was built for (override it).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from zsim.errors import ConfigError

_MISSING = object()


class HfConfig:
    """A parsed config.json with typed, file-and-key-naming accessors."""

    def __init__(self, data: dict[str, Any], path: Path):
        self.data, self.path = data, path
        self.model_type = data.get("model_type")

    def fail(self, key: str, message: str) -> ConfigError:
        return ConfigError(message, source=str(self.path), path=key)

    def positive(self, *names: str, default: Any = _MISSING) -> int | None:
        """The first of `names` present (an integer > 0), else `default`; missing and no default: error."""
        for name in names:
            value = self.data.get(name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise self.fail(name, f"expected a positive integer, got {value!r}")
            return value
        if default is _MISSING:
            raise self.fail(names[0], f"required for model_type {self.model_type!r}, but missing")
        return default

    def rate(self, name: str, default: float) -> float:
        """A dropout probability in [0, 1] (absent or null: `default`)."""
        value = default if self.data.get(name) is None else self.data[name]
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
            raise self.fail(name, f"expected a probability between 0 and 1, got {value!r}")
        return float(value)

    def flag(self, name: str, default: bool) -> bool:
        """A boolean (absent or null: `default`)."""
        value = default if self.data.get(name) is None else self.data[name]
        if not isinstance(value, bool):
            raise self.fail(name, f"expected true or false, got {value!r}")
        return value


def _gpt2(c: HfConfig) -> dict[str, Any]:
    # transformers GPT2Config: n_inner None means 4 × n_embd; n_ctx is the older name of n_positions.
    positions = c.positive("n_positions", "n_ctx", default=1024)
    dropout = any(c.rate(key, 0.1) > 0 for key in ("attn_pdrop", "resid_pdrop", "embd_pdrop"))
    keys = dict(layers=c.positive("n_layer"), hidden=c.positive("n_embd"), heads=c.positive("n_head"),
                vocab=c.positive("vocab_size"), seq_len=positions, max_positions=positions,
                tied_head=c.flag("tie_word_embeddings", True), norm="layernorm", position="learned",
                gated_mlp=False, linear_bias=True, dropout=dropout)
    inner = c.positive("n_inner", default=None)
    return keys | ({"ffn_hidden": inner} if inner else {})


def _opt(c: HfConfig) -> dict[str, Any]:
    # OPTConfig / modeling_opt.py: a GPT shape with ReLU (ffn_dim wide, biases everywhere: enable_bias),
    # a learned position table of max_position_embeddings + 2 rows (OPTLearnedPositionalEmbedding's
    # offset of 2), pre-LayerNorm and a final LayerNorm, the head tied to the embedding.
    hidden = c.positive("hidden_size")
    if c.positive("word_embed_proj_dim", default=hidden) != hidden:
        raise c.fail("word_embed_proj_dim", "≠ hidden_size adds project_in/project_out matrices (OPT-350m) that zsim "
                     "does not model")
    if not c.flag("do_layer_norm_before", True):
        raise c.fail("do_layer_norm_before", "false (post-LayerNorm, no final norm: OPT-350m) is not modelled")
    if not c.flag("enable_bias", True):
        raise c.fail("enable_bias", "false is not modelled (zsim's GPT shape has the OPT biases)")
    positions = c.positive("max_position_embeddings")
    dropout = any(c.rate(key, 0.1) > 0 for key in ("dropout", "attention_dropout"))
    return dict(layers=c.positive("num_hidden_layers"), hidden=hidden, heads=c.positive("num_attention_heads"),
                vocab=c.positive("vocab_size"), seq_len=positions, max_positions=positions + 2,
                ffn_hidden=c.positive("ffn_dim"), tied_head=c.flag("tie_word_embeddings", True), norm="layernorm",
                position="learned", gated_mlp=False, linear_bias=True, dropout=dropout)


def _olmo(c: HfConfig) -> dict[str, Any]:
    # OlmoConfig / modeling_olmo.py: the LLaMA layout (SwiGLU, rotary, no biases unless attention_bias)
    # with OlmoLayerNorm, a LayerNorm without weight or bias (Groeneveld et al. 2024, "OLMo", §2.1).
    if c.flag("attention_bias", False):
        raise c.fail("attention_bias", "true is not modelled for olmo")
    keys = _llama_family(c)
    return keys | {"norm": "nonparametric"}


def _bloom(c: HfConfig) -> dict[str, Any]:
    # BloomConfig / modeling_bloom.py: ALiBi (no position table), word_embeddings_layernorm after the
    # embedding, LayerNorm, biases everywhere, a 4h GeLU MLP, the head tied to the embedding. No
    # max_position_embeddings (ALiBi): seq_len defaults to `seq_length` or BLOOM's 2048 (Scao et al.
    # 2022 §3.3).
    dropout = any(c.rate(key, 0.0) > 0 for key in ("hidden_dropout", "attention_dropout"))
    return dict(layers=c.positive("n_layer", "num_hidden_layers"), hidden=c.positive("hidden_size", "n_embed"),
                heads=c.positive("n_head", "num_attention_heads"), vocab=c.positive("vocab_size"),
                seq_len=c.positive("seq_length", default=2048), tied_head=c.flag("tie_word_embeddings", True),
                norm="layernorm", position="alibi", embedding_norm=True, gated_mlp=False, linear_bias=True,
                dropout=dropout)


def _gpt_neox(c: HfConfig) -> dict[str, Any]:
    # GPTNeoXConfig: attention_bias (default true) covers query_key_value and dense; the MLP always has
    # biases. zsim's linear_bias covers dense and the MLP together, so they must agree.
    if not c.flag("attention_bias", True):
        raise c.fail("attention_bias", "false with the MLP's biases (GPT-NeoX always has them) is a "
                     "combination zsim's linear_bias cannot express")
    return dict(layers=c.positive("num_hidden_layers"), hidden=c.positive("hidden_size"),
                heads=c.positive("num_attention_heads"), vocab=c.positive("vocab_size"),
                seq_len=c.positive("max_position_embeddings"),
                ffn_hidden=c.positive("intermediate_size"), tied_head=c.flag("tie_word_embeddings", False),
                norm="layernorm", position="rotary", gated_mlp=False, linear_bias=True,
                # GPTNeoXConfig: attention_dropout and hidden_dropout (default 0.0); the 20B config
                # spells them attention_probs_dropout_prob and hidden_dropout_prob.
                dropout=any(c.rate(key, 0.0) > 0 for key in ("attention_dropout", "hidden_dropout",
                                                            "attention_probs_dropout_prob", "hidden_dropout_prob")))


def _llama_family(c: HfConfig) -> dict[str, Any]:
    hidden, heads = c.positive("hidden_size"), c.positive("num_attention_heads")
    head_dim = c.positive("head_dim", default=None)
    if head_dim is not None and head_dim * heads == hidden:
        head_dim = None  # the default: written only where it differs (Mistral-Nemo, Gemma)
    if c.model_type in ("olmo2", "gemma2", "gemma3_text", "deepseek_v2", "deepseek_v3", "qwen3", "qwen3_moe") \
            and c.flag("attention_bias", False):
        raise c.fail("attention_bias", f"true is not modelled for {c.model_type} (its released models have none)")
    if c.model_type == "llama":  # LlamaConfig: attention_bias on q, k, v and o; mlp_bias on the MLP
        qkv_bias, mlp_bias = c.flag("attention_bias", False), c.flag("mlp_bias", False)
        if qkv_bias and not mlp_bias:
            raise c.fail("attention_bias", "true with mlp_bias false: zsim's linear_bias covers o_proj and the "
                         "MLP together")
        bias = dict(qkv_bias=qkv_bias, linear_bias=mlp_bias)
    elif c.model_type in ("qwen2", "qwen2_moe"):  # Qwen2(Moe)Attention: bias=True on q, k, v; o_proj and the MLP without
        bias = dict(qkv_bias=True, linear_bias=False)
    else:  # MistralAttention and MistralMLP; GemmaAttention and GemmaMLP (GeGLU: gate, up, down); Phi3Attention (fused qkv_proj) and Phi3MLP (fused gate_up_proj): no biases
        bias = dict(qkv_bias=False, linear_bias=False)
    # Phi3Config: resid_pdrop, embd_pdrop and attention_dropout (default 0.0)
    dropout_keys = ("attention_dropout", "resid_pdrop", "embd_pdrop") if c.model_type == "phi3" else ("attention_dropout",)
    # MistralAttention and MixtralAttention attend through sliding_window (null: globally; Mistral-7B-v0.1:
    # 4096); Gemma-2/3's is set by _gemma2 with its pattern
    window = c.positive("sliding_window", default=None) if c.model_type in ("mistral", "mixtral") else None
    return dict(layers=c.positive("num_hidden_layers"), hidden=hidden, heads=heads,
                kv_heads=c.positive("num_key_value_heads", default=heads), vocab=c.positive("vocab_size"),
                seq_len=c.positive("max_position_embeddings"), ffn_hidden=c.positive("intermediate_size"),
                # Gemma(2, 3)Config tie the head to the embedding by default; the LLaMA family does not
                tied_head=c.flag("tie_word_embeddings", c.model_type in GEMMA), norm="rmsnorm", position="rotary",
                gated_mlp=True, dropout=any(c.rate(key, 0.0) > 0 for key in dropout_keys), attention=FLASH_DEFAULT,
                **({"head_dim": head_dim} if head_dim else {}), **({"sliding_window": window} if window else {}), **bias)


GEMMA = ("gemma", "gemma2", "gemma3_text")


def _gemma2(c: HfConfig) -> dict[str, Any]:
    # Gemma2Config / modeling_gemma2.py (Gemma Team 2024, "Gemma 2", §2): the Gemma layout (GeGLU
    # gate/up/down, head_dim, tied head) with four RMSNorms per block (input_, post_attention_,
    # pre_feedforward_, post_feedforward_layernorm). Gemma3TextConfig (gemma3_text) adds q_norm and
    # k_norm, one head_dim-wide RMSNorm each shared by the heads (Gemma Team 2025, "Gemma 3", §2).
    # Soft-capping (attn_logit_softcapping, final_logit_softcapping: a tanh on the scores and the
    # logits) adds no parameter and no matmul. Local and global layers: Gemma2DecoderLayer attends
    # through sliding_window (default 4096) in every other block (layer_idx % 2 == 0), globally in the
    # rest; Gemma-3 in five of six (sliding_window_pattern 6: block i is global when (i + 1) % 6 == 0),
    # or as its layer_types list says.
    keys = _llama_family(c) | {"layer_norms": 4}
    gemma3 = c.model_type == "gemma3_text"
    window = c.positive("sliding_window", default=None if gemma3 else 4096)
    every = c.positive("sliding_window_pattern", default=6) if gemma3 else 2
    types = c.data.get("layer_types")
    if types is not None:
        full = [i for i, kind in enumerate(types) if kind == "full_attention"] if isinstance(types, list) else None
        every = full[0] + 1 if full else 0
        if full is None or len(types) != keys["layers"] or \
                full != [i for i in range(keys["layers"]) if every and (i + 1) % every == 0]:
            raise c.fail("layer_types", "expected num_hidden_layers entries with full_attention every k-th layer "
                         "(zsim's full_attention_every), got another pattern")
    local = {"sliding_window": window, "full_attention_every": every} if window else {}
    return keys | local | ({"qk_norm": "head"} if gemma3 else {})


def _olmo2(c: HfConfig) -> dict[str, Any]:
    # Olmo2Config / modeling_olmo2.py (OLMo Team 2024, "2 OLMo 2 Furious", §3.1): the LLaMA layout
    # with RMSNorm (weights) after attention and after the MLP instead of before (two per block, the
    # same count), and QK-norm: q_norm over all heads·head_dim, k_norm over kv_heads·head_dim.
    return _llama_family(c) | {"qk_norm": "full"}


def _falcon(c: HfConfig) -> dict[str, Any]:
    # FalconConfig / modeling_falcon.py: fused query_key_value (multi_query: one K/V head, Falcon-7B;
    # new_decoder_architecture: num_kv_heads groups, Falcon-40B/180B), dense, a 4h GeLU MLP
    # (ffn_hidden_size where given), LayerNorms; `bias` on every linear (false in the released
    # models); rotary unless alibi. FalconDecoderLayer: new_decoder_architecture has
    # num_ln_in_parallel_attn norms (ln_attn and ln_mlp, default 2); the older one input_layernorm
    # only when parallel_attn (else a post_attention_layernorm as well). The head is tied unless
    # tie_word_embeddings is false (PretrainedConfig's default true). Parallel attention and MLP (one
    # residual add) change no parameter and no matmul: zsim prices them as a sequential block.
    hidden, heads = c.positive("hidden_size"), c.positive("num_attention_heads", "n_head")
    new_arch, parallel = c.flag("new_decoder_architecture", False), c.flag("parallel_attn", True)
    if new_arch:
        kv_heads = c.positive("num_kv_heads", default=heads)
        norms = c.positive("num_ln_in_parallel_attn", default=2)
        if norms > 2:
            raise c.fail("num_ln_in_parallel_attn", f"expected 1 or 2, got {norms}")
    else:
        kv_heads = 1 if c.flag("multi_query", True) else heads
        norms = 1 if parallel else 2
    bias = c.flag("bias", False)
    alibi = c.flag("alibi", False)
    keys = dict(layers=c.positive("num_hidden_layers", "n_layer"), hidden=hidden, heads=heads, kv_heads=kv_heads,
                vocab=c.positive("vocab_size"), seq_len=c.positive("max_position_embeddings", default=2048),
                ffn_hidden=c.positive("ffn_hidden_size", default=4 * hidden), tied_head=c.flag("tie_word_embeddings", True),
                norm="layernorm", position="alibi" if alibi else "rotary", gated_mlp=False, linear_bias=bias,
                qkv_bias=bias, layer_norms=norms, attention=FLASH_DEFAULT,
                dropout=any(c.rate(key, 0.0) > 0 for key in ("attention_dropout", "hidden_dropout")))
    head_dim = c.positive("head_dim", default=None)
    return keys | ({"head_dim": head_dim} if head_dim and head_dim * heads != hidden else {})


def _qwen3(c: HfConfig) -> dict[str, Any]:
    # Qwen3Config / modeling_qwen3.py (Qwen Team 2025, "Qwen3 Technical Report", §2): the LLaMA layout without
    # the Qwen2 q/k/v biases (attention_bias, default false; refused true above) and with QK-norm:
    # Qwen3Attention's q_norm and k_norm, one head_dim-wide RMSNorm each, shared by the heads.
    return _llama_family(c) | {"qk_norm": "head"}


def _qwen3_moe(c: HfConfig) -> dict[str, Any]:
    # Qwen3MoeConfig / modeling_qwen3_moe.py: Qwen3's attention (above) and Qwen2-MoE's sparse layers
    # without the shared expert (Qwen3MoeSparseMoeBlock: gate h × num_experts without bias, num_experts SwiGLU
    # experts of moe_intermediate_size, top num_experts_per_tok, default 8); norm_topk_prob rescales the
    # top-k weights (no parameter, no matmul).
    return _qwen2_moe(c, top_k=8, shared=False) | {"qk_norm": "head"}


def _qwen2_moe(c: HfConfig, top_k: int = 4, shared: bool = True) -> dict[str, Any]:
    # Qwen2MoeConfig / modeling_qwen2_moe.py: the Qwen2 attention (q/k/v biases) and, in every
    # decoder_sparse_step-th layer not in mlp_only_layers, Qwen2MoeSparseMoeBlock: gate h × num_experts,
    # num_experts SwiGLU experts of moe_intermediate_size, top num_experts_per_tok, one shared expert of
    # shared_expert_intermediate_size scaled by sigmoid(shared_expert_gate(x)) (h × 1); the other layers a
    # dense Qwen2MoeMLP of intermediate_size. zsim's MoE blocks follow the dense ones: only
    # mlp_only_layers = the first k layers (and decoder_sparse_step 1) can be expressed. `top_k`: the default
    # of num_experts_per_tok; `shared`: whether the type has the shared expert (Qwen3-MoE has none).
    keys = _llama_family(c)
    layers = keys["layers"]
    step = c.positive("decoder_sparse_step", default=1)
    dense = c.data.get("mlp_only_layers") or []
    if not isinstance(dense, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in dense):
        raise c.fail("mlp_only_layers", f"expected a list of layer indices, got {dense!r}")
    if step != 1:
        raise c.fail("decoder_sparse_step", f"{step}: MoE every {step}th layer (dense ones between) is not "
                     "modelled; zsim's dense blocks come first (moe.dense_layers)")
    if sorted(dense) != list(range(len(dense))) or len(dense) > layers:
        raise c.fail("mlp_only_layers", f"{dense}: zsim models dense layers only as the first k (moe.dense_layers)")
    shared = c.positive("shared_expert_intermediate_size", default=None) if shared else None
    moe = {"experts": c.positive("num_experts"), "top_k": c.positive("num_experts_per_tok", default=top_k),
           "expert_ffn_hidden": c.positive("moe_intermediate_size"), "dense_layers": len(dense),
           **({"shared_experts": 1, "shared_ffn_hidden": shared, "shared_expert_gate": True} if shared else {})}
    return keys | {"moe": moe}


def _deepseek(c: HfConfig) -> dict[str, Any]:
    # DeepseekV2Config / DeepseekV3Config, modeling_deepseek_v2.py / _v3.py (DeepSeek-AI 2024,
    # "DeepSeek-V2" §2.1-2.2, "DeepSeek-V3" §2.1): MLA attention (zsim.workload.mla), RMSNorm, SwiGLU,
    # untied head; the first first_k_dense_replace layers a dense MLP of intermediate_size, the others
    # DeepSeekMoE: n_routed_experts of moe_intermediate_size, top num_experts_per_tok, n_shared_experts
    # (one MLP n_shared × moe_intermediate_size wide: the same tensors), a router h × E and, in V3
    # (topk_method noaux_tc), its e_score_correction_bias (E). V3's multi-token-prediction module
    # (num_nextn_predict_layers, in the checkpoint as layer 61) is not part of the model zsim counts or
    # trains: the published 671B is without it.
    keys = _llama_family(c)
    # MLA sets the heads' widths: num_key_value_heads (= the heads) and a head_dim some configs write
    # (DeepseekV3Config's, = qk_rope_head_dim) are not K/V widths
    keys.pop("kv_heads"), keys.pop("head_dim", None)
    freq = c.positive("moe_layer_freq", default=1)
    if freq != 1:
        raise c.fail("moe_layer_freq", f"{freq}: MoE every {freq}th layer is not modelled (dense layers come first)")
    q_rank = c.positive("q_lora_rank", default=None)
    mla = {"kv_lora_rank": c.positive("kv_lora_rank"), "qk_nope_head_dim": c.positive("qk_nope_head_dim"),
           "qk_rope_head_dim": c.positive("qk_rope_head_dim"), "v_head_dim": c.positive("v_head_dim"),
           **({"q_lora_rank": q_rank} if q_rank else {})}
    shared, first = c.data.get("n_shared_experts"), c.data.get("first_k_dense_replace") or 0
    if not isinstance(first, int) or isinstance(first, bool) or first < 0:
        raise c.fail("first_k_dense_replace", f"expected a non-negative integer, got {first!r}")
    moe = {"experts": c.positive("n_routed_experts"), "top_k": c.positive("num_experts_per_tok"),
           "expert_ffn_hidden": c.positive("moe_intermediate_size"),
           "dense_layers": min(keys["layers"], first),
           "router_bias": c.model_type == "deepseek_v3" or c.data.get("topk_method") == "noaux_tc",
           **({"shared_experts": c.positive("n_shared_experts")} if shared else {})}
    return keys | {"mla": mla, "moe": moe}


# The families trained with FlashAttention (LLaMA 2/3, Mistral, Qwen2 and every later one: their
# modeling code's attn_implementation "flash_attention_2", and their reports) import with it where the
# GPU runs it: "auto" is FA2 on Ampere and newer in fp16/bf16, the unfused attention elsewhere (as
# transformers falls back to "eager"/"sdpa"); write model.attention: flash3 for Hopper's FA3.
FLASH_DEFAULT = "auto"

def _mixtral(c: HfConfig) -> dict[str, Any]:
    # MixtralConfig: a Mistral decoder whose MLP is num_local_experts SwiGLU experts of intermediate_size
    # (MixtralSparseMoeBlock: gate h × E without bias, experts w1/w3 h × f and w2 f × h), top
    # num_experts_per_tok (default 2); router_jitter_noise and aux-loss keys change no FLOP.
    keys = _llama_family(c)
    experts = c.positive("num_local_experts", default=8)
    return keys | {"moe": {"experts": experts, "top_k": c.positive("num_experts_per_tok", default=2)}}


FAMILIES: dict[str, Callable[[HfConfig], dict[str, Any]]] = {
    "gpt2": _gpt2, "gpt_neox": _gpt_neox, "llama": _llama_family, "mistral": _llama_family, "qwen2": _llama_family,
    "phi3": _llama_family, "mixtral": _mixtral, "gemma": _llama_family, "olmo": _olmo, "opt": _opt, "bloom": _bloom,
    "gemma2": _gemma2, "gemma3_text": _gemma2, "olmo2": _olmo2, "falcon": _falcon, "qwen2_moe": _qwen2_moe,
    "deepseek_v2": _deepseek, "deepseek_v3": _deepseek, "qwen3": _qwen3, "qwen3_moe": _qwen3_moe,
}

# Mixture-of-experts types refused (transformers' configuration classes whose routers, attention or
# hybrid layers no importer maps), and the keys that say a config routes tokens to experts: refused with
# a message that names MoE and the MoE families that do import (issue 27 item 6).
MOE_TYPES = frozenset({"dbrx", "olmoe", "phimoe",
                       "granitemoe", "jamba", "jetmoe", "switch_transformers", "nllb_moe", "gpt_oss"})
# What each refused MoE type has that its nearest imported family lacks (transformers' modeling_<type>.py).
MOE_NEAREST = {
    "dbrx": ("mixtral", "DBRX's key names (d_model, ffn_config, attn_config), its clip_qkv and bias-free LayerNorms"),
    "olmoe": ("mixtral", "OLMoE's QK-norm over all heads (qk_norm: full) and its num_experts key names"),
    "phimoe": ("mixtral", "PhiMoE's LayerNorms with biases and its attention biases"),
    "granitemoe": ("mixtral", "Granite's embedding, residual, attention and logit multipliers"),
    "jamba": ("mixtral", "Jamba's Mamba layers between its attention layers"),
    "jetmoe": ("mixtral", "JetMoE's mixture of attention heads"),
    "gpt_oss": ("mixtral", "gpt-oss's attention sinks, 128-token sliding windows and biases on the experts"),
    "switch_transformers": (None, "Switch Transformer is an encoder-decoder; zsim models decoder-only transformers"),
    "nllb_moe": (None, "NLLB-MoE is an encoder-decoder; zsim models decoder-only transformers"),
}
MOE_FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3")
MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")

# Dense types zsim does not import yet: what they have that the nearest supported family lacks
# (transformers' modeling_<type>.py), so a refusal says what is missing.
NEAREST = {
    "gemma3": ("gemma3_text", "the vision tower and projector of the multimodal checkpoint (import its "
               "text_config, saved as a config.json of its own, for the language model)"),
    "phi": ("gpt_neox", "a parallel attention and MLP block with one LayerNorm, partial rotary"),
}
