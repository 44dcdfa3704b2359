"""The shape options (docs/models.md) in the workload: parameters, tensors, FLOPs and activation bytes
of a GQA + SwiGLU + RMSNorm + rotary block computed by hand, the MP split identities, and the checks
that reject shapes Megatron cannot split."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.conftest import small_dict
from zsim.scenario.scenario import build_scenario
from zsim.config.model_section import ModelSection
from zsim.errors import ConfigError
from zsim.workload.activations import layer_saved_tensors
from zsim.workload.parameters import total_params
from zsim.workload.shape import Shape, layer_tensors
from zsim.workload.transformer import build_workload, layer_fwd_flops, mp_problems

# h 8, a 4 query heads, 2 KV heads (d = 2, K and V 4 wide), SwiGLU of 12, no biases, RMSNorm, rotary, untied.
LLAMA_LIKE = dict(layers=2, hidden=8, heads=4, kv_heads=2, ffn_hidden=12, gated_mlp=True, linear_bias=False,
                  norm="rmsnorm", position="rotary", tied_head=False, seq_len=4, vocab=10, micro_batch=3,
                  vocab_padding=1)


def llama(**kw) -> ModelSection:
    return ModelSection(**{**LLAMA_LIKE, **kw})


def test_block_tensors_by_hand():
    # QKV 8 × (8 + 2·4) = 128, o_proj 64, gate+up 8 × 24 = 192, down 12 × 8 = 96, two RMSNorm weights 8.
    assert layer_tensors(Shape.of(llama())) == (128, 64, 192, 96, 8, 8)
    # Qwen2: biases on Q, K, V only (8 + 4 + 4 = 16).
    assert layer_tensors(Shape.of(llama(qkv_bias=True))) == (128, 16, 64, 192, 96, 8, 8)
    # MP 2: column-parallel QKV and gate+up split with their biases, o_proj and down split, norms whole.
    assert layer_tensors(Shape.of(llama(qkv_bias=True)), 2) == (64, 8, 32, 96, 48, 8, 8)


def test_total_params_by_hand():
    # 2 blocks of 496, word embedding 10 × 8, untied head 10 × 8, no position table, final RMSNorm 8.
    assert total_params(llama()) == 2 * 496 + 80 + 80 + 8
    assert total_params(llama(tied_head=True)) == 2 * 496 + 80 + 8
    # Learned positions add a seq_len × h table (max_positions rows when given).
    assert total_params(llama(position="learned")) == 2 * 496 + 160 + 4 * 8 + 8
    assert total_params(llama(position="learned", max_positions=16)) == 2 * 496 + 160 + 16 * 8 + 8


def test_block_flops_by_hand():
    b, s, h, f, kv = 3, 4, 8, 12, 4
    qkv, attention, out, mlp = 2 * b * s * h * (h + 2 * kv), 4 * b * s * s * h, 2 * b * s * h * h, 3 * 2 * b * s * h * f
    assert (qkv, attention, out, mlp) == (3072, 1536, 1536, 6912)
    w = build_workload(llama(), mp=1)
    assert w.blocks[0].fwd_flops == 13056
    assert build_workload(llama(), mp=2).blocks[0].fwd_flops == 13056 / 2


def test_saved_activation_bytes_by_hand():
    # sbh 96, sbf 144, as²b 192 at e = 2: attention 192 + 192 + 2·2·96 (Q, K) + 384 + 192 + 384 + 2·96 (V)
    # + 192 + 96, K and V h wide although there are 2 KV heads: the unfused attention repeats them for
    # the query heads and saves the repeated tensors (Megatron-Core DotProductAttention, HF repeat_kv);
    # SwiGLU MLP 192 + 192 + 2·2·144 (gate and up) + 2·144 (down's input) + 96.
    saved = layer_saved_tensors(Shape.of(llama()), s=4, b=3, t=1, e=2)
    assert sum(saved[:9]) == 2208 and sum(saved[9:]) == 1344
    assert build_workload(llama(), mp=1).blocks[0].saved_bytes == 3552
    assert layer_saved_tensors(Shape.of(llama(kv_heads=4)), s=4, b=3, t=1, e=2) == saved
    # Without dropout (LLaMA trains without): no masks (192 + 2·96) and no dropout output (384).
    assert build_workload(llama(dropout=False), mp=1).blocks[0].saved_bytes == 3552 - 192 - 2 * 96 - 384
    assert build_workload(llama(dropout=False), mp=1).modules[0].saved_bytes == 0  # the embedding's mask


def test_no_dropout_gpt_block_is_k22_without_the_masks():
    """For GPT widths at e = 2 without dropout: sbh(8 + 24/t + 2as/(ht)) (K22 eq. 2 less the masks)."""
    s, b, h, a, t = 64, 2, 128, 8, 4
    shape = Shape.of(ModelSection(layers=1, hidden=h, heads=a, seq_len=s, vocab=64, micro_batch=b, dropout=False))
    assert sum(layer_saved_tensors(shape, s, b, t)) == s * b * h * (8 + 24 / t) + 2 * a * s * s * b / t


def test_untied_head_is_its_own_vocab_parallel_tensor():
    w = build_workload(llama(), mp=2)
    head, embed = w.modules[-1], w.modules[0]
    assert head.tensors == (8, 5 * 8)  # final RMSNorm weight, V/t × h output layer
    assert embed.tensors == (5 * 8,)  # rotary: no position table
    assert build_workload(llama(tied_head=True), mp=2).modules[-1].tensors == (8,)


shapes = st.builds(
    lambda d, kv, group, ffn, gated, bias, qkv, rms, t: (
        ModelSection(layers=1, hidden=d * kv * group * t, heads=kv * group * t, kv_heads=kv * t, ffn_hidden=ffn * t,
                     gated_mlp=gated, linear_bias=bias, qkv_bias=qkv, norm="rmsnorm" if rms else "layernorm",
                     seq_len=8, vocab=64, micro_batch=1), t),
    st.sampled_from([2, 4, 8]), st.integers(1, 3), st.integers(1, 3), st.integers(1, 40), st.booleans(),
    st.booleans(), st.sampled_from([None, True, False]), st.booleans(), st.sampled_from([1, 2, 4]))


@given(shapes)
def test_mp_split_adds_up_to_the_whole_block(case):
    """Summed over the t MP ranks, a block's parameters are the whole block's plus (t - 1) copies of
    the replicated ones (row-parallel biases and norms) [S19 §3]; FLOPs split exactly t ways."""
    model, t = case
    shape = Shape.of(model)
    replicated = (2 * shape.hidden if shape.linear_bias else 0) + 2 * sum(shape.norm_tensors)
    assert t * sum(layer_tensors(shape, t)) == sum(layer_tensors(shape)) + (t - 1) * replicated
    assert layer_fwd_flops(shape, 8, 1, t) * t == pytest.approx(layer_fwd_flops(shape, 8, 1))
    assert mp_problems(model, t) == []


def test_gpt_defaults_are_the_old_gpt_shape():
    gpt = ModelSection(layers=2, hidden=8, heads=2, seq_len=4, vocab=10, micro_batch=3)
    explicit = ModelSection(layers=2, hidden=8, heads=2, seq_len=4, vocab=10, micro_batch=3, ffn_hidden=32,
                            kv_heads=2, gated_mlp=False, tied_head=True, linear_bias=True, qkv_bias=True,
                            norm="layernorm", position="learned", max_positions=4, vocab_padding=128,
                            dropout=True)
    assert build_workload(gpt, 2) == build_workload(explicit, 2)


@pytest.mark.parametrize("keys,message", [
    (dict(kv_heads=3), "kv_heads 3 must divide heads 4"),
    (dict(kv_heads=8), "kv_heads 8 must divide heads 4"),
    (dict(hidden=12, heads=4, kv_heads=None),
     "rotary positions rotate pairs of a head's dimensions, but hidden 12 / heads 4 = 3 is odd"),
    (dict(max_positions=8), "max_positions 8 sizes a learned position table, but position is rotary"),
])
def test_inconsistent_shapes_are_rejected(keys, message):
    with pytest.raises(ValueError, match=message):
        llama(**keys)


@pytest.mark.parametrize("keys,where", [
    (dict(heads=8, kv_heads=2), "model.kv_heads: 2 KV heads cannot be split evenly across mp 4"),
    (dict(ffn_hidden=1002), "model.ffn_hidden: the MLP width 1002 cannot be split evenly across mp 4"),
])
def test_mp_must_split_kv_heads_and_the_mlp(keys, where):
    with pytest.raises(ConfigError) as info:
        build_scenario(small_dict(model=keys), source="s.yaml")
    assert f"s.yaml: {where}" in str(info.value)
