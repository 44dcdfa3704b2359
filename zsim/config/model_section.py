"""The scenario's model section: a decoder-only transformer's shape and options, with its mixture-of-experts
and multi-head latent attention subsections (one msgspec Struct each, zsim.config.struct); every field
documented. zsim.config.schema holds the other sections and the scenario file."""

from __future__ import annotations

from typing import Annotated, Literal

from zsim.config.bounds import MAX_ACCUM, MAX_BATCH, MAX_HIDDEN, MAX_LAYERS, MAX_SEQ, MAX_VOCAB, Text
from zsim.config.struct import Meta, Section


# The keys a Hugging Face config.json can supply (zsim/config/hf.py); without from_hf they are required.
HF_SHAPE_KEYS = ("layers", "hidden", "heads", "seq_len", "vocab")


def model_json_schema(schema: dict) -> None:
    """JSON Schema of the model section: the shape keys are required unless from_hf supplies them."""
    schema["required"] = [k for k in schema.get("required", []) if k not in HF_SHAPE_KEYS]
    schema["anyOf"] = [{"required": ["from_hf"]}, {"required": list(HF_SHAPE_KEYS)}]


class MoeSection(Section, kw_only=True):
    """Mixture-of-experts MLPs (Shazeer et al. 2017; GShard, Lepikhin et al. 2020; Switch, Fedus et al.
    2022; Mixtral, Jiang et al. 2024; DeepSeekMoE, Dai et al. 2024): each MoE layer's MLP is `experts`
    routed expert FFNs, of which a router picks `top_k` per token, beside `shared_experts` every token
    passes through (docs/moe.md)."""

    experts: Annotated[int, Meta(ge=2, le=MAX_HIDDEN, description="routed experts per MoE layer E")]
    top_k: Annotated[int, Meta(ge=1, le=MAX_HIDDEN, description="experts each token is routed to (Mixtral 2)")]
    expert_ffn_hidden: Annotated[int, Meta(gt=0, le=MAX_HIDDEN, description=(
        "one routed expert's inner width (HF moe_intermediate_size); default model.ffn_hidden"))] | None = None
    shared_experts: Annotated[int, Meta(ge=0, le=MAX_HIDDEN, description=(
        "experts every token passes through (DeepSeekMoE, Qwen-MoE); 0: none"))] = 0
    shared_ffn_hidden: Annotated[int, Meta(gt=0, le=MAX_HIDDEN, description=(
        "one shared expert's inner width; default expert_ffn_hidden"))] | None = None
    capacity_factor: Annotated[float, Meta(gt=0, le=1000, description=(
        "GShard/Switch capacity: each expert takes at most capacity_factor × the mean tokens, padded to it "
        "(tokens beyond are dropped); absent: dropless (every token computed, the busiest expert sets the pace)"))] | None = None
    imbalance: Annotated[float, Meta(ge=1, le=1000, description=(
        "load imbalance: the busiest expert's tokens over the mean (1.0: perfectly balanced); dropless "
        "routing computes and sends that many on the busiest rank"))] = 1.0
    dense_layers: Annotated[int, Meta(ge=0, le=MAX_LAYERS, description=(
        "the first dense_layers blocks keep a dense MLP (DeepSeek first_k_dense_replace)"))] = 0
    shared_expert_gate: Annotated[bool, Meta(description=(
        "a sigmoid gate h × 1 scales the shared experts' output (Qwen2-MoE's shared_expert_gate)"))] = False
    router_bias: Annotated[bool, Meta(description=(
        "the router holds a per-expert bias of E elements used for top-k selection (DeepSeek-V3's "
        "e_score_correction_bias)"))] = False
    dispatcher: Annotated[Literal["alltoall", "deepep"], Meta(description=(
        "how tokens reach their experts' EP ranks: alltoall, one copy per routed expert (Megatron-Core's "
        "alltoall dispatcher); deepep, one copy per destination rank however many of its experts the token "
        "picked (DeepEP's dispatch; the expected ranks under uniform routing, docs/moe.md)"))] = "alltoall"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.top_k > self.experts:
            raise ValueError(f"top_k {self.top_k} is more than the {self.experts} experts")


