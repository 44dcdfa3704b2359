"""What the kernel lists of a module depend on: the model's shape per MP rank, the micro-batch, the
precision and the options that change kernels (zsim.compute.kernels builds a list once per Shape)."""

from __future__ import annotations

from dataclasses import dataclass

from zsim.compute.fp8 import copies


@dataclass(frozen=True, slots=True)
class Shape:
    """The transformer shape on one MP rank, as the kernel lists need it."""

    s: int  # sequence length
    b: int  # micro-batch
    h: int  # hidden
    a: int  # attention heads
    t: int  # MP degree
    v: int  # padded vocabulary
    ffn: int  # MLP hidden
    kv_heads: int
    gated: bool
    linear_bias: bool
    qkv_bias: bool
    e: int  # activation element bytes
    rotary: bool = False  # rotary position embedding on Q and K instead of a learned table
    alibi: bool = False  # ALiBi: no position table (its score bias rides the mask kernels)
    embedding_norm: bool = False  # a LayerNorm after the word embedding (BLOOM)
    flash: int = 0  # FlashAttention version (2, 3), 0 for the unfused attention
    arch: int = 0  # the GPU's compute capability (FlashAttention's speed depends on it)
    selective: bool = False  # selective recompute of the attention core in backward
    # selective recompute of a MoE block's pre-MLP norm and of its experts' activation (Megatron-Core
    # --recompute-modules layernorm, moe_act): each runs its forward kernel again in backward
    recompute_norm: bool = False
    recompute_act: bool = False
    # a dense block's whole MLP and a MoE block's whole MoE layer recomputed in backward (--recompute-modules
    # mlp, moe): their forward kernels run again before their backward
    recompute_mlp: bool = False
    recompute_moe: bool = False
    # MLA's up projections and RoPE recomputed in backward (--recompute-modules mla_up_proj; zsim.workload.mla)
    recompute_mla_up: bool = False
    sp: bool = False  # sequence parallelism (mp > 1)
    # MoE MLP on this rank (zsim.workload.moe): (experts E, local experts, tokens per local expert,
    # expert width per expert-MP rank, shared experts' width per MP rank, top_k, tokens the router and the
    # dispatch handle: s·b, or s·b/mp with the experts whole beside MP); None for a dense MLP
    moe: tuple[int, int, int, int, int, int, int] | None = None
    d: int = 0  # head dim when the model gives one (heads·d ≠ h); 0: h / a
    norms: int = 2  # h-wide norms per block: 1 (Falcon-7B), 2, 4 (Gemma-2's post-norms too)
    qk_norm: bool = False  # RMSNorm on q and k (OLMo-2, Gemma-3): one fused norm kernel over both
    # multi-head latent attention (zsim.workload.mla): (q_lora_rank or 0, kv_lora_rank, qk_nope_head_dim,
    # qk_rope_head_dim, v_head_dim); None for Q/K/V projections
    mla: tuple[int, int, int, int, int] | None = None
    moe_gate: bool = False  # a MoE MLP's shared-expert gate h × 1 (Qwen2-MoE)
    # FlashAttention in a sliding-window block: the mean keys per query (zsim.workload.transformer
    # Shape.window_keys; set per module by the plan); 0: causal over the whole sequence
    window: int = 0
    # dropout on the attention probabilities and the residual branches (model.dropout); without it no
    # dropout kernel runs (zsim.compute.kernels.module_kernels)
    dropout: bool = True
    # whose kernel lists (model.kernels): "megatron-2020" or "pytorch-2"; and the loss (model.loss), whose
    # kernels differ under pytorch-2 (zsim.compute.torch_kernels)
    kernels: str = "megatron-2020"
    loss: str = "megatron"
    tied: bool = True  # the head's weight is the word embedding's (model.tied_head): autograd sums its two gradients
    # context parallelism: `s` is this rank's s/cp share of each sequence, whose queries attend the cp·s keys of the
    # whole sequence (zsim.compute.kernels._flash)
    cp: int = 1
    # Transformer Engine's FP8 recipe for the blocks' linear layers (precision.fp8, or 'nvfp4': precision.fp4;
    # zsim.compute.fp8); "" for none
    fp8: str = ""
    fp8_copies: int = 2  # the FP8 copies each quantize writes (zsim.compute.fp8.copies: 1 on Blackwell per tensor)
    # cuDNN's FP8 fused attention (precision.fp8_attention; zsim.compute.flash, zsim.compute.kernels._flash)
    fp8_attention: bool = False

    @staticmethod
    def of(model, mp: int, padded_vocab: int, dtype: str, *, arch: int = 0, selective: bool = False,
           sp: bool = False, ep: int = 1, etp: int | None = None,
           recompute: frozenset[str] = frozenset(), cp: int = 1, fp8: str = "none",
           fp8_attention: bool = False) -> "Shape":
        """From a ModelSection; optional shape fields per COORDINATION.md contract 1 (defaults: GPT).
        `arch`: the GPU's compute capability; `selective`, `sp`: the scenario's recompute granularity
        and sequence parallelism (ignored at mp 1); `ep`, `etp`: a MoE model's expert-parallel degree and its
        experts' tensor-parallel degree (default mp); `recompute`: the modules selective recompute redoes
        besides the attention core ('layernorm', 'moe_act', 'mlp', 'moe', 'mla_up_proj';
        zsim.zero.rank_states.recompute_modules);
        `cp`: the context-parallel degree (each rank's kernels run on s/cp tokens of a sequence); `fp8`: precision.fp8
        (with `arch`, the copies its quantizes write: zsim.compute.fp8.copies); `fp8_attention`:
        precision.fp8_attention."""
        if cp > 1:
            from zsim.config.struct import replace

            model = replace(model, seq_len=model.seq_len // cp)
        h = model.hidden
        linear_bias = getattr(model, "linear_bias", True)
        qkv_bias = getattr(model, "qkv_bias", None)
        attention = getattr(model, "attention", "standard")
        return Shape(s=model.seq_len, b=model.micro_batch, h=h, a=model.heads, t=mp, v=padded_vocab,
                     ffn=getattr(model, "ffn_hidden", None) or 4 * h,
                     kv_heads=getattr(model, "kv_heads", None) or model.heads,
                     gated=bool(getattr(model, "gated_mlp", False)), linear_bias=bool(linear_bias),
                     qkv_bias=bool(linear_bias if qkv_bias is None else qkv_bias),
                     e=4 if dtype == "fp32" else 2, rotary=getattr(model, "position", "learned") == "rotary",
                     alibi=getattr(model, "position", "learned") == "alibi",
                     embedding_norm=bool(getattr(model, "embedding_norm", False)),
                     flash=int(attention[-1]) if attention in ("flash2", "flash3") else 0,
                     arch=arch if attention in ("flash2", "flash3") else 0,
                     selective=selective, recompute_norm="layernorm" in recompute,
                     recompute_act="moe_act" in recompute, recompute_mlp="mlp" in recompute,
                     recompute_moe="moe" in recompute,
                     recompute_mla_up="mla_up_proj" in recompute and getattr(model, "mla", None) is not None,
                     sp=sp and mp > 1, moe=_moe_dims(model, mp, ep, mp if etp is None else etp),
                     d=getattr(model, "head_dim", None) or 0, norms=getattr(model, "layer_norms", 2),
                     qk_norm=getattr(model, "qk_norm", "none") != "none", mla=_mla_dims(model),
                     moe_gate=bool(getattr(getattr(model, "moe", None), "shared_expert_gate", False)),
                     dropout=bool(getattr(model, "dropout", True)),
                     kernels=getattr(model, "kernels", "megatron-2020"), loss=getattr(model, "loss", "megatron"),
                     tied=bool(getattr(model, "tied_head", True)), cp=cp, fp8="" if fp8 == "none" else fp8,
                     fp8_copies=copies(fp8, arch), fp8_attention=fp8_attention)


def _mla_dims(model) -> tuple[int, int, int, int, int] | None:
    """Shape.mla of a model with model.mla, else None."""
    m = getattr(model, "mla", None)
    if m is None:
        return None
    return (m.q_lora_rank or 0, m.kv_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim)


def _moe_dims(model, mp: int, ep: int, etp: int) -> tuple[int, int, int, int, int, int, int] | None:
    """Shape.moe of a model with model.moe (zsim.workload.moe.Moe), else None: the routed experts split etp
    ways, each computing the tokens its EP group routes to it (Moe.expert_tokens), the shared ones mp ways."""
    from zsim.workload.moe import Moe

    moe = Moe.of(model) if getattr(model, "moe", None) is not None else None
    if moe is None:
        return None
    tokens = moe.expert_tokens(model.seq_len * model.micro_batch, mp, etp)
    return (moe.experts, moe.experts // ep, moe.tokens_per_expert(tokens, ep), moe.ffn // etp,
            moe.shared * moe.shared_ffn // mp, moe.top_k, tokens)
