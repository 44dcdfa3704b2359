"""Activation memory: the tensors a block saves for backward, and what the loss keeps and holds, per MP
rank, in bytes.

Sources:
  [K22] Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", §4-5
        (activation bytes per layer with tensor and sequence parallelism; selective recompute; for fp32
        training the 2-byte tensors become 4-byte ones and the 1-byte dropout masks stay).
  [D23] Dao 2023, "FlashAttention-2", §2-3 (the fused kernel saves Q, K, V, its output and the fp32 row
        log-sum-exp, b·a·s values, and recomputes the s×s scores in backward; dropout from the RNG state,
        no mask); GQA's K and V stay kv_heads wide (flash-attn: "MQA/GQA ... nheads_k").
  [MC]  Megatron-Core dot_product_attention.py (the unfused attention repeats each KV head for its query
        heads) and fusions/fused_bias_swiglu.py (saves the 2f-wide input).
  [G24] Gemma Team 2024, "Gemma 2", §2; [O24] OLMo Team 2024, §3.1 (QK-norm).
  [TE]  Transformer Engine 366798ef (v2.14.1) pytorch/module/linear.py, layernorm_linear.py, grouped_linear.py:
        with FP8 or NVFP4 a linear layer saves its quantized input (the column-wise copy the weight gradient
        reads: update_usage(rowwise_usage=False, columnwise_usage=True)) unless told to save the original.
  [MCA] Megatron-Core 2edffadb5 transformer/attention.py L363-379: with FP8 other than delayed scaling (TE >=
        2.6) or FP4, linear_proj saves its original input, "the output of the fused core_attn [...] saved by
        itself", to avoid the quantized copy.
"""

from __future__ import annotations

from zsim.workload.shape import Shape


