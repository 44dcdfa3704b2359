"""The shape of a decoder block with every default resolved, and its parameter tensors per MP rank.

Sources:
  [S19] Shoeybi et al. 2019, "Megatron-LM", §3 (which tensors MP splits).
  [N21] Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
        Megatron-LM", §5.1 (the GPT block).
  [T23] Touvron et al. 2023, "LLaMA", §2.2 (RMSNorm, SwiGLU, rotary embeddings); Hugging Face
        transformers models/llama/modeling_llama.py (q/k/v/o projections without bias; untied lm_head).
  [A23] Ainslie et al. 2023, "GQA" (kv_heads key/value heads: K and V are h × kv_heads·d).
  [D23] Dao 2023, "FlashAttention-2" (the fused kernel keeps no s×s tensor).
  [MC]  Megatron-Core transformer/attention.py and mlp.py: GQA's query groups split across MP; the gated
        MLP's gate and up fused in one column-parallel linear_fc1 of width 2f.
  [G24] Gemma Team 2024, "Gemma 2", §2 (a norm before and after each sub-layer: four per block).
  [BPC20] Beltagy, Peters & Cohan 2020, "Longformer", §3.1 (sliding-window attention, causal here).
  [O24] OLMo Team 2024, "2 OLMo 2 Furious", §3.1 (QK-norm on the whole q and k projections).
docs/models.md derives the general formulas from these sources.
"""

from __future__ import annotations

from dataclasses import dataclass

from zsim.config.model_section import ModelSection
from zsim.workload.mla import Mla


