"""`model.from_hf` for Gemma-2/3, OLMo-2, Falcon, Qwen2-MoE and DeepSeek-V2/V3: each released config.json
(the keys zsim reads, copied from the file at the URL in the comment) imports to the parameter count of
the released checkpoint, exactly; MLA prices its attention by DeepSeek-V2 §2.1; what is not modelled
is refused naming the key."""

import json
from pathlib import Path
from dataclasses import replace

import pytest

from zsim.compute.kernel_shape import Shape as KShape
from zsim.compute.kernels import block_backward, block_forward, moe_block_forward
from zsim.config.hf import read_hf_config
from zsim.config.model_section import ModelSection
from zsim.config.validation import validate
from zsim.errors import ConfigError
from zsim.workload.activations import layer_saved_tensors
from zsim.workload.parameters import active_params, total_params
from zsim.workload.shape import Shape
from zsim.workload.transformer import build_workload, layer_fwd_flops

# Each count is the checkpoint's: the Hugging Face Hub's safetensors parameter total (api/models/<id>,
# "safetensors.total", the sum of the tensor sizes), quoted where a public repository records it:
# keras-hub's presets ("params") for Gemma-2 and Qwen1.5-MoE, and the Hub API's totals for the others.

# https://huggingface.co/google/gemma-2-2b/blob/main/config.json (tied head: Gemma2Config's default)
GEMMA2_2B = {"model_type": "gemma2", "hidden_size": 2304, "intermediate_size": 9216, "num_attention_heads": 8,
             "num_hidden_layers": 26, "num_key_value_heads": 4, "head_dim": 256, "vocab_size": 256000,
             "max_position_embeddings": 8192, "attention_bias": False, "attention_dropout": 0.0,
             "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0, "query_pre_attn_scalar": 256,
             "sliding_window": 4096, "hidden_activation": "gelu_pytorch_tanh"}
# https://huggingface.co/google/gemma-2-9b/blob/main/config.json
GEMMA2_9B = GEMMA2_2B | {"hidden_size": 3584, "intermediate_size": 14336, "num_attention_heads": 16,
                         "num_hidden_layers": 42, "num_key_value_heads": 8}
# https://huggingface.co/google/gemma-2-27b/blob/main/config.json (head_dim 128, query_pre_attn_scalar 144)
GEMMA2_27B = GEMMA2_2B | {"hidden_size": 4608, "intermediate_size": 36864, "num_attention_heads": 32,
                          "num_hidden_layers": 46, "num_key_value_heads": 16, "head_dim": 128,
                          "query_pre_attn_scalar": 144}
# https://huggingface.co/google/gemma-3-1b-pt/blob/main/config.json (gemma3_text: q_norm, k_norm)
GEMMA3_1B = {"model_type": "gemma3_text", "hidden_size": 1152, "intermediate_size": 6912, "num_attention_heads": 4,
             "num_hidden_layers": 26, "num_key_value_heads": 1, "head_dim": 256, "vocab_size": 262144,
             "max_position_embeddings": 32768, "attention_bias": False, "attn_logit_softcapping": None,
             "query_pre_attn_scalar": 256, "sliding_window": 512, "sliding_window_pattern": 6}
# https://huggingface.co/allenai/OLMo-2-1124-7B/blob/main/config.json (untied)
OLMO2_7B = {"model_type": "olmo2", "hidden_size": 4096, "intermediate_size": 11008, "num_attention_heads": 32,
            "num_hidden_layers": 32, "num_key_value_heads": 32, "vocab_size": 100352,
            "max_position_embeddings": 4096, "attention_bias": False, "attention_dropout": 0.0,
            "rms_norm_eps": 1e-06, "tie_word_embeddings": False}
# https://huggingface.co/allenai/OLMo-2-1124-13B/blob/main/config.json
OLMO2_13B = OLMO2_7B | {"hidden_size": 5120, "intermediate_size": 13824, "num_attention_heads": 40,
                        "num_hidden_layers": 40, "num_key_value_heads": 40}
