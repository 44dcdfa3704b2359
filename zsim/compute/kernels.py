"""The kernels one MP rank launches per module and pass, as Megatron-LM of 2019/2020 (the code the ZeRO
paper ran: DeepSpeedExamples/Megatron-LM, megatron-lm mpu/transformer.py GPT2ParallelTransformerLayer,
mpu/layers.py, mpu/cross_entropy.py, model/gpt2_modeling.py) and DeepSpeed's fp16 optimizer launched
them. Shapes are per MP rank t; tokens T = s·b. Element bytes e: 2 for fp16/bf16, 4 for fp32.

GEMMs carry (M, N, K, batch); memory-bound kernels carry the bytes they read and write. What Megatron
did then, and these lists follow:
  - F.linear on a 3-D input is a matmul plus a separate bias add (PyTorch 1.x functional.linear);
    row-parallel layers add their bias after the MP all-reduce (mpu/layers.py RowParallelLinear).
  - attention: Q, K, V are permuted views; torch.matmul copies them contiguous; scores
    (b·a/t batches of s×s×hn), scale, mask as `scores·mask − 10000·(1 − mask)`, softmax, dropout,
    context (b·a/t batches of s×hn×s), a contiguous copy of the permuted context, output projection.
  - GeLU is one TorchScript-fused kernel (gelu_impl, @torch.jit.script); dropouts write a 1-byte mask;
    residual adds and layer norms (apex FusedLayerNorm: one kernel forward, two backward).
  - the head: logits against the tied word embedding, `.float()`, vocab-parallel cross-entropy
    (clone, max, subtract, exp, sum, divide; mpu/cross_entropy.py).
  - backward: two GEMMs per GEMM (input and weight gradient), a reduction per bias, the backward of
    every elementwise kernel, and an add where autograd sums the two gradients of a residual branch.
Shape fields beyond the 2020 GPT (ffn_hidden, gated_mlp, kv_heads, linear_bias, qkv_bias, position)
follow the model-shape contract (COORDINATION.md) with today's defaults; tied_head and norm change no
kernel (an untied head has the same GEMMs; an RMSNorm is priced as one fused norm kernel).

`model.kernels: pytorch-2` (PyTorch >= 2.0 eager modules, zsim's runtime on a GPU) drops the forward bias
adds into the GEMMs' epilogue (a row-parallel bias after the MP all-reduce keeps its add) and, at MP 1,
takes the embedding's and the cross-entropy's lists from zsim.compute.torch_kernels.

Today's options (docs/models.md): FlashAttention (`attention` flash2/flash3) replaces everything from
the Q/K/V copies to the context copy with one fused kernel each way, priced at the published rate of
zsim.compute.flash (kind 'flash'); selective recompute (Korthikanti et al. 2022 §5) launches the
attention core's forward again at the start of the block's backward; sequence parallelism (same
paper, §4.2.2) runs the norms, dropouts, residual adds and row-parallel bias adds on T/t tokens.
"""

from __future__ import annotations

import functools
from dataclasses import replace

from zsim.compute import torch_kernels
from zsim.compute.fp8 import with_fp8
from zsim.compute.kernel_list import Kernel, KernelList, gemm, linear_bwd, linear_fwd, mem, red
from zsim.compute.kernel_shape import Shape
from zsim.compute.mla_kernels import mla_backward, mla_forward, mla_up_recompute