@dataclass(frozen=True, slots=True)
class Shape:
    """A decoder's shape with every default of ModelSection resolved (sizes in elements).

    Build it with `Shape.of(model)`; `Shape.gpt(h)` is the GPT block of hidden size h.
    """

    layers: int  # L
    hidden: int  # h
    heads: int  # a (query heads)
    kv_heads: int  # key/value heads; = heads without grouped-query attention [A23]
    ffn: int  # MLP inner width f
    gated: bool  # gated (SwiGLU) MLP: gate and up h×f, down f×h [T23]
    linear_bias: bool  # biases on the attention output and MLP linears
    qkv_bias: bool  # biases on Q, K, V
    norm: str  # "layernorm" (weight + bias), "rmsnorm" (weight) or "nonparametric" (none: OLMo-1)
    position: str  # "learned", "rotary" or "alibi"
    positions: int  # rows of the learned position table (0 when rotary or alibi)
    tied_head: bool  # the LM head reuses the word embedding
    dropout: bool = True  # dropout on attention probabilities and residual branches (K22 saves its masks)
    attention: str = "standard"  # "standard" (s×s scores kept) or "flash2"/"flash3" (FlashAttention) [D23]
    head_width: int = 0  # d when given (heads·d ≠ h: Gemma, Mistral-Nemo); 0: h / a
    layer_norms: int = 2  # h-wide norms per block: 1 (Falcon-7B), 2, 4 (Gemma-2: before and after each) [G24]
    qk_norm: str = "none"  # RMSNorm weights on q and k: "head" (d each), "full" (a·d and kv·d: OLMo-2 [O24])
    mla: Mla | None = None  # multi-head latent attention in place of Q/K/V (zsim.workload.mla)
    window: int = 0  # sliding-window attention: keys a query attends to at most (0: global) [BPC20]
    full_every: int = 0  # with a window: every full_every-th block global (0: none)
    loss: str = "megatron"  # what the cross-entropy keeps: "megatron" (fp32 copies), "fused" or "torch" (loss_tensors)

    @classmethod
    def of(cls, model: ModelSection) -> Shape:
        h = model.hidden
        return cls(
            layers=model.layers, hidden=h, heads=model.heads, kv_heads=model.kv_heads or model.heads,
            ffn=model.ffn_hidden or 4 * h, gated=model.gated_mlp, linear_bias=model.linear_bias,
            qkv_bias=model.linear_bias if model.qkv_bias is None else model.qkv_bias, norm=model.norm,
            position=model.position,
            positions=0 if model.position in ("rotary", "alibi") else (model.max_positions or model.seq_len),
            tied_head=model.tied_head, dropout=model.dropout, attention=model.attention,
            head_width=model.head_dim or 0, layer_norms=model.layer_norms, qk_norm=model.qk_norm,
            mla=Mla.of(model), window=model.sliding_window or 0, full_every=model.full_attention_every,
            loss=model.loss,
        )

    @classmethod
    def gpt(cls, hidden: int, heads: int = 1, layers: int = 1, positions: int = 0) -> Shape:
        """The GPT shape [N21]: MLP 4h with GeLU, biases everywhere, layer norms, tied head."""
        return cls(layers=layers, hidden=hidden, heads=heads, kv_heads=heads, ffn=4 * hidden, gated=False,
                   linear_bias=True, qkv_bias=True, norm="layernorm", position="learned", positions=positions,
                   tied_head=True)

    @property
    def head_dim(self) -> int:
        """d: h / a, or the model's head_dim."""
        return self.head_width or self.hidden // self.heads

    @property
    def q_dim(self) -> int:
        """Width of Q, of the attention's output and of the output projection's input: a·d (h unless
        head_dim says otherwise)."""
        return self.heads * self.head_dim

    @property
    def flash(self) -> bool:
        """FlashAttention: no s×s tensor is kept [D23] ('auto' unresolved, without a GPU: the unfused one)."""
        return self.attention in ("flash2", "flash3")

    def window_keys(self, i: int, s: int) -> int:
        """Mean keys per query of block i when it attends through a sliding window shorter than s: a
        causal query at position p attends min(p + 1, w) keys [BPC20 §3.1], so w(w + 1)/2 + (s − w)·w
        pairs over s queries; 0 for a global block (or a window not shorter than s)."""
        w = self.window
        if not w or w >= s or (self.full_every and (i + 1) % self.full_every == 0):
            return 0
        return (w * (w + 1) // 2 + (s - w) * w) // s

    @property
    def kv_dim(self) -> int:
        """Width of K (and of V): kv_heads · d [A23]; h without GQA."""
        return self.kv_heads * self.head_dim

    @property
    def norm_tensors(self) -> tuple[int, ...]:
        """One norm's parameter tensors: LayerNorm's weight and bias, RMSNorm's weight [T23]."""
        if self.norm == "nonparametric":  # OLMo's LayerNorm without affine parameters (Groeneveld et al. 2024 §2.1)
            return ()
        return (self.hidden, self.hidden) if self.norm == "layernorm" else (self.hidden,)

    @property
    def layer_params(self) -> int:
        """Parameters of one whole block (no MP)."""
        return sum(layer_tensors(self))


def layer_tensors(shape: Shape, t: int = 1) -> tuple[int, ...]:
    """The parameter tensors of one block on one of t MP ranks, in elements, in Megatron's order:
    fused QKV weight h × (h + 2·kv_dim) [A23] and its bias, attention output weight h × h and bias,
    MLP linear_fc1 h × f (h × 2f when gated: gate and up fused [MC]) and bias, linear_fc2 f × h and
    bias, two norms. Under MP [S19 §3] QKV and fc1 are column-parallel (weights and biases split), the
    output projection and fc2 row-parallel (weights split, biases whole), norms replicated."""
    h, f, kv, q = shape.hidden, shape.ffn, shape.kv_dim, shape.q_dim
    qkv, fc1 = q + 2 * kv, (2 if shape.gated else 1) * f
    assert (h * qkv) % t == 0 and qkv % t == 0 and f % t == 0 and (h * q) % t == 0, "checked by mp_problems"
    row_b, fc1_b = ((h,), (fc1 // t,)) if shape.linear_bias else ((), ())
    return (*attention_tensors(shape, t), h * fc1 // t, *fc1_b, f * h // t, *row_b, *shape.norm_tensors * shape.layer_norms)


def attention_tensors(shape: Shape, t: int = 1) -> tuple[int, ...]:
    """The attention's tensors of one block on one of t MP ranks (layer_tensors' first ones): fused QKV
    weight [and bias], output weight [and bias]; the QK-norm weights (column-parallel with their heads
    when "full" [O24], replicated when "head"); with MLA, zsim.workload.mla's projections instead."""
    h, kv, q = shape.hidden, shape.kv_dim, shape.q_dim
    row_b = (h,) if shape.linear_bias else ()
    if shape.mla is not None:
        return (*shape.mla.tensors(h, shape.heads, t), *row_b)
    qkv = q + 2 * kv
    qk = {"none": (), "head": (shape.head_dim, shape.head_dim), "full": (q // t, kv // t)}[shape.qk_norm]
    return (h * qkv // t, *((qkv // t,) if shape.qkv_bias else ()), q * h // t, *row_b, *qk)
