"""The workload of a GPT-style transformer: parameters, FLOPs and activation bytes per module.

Every figure is per micro-batch and per MP rank (Megatron tensor parallelism divides the GEMMs, and
some activations, by the MP degree t). Sources:
  [N21] Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
        Megatron-LM", §5.1 (parameter count and FLOPs).
  [K22] Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", §4
        (activation bytes per layer, fp16, with tensor parallelism and no sequence parallelism; for
        fp32 training the 2-byte tensors become 4-byte ones and the 1-byte dropout masks stay).
  [S19] Shoeybi et al. 2019, "Megatron-LM", §3 (which tensors MP splits; the MP all-reduces).
  [T23] Touvron et al. 2023, "LLaMA: Open and Efficient Foundation Language Models", §2.2 (RMSNorm,
        SwiGLU, rotary embeddings); Hugging Face transformers models/llama/modeling_llama.py
        (LlamaMLP: down(act(gate(x)) · up(x)); q/k/v/o projections without bias; untied lm_head).
  [A23] Ainslie et al. 2023, "GQA: Training Generalized Multi-Query Transformer Models from Multi-Head
        Checkpoints" (kv_heads key/value heads shared by groups of query heads: K and V are h × kv_heads·d).
  [D23] Dao 2023, "FlashAttention-2", §2-3 (the fused kernel saves Q, K, V, its output and the fp32
        row log-sum-exp, b·a·s values, and recomputes the s×s scores in backward; dropout from the RNG
        state, no mask); GQA's K and V stay kv_heads wide (flash-attn: "MQA/GQA ... nheads_k").
  [MC]  Megatron-Core transformer/attention.py and mlp.py: GQA's query groups split across MP
        (num_query_groups % tensor_model_parallel_size == 0); the gated MLP's gate and up fused in one
        column-parallel linear_fc1 of width 2f; fusions/fused_bias_swiglu.py saves that 2f-wide input.
  [G24] Gemma Team 2024, "Gemma 2", §2 (a norm before and after each sub-layer: four per block);
        transformers models/gemma2/modeling_gemma2.py (pre_/post_feedforward_layernorm).
  [BPC20] Beltagy, Peters & Cohan 2020, "Longformer", §3.1 (sliding-window attention: each token
        attends w neighbours; causal here, as Mistral's and Gemma's); Dao 2023 flash-attn's window_size
        (the fused kernel skips the blocks outside the window).
  [O24] OLMo Team 2024, "2 OLMo 2 Furious", §3.1 (QK-norm: RMSNorm on the whole q and k projections;
        norms after attention and after the MLP); transformers modeling_olmo2.py (q_norm, k_norm).
Multi-head latent attention (DeepSeek-V2/V3) is zsim.workload.mla.
The GPT shape is the default; docs/models.md derives the general formulas from these sources.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from zsim.config.schema import ModelSection
from zsim.workload.mla import Mla
from zsim.workload.moe import Moe

# Megatron-LM pads the vocabulary to a multiple of 128 × t (arguments.make_vocab_size_divisible_by,
# megatron/training/tokenizer: _vocab_size_with_padding) so the embedding splits evenly over MP.
VOCAB_MULTIPLE = 128


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


@dataclass(frozen=True, slots=True)
class Module:
    """One step of the forward pass on one MP rank: the embedding, a transformer block, or the head.

    Attributes:
        name: `embed`, `layer.<i>` or `head`.
        params: parameters this MP rank holds (elements).
        fwd_flops: forward FLOPs on this MP rank (the matmuls).
        fwd_hbm_bytes: HBM traffic of the forward's non-matmul kernels (layer norms, softmax, GeLU,
            dropout, residual adds): each saved activation written once and read once.
        saved_bytes: activation bytes kept for backward without checkpointing.
        checkpoint_bytes: activation bytes kept for backward with checkpointing (the module's input).
        mp_allreduce_bytes: payload of each Megatron MP all-reduce in forward (0 if MP = 1).
        mp_allreduces_fwd: MP all-reduces in forward; backward has `mp_allreduces_bwd`.
        mp_allreduces_bwd: MP all-reduces in backward.
        layer: block index, or None for embed/head.
        tensors: element counts of the module's parameter tensors on this MP rank (they sum to
            `params`; ZeRO stage 3 pads and partitions each on its own).
        saved_tensors: the tensors making up `saved_bytes`, in bytes, in the order the forward
            creates them (the caching allocator sees each one).
    """

    name: str
    params: int
    fwd_flops: float
    fwd_hbm_bytes: float
    saved_bytes: int
    checkpoint_bytes: int
    mp_allreduce_bytes: int
    mp_allreduces_fwd: int
    mp_allreduces_bwd: int
    layer: int | None = None
    tensors: tuple[int, ...] = ()
    saved_tensors: tuple[int, ...] = ()
    # Bytes of further MP all-reduces in forward, after the module's own: the vocab-parallel
    # cross-entropy's max, target logit and sum of exponentials (fp32, one per token) [S19 §3].
    mp_loss_allreduce_bytes: tuple[int, ...] = ()
    # Tensors (bytes) the forward holds only while it runs, on top of saved_tensors, freed when it ends:
    # the head's copies of the logits in Megatron-LM's loss (see build_workload); none for a block,
    # whose transients within the layer are below zsim's unit (docs/memory.md).
    fwd_work_tensors: tuple[int, ...] = ()
    # Tensors (bytes) the training loop holds from the module's forward until the whole backward pass has
    # run, freed with the pass's last op: the head's e-byte logits under model.loss torch (loss_tensors).
    held_tensors: tuple[int, ...] = ()
    # Sequence parallelism [K22 §4.2.2]: the MP collectives (op, bytes of the whole tensor) in forward and
    # in backward, in place of the all-reduces (whose counts are then 0).
    mp_collectives_fwd: tuple[tuple[str, int], ...] = ()
    mp_collectives_bwd: tuple[tuple[str, int], ...] = ()
    # Hardware FLOPs beyond (or short of) the model's, in forward and in backward: FlashAttention's causal
    # kernel skips the masked half of QKᵀ and attention·V, and its backward recomputes QKᵀ [D23 §3.1.2];
    # selective recompute runs the attention core's forward again in backward [K22 §5].
    fwd_hw_extra_flops: float = 0.0
    bwd_hw_extra_flops: float = 0.0
    # Mixture-of-experts (zsim.workload.moe): the routed experts this rank holds (their states are
    # partitioned over the expert-data-parallel group, not DP: not in `params`/`tensors`), and the bytes
    # of each all-to-all (dispatch, combine) over the EP group; forward runs two, backward two.
    expert_tensors: tuple[int, ...] = ()
    ep_all_to_all_bytes: int = 0
    moe: bool = False
    # A sliding-window block under FlashAttention: the mean keys per query its fused kernel computes
    # (Shape.window_keys; zsim.compute.kernels prices it); 0 for a global block.
    window: int = 0

    @property
    def expert_params(self) -> int:
        return sum(self.expert_tensors)

    @property
    def hw_fwd_flops(self) -> float:
        """FLOPs the GPU runs in forward (the model's, less what a causal fused kernel skips)."""
        return self.fwd_flops + self.fwd_hw_extra_flops

    @property
    def hw_bwd_flops(self) -> float:
        """FLOPs the GPU runs in backward, recompute inside the backward included."""
        return self.bwd_flops + self.bwd_hw_extra_flops

    @property
    def bwd_flops(self) -> float:
        # Backward is twice the forward: a gradient w.r.t. inputs and one w.r.t. weights per matmul [N21 §5.1].
        return 2.0 * self.fwd_flops


@dataclass(frozen=True, slots=True)
class Workload:
    """The modules of one model replica's MP rank, in forward order, and whole-model totals."""

    modules: tuple[Module, ...]
    total_params: int  # Ψ of the whole model (unique parameters, all MP ranks together)
    padded_vocab: int
    tokens_per_micro_batch: int  # per model replica: micro_batch × seq_len
    shape: Shape | None = field(default=None, compare=False)  # the resolved shape (None: built elsewhere)
    # Derived from `modules` once (the plan asks for them per module: hundreds of times a simulation).
    params_per_mp_rank: int = field(init=False, compare=False, repr=False)
    expert_params_per_rank: int = field(init=False, compare=False, repr=False)
    blocks: tuple[Module, ...] = field(init=False, compare=False, repr=False)
    tensors: tuple[int, ...] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        # Ψ as the DP group sees it: the parameters one MP rank holds (what ZeRO partitions); a MoE
        # model's routed experts are apart, in expert_params_per_rank.
        object.__setattr__(self, "params_per_mp_rank", sum(m.params for m in self.modules))
        object.__setattr__(self, "expert_params_per_rank", sum(m.expert_params for m in self.modules))
        object.__setattr__(self, "blocks", tuple(m for m in self.modules if m.layer is not None))
        # Element counts of every parameter tensor of this MP rank (they sum to params_per_mp_rank).
        object.__setattr__(self, "tensors", tuple(n for m in self.modules for n in m.tensors))

    @property
    def largest_module_params(self) -> int:
        return max(m.params for m in self.modules)


def padded_vocab(vocab: int, mp: int, multiple: int = VOCAB_MULTIPLE) -> int:
    """Vocabulary rounded up to a multiple of `multiple` × mp (Megatron-LM _vocab_size_with_padding;
    multiple = 1 pads only as far as the vocab-parallel embedding needs)."""
    step = multiple * mp
    return math.ceil(vocab / step) * step


def model_vocab(model: ModelSection, mp: int) -> int:
    """The vocabulary rows the model holds under MP degree `mp`: model.vocab padded to a multiple of
    vocab_padding × mp (default 128, Megatron-LM's make_vocab_size_divisible_by)."""
    return padded_vocab(model.vocab, mp, model.vocab_padding or VOCAB_MULTIPLE)


def mp_problems(model: ModelSection, mp: int) -> list[tuple[str, str]]:
    """(dotted key, message) for each way `model` cannot be split across `mp` Megatron-style ranks:
    attention by heads [S19 §3], K and V by query groups [MC], the MLP by its inner width [S19 §3].
    The simulator and the runtime both check this one rule."""
    shape, problems = Shape.of(model), []
    if shape.heads % mp:
        problems.append(("model.heads", f"{shape.heads} heads cannot be split evenly across mp {mp}"))
    if shape.kv_heads % mp:
        problems.append(("model.kv_heads", f"{shape.kv_heads} KV heads cannot be split evenly across mp {mp} "
                         "(Megatron splits the query groups: kv_heads % mp must be 0)"))
    if shape.ffn % mp:
        key, what = ("model.ffn_hidden", f"the MLP width {shape.ffn}") if model.ffn_hidden else \
                    ("model.hidden", f"the 4 × {model.hidden} MLP width")
        problems.append((key, f"{what} cannot be split evenly across mp {mp}"))
    return problems


def layer_tensors(shape: Shape, t: int = 1) -> tuple[int, ...]:
    """The parameter tensors of one block on one of t MP ranks, in elements, in Megatron's order:
    fused QKV weight h × (h + 2·kv_dim) [A23] and its bias, attention output weight h × h and bias,
    MLP linear_fc1 h × f (h × 2f when gated: gate and up fused [MC]) and bias, linear_fc2 f × h and
    bias, two norms. Under MP [S19 §3] QKV and fc1 are column-parallel (weights and biases split), the
    output projection and fc2 row-parallel (weights split, biases whole), norms replicated."""
    h, f, kv, q = shape.hidden, shape.ffn, shape.kv_dim, shape.q_dim
    qkv, fc1 = q + 2 * kv, (2 if shape.gated else 1) * f
    assert (h * qkv) % t == 0 and qkv % t == 0 and f % t == 0 and (h * q) % t == 0, "checked by mp_problems"
    qkv_b, row_b, fc1_b = (qkv // t,) if shape.qkv_bias else (), (h,) if shape.linear_bias else (), \
        (fc1 // t,) if shape.linear_bias else ()
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


def moe_layer_tensors(shape: Shape, moe: Moe, t: int = 1) -> tuple[int, ...]:
    """A MoE block's tensors every DP rank holds on one of t MP ranks: layer_tensors with the MLP
    replaced by the router and the shared experts (zsim.workload.moe); the routed experts are apart."""
    return attention_tensors(shape, t) + moe.dense_tensors(shape.hidden, t) + shape.norm_tensors * shape.layer_norms


def block_params(h: int, t: int = 1) -> int:
    """Parameters of one GPT block held by one of t MP ranks.

    Whole block (t = 1): 12h² + 13h [N21 §5.1]: QKV 3h² + 3h, attention output h² + h,
    MLP 4h² + 4h and 4h² + h, two layer norms 4h. Under MP [S19 §3] the column-parallel QKV and
    first MLP matmul split weights and biases; the row-parallel output matmuls split weights but
    keep their biases whole; layer norms are replicated: 12h²/t + 7h/t + 6h.
    """
    return sum(block_tensors(h, t))


def block_tensors(h: int, t: int = 1) -> tuple[int, ...]:
    """The parameter tensors of one GPT block on one of t MP ranks, in elements (they sum to
    block_params(h, t)): QKV weight and bias, attention output weight and bias, MLP weights and
    biases, two layer norms' weight and bias [S19 §3 for which are split]."""
    return layer_tensors(Shape.gpt(h), t)


def layer_saved_tensors(shape: Shape, s: int, b: int, t: int, e: int = 2, *, sp: bool = False,
                        selective: bool = False, mlp_inner: tuple[int, ...] | None = None) -> tuple[int, ...]:
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
    inner = (2 * e * sbf // t, e * sbf // t) if shape.gated else (e * sbf // t, e * sbf // t)
    if mlp_inner is not None:
        inner = mlp_inner
    attention = [e * sbh // r, e * sbh // r]
    if mla:
        attention += mla.latent_tensors(sb, e)
    if shape.qk_norm != "none":
        attention += [e * sb * shape.q_dim // t, e * sb * shape.kv_dim // t]
    if shape.flash:
        attention += [e * sb * q_w // t, e * sb * k_w // t, e * sb * v_w // t,
                      *(() if selective else (4 * a * s * b // t,)), e * sb * out_w // t]
    else:
        attention.append(e * sb * (q_w + k_w) // t)
        if not selective:  # the softmax output; with dropout, its mask and the dropout's output
            attention += [e * as2b // t, as2b // t, e * as2b // t] if shape.dropout else [e * as2b // t]
        attention += [e * sb * v_w // t, e * sb * out_w // t]
    masks = (sbh // r,) if shape.dropout else ()
    post = (e * sbh // r,) if shape.layer_norms == 4 else ()  # the post-norm's input [G24]
    mlp_in = () if shape.layer_norms == 1 else (e * sbh // r, e * sbh // r)
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


def layer_fwd_flops(shape: Shape, s: int, b: int, t: int = 1) -> float:
    """Forward FLOPs of one block on one of t MP ranks: 2 FLOPs per multiply-add of each GEMM [N21 §5.1].
    QKV 2bsh(h + 2·kv_dim) [A23], QKᵀ and attention·V 4bs²h, output projection 2bsh², MLP 4bshf, or
    6bshf gated (three h×f matmuls [T23]). The GPT shape gives N21's 24bsh² + 4bs²h."""
    h, f, kv, q = shape.hidden, shape.ffn, shape.kv_dim, shape.q_dim
    mlp = (3 if shape.gated else 2) * 2 * b * s * h * f
    if shape.mla is not None:  # the latent projections and the a·(d_h + d_h^R), a·d_v core [DV2 eqs. 9-19]
        model, _ = shape.mla.projection_flops(s * b, h, shape.heads, t)
        return model + shape.mla.core_flops(s, b, shape.heads, t) + mlp / t
    return (2 * b * s * h * (q + 2 * kv) + 4 * b * s * s * q + 2 * b * s * q * h + mlp) / t


def loss_work_tensors(tokens: int, vocab: int, t: int, e: int) -> tuple[int, ...]:
    """Bytes the loss holds while it runs over `tokens` tokens and the V/t logit columns of an MP rank,
    beside the fp32 softmax it saves (4·T·V/t) [K22 §4.3]. As Megatron-LM of the ZeRO paper's time
    (DeepSpeedExamples/Megatron-LM @ 5426d18a, pretrain_gpt2.py forward_step, mpu/cross_entropy.py): the
    e-byte logits (`output`, alive until forward_step returns), their fp32 copy (`output.float()`, the
    loss's input; none when e = 4) and the loss's own fp32 copy of that (`logits =
    vocab_parallel_logits.clone()`, "so the input remains unchanged")."""
    logits = tokens * vocab // t
    return (e * logits,) + ((4 * logits,) if e != 4 else ()) + (4 * logits,)


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
          `.backward()` in the same scope). No tensor parallelism (t = 1 in that loss)."""
    logits = tokens * vocab // t
    if loss == "fused":
        return (e * logits, 4 * tokens), (), ()
    if loss == "torch":
        return (e * logits,), (), (e * logits,)
    return (4 * logits,), loss_work_tensors(tokens, vocab, t, e), ()


def total_params(model: ModelSection, vocab: int | None = None) -> int:
    """Ψ of the whole model: L blocks, the word embedding V × h, the LM head V × h unless tied, the
    learned position table, the final norm. For GPT: L(12h² + 13h) + (V + s)h + 2h [N21 §5.1].
    `vocab` replaces model.vocab (e.g. the padded vocabulary)."""
    shape = Shape.of(model)
    v, h = model.vocab if vocab is None else vocab, model.hidden
    head = 0 if shape.tied_head else v * h
    moe = Moe.of(model)
    if moe is None:
        blocks = model.layers * shape.layer_params
    else:  # dense_layers dense blocks, then MoE blocks holding all E experts (zsim.workload.moe)
        moe_block = sum(moe_layer_tensors(shape, moe)) + sum(moe.expert_tensors(h, moe.ffn, 1)) * moe.experts
        blocks = moe.dense_layers * shape.layer_params + (model.layers - moe.dense_layers) * moe_block
    embed_norm = 2 * h if getattr(model, "embedding_norm", False) else 0  # BLOOM's word_embeddings_layernorm
    return blocks + v * h + head + shape.positions * h + sum(shape.norm_tensors) + embed_norm


# Sequence parallelism's MP collectives per module [K22 §4.2.2, Fig. 5; Megatron-Core
# tensor_parallel/mappings.py and layers.py]: a block's forward all-gathers the sequence-split input of
# attention and of the MLP ('g') and reduce-scatters their outputs ('ḡ'); its backward reduce-scatters the
# two input gradients and all-gathers the two output gradients. (Its backward also all-gathers the two
# sequence-split inputs again for the weight gradients, LinearWithGradAccumulationAndAsyncCommunication
# .backward, asynchronously under the input-gradient GEMM, which hides them: not priced.) The embedding reduce-scatters its output
# (VocabParallelEmbedding with reduce_scatter_embeddings) and all-gathers the gradient; the head
# all-gathers its input (gather_from_sequence_parallel_region) and reduce-scatters the gradient.
SP_COLLECTIVES = {
    "block": (("all_gather", "reduce_scatter") * 2, ("all_gather", "reduce_scatter") * 2),
    "embed": (("reduce_scatter",), ("all_gather",)),
    "head": (("all_gather",), ("reduce_scatter",)),
}


def _sp_collectives(kind: str, nbytes: int) -> dict:
    """Module fields for sequence parallelism: SP_COLLECTIVES[kind] of `nbytes` each (build_workload then
    sets the all-reduce counts to 0)."""
    fwd, bwd = SP_COLLECTIVES[kind]
    return dict(mp_collectives_fwd=tuple((op, nbytes) for op in fwd), mp_collectives_bwd=tuple((op, nbytes) for op in bwd))


def attention_core_flops(shape: Shape, s: int, b: int, t: int = 1) -> float:
    """Forward FLOPs of QKᵀ and attention·V on one of t MP ranks: 4bs²h/t [N21 §5.1] (4bs²·a·d); MLA's
    2bs²·a·(d_h + d_h^R + d_v)/t (zsim.workload.mla)."""
    if shape.mla is not None:
        return shape.mla.core_flops(s, b, shape.heads, t)
    return 4 * b * s * s * shape.q_dim / t


def _moe_fields(shape: Shape, moe: Moe, s: int, b: int, t: int, e: int, ep: int, sp: bool, selective: bool,
                dense_flops: float, fwd_extra: float, bwd_extra: float) -> dict:
    """The Module fields of a MoE block (zsim.workload.moe): its dense tensors and local experts, its
    FLOPs (the dense MLP's replaced by the MoE MLP's model FLOPs; the busiest rank computes `load` × the
    routed part: hardware FLOPs), its saved tensors and all-to-all bytes."""
    h, tokens = shape.hidden, s * b
    dense_mlp = (3 if shape.gated else 2) * 2 * tokens * h * shape.ffn / t
    routed = moe.routed_flops(tokens, h, t)
    saved = layer_saved_tensors(shape, s, b, t, e, sp=sp, selective=selective,
                                mlp_inner=moe.saved_tensors(tokens, h, t, e, ep))
    tensors = moe_layer_tensors(shape, moe, t)
    return dict(params=sum(tensors), fwd_flops=dense_flops - dense_mlp + moe.fwd_flops(tokens, h, t),
                fwd_hbm_bytes=2.0 * sum(saved), saved_bytes=sum(saved), tensors=tensors, saved_tensors=saved,
                fwd_hw_extra_flops=fwd_extra + (moe.load - 1) * routed, bwd_hw_extra_flops=bwd_extra + 2 * (moe.load - 1) * routed,
                expert_tensors=moe.local_expert_tensors(h, t, ep), ep_all_to_all_bytes=moe.all_to_all_bytes(tokens, h, e, ep, t),
                moe=True)


def attention_score_bytes(shape: Shape, s: int, b: int, t: int, e: int = 2) -> int:
    """Bytes of one layer's s×s attention tensors on one of t MP ranks, as layer_saved_tensors keeps them
    without FlashAttention or selective recompute: the softmax output and, with dropout, its mask and
    output [K22 §4.1]; 0 with FlashAttention."""
    if shape.flash:
        return 0
    as2b = shape.heads * s * s * b
    return e * as2b // t + as2b // t + e * as2b // t if shape.dropout else e * as2b // t


def active_params(model: ModelSection) -> int:
    """Parameters one token passes through: Ψ less the routed experts it is not sent to, (E − top_k)
    experts in each MoE block (zsim.workload.moe); Ψ for a dense model."""
    moe = Moe.of(model)
    if moe is None:
        return total_params(model)
    idle = (moe.experts - moe.top_k) * sum(moe.expert_tensors(model.hidden, moe.ffn, 1))
    return total_params(model) - (model.layers - moe.dense_layers) * idle


def build_workload(model: ModelSection, mp: int, dtype: str = "fp16", *, sequence_parallel: bool = False,
                   selective: bool = False, ep: int = 1) -> Workload:
    """Per-MP-rank modules of `model` under MP degree `mp`, with activations in `dtype` (fp16 and
    bf16: 2 bytes, fp32: 4); see the module docstring for sources. `sequence_parallel`: Megatron's
    sequence parallelism [K22 §4.2.2] (ignored at mp 1, as Megatron-LM ignores it); `selective`:
    selective activation recompute [K22 §5]; `ep`: the expert-parallel degree of a MoE model
    (zsim.workload.moe)."""
    shape = Shape.of(model)
    h, s, b, L = model.hidden, model.seq_len, model.micro_batch, model.layers
    t = mp
    sp = sequence_parallel and t > 1
    r = t if sp else 1  # SP splits what MP replicates
    e = 4 if dtype == "fp32" else 2  # activation element bytes
    v = model_vocab(model, t)
    sbh = s * b * h
    mp_bytes = e * sbh if t > 1 else 0  # activations of shape (s, b, h) [S19 §3]

    block_flops = layer_fwd_flops(shape, s, b, t)  # 24bsh² + 4bs²h for GPT [N21 §5.1], split t ways
    saved_tensors = layer_saved_tensors(shape, s, b, t, e, sp=sp, selective=selective)  # [K22 §4.2, eq. 2]
    block_saved = sum(saved_tensors)
    tensors = layer_tensors(shape, t)
    core = attention_core_flops(shape, s, b, t)
    # The core's model FLOPs: `core` forward, 2·core backward [N21]. FlashAttention runs causal: core/2
    # forward, 2.5 × that backward (QKᵀ recomputed) [D23; flash-attn benchmarks' count]; selective
    # recompute adds the core's forward again in backward [K22 §5] (with FlashAttention, its causal one).
    # A sliding-window block [BPC20] does the attention of n = window_keys keys per query: its model core
    # 2·core·n/s (the pairs it attends, counted as N21 counts the global ones); FlashAttention computes
    # half of that forward (causal, the blocks outside the window skipped), the unfused attention all
    # s² scores under a mask (its hardware FLOPs those of a global block).
    replicated = shape.mla.projection_flops(s * b, h, shape.heads, t)[1] if shape.mla is not None else 0.0
    moe = Moe.of(model)

    def attention_terms(n: int) -> dict:
        """fwd_flops, hw extras and the window of a block whose queries attend n keys each (0: all)."""
        model_core = 2 * core * n / s if n else core
        fwd_core = model_core / 2 if shape.flash else core
        fwd_extra = fwd_core - model_core
        bwd_extra = (2.5 * fwd_core if shape.flash else 2 * core) - 2 * model_core + (fwd_core if selective else 0.0)
        if replicated:  # MLA's down projections run whole on every MP rank (replicated) [MC]
            fwd_extra, bwd_extra = fwd_extra + replicated, bwd_extra + 2 * replicated
        return dict(fwd_flops=block_flops - core + model_core if n else block_flops, fwd_hw_extra_flops=fwd_extra,
                    bwd_hw_extra_flops=bwd_extra, window=n if shape.flash else 0)

    block_sp = _sp_collectives("block", mp_bytes) if sp else {}
    variants: dict[tuple[bool, int], dict] = {}

    def fields(i: int) -> dict:
        n = shape.window_keys(i, s)
        key = (moe is not None and moe.is_moe(i), n)
        if key not in variants:  # one dict per kind of block (dense or MoE, global or its window)
            terms = attention_terms(n)
            if key[0]:
                variants[key] = _moe_fields(shape, moe, s, b, t, e, ep, sp, selective, terms["fwd_flops"],
                                            terms["fwd_hw_extra_flops"], terms["bwd_hw_extra_flops"]) | {"window": terms["window"]}
            else:
                variants[key] = dict(params=sum(tensors), fwd_hbm_bytes=2.0 * block_saved, saved_bytes=block_saved,
                                     tensors=tensors, saved_tensors=saved_tensors) | terms
        return variants[key]

    block = [
        Module(
            name=f"layer.{i}",
            checkpoint_bytes=e * sbh // r,  # the block's input, replicated across MP [K22 §5] (split by SP)
            mp_allreduce_bytes=mp_bytes,
            # Two all-reduces in forward (after attention and after the MLP) and two in backward
            # (the 'f' operators of the column-parallel inputs) [S19 §3, Fig. 4].
            mp_allreduces_fwd=2 if t > 1 else 0, mp_allreduces_bwd=2 if t > 1 else 0, layer=i,
            **fields(i), **block_sp,
        )
        for i in range(L)
    ]
    # Vocab-parallel word embedding (V/t rows) + replicated learned position table [S19 §3]; a rotary
    # or ALiBi model has no position parameters [T23]; BLOOM's LayerNorm after the embedding (weight and
    # bias, replicated) saves its input (Scao et al. 2022, "BLOOM", §3.2.2 "Embedding LayerNorm").
    embed_tensors = (v * h // t, shape.positions * h) if shape.positions else (v * h // t,)
    embed_norm = getattr(model, "embedding_norm", False)
    embed_tensors += (h, h) if embed_norm else ()
    embed_saved = ((e * sbh,) if embed_norm else ()) + ((sbh // r,) if shape.dropout else ())  # + dropout mask [K22 §4.3]
    embed = Module(
        name="embed", params=sum(embed_tensors), fwd_flops=0.0, fwd_hbm_bytes=2.0 * 2 * sbh,
        saved_bytes=sum(embed_saved),
        checkpoint_bytes=0,
        # Vocab-parallel embedding all-reduces its output in forward only [S19 §3].
        mp_allreduce_bytes=mp_bytes, mp_allreduces_fwd=1 if t > 1 else 0, mp_allreduces_bwd=0,
        tensors=embed_tensors, saved_tensors=embed_saved, **(_sp_collectives("embed", mp_bytes) if sp else {}),
    )
    # The head: final norm, logits against the word embedding or, untied, its own vocab-parallel
    # V/t × h output layer (Megatron untie_embeddings_and_output_weights) (2bshV/t FLOPs [N21 §5.1]),
    # cross-entropy in fp32 on the vocab-parallel logits: 4sbV/t bytes [K22 §4.3] plus its input, or a
    # fused kernel's e-byte logits and per-token log-sum-exp (model.loss; loss_tensors).
    loss_saved, loss_work, loss_held = loss_tensors(s * b, v, t, e, shape.loss)
    head_saved = sum(loss_saved) + e * sbh // r  # the final norm's input is sequence-split under SP
    head_tensors = shape.norm_tensors + (() if shape.tied_head else (v * h // t,))
    head = Module(
        name="head", params=sum(head_tensors), fwd_flops=2 * b * s * h * v / t, fwd_hbm_bytes=2.0 * head_saved,
        saved_bytes=head_saved, checkpoint_bytes=head_saved,  # the head is not checkpointed
        # Its input gradient is all-reduced across MP in backward (the 'f' operator) [S19 §3].
        mp_allreduce_bytes=mp_bytes, mp_allreduces_fwd=0, mp_allreduces_bwd=1 if t > 1 else 0,
        tensors=head_tensors,  # the final norm's weight (and bias); the untied output layer
        saved_tensors=(e * sbh // r, *loss_saved),
        # Megatron's vocab_parallel_cross_entropy all-reduces the per-token max logit, target logit
        # and sum of exponentials over MP, in fp32 (megatron/core/tensor_parallel/cross_entropy.py).
        mp_loss_allreduce_bytes=(4 * s * b,) * 3 if t > 1 else (),
        fwd_work_tensors=loss_work, held_tensors=loss_held, **(_sp_collectives("head", mp_bytes) if sp else {}),
    )
    modules = (embed, *block, head)
    if sp:  # the reduce-scatters and all-gathers replace every MP all-reduce but the loss's
        modules = tuple(replace(m, mp_allreduces_fwd=0, mp_allreduces_bwd=0) for m in modules)
    return Workload(
        modules=modules,
        total_params=total_params(model, v),
        padded_vocab=v,
        tokens_per_micro_batch=b * s,
        shape=shape,
    )