def _block_dims(x: Shape) -> tuple[int, int, int, int, int, int]:
    """T, hn (head dim; MLA: d_v, the output's), heads per rank, QKV width per rank, MLP width per
    rank, score elements."""
    tokens = x.s * x.b
    hn = x.d or x.h // x.a
    heads = max(1, x.a // x.t)
    kv = max(1, x.kv_heads // x.t)  # GQA/MQA: K/V heads are replicated when fewer than t
    qkv = heads * hn + 2 * kv * hn
    if x.mla is not None:  # Q and K a·(d_h + d_h^R), V a·d_v wide (zsim.workload.mla)
        qk, hn = _head_dims(x)
        qkv = heads * (2 * qk + hn)
    ffn = x.ffn // x.t
    scores = x.b * heads * x.s * x.s
    return tokens, hn, heads, qkv, ffn, scores


def _head_dims(x: Shape) -> tuple[int, int]:
    """A head's QKᵀ width and attention·V width: d and d, or MLA's d_h + d_h^R and d_v."""
    if x.mla is not None:
        return x.mla[2] + x.mla[3], x.mla[4]
    hn = x.d or x.h // x.a
    return hn, hn


def _flash(x: Shape, phase: str, name: str) -> Kernel:
    """FlashAttention's fused kernel on one MP rank, causal: m = s queries, n = s/2 keys on average,
    k = head dim × its s×s×d matmuls (2 forward; 5 backward, QKᵀ recomputed), at the published
    rate for this GPU, version, sequence length and head dim (zsim.compute.flash; the QKᵀ width, which
    flash-attn's API calls the head dim, q.shape[-1]); MLA's QKᵀ and attention·V
    widths differ: k = d_qk + d_v forward, 2.5 × that backward. A sliding-window block: n = the mean keys
    per query in its window (flash-attn's window_size skips the blocks outside it). Under context parallelism the
    s/cp queries of a rank's zig-zag chunks attend cp·s/2 keys on average (Transformer Engine's ring runs them as
    per-chunk kernels; zsim prices one kernel of the same FLOPs)."""
    from zsim.compute.flash import efficiency

    (qk, vd), heads = _head_dims(x), max(1, x.a // x.t)
    return Kernel(name, "flash", m=x.s, n=x.window or max(1, x.s * x.cp // 2), k=(qk + vd) if phase == "fwd" else 5 * (qk + vd) // 2,
                  batch=x.b * heads, efficiency=efficiency(x.flash, phase, x.arch, x.s, qk, x.fp8_attention))


def _fp8_attention_casts(x: Shape, phase: str) -> list[Kernel]:
    """precision.fp8_attention's casts before cuDNN's FP8 kernel (Transformer Engine's DotProductAttention under
    Float8CurrentScaling: an amax read and a cast to one 1-byte copy, zsim.compute.fp8.quantize): Q, K and V forward,
    the output gradient backward (the output itself kept 16-bit, NVTE_DPA_FP8CS_O_in_F16 as MLPerf's configs set it)."""
    if not x.fp8_attention:
        return []
    from zsim.compute.fp8 import quantize

    T, hn, heads, qkv, _, _ = _block_dims(x)
    if phase == "fwd":
        return quantize("attention.qkv_fp8", T * qkv, "current", x.e, 1)
    return quantize("attention.grad_output_fp8", T * heads * _head_dims(x)[1], "current", x.e, 1)


def _attention_core(x: Shape) -> list[Kernel]:
    """From the Q, K, V copies to the context copy (what selective recompute recomputes [K22 §5]); with
    FlashAttention, its one fused kernel (Q, K, V in place in the fused QKV output)."""
    T, hn, heads, qkv, ffn, S = _block_dims(x)
    e = x.e
    if x.flash:
        return _fp8_attention_casts(x, "fwd") + [_flash(x, "fwd", "attention.flash")]
    qk, vd = _head_dims(x)
    return [gemm("attention.scores", x.s, x.s, qk, x.b * heads), mem("attention.scale", 2 * e * S),
            mem("attention.mask_const", 2 * e * x.s * x.s, count=2),  # 1 − mask, 10000·(…)
            mem("attention.mask", 4 * e * S, count=2),  # scores·mask, − 10000(1 − mask)
            mem("attention.softmax", 2 * e * S), mem("attention.dropout", (2 * e + 1) * S),
            gemm("attention.context", x.s, vd, x.s, x.b * heads)]


def _rotary_width(x: Shape, heads: int, hn: int, qkv: int) -> int:
    """Elements per token the rotary kernels rotate: Q and K (MLA: each head's d_h^R of Q and the one
    shared d_h^R key [DV2 eqs. 14-15])."""
    if x.mla is not None:
        return (heads + 1) * x.mla[3]
    return qkv - (qkv - heads * hn) // 2


def block_forward(x: Shape) -> tuple[Kernel, ...]:
    """One transformer block's forward on one MP rank (also its recompute under checkpointing). Shape
    options: MLA's projections in place of QKV (zsim.compute.mla_kernels); a QK-norm kernel; Gemma-2's norms after
    attention and after the MLP (x.norms 4); Falcon-7B's one norm for both (x.norms 1)."""
    T, hn, heads, qkv, ffn, S = _block_dims(x)
    e, h = x.e, x.h
    th = T * h
    tr = th // x.t if x.sp else th  # the elementwise kernels outside attention and MLP: T/t tokens under SP
    ks: list[Kernel] = [mem("input_layernorm", 2 * e * tr)]
    ks += mla_forward(x) if x.mla is not None else linear_fwd("qkv", T, qkv, h, x.qkv_bias and not _epilogue(x), e)
    if x.qk_norm:  # q and k through their RMSNorms: read and write both
        ks.append(mem("attention.qk_norm", 2 * e * T * (qkv - (qkv - heads * hn) // 2)))
    if not x.flash:
        ks.append(mem("qkv.contiguous", 2 * e * T * qkv, count=3))  # Q, K, V permuted copies for matmul
    if x.rotary:  # rotate Q and K (cos/sin tables read once): read and write both
        ks.append(mem("attention.rotary", 2 * e * T * _rotary_width(x, heads, hn, qkv), count=2))
    ks += _attention_core(x)
    if not x.flash:
        ks.append(mem("attention.context.contiguous", 2 * e * T * heads * hn))
    ks.append(gemm("attention.dense", T, h, heads * hn))
    if x.norms == 4:
        ks.append(mem("post_attention_norm", 2 * e * tr))
    ks += _residual_tail("attention", tr, x.linear_bias and not (_epilogue(x) and x.t == 1), e)
    if x.norms != 1:
        ks.append(mem("post_attention_layernorm", 2 * e * tr))
    width = 2 * ffn if x.gated else ffn
    ks += linear_fwd("mlp.h_to_4h", T, width, h, x.linear_bias and not _epilogue(x), e)
    ks.append(mem("mlp.swiglu" if x.gated else "mlp.gelu", (3 if x.gated else 2) * e * T * ffn))
    ks.append(gemm("mlp.4h_to_h", T, h, ffn))
    if x.norms == 4:
        ks.append(mem("post_mlp_norm", 2 * e * tr))
    ks += _residual_tail("mlp", tr, x.linear_bias and not (_epilogue(x) and x.t == 1), e)
    return tuple(ks)


def _epilogue(x: Shape) -> bool:
    """Whether a linear's bias rides its GEMM (model.kernels pytorch-2: addmm's cuBLASLt epilogue,
    aten/src/ATen/native/cuda/Blas.cpp gemm_and_bias), rather than a separate add. A row-parallel
    layer's bias is added after the MP all-reduce, in its own kernel, by both frameworks."""
    return x.kernels == "pytorch-2"


def _residual_tail(name: str, th: int, bias: bool, e: int) -> list[Kernel]:
    """After a row-parallel GEMM and its all-reduce: bias add, dropout (1-byte mask), residual add."""
    ks = [mem(f"{name}.bias", 2 * e * th)] if bias else []
    return ks + [mem(f"{name}.dropout", (2 * e + 1) * th), mem(f"{name}.residual", 3 * e * th)]


def block_backward(x: Shape) -> tuple[Kernel, ...]:
    """One block's backward on one MP rank, in the order autograd runs it."""
    T, hn, heads, qkv, ffn, S = _block_dims(x)
    e, h = x.e, x.h
    th = T * h
    tr = th // x.t if x.sp else th  # T/t tokens under SP (block_forward)
    # selective recompute: the attention core's forward again, first [K22 §5; Megatron-Core
    # CheckpointWithoutOutput of core_attention runs when backward reaches the layer]
    ks: list[Kernel] = [replace(k, name=f"recompute.{k.name}") for k in _attention_core(x)] if x.selective else []
    if x.recompute_mlp:  # --recompute-modules mlp: the MLP's forward, its norm through fc2, again [MC checkpoint]
        fwd = block_forward(replace(x, recompute_mlp=False))
        names = [k.name for k in fwd]
        first = names.index("post_attention_layernorm") if x.norms != 1 else names.index("mlp.h_to_4h")
        ks += [replace(k, name=f"recompute.{k.name}") for k in fwd[first:names.index("mlp.4h_to_h") + 1]]
    ks += [mem("mlp.residual_grad_sum", 3 * e * tr), mem("mlp.dropout.bwd", (2 * e + 1) * tr)]
    if x.linear_bias:
        ks.append(red("mlp.bias_grad", e * tr))
    if x.norms == 4:
        ks.append(mem("post_mlp_norm.bwd", 5 * e * tr, count=2))
    ks += [gemm("mlp.4h_to_h.dgrad", T, ffn, h), gemm("mlp.4h_to_h.wgrad", h, ffn, T)]
    ks.append(mem("mlp.swiglu.bwd" if x.gated else "mlp.gelu.bwd", (5 if x.gated else 3) * e * T * ffn))
    width = 2 * ffn if x.gated else ffn
    ks += linear_bwd("mlp.h_to_4h", T, width, h, x.linear_bias, e)
    if x.norms != 1:
        ks.append(mem("post_attention_layernorm.bwd", 5 * e * tr, count=2))
    ks += [mem("attention.residual_grad_sum", 3 * e * tr), mem("attention.dropout.bwd", (2 * e + 1) * tr)]
    if x.linear_bias:
        ks.append(red("attention.bias_grad", e * tr))
    if x.norms == 4:
        ks.append(mem("post_attention_norm.bwd", 5 * e * tr, count=2))
    ks += [gemm("attention.dense.dgrad", T, heads * hn, h), gemm("attention.dense.wgrad", h, heads * hn, T)]
    if x.recompute_mla_up and x.mla is not None:  # Q, K, V brought back first: the up projections and RoPE again
        ks += [replace(k, name=f"recompute.{k.name}") for k in mla_up_recompute(x)]
        if x.rotary:
            ks.append(mem("recompute.attention.rotary", 2 * e * T * _rotary_width(x, heads, hn, qkv), count=2))
    if x.flash:
        ks += _fp8_attention_casts(x, "bwd") + [_flash(x, "bwd", "attention.flash.bwd")]
    else:
        ks += _attention_core_bwd(x)
    if x.rotary:
        ks.append(mem("attention.rotary.bwd", 2 * e * T * _rotary_width(x, heads, hn, qkv), count=2))
    if not x.flash:
        ks.append(mem("qkv.contiguous.bwd", 2 * e * T * qkv, count=3))
    if x.qk_norm:
        ks.append(mem("attention.qk_norm.bwd", 5 * e * T * (qkv - (qkv - heads * hn) // 2)))
    ks.append(mem("qkv.split.bwd", 2 * e * T * qkv))  # the three gradients gathered into one
    ks += mla_backward(x) if x.mla is not None else linear_bwd("qkv", T, qkv, h, x.qkv_bias, e)
    ks.append(mem("input_layernorm.bwd", 5 * e * tr, count=2))
    return tuple(ks)


def _attention_core_bwd(x: Shape) -> list[Kernel]:
    """The unfused attention's backward, from the context copy to the scores' gradients."""
    T, hn, heads, qkv, ffn, S = _block_dims(x)
    e = x.e
    ks = [mem("attention.context.contiguous.bwd", 2 * e * T * heads * hn)]
    ks += [gemm("attention.context.dgrad_probs", x.s, x.s, hn, x.b * heads),
           gemm("attention.context.dgrad_value", x.s, hn, x.s, x.b * heads)]
    ks.append(mem("attention.dropout.bwd", (2 * e + 1) * S))
    ks.append(mem("attention.softmax.bwd", 3 * e * S))
    ks.append(mem("attention.mask.bwd", 2 * e * S))
    ks.append(mem("attention.scale.bwd", 2 * e * S))
    qk = _head_dims(x)[0]
    return ks + [gemm("attention.scores.dgrad_q", x.s, qk, x.s, x.b * heads),
                 gemm("attention.scores.dgrad_k", x.s, qk, x.s, x.b * heads)]


def embed_forward(x: Shape) -> tuple[Kernel, ...]:
    """Vocab-parallel word embedding (mask ids outside this rank's range, gather, zero the masked
    rows), position embedding, their sum, dropout (mpu/layers.py VocabParallelEmbedding); PyTorch's
    nn.Embedding under pytorch-2 at MP 1 (zsim.compute.torch_kernels)."""
    if torch_kernels.applies(x, "embed"):
        return torch_kernels.embed_forward(x)
    T, th, e = x.s * x.b, x.s * x.b * x.h, x.e
    ks = [mem("embed.mask_ids", 8 * 4 * T, count=4), mem("embed.word", 2 * e * th), mem("embed.zero_masked", 2 * e * th)]
    if not x.rotary and not x.alibi:  # a learned position table: gather and add
        ks += [mem("embed.position", 2 * e * th), mem("embed.add", 3 * e * th)]
    if x.embedding_norm:
        ks.append(mem("embed.layernorm", 2 * e * th))
    return tuple(ks + [mem("embed.dropout", (2 * e + 1) * (th // x.t if x.sp else th))])


def embed_backward(x: Shape) -> tuple[Kernel, ...]:
    """Dropout backward, and the dense embedding gradients: zero the (V/t)×h and s×h tables, then
    scatter-add the T·h token gradients into them (embedding_dense_backward); pytorch-2 at MP 1:
    zsim.compute.torch_kernels."""
    if torch_kernels.applies(x, "embed"):
        return torch_kernels.embed_backward(x)
    th, e = x.s * x.b * x.h, x.e
    ks = [mem("embed.dropout.bwd", (2 * e + 1) * th), mem("embed.mask.bwd", 2 * e * th),
          mem("embed.word.zero_grad", e * x.v // x.t * x.h), mem("embed.word.scatter_add", 3 * e * th)]
    if x.embedding_norm:
        ks.insert(1, mem("embed.layernorm.bwd", 5 * e * th, count=2))
    if not x.rotary and not x.alibi:
        ks += [mem("embed.position.zero_grad", e * x.s * x.h), mem("embed.position.scatter_add", 3 * e * th)]
    return tuple(ks)


def head_forward(x: Shape) -> tuple[Kernel, ...]:
    """Final layer norm, logits against the tied word embedding (T×V/t×h), then in fp32 the
    vocab-parallel cross-entropy: cast, a copy of its input, max, subtract, exp, sum, divide
    (mpu/cross_entropy.py: `logits = vocab_parallel_logits.clone()`). PyTorch's F.cross_entropy under
    pytorch-2 with model.loss torch or torch-fp32 (zsim.compute.torch_kernels)."""
    if torch_kernels.applies(x, "head"):
        return torch_kernels.head_forward(x)
    T, th, e = x.s * x.b, x.s * x.b * x.h, x.e
    tv = T * x.v // x.t
    ks = [mem("final_layernorm", 2 * e * (th // x.t if x.sp else th)), gemm("logits", T, x.v // x.t, x.h)]
    if e != 4:
        ks.append(mem("logits.float", 6 * tv))
    return tuple(ks + [mem("cross_entropy.clone", 8 * tv), red("cross_entropy.max", 4 * tv), mem("cross_entropy.sub", 8 * tv),
                       mem("cross_entropy.exp", 8 * tv), red("cross_entropy.sum", 4 * tv),
                       mem("cross_entropy.div", 8 * tv), mem("cross_entropy.targets", 4 * 4 * T, count=6)])


def head_backward(x: Shape) -> tuple[Kernel, ...]:
    """Cross-entropy backward (softmax − one-hot, times the loss gradient), the cast back, the logits
    GEMM's input and weight gradients, the final layer norm's backward (pytorch-2: torch_kernels)."""
    if torch_kernels.applies(x, "head"):
        return torch_kernels.head_backward(x)
    T, th, e = x.s * x.b, x.s * x.b * x.h, x.e
    tv = T * x.v // x.t
    ks = [mem("cross_entropy.bwd.targets", 4 * 4 * T, count=2), mem("cross_entropy.bwd.scale", 8 * tv)]
    if e != 4:
        ks.append(mem("logits.float.bwd", 6 * tv))
    return tuple(ks + [gemm("logits.dgrad", T, x.h, x.v // x.t), gemm("logits.wgrad", x.v // x.t, x.h, T),
                       mem("final_layernorm.bwd", 5 * e * th, count=2)])


def _moe_mlp_forward(x: Shape) -> list[Kernel]:
    """A MoE MLP's forward on one rank (Megatron-Core moe/: router.py, token_dispatcher.py alltoall,
    experts.py GroupedMLP): the router GEMM (T × E × h) and its fp32 softmax and top-k, the permute of
    the T·top_k token copies, the local experts' GEMMs batched (each on its tokens_per_expert rows, the
    busiest rank's), their activation, the unpermute and the weighted combine; shared experts as a
    dense MLP. The router and the dispatch handle Tm tokens: s·b, or with the experts whole beside MP
    (expert_mp 1) this rank's s·b/mp sequence-parallel share. The all-to-alls run between (zsim.zero.plan)."""
    E, local, m, f, fs, k, Tm = x.moe
    T, e, h = x.s * x.b, x.e, x.h
    R = m * local  # token copies this rank's experts compute
    width = 2 * f if x.gated else f
    ks = [gemm("moe.router", Tm, E, h), mem("moe.router.softmax_topk", 2 * 4 * Tm * E), mem("moe.permute", 2 * e * Tm * k * h),
          gemm("moe.experts.fc1", m, width, h, local), mem("moe.experts.act", (3 if x.gated else 2) * e * R * f),
          gemm("moe.experts.fc2", m, h, f, local), mem("moe.unpermute", 2 * e * Tm * k * h),
          mem("moe.combine", (k + 1) * e * Tm * h)]
    if fs:
        ks += [gemm("moe.shared.fc1", T, 2 * fs if x.gated else fs, h), mem("moe.shared.act", (3 if x.gated else 2) * e * T * fs),
               gemm("moe.shared.fc2", T, h, fs)]
    if x.moe_gate:  # Qwen2-MoE's sigmoid gate on the shared expert: T × 1 × h, then the scale
        ks += [gemm("moe.shared.gate", T, 1, h), mem("moe.shared.gate.scale", 3 * e * T * h)]
    return ks


def _moe_mlp_backward(x: Shape) -> list[Kernel]:
    """The MoE MLP's backward: every forward GEMM's input and weight gradients, the elementwise
    kernels' backward, in reverse."""
    E, local, m, f, fs, k, Tm = x.moe
    T, e, h = x.s * x.b, x.e, x.h
    R = m * local
    width = 2 * f if x.gated else f
    ks = []
    if x.moe_gate:
        ks += [mem("moe.shared.gate.scale.bwd", 4 * e * T * h), gemm("moe.shared.gate.dgrad", T, h, 1),
               gemm("moe.shared.gate.wgrad", 1, h, T)]
    if fs:
        ks += [gemm("moe.shared.fc2.dgrad", T, fs, h), gemm("moe.shared.fc2.wgrad", h, fs, T),
               mem("moe.shared.act.bwd", (5 if x.gated else 3) * e * T * fs),
               gemm("moe.shared.fc1.dgrad", T, h, 2 * fs if x.gated else fs), gemm("moe.shared.fc1.wgrad", 2 * fs if x.gated else fs, h, T)]
    ks += [mem("moe.combine.bwd", (k + 1) * e * Tm * h), mem("moe.unpermute.bwd", 2 * e * Tm * k * h)]
    if x.recompute_act:  # moe_act: the activation's forward again before fc2's weight gradient needs its output
        ks.append(mem("recompute.moe.experts.act", (3 if x.gated else 2) * e * R * f))
    return ks + [gemm("moe.experts.fc2.dgrad", m, f, h, local), gemm("moe.experts.fc2.wgrad", h, f, m, local),
                 mem("moe.experts.act.bwd", (5 if x.gated else 3) * e * R * f),
                 gemm("moe.experts.fc1.dgrad", m, h, width, local), gemm("moe.experts.fc1.wgrad", width, h, m, local),
                 mem("moe.permute.bwd", 2 * e * Tm * k * h), mem("moe.router.softmax_topk.bwd", 3 * 4 * Tm * E),
                 gemm("moe.router.dgrad", Tm, h, E), gemm("moe.router.wgrad", E, h, Tm)]


def _replace_mlp(ks: tuple[Kernel, ...], first: str, last: str, moe: list[Kernel]) -> tuple[Kernel, ...]:
    """`ks` with the dense MLP's kernels from `first` through `last` (names) replaced by `moe`."""
    names = [k.name for k in ks]
    i, j = names.index(first), names.index(last)
    return ks[:i] + tuple(moe) + ks[j + 1:]


def moe_block_forward(x: Shape) -> tuple[Kernel, ...]:
    """A MoE block's forward: block_forward with the MLP's GEMMs replaced by _moe_mlp_forward."""
    return _replace_mlp(block_forward(x), "mlp.h_to_4h", "mlp.4h_to_h", _moe_mlp_forward(x))


def moe_block_backward(x: Shape) -> tuple[Kernel, ...]:
    """A MoE block's backward: block_backward with the MLP's GEMMs replaced by _moe_mlp_backward; with
    layernorm recompute the pre-MLP norm's forward runs again before the MoE MLP's backward (Megatron-Core
    transformer_layer.py pre_mlp_norm_checkpoint: its output is restored when backward first needs it)."""
    ks = block_backward(replace(x, recompute_mlp=False))  # a dense block's MLP recompute is not a MoE block's
    last = "mlp.h_to_4h.bias_grad" if x.linear_bias else "mlp.h_to_4h.wgrad"
    moe = _moe_mlp_backward(x)
    if x.recompute_moe:  # --recompute-modules moe: the MoE layer's forward again first (moe_layer.py checkpoint)
        moe[:0] = [replace(k, name=f"recompute.{k.name}") for k in _moe_mlp_forward(x)]
    if x.recompute_norm:
        tr = x.s * x.b * x.h // x.t if x.sp else x.s * x.b * x.h
        moe.insert(0, mem("recompute.post_attention_layernorm", 2 * x.e * tr))
    return _replace_mlp(ks, "mlp.4h_to_h.dgrad", last, moe)


def _mtp_pre(x: Shape) -> list[Kernel]:
    """A multi-token prediction module's own kernels before its layer (zsim.workload.transformer._mtp_module):
    the two RMSNorms, the concatenation and eh_proj (2h → h/t)."""
    T, e, h = x.s * x.b, x.e, x.h
    tr = T * h // x.t if x.sp else T * h
    return [mem("mtp.enorm", 2 * e * tr), mem("mtp.hnorm", 2 * e * tr), mem("mtp.concat", 2 * 2 * e * tr),
            gemm("mtp.eh_proj", T, h // x.t, 2 * h)]


def _mtp_pre_backward(x: Shape) -> list[Kernel]:
    """_mtp_pre's backward, in reverse: eh_proj's input and weight gradients, the split, the norms'."""
    T, e, h = x.s * x.b, x.e, x.h
    tr = T * h // x.t if x.sp else T * h
    return [gemm("mtp.eh_proj.dgrad", T, 2 * h, h // x.t), gemm("mtp.eh_proj.wgrad", h // x.t, 2 * h, T),
            mem("mtp.concat.bwd", 2 * 2 * e * tr), mem("mtp.hnorm.bwd", 5 * e * tr, count=2),
            mem("mtp.enorm.bwd", 5 * e * tr, count=2)]


def mtp_forward(x: Shape, moe: bool = False) -> tuple[Kernel, ...]:
    """A multi-token prediction module's forward [MC multi_token_prediction.py]: the embedding of the shifted
    tokens, its own kernels, its layer (dense or MoE), then its final norm, logits and loss as the head's."""
    layer = moe_block_forward(x) if moe else block_forward(x)
    return (*embed_forward(x), *_mtp_pre(x), *layer, *head_forward(x))


def mtp_backward(x: Shape, moe: bool = False) -> tuple[Kernel, ...]:
    """mtp_forward's backward, in autograd's order."""
    layer = moe_block_backward(x) if moe else block_backward(x)
    return (*head_backward(x), *layer, *_mtp_pre_backward(x), *embed_backward(x))


_BUILDERS = {("block", "fwd"): block_forward, ("block", "bwd"): block_backward,
             ("mtp", "fwd"): mtp_forward, ("mtp", "bwd"): mtp_backward,
             ("mtp_moe", "fwd"): functools.partial(mtp_forward, moe=True),
             ("mtp_moe", "bwd"): functools.partial(mtp_backward, moe=True),
             ("moe_block", "fwd"): moe_block_forward, ("moe_block", "bwd"): moe_block_backward,
             ("embed", "fwd"): embed_forward, ("embed", "bwd"): embed_backward,
             ("head", "fwd"): head_forward, ("head", "bwd"): head_backward}


@functools.lru_cache(maxsize=256)
def module_kernels(kind: str, phase: str, shape: Shape) -> KernelList:
    """The kernels of module `kind` ('embed', 'block', 'head') in `phase` ('fwd', 'recompute', 'bwd');
    a recompute launches its forward's kernels again (Megatron-LM CheckpointFunction). Built once per
    (kind, phase, shape) and shared."""
    if phase == "recompute":
        return module_kernels(kind, "fwd", shape)
    kernels = _BUILDERS[(kind, phase)](shape)
    if not shape.dropout:
        # A dropout of p = 0 launches nothing: ATen's _dropout_impl returns its input when p == 0
        # (aten/src/ATen/native/Dropout.cpp), and the fused CUDA path needs p > 0 (is_fused_kernel_acceptable).
        kernels = tuple(k for k in kernels if ".dropout" not in k.name)
    if shape.fp8 and kind in ("block", "moe_block", "mtp", "mtp_moe"):  # TE's FP8 linear layers (zsim.compute.fp8)
        kernels = with_fp8(kernels, shape.fp8, shape.e, shape.fp8_copies)
    return KernelList(f"{kind}.{phase}", kernels)


@functools.lru_cache(maxsize=256)
def with_bucket_copy(base: KernelList, elements: int, e: int) -> KernelList:
    """`base` (a module's backward) and then the copy of its `elements`-element gradient into the
    reduction bucket (e bytes read and written per element): DeepSpeed's ZeRO-2 with contiguous
    gradients (deepspeed_zero_optimizer.py v0.2, reduce_independent_p_g_buckets_and_remove_grads:
    `new_grad_tensor.copy_(param.grad.view(-1))` into the ipg buffer) and ZeRO-3
    (__add_grad_to_ipg_bucket) do it in the backward hook, on the compute stream; the runtime's
    stages 2 and 3 too (runtime/zero/buckets.py)."""
    return KernelList(f"{base.key}+grads.to_bucket", base.kernels + (mem("grads.to_bucket", 2 * e * elements),))


