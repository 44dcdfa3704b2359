"""The scenario schema: one model (a msgspec Struct, zsim.config.struct) per YAML section, each field
documented.

Only per-field and per-section checks live here; checks that need the hardware profile (does the
layout match the cluster?) live in `zsim.scenario.scenario`, which builds the validated `Scenario`.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from zsim.config.struct import Meta, Section, field
from zsim.config.validation import PROFILE_NAME_PATTERN, PROFILE_NAME_RULE

# Upper bounds (issue 13): far above any real training run, low enough that the closed-form checks
# and the per-layer workload stay cheap and no product overflows a float. Ψ of the largest bound
# model is ~12·L·h² = 12 · 1e5 · (1e6)² ≈ 1e18 parameters: still finite and still "does not fit".
MAX_LAYERS = 100_000
MAX_HIDDEN = 1_000_000
MAX_SEQ = 100_000_000  # 1e8 tokens: beyond any published context length
MAX_VOCAB = 100_000_000
MAX_BATCH = 100_000_000  # sequences (micro_batch, global_batch)
MAX_ACCUM = 1_000_000
MAX_GPUS = 1 << 24  # dp, nodes (16.7M GPUs)
MAX_MP = 1024
MAX_ELEMENTS = 1 << 50  # reduce_bucket_elements
MAX_STEPS = 1000  # simulated optimizer steps: each step is simulated in full
MAX_DEGRADE = 10_000  # degraded links listed

_PROFILE_NAME = re.compile(PROFILE_NAME_PATTERN)


def profile_name(value: str) -> str:
    """A profile *name* (issue 13 containment): letters, digits, '.', '_', '+', '-'; no '/', '\\', '..',
    no absolute path. Profiles are looked up by name in the profile folders, never read from a path
    written in a scenario file. Raises ValueError otherwise."""
    if not _PROFILE_NAME.fullmatch(value):
        raise ValueError(PROFILE_NAME_RULE)
    return value


# Names and free text lose their control characters in the __post_init__ of the section holding them
# (Section._STRIP); a profile name is checked by its pattern (PROFILE_NAME_PATTERN: no '..').
ProfileName = Annotated[str, Meta(max_length=100, pattern=PROFILE_NAME_PATTERN)]
Name = Annotated[str, Meta(min_length=1, max_length=200)]
Text = Annotated[str, Meta(max_length=4000)]


# The keys a Hugging Face config.json can supply (zsim/config/hf.py); without from_hf they are required.
HF_SHAPE_KEYS = ("layers", "hidden", "heads", "seq_len", "vocab")


def _model_json_schema(schema: dict) -> None:
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
        "flash3: FlashAttention-2 (Ampere+) or -3 (Hopper): no s×s memory, one fused kernel priced from "
        "the published benchmarks; auto: flash2 where it runs (a 16-bit dtype on Ampere or newer), else "
        "standard (what from_hf imports of the families trained with FlashAttention set)"))] = "standard"
    # What the cross-entropy keeps (docs/memory.md, "The loss"): Megatron-LM's of 2020 holds fp32 copies
    # of the logits (zsim.workload.activations.loss_work_tensors); a fused kernel keeps the e-byte logits
    # and one fp32 log-sum-exp per token (flash-attn flash_attn/losses/cross_entropy.py
    # SoftmaxCrossEntropyLossFn: ctx.save_for_backward(logits, lse, labels)).
    loss: Annotated[Literal["megatron", "fused", "torch"], Meta(description=(
        "the cross-entropy's memory: megatron: Megatron-LM's vocab-parallel loss of 2020 (the e-byte logits, "
        "their fp32 copy, its fp32 clone and the saved fp32 softmax: (e + 12) bytes per logit); fused: a fused "
        "kernel that keeps only the e-byte logits and a per-token fp32 log-sum-exp (flash-attn's xentropy, "
        "llm-foundry's default loss_fn: fused_crossentropy); torch: PyTorch's cross_entropy on the e-byte "
        "logits without an fp32 upcast, which saves its e-byte log-softmax while the training loop holds the "
        "logits until backward ends (NeMo AutoModel's MaskedCrossEntropy with fp32_upcast false; mp 1 only)"))] = "megatron"
    moe: Annotated[MoeSection, Meta(description=(
        "mixture-of-experts MLPs (docs/moe.md); absent: every MLP dense"))] | None = None
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


class ParallelSection(Section, kw_only=True):
    """The parallel layout: world size = dp × mp × pp. MP is Megatron-style tensor parallelism, PP pipeline
    parallelism."""

    dp: Annotated[int, Meta(gt=0, le=MAX_GPUS, description="data-parallel degree Nd (ZeRO partitions across it)")]
    mp: Annotated[int, Meta(gt=0, le=MAX_MP, description=(
        "model (tensor) parallel degree: divides the GPUs of a node, or is a multiple of them (the group "
        "spans whole nodes, its all-reduces on the network)"))] = 1
    ep: Annotated[int, Meta(gt=0, le=MAX_GPUS, description=(
        "expert-parallel degree (mixture-of-experts): each group of ep DP ranks splits the experts among "
        "its members and exchanges tokens by all-to-all; divides dp and model.moe.experts"))] = 1
    # Korthikanti et al. 2022 §4.2.2; Megatron-LM --sequence-parallel.
    sequence_parallel: Annotated[bool, Meta(description=(
        "Megatron sequence parallelism: the layer norms, dropouts and residuals run on s/mp tokens per MP "
        "rank, each MP all-reduce becomes a reduce-scatter and an all-gather, and the activations they keep "
        "are divided by mp (no effect at mp 1, as Megatron-LM turns it off there)"))] = False
    # Pipeline parallelism (Narayanan et al. 2021, PTD-P; zsim.parallel.pipeline, docs/parallel.md).
    pp: Annotated[int, Meta(gt=0, le=MAX_MP, description=(
        "pipeline-parallel degree p: the layers split into p stages; world = mp × dp × pp, ranks in "
        "Megatron's order (tensor fastest, then data, then pipeline)"))] = 1
    pipeline_schedule: Annotated[Literal["1f1b", "gpipe", "interleaved"], Meta(description=(
        "the pipeline schedule: 1f1b (PipeDream-Flush), gpipe (all forwards, then all backwards) or "
        "interleaved (1F1B over virtual_stages model chunks per stage; micro-batches a multiple of pp)"))] = "1f1b"
    virtual_stages: Annotated[int, Meta(gt=0, le=MAX_LAYERS, description=(
        "model chunks v per pipeline stage (interleaved schedule only; 1 otherwise)"))] = 1
    pp_layers: Annotated[list[Annotated[int, Meta(gt=0, le=MAX_LAYERS)]] | None, Meta(description=(
        "an uneven split: layer counts per virtual stage, in virtual-stage order (pp × virtual_stages of "
        "them, adding up to model.layers); default: an even split"))] = None


class ZeroSection(Section, kw_only=True):
    """ZeRO-DP stage and ZeRO-R options (paper §5 and §6)."""

    stage: Annotated[int, Meta(ge=0, le=3, description="0: plain DP, 1: Pos, 2: Pos+g, 3: Pos+g+p")]
    activation_checkpointing: Annotated[bool, Meta(description=(
        "keep one input per layer, recompute in backward"))] = True
    checkpoint_every: Annotated[int, Meta(gt=0, le=MAX_LAYERS, description=(
        "with checkpointing: keep one checkpoint every k layers and recompute k layers at a time in backward "
        "(Megatron-LM checkpoint_num_layers; Chen et al. 2016)"))] = 1
    # Korthikanti et al. 2022 §5 (selective activation recomputation); Megatron-LM --recompute-granularity.
    recompute_granularity: Annotated[Literal["full", "selective"], Meta(description=(
        "with checkpointing: full keeps each layer's input and recomputes the layer (Megatron 'full'); "
        "selective keeps every activation but the attention core's s×s ones (softmax, its dropout mask and "
        "output) and recomputes only QKᵀ, softmax, dropout and attention·V in backward (Megatron "
        "'selective')"))] = "full"
    reduce_bucket_elements: Annotated[int, Meta(gt=0, le=MAX_ELEMENTS, description=(
        "gradient elements per reduction bucket (DeepSpeed reduce_bucket_size); the constant buffer size when"
        " constant_buffers is true"))] = 500000000
    allgather_bucket_elements: Annotated[int, Meta(gt=0, le=MAX_ELEMENTS, description=(
        "stage 2: parameter elements per all-gather after the step (DeepSpeed allgather_bucket_size; PyTorch "
        "stages it through a buffer of this many elements)"))] = 500000000
    sub_group_elements: Annotated[int, Meta(gt=0, le=MAX_ELEMENTS, description=(
        "stage 3: the optimizer steps its partition in sub-groups of this many elements, each upcast to fp32 "
        "on its own (DeepSpeed sub_group_size; 1e12, i.e. the whole partition, is the default of stage 3 as "
        "it shipped in v0.3.13)"))] = 1000000000000
    prefetch_layers: Annotated[int, Meta(ge=0, le=MAX_LAYERS, description=(
        "stage 3: layers gathered ahead of the one computing"))] = 1
    # deepspeed-0.5's parameter coordinator (zsim.zero.implementation.coordinator); the defaults are DeepSpeed's
    # (runtime/zero/constants.py @ v0.3.13 L86-94: stage3_max_live_parameters 1e9, stage3_max_reuse_distance 1e9,
    # stage3_prefetch_bucket_size 5e7).
    prefetch_bucket_elements: Annotated[int, Meta(gt=0, le=MAX_ELEMENTS, description=(
        "deepspeed-0.5, stage 3: parameter elements prefetched after each sub-module's fetch (DeepSpeed "
        "stage3_prefetch_bucket_size)"))] = 50000000
    max_live_elements: Annotated[int, Meta(gt=0, le=MAX_ELEMENTS, description=(
        "deepspeed-0.5, stage 3: no prefetch while this many gathered parameter elements are live (DeepSpeed "
        "stage3_max_live_parameters)"))] = 1000000000
    max_reuse_elements: Annotated[int, Meta(gt=0, le=MAX_ELEMENTS, description=(
        "deepspeed-0.5, stage 3: a gathered tensor is kept, not released, when it is used again within this "
        "many parameter elements of fetches (DeepSpeed stage3_max_reuse_distance); released tensors are "
        "gathered again"))] = 1000000000
    # zsim.zero.implementation cites each version's code (DeepSpeed tags v0.3.13, v0.5.10, v0.14.0).
    implementation: Annotated[Literal["paper", "deepspeed-0.2", "deepspeed-0.5", "deepspeed-0.14"], Meta(description=(
        "ZeRO as implemented: 'paper' (default) the paper's schedules (stage 2: one reduce-scatter per "
        "bucket; stage 3: one all-gather per module overlapping compute); 'deepspeed-0.2' (stages 0-2) "
        "stage 2 reduces each bucket to its owners, one reduce per rank; 'deepspeed-0.5' DeepSpeed "
        "v0.3.13-v0.5.10 stage 3: one all-gather per parameter tensor with a device synchronise before each "
        "(no overlap), list copies of Nd pieces per gather and per reduce-scatter; 'deepspeed-0.14' stage 3: "
        "coalesced gathers per module, each parameter rebuilt by a cat of its Nd pieces. Stages 0-1 (and 2 "
        "but under deepspeed-0.2) follow DeepSpeed v0.2.0 for every value"))] = "paper"
    # DeepSpeed overlap_comm. DeepSpeed's own default for stages 1-2 was false from v0.2.0 (2020-06) to
    # v0.3.13 (2021-03) and beyond (deepspeed/pt/deepspeed_zero_config.py @ 96c4daabc,
    # runtime/zero/constants.py @ v0.3.13: ZERO_OPTIMIZATION_OVERLAP_COMM_DEFAULT = False; stage 3: True),
    # and then reduce_ipg_grads/average_tensor ran on torch.cuda.current_stream(). zsim defaults to true
    # (what a tuned run sets today); scenarios/paper/ set false as the paper's configs left it.
    overlap_comm: Annotated[bool, Meta(description=(
        "DP gradient reductions run on their own stream, overlapping backward (DeepSpeed overlap_comm); "
        "false: on the compute stream, which waits for each (DeepSpeed's default for stages 1-2 in 2020-21)"))] = True
    # ZeRO-R options (paper §6; docs/memory.md).
    partition_activations: Annotated[bool, Meta(description=(
        "Pa: checkpoints partitioned across the MP group, all-gathered before recompute (§6.1)"))] = False
    cpu_offload_activations: Annotated[bool, Meta(description=(
        "Pa+cpu: partitioned checkpoints kept in host memory, copied over the host link (§6.1); needs "
        "partition_activations"))] = False
    # DeepSpeed copies Pa+cpu's partitions synchronously, in line with compute, and brings each back only
    # when its segment recomputes: `partition.cpu()` in the forward and `get_full_inputs(...,
    # device=cuda_device)` in the backward (v0.2.0 deepspeed_checkpointing.py, unchanged through 2025's
    # runtime/activation_checkpointing/checkpointing.py). An implementation can do better.
    cpu_offload_overlap: Annotated[bool, Meta(description=(
        "with Pa+cpu: false (default, as DeepSpeed) copies each partition to and from the host in line "
        "with compute, the way back when its segment recomputes; true copies on a stream of their own and "
        "brings each back one segment ahead, overlapping compute"))] = False
    # CB defaults to true because DeepSpeed always reduces in constant-size buckets (reduce_bucket_size);
    # false models the fused whole-model buffers of §3.2 (the baseline the paper measures against).
    constant_buffers: Annotated[bool, Meta(description=(
        "CB: gradient reductions and stage 3's fp32 gradients use buffers of reduce_bucket_elements; false: "
        "one fused fp32 buffer of 4Ψ (§3.2, §6.2)"))] = True
    defragment: Annotated[bool, Meta(description=(
        "MD: contiguous buffers for gradients (stages 2-3, outside the caching allocator) and for the "
        "checkpoints, as md_checkpoints says (§6.3)"))] = False
    # How MD holds checkpoints (docs/memory.md, "MD"). DeepSpeed (v0.2.0 deepspeed_checkpointing.py, and
    # every release since) has a contiguous checkpoint buffer only with Pa, on the GPU only without
    # Pa+cpu, allocates its slots through the caching allocator at the first forward of each micro-batch
    # and drops them as backward uses them; the paper's §6.3 describes chunks "pre-allocated" for the run.
    md_checkpoints: Annotated[Literal["deepspeed", "reserved"], Meta(description=(
        "with defragment: 'deepspeed' (with Pa on the GPU, every checkpoint's slot is allocated at the first "
        "forward of a micro-batch and freed as backward uses it; no buffer without Pa), or 'reserved' (the "
        "paper's reading: one buffer for all checkpoints, with or without Pa, reserved for the whole run "
        "outside the allocator)"))] = "deepspeed"


class PrecisionSection(Section, kw_only=True):
    """fp16/bf16 mixed precision (fp32 master weights and Adam, K = 12), plain fp32 training (K = 8), or pure
    bf16 training (master_weights false: Adam's states in bf16, K = 4)."""

    dtype: Annotated[Literal["fp16", "bf16", "fp32"], Meta(description=(
        "parameter, gradient and activation dtype; fp32 means no 16-bit copy and no master copy"))] = "fp16"
    # PyTorch's torch.optim.Adam keeps exp_avg and exp_avg_sq in the parameters' dtype (torch.zeros_like(p)),
    # so a model built in bf16 and trained without a master copy holds 2 + 2 bytes of Adam states per
    # parameter (NeMo AutoModel's custom MoE models: initialize_weights() casts the model to bf16, FSDP2 shards
    # the bf16 parameters). zsim.zero.model_states.PURE_BF16_K.
    master_weights: Annotated[bool, Meta(description=(
        "false: pure bf16 training, no fp32 master copy: the parameters, gradients and Adam's momentum and "
        "variance all in bf16 (K = 4; torch.optim.Adam on a model cast to bf16); bf16 only"))] = True
    optimizer: Annotated[Literal["adam"], Meta(description="Adam: fp32 master, momentum, variance")] = "adam"


class HardwareSection(Section, kw_only=True):
    """The cluster: a system profile from hwprofiles/ and how many of its nodes. The optional keys
    replace the profile's value for this scenario only (a what-if without a new profile file:
    `--set hardware.nic_Gbps=200`); zsim.fabric.cluster.load_cluster applies them."""

    profile: Annotated[ProfileName, Meta(description=(
        "name of a system profile (hwprofiles/<profile>.yaml), e.g. dgx2; a name, not a path"))]
    nodes: Annotated[int, Meta(gt=0, le=MAX_GPUS, description="number of nodes")]
    gpu: Annotated[ProfileName, Meta(description=(
        "a GPU profile name (hwprofiles/gpus/) instead of the system's"))] | None = None
    gpus_per_node: Annotated[int, Meta(gt=0, le=4096, description=(
        "GPUs per node instead of the system's"))] | None = None
    nics_per_node: Annotated[int, Meta(gt=0, le=4096, description="inter-node NIC ports per node")] | None = None
    nic_Gbps: Annotated[float, Meta(gt=0, le=1e6, description=(
        "one NIC port's line rate, Gbit/s per direction"))] | None = None
    nic_latency_us: Annotated[float, Meta(ge=0, le=1e6, description=(
        "network latency per hop, microseconds"))] | None = None
    gpu_memory_GiB: Annotated[float, Meta(gt=0, le=1e6, description=(
        "GPU memory, GiB (2^30 bytes)"))] | None = None
    oversubscription: Annotated[float, Meta(ge=1, le=1e6, description=(
        "fat-tree oversubscription (node injection bandwidth / bandwidth up to the spines), >= 1"))] | None = None

    def overrides(self) -> dict[str, float | int | str]:
        """The override keys that are set, by name (the keyword arguments of load_cluster)."""
        return {k: getattr(self, k) for k in self.__struct_fields__
                if k not in ("profile", "nodes") and getattr(self, k) is not None}


class DegradeItem(Section, kw_only=True):
    """One slow or failed link, for a what-if (per-rank mode)."""

    link: Annotated[Literal["nvlink", "nic"], Meta(description="'nvlink' (of a GPU) or 'nic' (of a node)")]
    gpu: Annotated[int, Meta(ge=0, lt=MAX_GPUS, description="nvlink: the GPU's global rank")] | None = None
    node: Annotated[int, Meta(ge=0, lt=MAX_GPUS, description="nic: the node")] | None = None
    index: Annotated[int, Meta(ge=0, le=1024, description="which of the GPU's NVLinks / the node's NICs")] = 0
    factor: Annotated[float, Meta(ge=0, le=1, description="bandwidth multiplier: 0.5 = half speed, 0 = failed")]

    def __post_init__(self) -> None:  # target given
        super().__post_init__()
        if self.link == "nvlink" and self.gpu is None:
            raise ValueError("an nvlink degradation needs gpu: <global rank>")
        if self.link == "nic" and self.node is None:
            raise ValueError("a nic degradation needs node: <node index>")


class FabricSection(Section, kw_only=True):
    """How the network is simulated (zsim.fabric)."""

    mode: Annotated[Literal["auto", "class", "per_rank"], Meta(description=(
        "class: one rank per class (fast); per_rank: every rank and flow; auto: per_rank when links are "
        "degraded, else class"))] = "auto"
    algorithm: Annotated[Literal["auto", "ring", "tree", "hierarchical"], Meta(description=(
        "collective algorithm; auto picks as NCCL's tuner does"))] = "auto"
    degrade: Annotated[list[DegradeItem], Meta(max_length=MAX_DEGRADE, description=(
        "slow or failed links (per_rank)"))] = field(default_factory=list)


class RunSection(Section, kw_only=True):
    """How to run the simulation."""

    _STRIP = ("output",)

    steps: Annotated[int, Meta(gt=0, le=MAX_STEPS, description="optimizer steps to simulate")] = 1
    output: Annotated[Text, Meta(description="output folder, relative and inside the working folder (no '..'); "
                                 "default out/<scenario name>; -o writes anywhere")] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        # As `name`, which becomes out/<safe name> (issue 13): a scenario file, perhaps from elsewhere,
        # must not write outside the folder zsim runs in; the person at the command line can (-o).
        if self.output is not None:
            parts = self.output.replace("\\", "/").split("/")
            if not self.output.strip() or self.output.startswith(("/", "~")) or ".." in parts:
                raise ValueError(f"output {self.output[:80]!r}: a folder inside the working folder, without '..' "
                                 "(write elsewhere with -o DIR)")


class ScenarioFile(Section, kw_only=True):
    """A whole scenario file."""

    _STRIP = ("name", "description")

    name: Annotated[Name, Meta(description=(
        "scenario name; default the file's stem (control characters removed)"))] | None = None
    description: Annotated[Text, Meta(description="free text shown in the summary")] | None = None
    model: ModelSection
    parallel: ParallelSection
    zero: ZeroSection
    precision: PrecisionSection = field(default_factory=PrecisionSection)
    hardware: HardwareSection
    fabric: FabricSection = field(default_factory=FabricSection)
    run: RunSection = field(default_factory=RunSection)


# Declared draft: what msgspec writes for these models (type, enum, anyOf, required, numeric
# exclusiveMinimum, additionalProperties, and $ref to "#/$defs/..." JSON pointers) is valid draft-07,
# which the VS Code YAML extension (yaml-language-server) supports fully; it warns that 2020-12 is
# "not yet fully supported" (redhat-developer/vscode-yaml#726). tests/test_schema_command.py validates
# the shipped scenarios with both draft-07 and 2020-12 validators.
JSON_SCHEMA_DRAFT = "http://json-schema.org/draft-07/schema#"


def scenario_json_schema() -> dict:
    """The JSON Schema of a scenario file, generated from ScenarioFile (for editors: docs/models.md):
    msgspec's schema with the root model inline, as editors expect, and the model section's shape
    keys required unless from_hf supplies them."""
    import msgspec

    schema = msgspec.json.schema(ScenarioFile)
    defs = schema.get("$defs", {})
    for section in defs.values():  # an optional key's description, from inside its anyOf, to the key
        for prop in section.get("properties", {}).values():
            described = [m for m in prop.get("anyOf", ()) if "description" in m]
            if described and "description" not in prop:
                prop["description"] = described[0].pop("description")
    root = defs.pop("ScenarioFile")
    _model_json_schema(defs["ModelSection"])
    # model.moe's experts and top_k may come from from_hf (a Mixtral config.json): the loader checks them
    defs["MoeSection"].pop("required", None)
    return {"$schema": JSON_SCHEMA_DRAFT, "title": "zsim scenario",
            **{k: v for k, v in root.items() if k != "title"}, "$defs": defs}