# https://huggingface.co/tiiuae/falcon-7b/blob/main/config.json (multi-query, one LayerNorm, tied)
# (its num_kv_heads 71 is read only with new_decoder_architecture: multi_query gives one K/V head)
FALCON_7B = {"model_type": "falcon", "hidden_size": 4544, "num_attention_heads": 71, "num_hidden_layers": 32,
             "num_kv_heads": 71, "vocab_size": 65024, "alibi": False, "bias": False, "multi_query": True,
             "new_decoder_architecture": False, "parallel_attn": True, "attention_dropout": 0.0,
             "hidden_dropout": 0.0}
# https://huggingface.co/tiiuae/falcon-40b/blob/main/config.json (8 KV groups, ln_attn and ln_mlp)
FALCON_40B = FALCON_7B | {"hidden_size": 8192, "num_attention_heads": 128, "num_hidden_layers": 60,
                          "num_kv_heads": 8, "new_decoder_architecture": True}
# https://huggingface.co/tiiuae/falcon-180B/blob/main/config.json
FALCON_180B = FALCON_40B | {"hidden_size": 14848, "num_attention_heads": 232, "num_hidden_layers": 80}
# https://huggingface.co/Qwen/Qwen1.5-MoE-A2.7B/blob/main/config.json
QWEN15_MOE = {"model_type": "qwen2_moe", "hidden_size": 2048, "intermediate_size": 5632, "num_attention_heads": 16,
              "num_hidden_layers": 24, "num_key_value_heads": 16, "vocab_size": 151936,
              "max_position_embeddings": 8192, "moe_intermediate_size": 1408,
              "shared_expert_intermediate_size": 5632, "num_experts": 60, "num_experts_per_tok": 4,
              "decoder_sparse_step": 1, "norm_topk_prob": False, "tie_word_embeddings": False}
# https://huggingface.co/Qwen/Qwen2-57B-A14B/blob/main/config.json
QWEN2_57B = QWEN15_MOE | {"hidden_size": 3584, "intermediate_size": 18944, "num_attention_heads": 28,
                          "num_hidden_layers": 28, "num_key_value_heads": 4, "max_position_embeddings": 131072,
                          "moe_intermediate_size": 2560, "shared_expert_intermediate_size": 20480,
                          "num_experts": 64, "num_experts_per_tok": 8}
# https://huggingface.co/Qwen/Qwen3-8B/blob/main/config.json
QWEN3_8B = {"model_type": "qwen3", "hidden_size": 4096, "intermediate_size": 12288, "num_attention_heads": 32,
            "num_hidden_layers": 36, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
            "max_position_embeddings": 40960, "attention_bias": False, "tie_word_embeddings": False}
# scenarios/hf/qwen3-30b-a3b.json (Qwen/Qwen3-30B-A3B's config.json)
QWEN3_30B_A3B = json.loads((Path(__file__).resolve().parents[1] / "scenarios/hf/qwen3-30b-a3b.json").read_text())
# https://huggingface.co/deepseek-ai/DeepSeek-V2/blob/main/config.json
DEEPSEEK_V2 = {"model_type": "deepseek_v2", "hidden_size": 5120, "intermediate_size": 12288,
               "moe_intermediate_size": 1536, "num_attention_heads": 128, "num_key_value_heads": 128,
               "num_hidden_layers": 60, "vocab_size": 102400, "max_position_embeddings": 163840,
               "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
               "v_head_dim": 128, "n_routed_experts": 160, "n_shared_experts": 2, "num_experts_per_tok": 6,
               "first_k_dense_replace": 1, "moe_layer_freq": 1, "topk_method": "group_limited_greedy",
               "n_group": 8, "topk_group": 3, "attention_bias": False, "tie_word_embeddings": False}
# https://huggingface.co/deepseek-ai/DeepSeek-V2-Lite/blob/main/config.json (no query latent)
DEEPSEEK_V2_LITE = DEEPSEEK_V2 | {"hidden_size": 2048, "intermediate_size": 10944, "moe_intermediate_size": 1408,
                                  "num_attention_heads": 16, "num_key_value_heads": 16, "num_hidden_layers": 27,
                                  "q_lora_rank": None, "n_routed_experts": 64, "topk_method": "greedy",
                                  "n_group": 1, "topk_group": 1}
# https://huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json (num_nextn_predict_layers 1: the
# MTP module, stored as model.layers.61, is not part of the published 671B nor of zsim's count)
DEEPSEEK_V3 = DEEPSEEK_V2 | {"model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432,
                             "moe_intermediate_size": 2048, "num_hidden_layers": 61, "vocab_size": 129280,
                             "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8,
                             "first_k_dense_replace": 3, "topk_method": "noaux_tc", "topk_group": 4,
                             "num_nextn_predict_layers": 1, "scoring_func": "sigmoid"}

