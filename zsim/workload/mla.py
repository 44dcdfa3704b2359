"""Multi-head latent attention (MLA): the parameters, FLOPs and saved activations of one block's
attention on one of t MP ranks, in place of the Q/K/V projections of a standard block.

Sources:
  [DV2] DeepSeek-AI 2024, "DeepSeek-V2: A Strong, Economical, and Efficient Mixture-of-Experts Language
        Model", §2.1.2-2.1.3, eqs. 9-19: c^KV = W^DKV h (d_c × h, eq. 9); k^C = W^UK c^KV, v^C = W^UV c^KV
        (n_h·d_h × d_c, eqs. 10-11); c^Q = W^DQ h (d_c' × h, eq. 12); q^C = W^UQ c^Q (n_h·d_h × d_c',
        eq. 13); q^R = RoPE(W^QR c^Q) (n_h·d_h^R × d_c', eq. 14); k^R = RoPE(W^KR h) (d_h^R × h, one key
        shared by every head, eq. 15); q = [q^C; q^R], k = [k^C; k^R] (eqs. 16-17); softmax(qᵀk /
        sqrt(d_h + d_h^R)) v (eq. 18); u = W^O o (h × n_h·d_v, eq. 19).
  [HF]  transformers models/deepseek_v2/modeling_deepseek_v2.py DeepseekV2Attention: q_a_proj (W^DQ),
        q_a_layernorm (RMSNorm d_c'), q_b_proj (W^UQ and W^QR fused), or q_proj h × n_h(d_h + d_h^R) when
        q_lora_rank is null (V2-Lite); kv_a_proj_with_mqa (W^DKV and W^KR fused), kv_a_layernorm (RMSNorm
        d_c), kv_b_proj (W^UK and W^UV fused), o_proj; no biases (attention_bias false).
  [MC]  Megatron-Core transformer/multi_latent_attention.py MLASelfAttention: linear_q_down_proj and
        linear_kv_down_proj are replicated across TP (TELinear parallel_mode "duplicated"), the up
        projections column-parallel (gather_output False), linear_proj row-parallel.
In training the keys and values are expanded per head ([DV2]'s "during training" form): the attention
core is a·(d_h + d_h^R)-wide QKᵀ and a·d_v-wide attention·V, and what it saves is as wide.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Mla:
    """A model's MLA widths (elements)."""

    q_rank: int  # d_c' (0: Q straight from h)
    kv_rank: int  # d_c
    nope: int  # d_h
    rope: int  # d_h^R
    v: int  # d_v

    @classmethod
    def of(cls, model) -> Mla | None:
        """From a ModelSection (None without model.mla)."""
        m = getattr(model, "mla", None)
        if m is None:
            return None
        return cls(q_rank=m.q_lora_rank or 0, kv_rank=m.kv_lora_rank, nope=m.qk_nope_head_dim,
                   rope=m.qk_rope_head_dim, v=m.v_head_dim)

    @property
    def qk_head(self) -> int:
        """A head's query and key width, d_h + d_h^R [DV2 eqs. 16-17]."""
        return self.nope + self.rope

    def down_widths(self, h: int) -> tuple[tuple[int, int], ...]:
        """(in, out) of the replicated down projections [MC]: W^DQ h → d_c' (absent without a q latent),
        W^DKV and W^KR fused h → d_c + d_h^R [HF kv_a_proj_with_mqa]."""
        q = ((h, self.q_rank),) if self.q_rank else ()
        return (*q, (h, self.kv_rank + self.rope))

    def up_widths(self, h: int, heads: int) -> tuple[tuple[int, int], ...]:
        """(in, out) of the column-parallel up projections, whole (÷ t per MP rank): Q from its latent
        (or from h), K^C and V from c^KV [DV2 eqs. 10-14]."""
        return ((self.q_rank or h, heads * self.qk_head), (self.kv_rank, heads * (self.nope + self.v)))

    def tensors(self, h: int, heads: int, t: int) -> tuple[int, ...]:
        """One block's attention tensors on one of t MP ranks, in [HF]'s order: q_a_proj, q_a_layernorm,
        q_b_proj (or q_proj), kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj. Down projections and
        the latent norms whole on every rank, up and output projections ÷ t [MC]."""
        q_up, kv_up = self.up_widths(h, heads)
        q = (h * self.q_rank, self.q_rank, q_up[0] * q_up[1] // t) if self.q_rank else (q_up[0] * q_up[1] // t,)
        return (*q, h * (self.kv_rank + self.rope), self.kv_rank, kv_up[0] * kv_up[1] // t, heads * self.v * h // t)

    def projection_flops(self, tokens: int, h: int, heads: int, t: int) -> tuple[float, float]:
        """(model, replicated) forward FLOPs of the projections on one of t MP ranks: 2 per multiply-add
        [N21 §5.1]; model: every projection ÷ t (the model's FLOPs shared out); replicated: what the
        duplicated down projections add on each rank beyond its share ((t − 1)/t of them) [MC]."""
        down = sum(2 * tokens * i * o for i, o in self.down_widths(h))
        up = sum(2 * tokens * i * o for i, o in self.up_widths(h, heads)) + 2 * tokens * heads * self.v * h
        return (down + up) / t, down * (t - 1) / t

    def up_flops(self, tokens: int, h: int, heads: int, t: int) -> float:
        """Forward FLOPs of the up projections on one of t MP ranks (column-parallel, ÷ t): what
        --recompute-modules mla_up_proj runs again in backward [MC]."""
        return sum(2 * tokens * i * o for i, o in self.up_widths(h, heads)) / t

    def core_flops(self, s: int, b: int, heads: int, t: int) -> float:
        """Forward FLOPs of QKᵀ (a·(d_h + d_h^R) wide) and attention·V (a·d_v wide) on one of t MP ranks,
        full (non-causal) s × s as N21 counts it: 2bs²·a·(d_h + d_h^R + d_v) / t [DV2 eq. 18]."""
        return 2 * b * s * s * heads * (self.qk_head + self.v) / t

    def latent_tensors(self, tokens: int, e: int) -> tuple[int, ...]:
        """Bytes the latents keep for backward (whole on every MP rank, as their projections [MC]):
        c^Q before and after q_a_layernorm (the norm's and q_b_proj's inputs), c^KV before and after
        kv_a_layernorm (the norm's and kv_b_proj's inputs) [HF]; the RoPE key keeps nothing (its
        rotation is linear)."""
        q = (e * tokens * self.q_rank,) * 2 if self.q_rank else ()
        return (*q, e * tokens * self.kv_rank, e * tokens * self.kv_rank)
