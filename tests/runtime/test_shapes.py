"""The runtime builds the shapes the simulator counts: the Hugging Face families' parameter counts on
torch's meta device, Megatron MP shards that add up to the unsplit block (GQA, SwiGLU, biases), the
same FLOP formula, and a LLaMA-shaped model that trains alike with MP 2 and without."""

from __future__ import annotations

import pytest
import torch

from tests.runtime.conftest import tiny_model
from tests.runtime.test_parity import assert_losses_close
from tests.test_hf import HF, PUBLISHED, imported
from zsim.config.model_section import ModelSection
from zsim.runtime.model import GPT, Block, GPTConfig, forward_flops
from zsim.runtime.tensor_parallel import shard_block
from zsim.workload.parameters import total_params
from zsim.workload.shape import Shape
from zsim.workload.transformer import layer_fwd_flops

# A LLaMA-shaped tiny model: 4 query heads on 2 KV heads (d = 8), SwiGLU of 48, RMSNorm, rotary, no biases.
LLAMA = dict(hidden=32, heads=4, kv_heads=2, ffn_hidden=48, gated_mlp=True, linear_bias=False, norm="rmsnorm",
             position="rotary")


def count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize("name", PUBLISHED)
def test_runtime_units_have_the_simulators_shapes(name):
    model = imported(name)
    shape = Shape.of(model)
    with torch.device("meta"):  # shapes only: LLaMA-3-70B without 280 GB of memory
        gpt = GPT(GPTConfig.of(model))
    embed, block, head = gpt.units[0], gpt.units[1], gpt.units[-1]
    h = model.hidden
    assert count(block) == shape.layer_params
    assert count(embed) == model.vocab * h + shape.positions * h
    assert count(head.ln) == sum(shape.norm_tensors)
    assert count(gpt) == total_params(model) == PUBLISHED[name]  # tied heads (GPT-2, Qwen2-0.5B) too


# 8 query heads on 4 KV heads (d = 8): splits over MP 2 and 4.
WIDE = dict(LLAMA, hidden=64, heads=8, kv_heads=4)


@pytest.mark.parametrize("shape", [WIDE, dict(WIDE, qkv_bias=True), dict(hidden=32, heads=4),
                                   dict(WIDE, linear_bias=True, position="learned", norm="layernorm")],
                         ids=["llama", "qwen2", "gpt", "gated-with-biases"])
@pytest.mark.parametrize("mp", [2, 4])
def test_mp_shards_add_up_to_the_whole_block(shape, mp):
    """Without the MP all-reduce, each shard's attention and MLP output is a partial sum (plus the
    replicated row-parallel bias): the shards' outputs add up to the unsplit block's."""
    torch.manual_seed(0)
    cfg = GPTConfig(layers=1, seq_len=16, vocab=63, **shape)
    block = Block(cfg)
    for p in block.parameters():  # non-trivial norms and biases too
        torch.nn.init.normal_(p, std=0.2)
    x = torch.randn(2, 16, cfg.hidden)
    shards = [shard_block(block, mp_rank=r, mp=mp, all_reduce=lambda t: None) for r in range(mp)]
    assert sum(count(s) for s in shards) == count(block) + (mp - 1) * (
        count(block.ln1) + count(block.ln2) + (2 * cfg.hidden if cfg.linear_bias else 0))
    for part in ("attn", "mlp"):
        y = block.ln1(x) if part == "attn" else block.ln2(x)
        whole = getattr(block, part)(y)
        parts = sum(getattr(s, part)(y) for s in shards)
        if cfg.linear_bias:  # every shard added the whole bias; the all-reduce sums before adding it once
            parts = parts - (mp - 1) * getattr(block, part).proj.bias
        torch.testing.assert_close(parts, whole, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["llama-3-70b.json", "gpt2-xl.json", "qwen2-0.5b.json"])
def test_runtime_flops_match_the_simulators(name):
    model = imported(name, seq_len=512)
    for mp in (1, 2):
        assert forward_flops(GPTConfig.of(model), 0, micro_batch=2, mp=mp) == \
            layer_fwd_flops(Shape.of(model), 512, 2, mp)


def test_gpt_config_takes_every_shape_field_from_the_model_section():
    model = ModelSection(layers=2, seq_len=16, vocab=63, micro_batch=2, **LLAMA)
    cfg = GPTConfig.of(model)
    assert (cfg.kv, cfg.ffn, cfg.gated_mlp, cfg.norm, cfg.position, cfg.linear_bias) == \
        (2, 48, True, "rmsnorm", "rotary", False)
    assert HF.is_dir()


def test_llama_shape_trains_alike_with_tensor_parallelism(traced):
    """MP 2 × DP 2 (4 ranks) of the LLaMA-shaped model gives DP 2's losses: the GQA heads, the fused
    SwiGLU and the rotary positions are split the way the unsplit model computes them."""
    # vocab 64 padded to a multiple of 1 x MP (vocab_padding 1, as for HF models): both runs hold the same
    # 64 rows (the default pads to 128 x MP, a different model under MP 2)
    llama = tiny_model(hidden=32, heads=4, vocab=64, vocab_padding=1,
                       **{k: v for k, v in LLAMA.items() if k not in ("hidden", "heads")})
    base = traced("llama_s0r2", stage=0, world_size=2, model=llama)
    run = traced("llama_mp2s3r4", stage=3, world_size=4, mp=2, model=llama)
    assert_losses_close(run.summary["losses"], base.summary["losses"])
    assert base.summary["losses"][-1] < base.summary["losses"][0] - 0.2  # it trains