# the shipped config (scenarios/hf/qwen3-235b-a22b.json: the zsim validate modern Megatron-Core MoE points' shape)
QWEN3_235B_A22B = json.loads((Path(__file__).resolve().parents[1] / "scenarios" / "hf" / "qwen3-235b-a22b.json").read_text())

RELEASED = [  # (name, config, checkpoint count, tied head)
    ("gemma-2-2b", GEMMA2_2B, 2_614_341_888, True),  # keras-hub gemma2_2b_en "params"; Hub safetensors
    ("gemma-2-9b", GEMMA2_9B, 9_241_705_984, True),  # keras-hub gemma2_9b_en
    ("gemma-2-27b", GEMMA2_27B, 27_227_128_320, True),  # keras-hub gemma2_27b_en
    ("gemma-3-1b", GEMMA3_1B, 999_885_952, True),  # keras-hub gemma3_1b; Hub google/gemma-3-1b-it
    ("olmo-2-7b", OLMO2_7B, 7_298_617_344, False),  # Hub allenai/OLMo-2-1124-7B safetensors total
    ("olmo-2-13b", OLMO2_13B, 13_716_198_400, False),  # Hub allenai/OLMo-2-1124-13B
    ("falcon-7b", FALCON_7B, 6_921_720_704, True),  # Hub tiiuae/falcon-7b
    ("qwen1.5-moe-a2.7b", QWEN15_MOE, 14_315_784_192, False),  # keras-hub qwen1.5_moe_2.7b_en
    ("qwen2-57b-a14b", QWEN2_57B, 57_408_658_944, False),  # Hub Qwen/Qwen2-57B-A14B safetensors total
    ("qwen3-8b", QWEN3_8B, 8_190_735_360, False),  # keras-hub qwen3_8b_en "params"
    ("qwen3-30b-a3b", QWEN3_30B_A3B, 30_532_122_624, False),  # keras-hub qwen3_moe_30b_a3b_en "params"
    # keras-hub qwen3_moe_235b_a22b_en "params"; Hub Qwen/Qwen3-235B-A22B safetensors total
    ("qwen3-235b-a22b", QWEN3_235B_A22B, 235_093_634_560, False),
    ("deepseek-v2", DEEPSEEK_V2, 235_741_434_880, False),  # Hub deepseek-ai/DeepSeek-V2
    ("deepseek-v2-lite", DEEPSEEK_V2_LITE, 15_706_484_224, False),  # Hub deepseek-ai/DeepSeek-V2-Lite
    # the main model's tensors of the FP8 checkpoint (the scale_inv tensors and the MTP layer left out)
    ("deepseek-v3", DEEPSEEK_V3, 671_026_419_200, False),
]
# Falcon-40B and -180B: the checkpoints also store lm_head.weight, V × h, though FalconConfig ties the
# head (tie_word_embeddings absent: true), so transformers loads one matrix for both. zsim imports the
# tied model; the checkpoint's total is that plus the stored copy (Hub safetensors totals).
FALCON_STORED_HEAD = [("falcon-40b", FALCON_40B, 41_835_970_560), ("falcon-180b", FALCON_180B, 179_522_565_120)]


def imported(tmp_path, config: dict, **keys) -> ModelSection:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return validate(ModelSection, read_hf_config(path) | {"micro_batch": 1} | keys, "model")


@pytest.mark.parametrize("name, config, count, tied", RELEASED, ids=[r[0] for r in RELEASED])
def test_parameter_count_is_the_released_checkpoints(tmp_path, name, config, count, tied):
    model = imported(tmp_path, config)
    assert model.tied_head is tied
    assert total_params(model) == count
    assert build_workload(model, mp=1).total_params == count


@pytest.mark.parametrize("name, config, count", FALCON_STORED_HEAD, ids=[r[0] for r in FALCON_STORED_HEAD])
def test_falcon_new_architecture_count_and_its_stored_head(tmp_path, name, config, count):
    model = imported(tmp_path, config)
    h, v = config["hidden_size"], config["vocab_size"]
    assert (model.kv_heads, model.layer_norms, model.tied_head) == (8, 2, True)
    assert total_params(model) + v * h == count
    assert total_params(imported(tmp_path, config, tied_head=False)) == count