def layer_saved_tensors(shape: Shape, s: int, b: int, t: int, e: int = 2, *, sp: bool = False,
                        selective: bool = False, mlp_inner: tuple[int, ...] | None = None,
                        norm_recompute: bool = False, mlp_recompute: bool = False, q: float = 0.0,
                        proj_q: float = 0.0, mla_up_recompute: bool = False) -> tuple[int, ...]:
    """The tensors one block saves for backward on one of t MP ranks, in bytes, with e-byte
    activations: K22 §4.1-4.2 with the MLP f wide.

    Attention: norm input, QKV input (replicated, e·sbh each), Q and K (2e·sbh/t), softmax output
    (e·as²b/t), its dropout mask (as²b/t bytes), dropout output (e·as²b/t), V (e·sbh/t),
    output-projection input (e·sbh/t), dropout mask (sbh). With grouped-query attention K and V are
    still h wide here: the unfused attention this model prices (K22's s² scores) repeats each KV head
    for its query heads before QKᵀ and attention·V, and those matmuls save the repeated tensors
    [MC dot_product_attention.py: key/value.repeat_interleave]. MLP: norm input, fc1 input (e·sbh
    each), then GeLU input and output (e·sbf/t each), or for a gated MLP the fused SwiGLU's 2f-wide
    input and the down projection's input (2e·sbf/t and e·sbf/t) [MC fused_bias_swiglu], dropout
    mask (sbh). For the GPT shape their sum is K22 eq. 2 for e = 2: sbh(10 + 24/t + 5as/(ht)). An
    RMSNorm saves its input as a LayerNorm does. Without dropout (shape.dropout false: LLaMA,
    Mistral, Qwen2 train without) the three masks and the dropout output are not there: for the GPT
    widths at e = 2, sbh(8 + 24/t + 2as/(ht)).

    Options: `sp` (sequence parallelism [K22 §4.2.2]) divides the tensors MP replicates (norm inputs,
    QKV and fc1 inputs, residual dropout masks) by t: K22 Table 2, sbh(34/t + 5as/(ht)). `selective`
    (selective recompute [K22 §5]) drops the attention core's s×s tensors (softmax output, its mask and
    dropout output), recomputed in backward: K22 Table 2, sbh(10 + 24/t), or sbh·34/t with sp.
    FlashAttention (shape.flash [D23]) keeps Q (e·sbh/t), K and V (e·sb·kv_dim/t each, not repeated),
    the fp32 log-sum-exp (4·a·s·b/t) and its output (the output projection's input), and no s×s
    tensor; with `selective` as well, Megatron recomputes the fused kernel and the log-sum-exp goes.
    `mlp_inner` replaces the MLP's inner tensors (a MoE MLP's, zsim.workload.moe.Moe.saved_tensors).
    `norm_recompute` (a MoE block under Megatron-Core's --recompute-modules layernorm) drops the pre-MLP
    norm's output, the router's and the dispatch's input, recomputed from the norm's input in backward
    (transformer_layer.py: pre_mlp_norm_checkpoint, CheckpointWithoutOutput; the input norm is fused into
    the QKV linear under Transformer Engine, gpt_layer_specs.py, and keeps its output).
    `mlp_recompute` (Megatron-Core --recompute-modules mlp for a dense block, moe for a MoE block: a normal
    checkpoint of the submodule, tensor_parallel.checkpoint in transformer_layer.py / moe_layer.py) keeps only
    the checkpoint's input: every inner tensor goes, and a dense block's fc1 input too (its norm is fused into
    fc1 under Transformer Engine, so the checkpoint's input is the norm's); a MoE block keeps its norm output
    (the MoE layer's input) unless `norm_recompute`.
    `mla_up_recompute` (--recompute-modules mla_up_proj, a model with MLA) drops the attention core's Q, K and V:
    the up projections and RoPE run under CheckpointWithoutOutput, which frees their outputs once the core has
    run and recomputes them in backward from the latents (kept anyway: the up projections' inputs) and the RoPE
    key, the checkpoint's one further input (e·sb·d_h^R, whole on every MP rank as the down projection that makes
    it) [MC multi_latent_attention.py @ 2edffadb5: qkv_up_checkpoint, discard_output_and_register_recompute].

    FP8 (and NVFP4) linear layers: `q` is the bytes an element of a GEMM input's saved low-precision copy
    takes (zsim.compute.fp8.saved_bytes; 0 for 16-bit GEMMs). Transformer Engine's linears save the quantized
    copy of their input for the weight gradient, not the 16-bit tensor [TE]: the QKV and fc1 inputs (the norms'
    outputs, which TE's LayerNormLinear quantizes) and the down projection's input take q bytes an element; a
    MoE block's MLP input stays 16-bit (the router keeps it) and its experts' are `mlp_inner`'s. The output
    projection's input is kept in 16 bits for FlashAttention's backward; Megatron-Core has the projection save
    that original instead of a copy except under delayed scaling [MCA], whose extra copy is `proj_q` bytes an
    element (0 otherwise). The unfused attention's output is the projection's alone (q bytes).

    Shape options: QK-norm (shape.qk_norm) keeps q and k before their norms (e·sb·(a·d + kv·d)/t)
    [O24]; a third and fourth norm (Gemma-2's after attention and after the MLP [G24]) each keep their
    input (e·sbh, replicated); one norm (Falcon-7B's parallel block) feeds attention and MLP the same
    tensors, which the MLP does not keep twice. MLA (zsim.workload.mla) keeps its latents and a
    Q, K a·(d_h + d_h^R) wide and V and the output a·d_v wide.
    """
    h, a, f = shape.hidden, shape.heads, shape.ffn
    sb = s * b
    sbh, sbf, as2b = sb * h, sb * f, a * s * s * b
    # widths of Q, of K and of V as the attention core keeps them, and of its output (the output
    # projection's input): a·d (h unless head_dim) for Q, the output and the unfused K and V (repeated
    # per query head), kv·d for flash's K and V; MLA: a·(d_h + d_h^R) and a·d_v (zsim.workload.mla)
    mla = shape.mla
    q_w, out_w = (a * mla.qk_head, a * mla.v) if mla else (shape.q_dim, shape.q_dim)
    k_w, v_w = (q_w, out_w) if mla or not shape.flash else (shape.kv_dim, shape.kv_dim)
    r = t if sp else 1  # what MP replicates, SP splits

    def gemm_input(elements: int, div: int) -> int:
        """Bytes of a linear layer's saved input of elements/div elements: 16-bit, or its copy of q bytes [TE]."""
        return round(q * elements / div) if q else e * elements // div

    inner = (2 * e * sbf // t, gemm_input(sbf, t)) if shape.gated else (e * sbf // t, gemm_input(sbf, t))
    if mlp_inner is not None:
        inner = mlp_inner
    if mlp_recompute:
        inner = ()
        norm_recompute = norm_recompute or mlp_inner is None  # a dense MLP's checkpoint starts at its fused norm
    attention = [e * sbh // r, gemm_input(sbh, r)]
    if mla:
        attention += mla.latent_tensors(sb, e)
    if shape.qk_norm != "none":
        attention += [e * sb * shape.q_dim // t, e * sb * shape.kv_dim // t]
    up_re = mla is not None and mla_up_recompute  # Q, K, V recomputed: the RoPE key kept in their place
    qkv = [e * sb * mla.rope] if up_re else [e * sb * q_w // t, e * sb * k_w // t, e * sb * v_w // t]
    if shape.flash:
        attention += [*qkv,
                      *(() if selective else (4 * a * s * b // t,)), e * sb * out_w // t,
                      *((round(proj_q * sb * out_w / t),) if proj_q else ())]
    else:
        attention.append(qkv[0] if up_re else e * sb * (q_w + k_w) // t)
        if not selective:  # the softmax output; with dropout, its mask and the dropout's output
            attention += [e * as2b // t, as2b // t, e * as2b // t] if shape.dropout else [e * as2b // t]
        attention += [*(() if up_re else (e * sb * v_w // t,)), gemm_input(sb * out_w, t)]
    masks = (sbh // r,) if shape.dropout else ()
    post = (e * sbh // r,) if shape.layer_norms == 4 else ()  # the post-norm's input [G24]
    fc1_in = e * sbh // r if mlp_inner is not None else gemm_input(sbh, r)  # a MoE MLP's input: the router's
    mlp_in = () if shape.layer_norms == 1 else (e * sbh // r,) if norm_recompute else (e * sbh // r, fc1_in)
    return (*attention, *post, *masks, *mlp_in, *inner, *post, *masks)


def block_saved_tensors(s: int, b: int, h: int, a: int, t: int, e: int = 2) -> tuple[int, ...]:
    """The tensors one GPT block saves for backward on one of t MP ranks, in bytes, with e-byte
    activations [K22 §4.1-4.2]; see layer_saved_tensors. Their sum is K22 eq. 2 for e = 2:
    sbh(10 + 24/t + 5as/(ht)); in general sbh(4e + 2 + 12e/t) + as²b(2e + 1)/t."""
    return layer_saved_tensors(Shape.gpt(h, heads=a), s, b, t, e)


def block_saved_bytes(s: int, b: int, h: int, a: int, t: int, e: int = 2) -> int:
    """Activation bytes one GPT block saves for backward on one of t MP ranks [K22 §4.2, eq. 2]: the
    sum of block_saved_tensors."""
    return sum(block_saved_tensors(s, b, h, a, t, e))


def attention_score_bytes(shape: Shape, s: int, b: int, t: int, e: int = 2) -> int:
    """Bytes of one layer's s×s attention tensors on one of t MP ranks, as layer_saved_tensors keeps them
    without FlashAttention or selective recompute: the softmax output and, with dropout, its mask and
    output [K22 §4.1]; 0 with FlashAttention."""
    if shape.flash:
        return 0
    as2b = shape.heads * s * s * b
    return e * as2b // t + as2b // t + e * as2b // t if shape.dropout else e * as2b // t


def loss_work_tensors(tokens: int, vocab: int, t: int, e: int) -> tuple[int, ...]:
    """Bytes the loss holds while it runs over `tokens` tokens and the V/t logit columns of an MP rank,
    beside the fp32 softmax it saves (4·T·V/t) [K22 §4.3]. As Megatron-LM of the ZeRO paper's time
    (DeepSpeedExamples/Megatron-LM @ 5426d18a, pretrain_gpt2.py forward_step, mpu/cross_entropy.py): the
    e-byte logits (`output`, alive until forward_step returns), their fp32 copy (`output.float()`, the
    loss's input; none when e = 4) and the loss's own fp32 copy of that (`logits =
    vocab_parallel_logits.clone()`, "so the input remains unchanged")."""
    logits = tokens * vocab // t
    return (e * logits,) + ((4 * logits,) if e != 4 else ()) + (4 * logits,)


def loss_backward_tensors(tokens: int, vocab: int, t: int, loss: str) -> tuple[int, ...]:
    """The fp32 logit gradients the loss's backward holds at once, beside its saved tensors, or () where
    the head's default backward work applies (StepPass._backward_work_bytes). torch-fp32: nll_loss's
    backward writes a dense fp32 gradient of the log-softmax (4·T·V), and log_softmax's backward a second
    one for the fp32 logits before the first is freed (aten log_softmax_backward_data allocates its
    output); the 2026-11-27 H200 history shows both live with the saved log-softmax
    (data/device/20261127-h200-memhist, h1024: three 1648 MB blocks)."""
    if loss != "torch-fp32":
        return ()
    logits = tokens * vocab // t
    return (4 * logits, 4 * logits)


def loss_tensors(tokens: int, vocab: int, t: int, e: int,
                 loss: str = "megatron") -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """(saved, work, held): the bytes the cross-entropy over `tokens` tokens and the V/t logit columns of an
    MP rank keeps for backward, those it holds only while forward runs, and those the training loop holds
    until the backward pass ends.
      megatron: the fp32 softmax (4·T·V/t) [K22 §4.3], beside loss_work_tensors' copies.
      fused: a fused softmax-cross-entropy kernel keeps its e-byte input logits and one fp32 log-sum-exp
          per token (4·T: every MP rank keeps the lse of all T tokens after the all-reduce over the vocab
          split) and nothing else: flash-attn flash_attn/losses/cross_entropy.py SoftmaxCrossEntropyLossFn
          (forward: `ctx.save_for_backward(logits, lse, labels)`; backward writes the logits' gradient,
          into a new tensor or, with inplace_backward, into the logits), llm-foundry's default
          (`loss_fn: fused_crossentropy`, llmfoundry/models/mpt/modeling_mpt.py). The e-byte logits
          are the head GEMM's output, which the Megatron loss also holds (as work).
      torch: PyTorch's F.cross_entropy on the e-byte logits without an fp32 upcast (NeMo AutoModel's
          MaskedCrossEntropy(fp32_upcast=False), nemo_automodel/components/loss/masked_ce.py): log_softmax
          saves its e-byte output for backward (nll_loss reads the same tensor); the logits themselves are
          held by the training loop's model output until its backward() returns (train_ft.py
          _forward_backward_step: `out = model(**batch)`, then `calculate_loss(..., logits=out.logits)` and
          `.backward()` in the same scope). No tensor parallelism (t = 1 in that loss).
      torch-fp32: PyTorch's F.cross_entropy on an fp32 copy of the logits (Hugging Face transformers
          loss/loss_utils.py ForCausalLMLoss: `logits = logits.float()`; zsim's runtime, runtime/model.py
          Head): log_softmax saves its fp32 output; the e-byte logits and their fp32 copy are freed when
          the forward ends (the loss is all the model returns). Measured block by block on an H200
          (data/device/20261127-h200-memhist): 824 MB of bf16 logits, 1648 MB fp32 copy, 1648 MB saved
          log-softmax at T·V = 412M. Its backward's tensors are loss_backward_tensors'. t = 1."""
    logits = tokens * vocab // t
    if loss == "torch-fp32":  # the e-byte logits and their fp32 copy while forward runs (none when e = 4)
        return (4 * logits,), (e * logits,) + ((4 * logits,) if e != 4 else ()), ()
    if loss == "fused":
        return (e * logits, 4 * tokens), (), ()
    if loss == "torch":
        return (e * logits,), (), (e * logits,)
    return (4 * logits,), loss_work_tensors(tokens, vocab, t, e), ()