class MlaSection(Section, kw_only=True):
    """Multi-head latent attention (DeepSeek-AI 2024, "DeepSeek-V2", §2.1, eqs. 9-19): K and V come up
    from a kv_lora_rank-wide latent, Q from a q_lora_rank-wide one (or straight from h), each head's
    query and key are qk_nope_head_dim + qk_rope_head_dim wide (the rotary part of the key shared by
    all heads), its value v_head_dim wide (docs/models.md)."""

    kv_lora_rank: Annotated[int, Meta(gt=0, le=MAX_HIDDEN, description="d_c: the compressed KV latent width")]
    q_lora_rank: Annotated[int, Meta(gt=0, le=MAX_HIDDEN, description=(
        "d_c': the compressed query latent width; absent: Q projected straight from h (DeepSeek-V2-Lite)"))] | None = None
    qk_nope_head_dim: Annotated[int, Meta(gt=0, le=MAX_HIDDEN, description="d_h: a head's query/key width without RoPE")]
    qk_rope_head_dim: Annotated[int, Meta(gt=0, le=MAX_HIDDEN, description=(
        "d_h^R: the decoupled RoPE part of each query head and of the one shared key"))]
    v_head_dim: Annotated[int, Meta(gt=0, le=MAX_HIDDEN, description="a head's value (and output) width")]