def test_gemma2_has_four_norms_and_gemma3_its_qk_norms(tmp_path):
    g2, g3 = imported(tmp_path, GEMMA2_2B), imported(tmp_path, GEMMA3_1B)
    assert (g2.layer_norms, g2.qk_norm, g2.head_dim, g3.qk_norm) == (4, "none", 256, "head")
    # the two extra norms are 2h per block: 26 × 2 × 2304 of Gemma-2-2B's count
    assert total_params(g2) - total_params(imported(tmp_path, GEMMA2_2B, layer_norms=2)) == 26 * 2 * 2304
    # Gemma-2's post-norms keep their inputs (e·sbh each), in the workload and in the kernels
    s, b = 1024, 1
    two, four = (sum(layer_saved_tensors(Shape.of(imported(tmp_path, GEMMA2_2B, layer_norms=n, seq_len=s)), s, b, 1))
                 for n in (2, 4))
    assert four - two == 2 * 2 * s * b * 2304
    names = [k.name for k in block_forward(KShape.of(imported(tmp_path, GEMMA2_2B, seq_len=s), 1, 256000, "bf16"))]
    assert "post_attention_norm" in names and "post_mlp_norm" in names


def test_olmo2_qk_norm_spans_every_head_and_falcon7b_has_one_layernorm(tmp_path):
    olmo = imported(tmp_path, OLMO2_7B)
    assert olmo.qk_norm == "full"
    # q_norm 4096 and k_norm 4096 per block
    assert total_params(olmo) - total_params(imported(tmp_path, OLMO2_7B, qk_norm="none")) == 32 * 2 * 4096
    falcon = imported(tmp_path, FALCON_7B)
    assert (falcon.kv_heads, falcon.layer_norms, falcon.gated_mlp, falcon.linear_bias, falcon.ffn_hidden) == \
        (1, 1, False, False, 4 * 4544)
    names = [k.name for k in block_forward(KShape.of(imported(tmp_path, FALCON_7B, seq_len=256), 1, 65024, "bf16"))]
    assert "post_attention_layernorm" not in names and "input_layernorm" in names


def test_moe_families_active_parameters_follow_their_routing(tmp_path):
    """Active parameters per token (what MoE FLOPs count): total less the routed experts a token is not
    sent to. DeepSeek-V3's report gives 37B activated (§1), DeepSeek-V2's 21B (abstract), Qwen1.5-MoE
    "2.7B activated" (its model card; with the embedding and head), Qwen2-57B-A14B 14B."""
    v3, v2 = imported(tmp_path, DEEPSEEK_V3), imported(tmp_path, DEEPSEEK_V2)
    idle = (256 - 8) * 3 * 7168 * 2048 * 58
    assert active_params(v3) == 671_026_419_200 - idle
    assert 37.0e9 < active_params(v3) < 38.0e9  # 37.55B with the embedding and the head
    assert 21.0e9 < active_params(v2) < 22.0e9
    qwen = imported(tmp_path, QWEN15_MOE)
    assert 2.6e9 < active_params(qwen) < 2.8e9  # 2,689,173,504
    assert 14.0e9 < active_params(imported(tmp_path, QWEN2_57B)) < 15.0e9
    assert (qwen.moe.shared_experts, qwen.moe.shared_ffn_hidden, qwen.moe.shared_expert_gate) == (1, 5632, True)
    assert (v3.moe.dense_layers, v3.moe.router_bias, v2.moe.router_bias) == (3, True, False)


def test_qwen2_moe_model_flops_are_twice_the_active_parameters_per_token(tmp_path):
    """One MoE block's forward FLOPs (attention core apart) are 2 × its active parameters × tokens:
    the shared expert's gate included (modeling_qwen2_moe.py)."""
    model = imported(tmp_path, QWEN15_MOE, seq_len=128)
    w = build_workload(model, mp=1)
    block = w.blocks[0]
    s, h = 128, 2048
    core = 4 * s * s * h
    active_block = (active_params(model) - 2 * 151936 * 2048 - h) // 24  # less embedding, head, final norm
    norms = 2 * h  # parameters without a matmul
    assert block.fwd_flops - core == pytest.approx(2 * s * (active_block - norms - (h + 2 * h)), rel=0, abs=0)
    ks = moe_block_forward(KShape.of(model, 1, 151936, "bf16"))
    assert any(k.name == "moe.shared.gate" for k in ks)


