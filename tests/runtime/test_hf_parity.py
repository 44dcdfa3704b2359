"""The runtime's model computes what Hugging Face transformers computes for the same shape and weights:
LLaMA (GQA, SwiGLU, RMSNorm, rotary), Qwen2 (Q/K/V biases) and GPT-2 (learned positions, biases,
LayerNorm) give the same logits. Needs `transformers` (not a dependency: skipped without it)."""

from __future__ import annotations

import pytest
import torch

from zsim.runtime.model import GPT, GPTConfig

transformers = pytest.importorskip("transformers")

VOCAB, SEQ = 97, 12


def llama_like(model_type: str):
    """A tiny HF model of `model_type` and the GPTConfig of the same shape."""
    cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config}[model_type]
    hf_cfg = cls(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ, rms_norm_eps=1e-5,
                 rope_theta=10000.0, tie_word_embeddings=False, attn_implementation="eager")
    ours = GPTConfig(layers=2, hidden=32, heads=4, kv_heads=2, ffn_hidden=48, gated_mlp=True, linear_bias=False,
                     qkv_bias=model_type == "qwen2", norm="rmsnorm", position="rotary", seq_len=SEQ, vocab=VOCAB,
                     tied_head=False)
    return hf_cfg, ours


@torch.no_grad()
def copy_llama(hf, gpt: GPT) -> None:
    m = hf.model
    gpt.units[0].tokens.weight.copy_(m.embed_tokens.weight)
    for layer, block in zip(m.layers, gpt.units[1:-1], strict=True):
        a, mlp = layer.self_attn, layer.mlp
        block.ln1.weight.copy_(layer.input_layernorm.weight)
        block.ln2.weight.copy_(layer.post_attention_layernorm.weight)
        block.attn.qkv.weight.copy_(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]))
        if block.attn.qkv.bias is not None:
            block.attn.qkv.bias.copy_(torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]))
        block.attn.proj.weight.copy_(a.o_proj.weight)
        block.mlp.fc.weight.copy_(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]))  # (gate, up) fused
        block.mlp.proj.weight.copy_(mlp.down_proj.weight)
    gpt.units[-1].ln.weight.copy_(m.norm.weight)
    gpt.units[-1].lm_head.weight.copy_(hf.lm_head.weight)


@torch.no_grad()
def copy_gpt2(hf, gpt: GPT) -> None:
    t = hf.transformer
    gpt.units[0].tokens.weight.copy_(t.wte.weight)
    gpt.units[0].positions.weight.copy_(t.wpe.weight)
    for layer, block in zip(t.h, gpt.units[1:-1], strict=True):  # HF's Conv1D weights are (in, out)
        for ours, theirs in ((block.ln1, layer.ln_1), (block.ln2, layer.ln_2)):
            ours.weight.copy_(theirs.weight)
            ours.bias.copy_(theirs.bias)
        for ours, theirs in ((block.attn.qkv, layer.attn.c_attn), (block.attn.proj, layer.attn.c_proj),
                             (block.mlp.fc, layer.mlp.c_fc), (block.mlp.proj, layer.mlp.c_proj)):
            ours.weight.copy_(theirs.weight.T)
            ours.bias.copy_(theirs.bias)
    gpt.units[-1].ln.weight.copy_(t.ln_f.weight)
    gpt.units[-1].ln.bias.copy_(t.ln_f.bias)  # the head is tied to wte, as GPT-2's


def logits(gpt: GPT, idx: torch.Tensor) -> torch.Tensor:
    x = idx
    for unit in gpt.units[:-1]:
        x = unit(x)
    head = gpt.units[-1]
    weight = gpt.units[0].tokens.weight if head.lm_head is None else head.lm_head.weight  # tied or not
    return torch.nn.functional.linear(head.ln(x), weight)


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "gpt2"])
def test_logits_match_transformers(model_type):
    torch.manual_seed(0)
    if model_type == "gpt2":  # "gelu": the exact GeLU the runtime uses (GPT-2 itself uses the tanh form)
        hf_cfg = transformers.GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=2, n_head=4,
                                         activation_function="gelu", attn_pdrop=0.0, resid_pdrop=0.0,
                                         embd_pdrop=0.0, attn_implementation="eager")
        ours = GPTConfig(layers=2, hidden=32, heads=4, seq_len=SEQ, vocab=VOCAB)
        hf = transformers.GPT2LMHeadModel(hf_cfg).eval()
        gpt = GPT(ours).eval()
        copy_gpt2(hf, gpt)
    else:
        hf_cfg, ours = llama_like(model_type)
        hf = (transformers.LlamaForCausalLM if model_type == "llama" else transformers.Qwen2ForCausalLM)(hf_cfg)
        hf = hf.eval()
        for p in hf.parameters():  # norms and biases away from their 1 / 0 initialisation
            torch.nn.init.normal_(p, std=0.3)
        gpt = GPT(ours).eval()
        copy_llama(hf, gpt)
    assert sum(p.numel() for p in gpt.parameters()) == sum(p.numel() for p in hf.parameters())  # tied: GPT-2
    idx = torch.randint(0, VOCAB, (2, SEQ))
    torch.testing.assert_close(logits(gpt, idx), hf(idx).logits, rtol=1e-4, atol=1e-4)