class ModelSection(Section, kw_only=True):
    """A decoder-only transformer. The defaults are GPT's (Megatron-LM, the ZeRO paper); the shape
    options describe LLaMA, Mistral, Qwen2 and GPT-NeoX too, and `from_hf` reads them from a Hugging
    Face config.json (docs/models.md has the formulas and the mapping)."""

    _STRIP = ("from_hf",)

    layers: Annotated[int, Meta(gt=0, le=MAX_LAYERS, description="number of transformer blocks L")]
    hidden: Annotated[int, Meta(gt=0, le=MAX_HIDDEN, description="hidden size h")]
    heads: Annotated[int, Meta(gt=0, le=MAX_HIDDEN, description="attention (query) heads a; must divide hidden")]
    seq_len: Annotated[int, Meta(gt=0, le=MAX_SEQ, description="sequence length s, tokens")]
    vocab: Annotated[int, Meta(gt=0, le=MAX_VOCAB, description=(
        "vocabulary size V (padded to a multiple of vocab_padding × mp)"))]
    micro_batch: Annotated[int, Meta(gt=0, le=MAX_BATCH, description="sequences per GPU per forward/backward pass")]
    global_batch: Annotated[int, Meta(gt=0, le=MAX_BATCH, description="sequences per optimizer step")] | None = None
    grad_accum: Annotated[int, Meta(gt=0, le=MAX_ACCUM, description="micro-batches per optimizer step")] | None = None
    # Shape options (docs/models.md); each default is the GPT shape.
    ffn_hidden: Annotated[int, Meta(gt=0, le=MAX_HIDDEN, description=(
        "MLP inner width f (HF intermediate_size); default 4 × hidden"))] | None = None
    gated_mlp: Annotated[bool, Meta(description=(
        "gated MLP (SwiGLU, LLaMA): gate and up projections h×f, down f×h; false: two matmuls h×f and f×h "
        "with GeLU between (GPT)"))] = False
    kv_heads: Annotated[int, Meta(gt=0, le=MAX_HIDDEN, description=(
        "key/value heads (grouped-query attention; 1 = multi-query); must divide heads; default heads"))] | None = None
    tied_head: Annotated[bool, Meta(description=(
        "the LM head reuses the word embedding (GPT-2, Megatron-LM); false: its own vocab × hidden matrix "
        "(LLaMA, Mistral, GPT-NeoX)"))] = True
    linear_bias: Annotated[bool, Meta(description=(
        "biases on the attention output projection and the MLP's linears (false for LLaMA, Mistral, Qwen2)"))] = True
    qkv_bias: Annotated[bool, Meta(description=(
        "biases on the Q, K and V projections; default linear_bias (Qwen2: true while linear_bias is false)"))] | None = None
    norm: Annotated[Literal["layernorm", "rmsnorm", "nonparametric"], Meta(description=(
        "layernorm: weight and bias (2h per norm); rmsnorm: weight only (h); nonparametric: a LayerNorm "
        "without weight or bias (OLMo-1)"))] = "layernorm"
    position: Annotated[Literal["learned", "rotary", "alibi"], Meta(description=(
        "learned: a table of max_positions × hidden parameters; rotary: RoPE, no parameters; alibi: ALiBi "
        "(Press et al. 2022; BLOOM), a bias on the attention scores, no parameters"))] = "learned"
    layer_norms: Annotated[int, Meta(ge=1, le=4, description=(
        "h-wide norms in each block: 2 (before attention and before the MLP); 1: Falcon-7B's one LayerNorm "
        "before its parallel attention and MLP; 4: Gemma-2's norms before and after each"))] = 2
    qk_norm: Annotated[Literal["none", "head", "full"], Meta(description=(
        "RMSNorm weights on the queries and keys: head (one head_dim-wide weight each, shared by the heads: "
        "Gemma-3, Qwen3), full (heads·head_dim and kv_heads·head_dim wide: OLMo-2)"))] = "none"
    sliding_window: Annotated[int, Meta(gt=0, le=MAX_SEQ, description=(
        "local attention: a query attends to at most this many tokens back (Mistral-7B-v0.1, Gemma-2/3; "
        "Beltagy et al. 2020); with FlashAttention a local block computes only those pairs; absent: global"))] | None = None
    full_attention_every: Annotated[int, Meta(ge=0, le=MAX_LAYERS, description=(
        "with sliding_window: every k-th block (blocks k, 2k, ... counting from 1) attends globally (Gemma-2: "
        "2, Gemma-3: 6); 0: every block is local"))] = 0
    mla: Annotated[MlaSection, Meta(description=(
        "multi-head latent attention (DeepSeek-V2/V3) in place of the Q/K/V projections; absent: standard"))] | None = None
    embedding_norm: Annotated[bool, Meta(description=(
        "a LayerNorm after the word embedding (BLOOM's word_embeddings_layernorm: 2h parameters)"))] = False
    max_positions: Annotated[int, Meta(gt=0, le=MAX_SEQ, description=(
        "rows of the learned position table (HF n_positions); default seq_len"))] | None = None
    vocab_padding: Annotated[int, Meta(gt=0, le=MAX_VOCAB, description=(
        "pad vocab to a multiple of vocab_padding × mp (Megatron-LM make_vocab_size_divisible_by); default "
        "128, or 1 with from_hf (the checkpoint's vocabulary, padded only as far as MP needs)"))] | None = None
    head_dim: Annotated[int, Meta(gt=0, le=MAX_HIDDEN, description=(
        "attention head width d; default hidden / heads (Gemma, Mistral-Nemo: heads × head_dim ≠ hidden, "
        "Q and the output projection are heads·head_dim wide)"))] | None = None
    dropout: Annotated[bool, Meta(description=(
        "dropout on the attention probabilities and the residual branches, whose masks backward keeps "
        "(Korthikanti et al. 2022); false for models trained without (LLaMA, Mistral, Qwen2, GPT-NeoX-20B)"))] = True
    # FlashAttention (Dao 2023; Shah et al. 2024): the fused kernel keeps no s×s scores (it recomputes them
    # in backward from Q, K, V and the per-row log-sum-exp); zsim.compute.flash prices it.
    attention: Annotated[Literal["standard", "flash2", "flash3", "auto"], Meta(description=(
        "standard: unfused attention that keeps the s×s scores for backward (Megatron-LM 2019-20); flash2 / "
        "flash3: FlashAttention-2 (Ampere+) or -3 (Hopper; on Blackwell cuDNN's fused attention, what Transformer "
        "Engine runs there): no s×s memory, one fused kernel priced from the published benchmarks at its head dim "
        "(up to 256); auto: flash2 where it runs (a 16-bit dtype on Ampere or newer, heads up to 256 wide; flash3 "
        "on Blackwell), else standard (what from_hf imports of the families trained with FlashAttention set)"))] = "standard"
    # What the cross-entropy keeps (docs/memory.md, "The loss"): Megatron-LM's of 2020 holds fp32 copies
    # of the logits (zsim.workload.activations.loss_work_tensors); a fused kernel keeps the e-byte logits
    # and one fp32 log-sum-exp per token (flash-attn flash_attn/losses/cross_entropy.py
    # SoftmaxCrossEntropyLossFn: ctx.save_for_backward(logits, lse, labels)).
    loss: Annotated[Literal["megatron", "fused", "torch", "torch-fp32"], Meta(description=(
        "the cross-entropy's memory: megatron: Megatron-LM's vocab-parallel loss of 2020 (the e-byte logits, "
        "their fp32 copy, its fp32 clone and the saved fp32 softmax: (e + 12) bytes per logit); fused: a fused "
        "kernel that keeps only the e-byte logits and a per-token fp32 log-sum-exp (flash-attn's xentropy, "
        "llm-foundry's default loss_fn: fused_crossentropy); torch: PyTorch's cross_entropy on the e-byte "
        "logits without an fp32 upcast, which saves its e-byte log-softmax while the training loop holds the "
        "logits until backward ends (NeMo AutoModel's MaskedCrossEntropy with fp32_upcast false; mp 1 only); "
        "torch-fp32: PyTorch's cross_entropy on an fp32 upcast of the logits (F.cross_entropy(logits.float()), "
        "as Hugging Face transformers' ForCausalLMLoss and zsim's runtime compute it), which saves its fp32 "
        "log-softmax and whose backward holds two fp32 logit gradients at once; mp 1 only"))] = "megatron"
    # Whose kernels each module launches (zsim.compute.kernels): the lists differ in what is fused, not
    # in FLOPs. pytorch-2 is zsim's runtime model (runtime/model.py) under PyTorch >= 2.0 eager, read from
    # its Kineto traces on an H200 (data/device/20261126-h200-kineto): at::linear folds a contiguous 3-D
    # input into addmm, whose CUDA path puts the bias in cuBLASLt's epilogue (aten/src/ATen/native/Linear.cpp
    # _flatten_nd_linear; cuda/Blas.cpp gemm_and_bias).
    kernels: Annotated[Literal["megatron-2020", "pytorch-2"], Meta(description=(
        "whose kernel lists the modules launch: megatron-2020: Megatron-LM as the ZeRO paper ran it (separate "
        "bias adds after every GEMM, vocab-parallel embedding masks, Megatron's seven-kernel cross-entropy); "
        "pytorch-2: plain PyTorch >= 2.0 modules on a GPU, as zsim's runtime builds them (column-parallel and "
        "MP-1 biases in the GEMM's cuBLASLt epilogue, nn.Embedding without masks, and with model.loss torch or "
        "torch-fp32 F.cross_entropy's log_softmax and nll_loss); what `zsim calibrate` and `zsim replay` "
        "rebuild a GPU run of the runtime with"))] = "megatron-2020"
    moe: Annotated[MoeSection, Meta(description=(
        "mixture-of-experts MLPs (docs/moe.md); absent: every MLP dense"))] | None = None
    # DeepSeek-AI 2024, "DeepSeek-V3" §2.2 (multi-token prediction); Megatron-Core --mtp-num-layers
    # (transformer/multi_token_prediction.py): D sequential modules after the last layer, on the last pipeline stage.
    mtp_layers: Annotated[int, Meta(ge=0, le=MAX_LAYERS, description=(
        "multi-token prediction depth D (DeepSeek-V3 §2.2, Megatron-Core --mtp-num-layers): D modules after the last "
        "layer, each the embedding of the tokens one further ahead and the previous depth's hidden state through two "
        "RMSNorms, a 2h → h projection, one transformer layer of the model's last kind, a final norm, and the shared "
        "output head and loss; on the last pipeline stage; 0: none (the models' published parameter counts leave "
        "it out)"))] = 0
    from_hf: Annotated[Text, Meta(description=(
        "a Hugging Face config.json (or the folder holding one) giving the shape; keys written here override "
        "it; a relative path is relative to the scenario file"))] | None = None

    def __post_init__(self) -> None:  # shape is consistent
        super().__post_init__()
        if self.head_dim is None and self.mla is None and self.hidden % self.heads:
            raise ValueError(f"hidden {self.hidden} is not divisible by heads {self.heads} (or give head_dim)")
        if self.kv_heads is not None and (self.kv_heads > self.heads or self.heads % self.kv_heads):
            raise ValueError(f"kv_heads {self.kv_heads} must divide heads {self.heads} (each KV head serves "
                             "heads / kv_heads query heads)")
        d = self.head_dim or self.hidden // self.heads
        if self.position == "rotary" and d % 2 and self.mla is None:
            what = f"head_dim {d}" if self.head_dim else f"hidden {self.hidden} / heads {self.heads} = {d}"
            raise ValueError(f"rotary positions rotate pairs of a head's dimensions, but {what} is odd")
        if self.position == "alibi" and self.max_positions is not None:
            raise ValueError(f"max_positions {self.max_positions} sizes a learned position table, but position "
                             "is alibi (no table)")
        if self.position == "rotary" and self.max_positions is not None:
            raise ValueError(f"max_positions {self.max_positions} sizes a learned position table, but position "
                             "is rotary (no table)")
        if self.mla is not None and (self.kv_heads not in (None, self.heads) or self.head_dim is not None or
                                     self.qk_norm != "none"):
            raise ValueError("mla sets the attention's widths itself: kv_heads, head_dim and qk_norm do not apply")
        if self.mla is not None and self.mla.qk_rope_head_dim % 2 and self.position == "rotary":
            raise ValueError(f"mla.qk_rope_head_dim {self.mla.qk_rope_head_dim} is odd: rotary positions rotate pairs")
        if self.full_attention_every and self.sliding_window is None:
            raise ValueError(f"full_attention_every {self.full_attention_every} alternates local and global "
                             "attention, but sliding_window is not set")
        if self.moe is not None and self.moe.dense_layers > self.layers:
            raise ValueError(f"moe.dense_layers {self.moe.dense_layers} is more than the {self.layers} layers")
        if self.max_positions is not None and self.max_positions < self.seq_len:
            raise ValueError(f"seq_len {self.seq_len} is longer than the {self.max_positions} rows of the learned "
                             "position table (max_positions)")