def test_mla_prices_its_projections_core_and_activations_by_the_paper(tmp_path):
    """DeepSeek-V2 §2.1: the projections W^DQ, W^UQ·W^QR, W^DKV·W^KR, W^UK·W^UV, W^O; the core QKᵀ over
    d_h + d_h^R and attention·V over d_v, per head; the latents kept for backward."""
    s, b = 512, 1
    v2 = imported(tmp_path, DEEPSEEK_V2, seq_len=s, attention="standard")
    h, a, rq, rk, dn, dr, dv = 5120, 128, 1536, 512, 128, 64, 128
    shape = Shape.of(v2)
    proj = 2 * s * (h * rq + rq * a * (dn + dr) + h * (rk + dr) + rk * a * (dn + dv) + a * dv * h)
    core = 2 * s * s * a * (dn + dr + dv)
    mlp = 6 * s * h * 12288
    assert layer_fwd_flops(shape, s, b) == proj + core + mlp
    # The kernels do the same FLOPs (dense block: layer 0), and under MP 8 each rank does its share plus the
    # replicated down projections whole (Megatron-Core MLASelfAttention: "duplicated").
    dense = KShape.of(v2, 1, 102400, "bf16")
    assert sum(k.flops for k in block_forward(dense)) == layer_fwd_flops(shape, s, b)
    assert sum(k.flops for k in block_backward(dense)) == 2 * layer_fwd_flops(shape, s, b)
    down = 2 * s * h * (rq + rk + dr)
    mp8 = KShape.of(v2, 8, 102400, "bf16")
    assert sum(k.flops for k in block_forward(mp8)) == pytest.approx(layer_fwd_flops(shape, s, b, 8) + down * 7 / 8)
    w8 = build_workload(v2, mp=8)
    assert w8.blocks[0].hw_fwd_flops == pytest.approx(sum(k.flops for k in block_forward(mp8)))
    # Saved activations: the latents (c^Q twice, c^KV twice, whole on each rank) and Q, K a·192 wide,
    # V and the output a·128 wide, the a·s² scores (bf16, no dropout in the import)
    saved = layer_saved_tensors(shape, s, b, 1, 2)
    e = 2
    expect = (e * s * h * 2 + e * s * (2 * rq + 2 * rk) + e * s * a * (dn + dr) * 2 + e * a * s * s
              + e * s * a * dv * 2 + e * s * h * 2 + 2 * e * s * 12288 + e * s * 12288)
    assert sum(saved) == expect
    # FlashAttention: no s² term; the parameters of a block's attention per MP rank
    flash = Shape.of(imported(tmp_path, DEEPSEEK_V2, seq_len=s, attention="flash2"))
    assert sum(layer_saved_tensors(flash, s, b, 1, 2)) == expect - e * a * s * s + 4 * a * s
    attn = h * rq + rq + rq * a * (dn + dr) // 8 + h * (rk + dr) + rk + rk * a * (dn + dv) // 8 + a * dv * h // 8
    assert w8.blocks[0].params == attn + 3 * h * 12288 // 8 + 2 * h
    assert sum(Shape.of(v2).mla.tensors(h, a, 1)) == 149_227_520  # docs/models.md's worked figure


def test_mla_flash_kernel_counts_both_head_widths(tmp_path):
    v3 = imported(tmp_path, DEEPSEEK_V3, seq_len=4096, attention="flash3")
    ks = [k for k in block_forward(KShape.of(v3, 1, 129280, "bf16", arch=90)) if k.kind == "flash"]
    assert len(ks) == 1 and ks[0].flops == 2 * 4096 * 2048 * (192 + 128) * 128


def test_what_is_not_modelled_is_refused_naming_the_key(tmp_path):
    def refused(config):
        path = tmp_path / "c.json"
        path.write_text(json.dumps(config))
        with pytest.raises(ConfigError) as err:
            read_hf_config(path)
        return err.value

    err = refused(QWEN15_MOE | {"decoder_sparse_step": 2})
    assert err.path == "decoder_sparse_step" and "moe.dense_layers" in str(err)
    err = refused(QWEN15_MOE | {"mlp_only_layers": [3, 7]})
    assert err.path == "mlp_only_layers"
    assert refused(DEEPSEEK_V2 | {"moe_layer_freq": 2}).path == "moe_layer_freq"
    assert total_params(imported(tmp_path, DEEPSEEK_V3 | {"head_dim": 64})) == 671_026_419_200  # not a K/V width
    assert refused(DEEPSEEK_V2 | {"first_k_dense_replace": "1"}).path == "first_k_dense_replace"
    assert refused(OLMO2_7B | {"attention_bias": True}).path == "attention_bias"
    err = refused({"model_type": "gemma3", "text_config": {}})
    assert "nearest supported family gemma3_text, which lacks the vision tower" in str(err)
    err = refused({"model_type": "olmoe", "num_experts": 64})
    assert err.path == "num_experts" and "mixtral, qwen2_moe, deepseek_v2, deepseek_v3, qwen3_moe" in str(err)
    assert "nearest supported family mixtral, which lacks OLMoE's QK-norm over all heads" in str(err)
    assert refused(QWEN3_8B | {"attention_bias": True}).path == "attention_bias"
    assert refused(QWEN3_30B_A3B | {"decoder_sparse_step": 2}).path == "decoder_sparse_step"


def test_qwen3_has_per_head_qk_norms_and_qwen3_moe_no_shared_expert(tmp_path):
    dense, moe = imported(tmp_path, QWEN3_8B), imported(tmp_path, QWEN3_30B_A3B)
    assert (dense.qk_norm, dense.qkv_bias, dense.linear_bias, dense.head_dim) == ("head", False, False, None)
    assert (moe.qk_norm, moe.qkv_bias, moe.head_dim) == ("head", False, 128)  # 32 heads x 128 != hidden 2048
    assert (moe.moe.experts, moe.moe.top_k, moe.moe.expert_ffn_hidden, moe.moe.shared_experts) == (128, 8, 768, 0)
    # a shared-expert key on a Qwen3-MoE config names no tensor (Qwen3MoeSparseMoeBlock has none)
    assert imported(tmp_path, QWEN3_30B_A3B | {"shared_expert_intermediate_size": 4096}).moe.shared_experts == 0
    assert imported(tmp_path, {k: v for k, v in QWEN3_30B_A3B.items() if k != "num_experts_per_tok"}).moe.top_k == 8


def test_mla_excludes_the_keys_it_replaces():
    from zsim.errors import ConfigError as Invalid

    base = dict(layers=2, hidden=256, heads=4, seq_len=64, vocab=100, micro_batch=1, position="rotary",
                mla={"kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16})
    with pytest.raises(Invalid, match="mla sets the attention's widths itself"):
        validate(ModelSection, {**base, "kv_heads": 2}, "model")
    with pytest.raises(Invalid, match="qk_rope_head_dim 7 is odd"):
        validate(ModelSection, {**base, "mla": {**base["mla"], "qk_rope_head_dim": 7}}, "model")


def test_sliding_window_blocks_attend_their_window_under_flash(tmp_path):
    """Gemma-2: blocks 0, 2, 4, ... attend 4096 keys back, the others globally (Gemma2DecoderLayer). At
    s = 8192 a local block's queries attend (w(w+1)/2 + (s − w)·w)/s = 3072 keys on average (Longformer
    §3.1, causal): its attention core is 3072/4096 of a global causal one."""
    s = 8192
    flash = imported(tmp_path, GEMMA2_9B, seq_len=s, attention="flash2")
    w = build_workload(flash, mp=1)
    assert (flash.sliding_window, flash.full_attention_every) == (4096, 2)
    n = (4096 * 4097 // 2 + (s - 4096) * 4096) // s
    assert n == 3072 and [m.window for m in w.blocks[:4]] == [n, 0, n, 0]
    core = 4 * s * s * 16 * 256  # 4bs²·a·d [N21]
    local, full = w.blocks[0], w.blocks[1]
    assert full.fwd_flops - local.fwd_flops == pytest.approx(core - 2 * core * n / s)
    assert local.hw_fwd_flops - (local.fwd_flops - 2 * core * n / s) == pytest.approx(core * n / s)  # causal half
    # the kernels the plan prices for the local block: flash over n keys per query
    ks = block_forward(replace(KShape.of(flash, 1, 256000, "bf16", arch=90), window=n))
    assert sum(k.flops for k in ks) == pytest.approx(local.hw_fwd_flops)
    # unfused attention computes every score under the mask: the local block's hardware FLOPs are a global one's
    std = build_workload(imported(tmp_path, GEMMA2_9B, seq_len=s, attention="standard"), mp=1)
    assert std.blocks[0].hw_fwd_flops == pytest.approx(std.blocks[1].hw_fwd_flops) and std.blocks[0].window == 0
    assert std.blocks[0].fwd_flops == local.fwd_flops
    # a sequence no longer than the window: every block global, the workload of no window at all
    short = imported(tmp_path, GEMMA2_9B, seq_len=4096, attention="flash2")
    assert build_workload(short, mp=1) == build_workload(imported(tmp_path, GEMMA2_9B, seq_len=4096,
                                                                 attention="flash2", sliding_window=None,
                                                                 full_attention_every=0), mp=1)


def test_gemma3_pattern_and_mistral_window_import(tmp_path):
    g3 = imported(tmp_path, GEMMA3_1B)
    assert (g3.sliding_window, g3.full_attention_every) == (512, 6)
    listed = GEMMA3_1B | {"layer_types": ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(26)]}
    assert imported(tmp_path, listed).full_attention_every == 6
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(GEMMA3_1B | {"layer_types": ["full_attention"] * 2 + ["sliding_attention"] * 24}))
    with pytest.raises(ConfigError) as err:
        read_hf_config(path)
    assert err.value.path == "layer_types"
    mistral = imported(tmp_path, {"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336,
                                  "num_attention_heads": 32, "num_hidden_layers": 2, "num_key_value_heads": 8,
                                  "vocab_size": 32000, "max_position_embeddings": 32768, "sliding_window": 4096},
                       attention="flash2")
    assert (mistral.sliding_window, mistral.full_attention_every) == (4096, 0)
    assert all(m.window for m in build_workload(mistral, mp=1).blocks)  # every block local


def test_a_simulated_step_is_faster_with_a_window(tmp_path):
    from tests.conftest import small_dict
    from zsim.scenario.scenario import build_scenario
    from zsim.engine.simulation import simulate
    from zsim.report.facts import facts

    def step(**model):
        data = small_dict(hardware={"profile": "dgx-h100", "nodes": 1}, parallel={"dp": 2, "mp": 4},
                          precision={"dtype": "bf16"}, model={"layers": 2, "hidden": 2048, "heads": 16,
                                                             "seq_len": 8192, "attention": "flash2", **model})
        return facts(simulate(build_scenario(data, source="<t>"), mode="class"))

    glob, local = step(), step(sliding_window=1024, full_attention_every=2)
    assert local["time"]["compute_seconds_per_step"] < 0.9 * glob["time"]["compute_seconds_per_step"]
    assert local["throughput"]["mfu_percent"] > 0
    with pytest.raises(ConfigError, match="full_attention_every 2 alternates local and global attention"):
        step(full_attention_every=2)


def test_cost_estimate_counts_a_moe_model_whose_dense_blocks_are_several(tmp_path):
    """zsim run's cost check built 1- and 2-layer copies of the model, which a MoE model with
    first_k_dense_replace 3 (DeepSeek-V3) refuses (dense_layers > layers): it now builds the model."""
    from zsim.zero.cost import params_per_mp_rank

    v3 = imported(tmp_path, DEEPSEEK_V3, seq_len=1024)
    assert params_per_mp_rank(v3, 8, "bf16") == build_workload(v3, mp=8, dtype="bf16").params_per_mp_rank


@pytest.mark.parametrize("config", [r[1] for r in RELEASED] + [FALCON_40B], ids=[r[0] for r in RELEASED] + ["falcon-40b"])
def test_imports_set_only_keys_listed_as_importable(tmp_path, config):
    """A model section that writes every importable key takes nothing from the file (a dumped model
    replays without it): the new keys are in the list."""
    from zsim.config.hf import IMPORTED_KEYS

    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    keys = read_hf_config(path)
    assert keys.keys() <= IMPORTED_KEYS
