"""The workload of a GPT-style transformer: its modules per MP rank (embedding, blocks, head) with their
parameters, FLOPs, activation bytes and MP collectives, per micro-batch.

Every figure is per micro-batch and per MP rank (Megatron tensor parallelism divides the GEMMs, and
some activations, by the MP degree t). The block's shape and parameter tensors are zsim.workload.shape,
Ψ and active parameters zsim.workload.parameters, saved activations zsim.workload.activations, MoE
zsim.workload.moe, multi-head latent attention zsim.workload.mla. Sources:
  [N21] Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
        Megatron-LM", §5.1 (FLOPs).
  [K22] Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", §4-5
        (checkpoints, sequence parallelism's collectives, selective recompute).
  [S19] Shoeybi et al. 2019, "Megatron-LM", §3 (the MP all-reduces, the vocab-parallel embedding and loss).
  [T23] Touvron et al. 2023, "LLaMA", §2.2 (SwiGLU: three h×f matmuls; rotary: no position table).
  [A23] Ainslie et al. 2023, "GQA" (K and V h × kv_heads·d).
  [D23] Dao 2023, "FlashAttention-2", §3.1.2 (the causal kernel skips the masked half; backward recomputes QKᵀ).
  [MC]  Megatron-Core (MLA's down projections replicated over MP).
  [BPC20] Beltagy, Peters & Cohan 2020, "Longformer", §3.1 (sliding-window attention).
  [DV3] DeepSeek-AI 2024, "DeepSeek-V3 Technical Report", §2.2 (multi-token prediction).
The GPT shape is the default; docs/models.md derives the general formulas from these sources.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from zsim.config.model_section import ModelSection
from zsim.workload.activations import layer_saved_tensors, loss_backward_tensors, loss_tensors
from zsim.workload.moe import Moe
from zsim.workload.moe_block import moe_block_fields
from zsim.workload.parameters import total_params
from zsim.workload.shape import Shape, layer_tensors

# Megatron-LM pads the vocabulary to a multiple of 128 × t (arguments.make_vocab_size_divisible_by,
# megatron/training/tokenizer: _vocab_size_with_padding) so the embedding splits evenly over MP.
VOCAB_MULTIPLE = 128


@dataclass(frozen=True, slots=True)
class Module:
    """One step of the forward pass on one MP rank: the embedding, a transformer block, or the head.

    Attributes:
        name: `embed`, `layer.<i>`, `mtp.<k>` or `head`.
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
    # Tensors (bytes) the module's backward holds at once, beside its saved activations, when they are
    # known one by one (the head under model.loss torch-fp32: loss_backward_tensors and its input's
    # gradient); () for the single sum of StepPass._backward_work_bytes.
    bwd_work_tensors: tuple[int, ...] = ()
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
    # Module-level recompute (Megatron-Core --recompute-modules layernorm, moe_act, mlp, moe): the bytes the
    # block's backward brings back for its own run (the saved tensors those modules dropped, freed with the
    # backward), the MP collectives a recomputed MLP or MoE layer issues again, and whether its all-to-alls
    # run again (moe: the whole MoE layer, dispatch and combine included).
    recompute_bytes: int = 0
    recompute_collectives: tuple[tuple[str, int], ...] = ()
    recompute_all_to_alls: bool = False
    # A sliding-window block under FlashAttention: the mean keys per query its fused kernel computes
    # (Shape.window_keys; zsim.compute.kernels prices it); 0 for a global block.
    window: int = 0
    # Context parallelism: the bytes of the whole sequence's keys and values on one MP rank, which the block's
    # attention gathers around its CP ring in forward (and again, with their gradients' reduce-scatter, in
    # backward) [MC, Transformer Engine's AttnFuncWithCPAndKVP2P]; 0 without CP.
    cp_kv_bytes: int = 0

    @property
    def mtp(self) -> bool:
        """A multi-token prediction module (`mtp.<k>`: _mtp_module): no layer index, the layer's fields, its own loss."""
        return self.name.startswith("mtp.")

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
    "attention": (("all_gather", "reduce_scatter"), ("all_gather", "reduce_scatter")),  # a block without the MLP's
    "embed": (("reduce_scatter",), ("all_gather",)),
    "head": (("all_gather",), ("reduce_scatter",)),
}


def _sp_collectives(kind: str, nbytes: int, gather_scale: float = 1.0, grad_gather_scale: float | None = None) -> dict:
    """Module fields for sequence parallelism: SP_COLLECTIVES[kind] of `nbytes` each, the forward's all-gathers
    scaled by `gather_scale` (the gathered element's bytes over e: 1/e under FP8, whose gathers carry 1-byte elements,
    (0.5 + 1/16)/e under NVFP4), the backward's (the output gradients') by `grad_gather_scale` (default the same);
    build_workload then sets the all-reduce counts to 0."""
    fwd, bwd = SP_COLLECTIVES[kind]
    grad_gather_scale = gather_scale if grad_gather_scale is None else grad_gather_scale

    def sized(ops: tuple[str, ...], scale: float) -> tuple[tuple[str, int], ...]:
        return tuple((op, _scaled(nbytes, scale) if op == "all_gather" else nbytes) for op in ops)

    return dict(mp_collectives_fwd=sized(fwd, gather_scale), mp_collectives_bwd=sized(bwd, grad_gather_scale))


def _mtp_module(k: int, *, base: dict, shape: Shape, s: int, b: int, t: int, e: int, r: int, q: float,
                gather_scale: float, head: Module) -> Module:
    """Multi-token prediction module k (model.mtp_layers) on one of t MP ranks [DV3 §2.2; MC
    multi_token_prediction.py MultiTokenPredictionLayer @ 2edffadb5]: the embedding of the tokens k + 1 further
    ahead and the previous depth's hidden state, each through an RMSNorm (enorm, hnorm), concatenated and projected
    2h → h (eh_proj: column-parallel, no bias, under the FP8 recipe), one transformer layer of the model's last kind
    (`base`: its fields), the module's final norm, then the logits against the shared output layer and the loss.
    The word embedding and the output layer are the model's (their copy on the last pipeline stage:
    zsim.zero.pipeline_plan); its own tensors are the norms and eh_proj. Under SP [MC]: the embedding's
    reduce-scatter, eh_proj's all-gather of its 2h-wide input and the all-gather of its output columns (then split
    back) in forward; their mirrors in backward, and the logits' all-gather and reduce-scatter as the head's."""
    h = shape.hidden
    sbh = s * b * h
    norm = shape.norm_tensors
    tensors = (*norm, *norm, 2 * h * h // t, *norm)  # enorm, hnorm, eh_proj, final_layernorm
    # the norms' inputs (the embedding and the hidden state), eh_proj's (FP8: its quantized copy), the final
    # norm's input; then the layer's and the loss's (the head's)
    proj_in = round(q * 2 * sbh / r) if q else 2 * e * sbh // r
    pre, post = (e * sbh // r, e * sbh // r, proj_in), (e * sbh // r, *head.saved_tensors[1:])
    saved = (*pre, *base["saved_tensors"], *post)
    extra_traffic = 2.0 * (2 * e * sbh // r + 2 * e * sbh // r + e * sbh // r)  # norms, concat, final norm
    mp_bytes = e * sbh if t > 1 else 0
    fields = dict(base)
    if t > 1:
        fwd = (("reduce_scatter", mp_bytes), ("all_gather", _scaled(2 * mp_bytes, gather_scale)),
               ("all_gather", mp_bytes))
        bwd = (("all_gather", mp_bytes), ("reduce_scatter", 2 * mp_bytes), ("all_gather", mp_bytes))
        fields.update(mp_collectives_fwd=fwd + base.get("mp_collectives_fwd", ()) + (("all_gather", mp_bytes),),
                      mp_collectives_bwd=(("reduce_scatter", mp_bytes),) + base.get("mp_collectives_bwd", ()) + bwd)
    fields.update(params=base["params"] + sum(tensors), tensors=(*base["tensors"], *tensors),
                  fwd_flops=base["fwd_flops"] + 2 * s * b * 2 * h * h / t + head.fwd_flops,
                  fwd_hbm_bytes=base["fwd_hbm_bytes"] + extra_traffic + head.fwd_hbm_bytes,
                  saved_bytes=sum(saved), saved_tensors=saved, window=0)
    return Module(name=f"mtp.{k}", checkpoint_bytes=sum(saved),  # not checkpointed
                  mp_allreduce_bytes=mp_bytes, mp_allreduces_fwd=0, mp_allreduces_bwd=0,
                  mp_loss_allreduce_bytes=head.mp_loss_allreduce_bytes, **fields)


def _scaled(nbytes: int, scale: float) -> int:
    """Bytes of an e-byte tensor of `nbytes` gathered at `scale` × its element size (exact for FP8's 1/2)."""
    return nbytes if scale == 1.0 else round(nbytes * scale)


def attention_core_flops(shape: Shape, s: int, b: int, t: int = 1) -> float:
    """Forward FLOPs of QKᵀ and attention·V on one of t MP ranks: 4bs²h/t [N21 §5.1] (4bs²·a·d); MLA's
    2bs²·a·(d_h + d_h^R + d_v)/t (zsim.workload.mla)."""
    if shape.mla is not None:
        return shape.mla.core_flops(s, b, shape.heads, t)
    return 4 * b * s * s * shape.q_dim / t


def build_workload(model: ModelSection, mp: int, dtype: str = "fp16", *, sequence_parallel: bool = False,
                   selective: bool = False, ep: int = 1, etp: int | None = None,
                   recompute: frozenset[str] = frozenset(), cp: int = 1, fp8: bool = False, saved_q: float = 0.0,
                   proj_q: float = 0.0, gather_q: float = 0.0, grad_gather_q: float = 0.0) -> Workload:
    """Per-MP-rank modules of `model` under MP degree `mp`, with activations in `dtype` (fp16 and
    bf16: 2 bytes, fp32: 4); see the module docstring for sources. `sequence_parallel`: Megatron's
    sequence parallelism [K22 §4.2.2] (ignored at mp 1, as Megatron-LM ignores it); `selective`:
    selective activation recompute [K22 §5]; `ep`: the expert-parallel degree of a MoE model
    (zsim.workload.moe); `etp`: its experts' MP degree, mp (default) or 1 (each expert whole: a MoE
    block's MLP then issues no sequence-parallel collective unless it has shared experts: `moe_sp` below);
    `recompute`: the parts besides the attention core that selective recompute redoes ('layernorm',
    'moe_act', 'mlp', 'moe': zsim.zero.rank_states.recompute_modules); `cp`: context parallelism [MC]: each rank
    computes s/cp of every sequence's tokens (its zig-zag pair of the 2·cp chunks), and its queries attend the whole
    sequence's keys, load-balanced: 1/cp of the causal attention core (the loader refuses windows and unfused attention
    with it); `fp8`: Transformer Engine's FP8 linear layers (precision.fp8), whose sequence-parallel all-gathers carry
    their quantized 1-byte inputs and output gradients (TE v2.9 layernorm_linear.py L246-265, linear.py L639-666:
    gathered in FP8), the reduce-scatters their 16-bit outputs; `gather_q`: the bytes an element of the forward's
    all-gathers takes, one rowwise copy with its scales (zsim.compute.fp8.saved_bytes: 1 under delayed or current
    scaling, 1 + 1/32 MXFP8, 1 + 4/128 blockwise, 0.5 + 1/16 NVFP4, as TE's _all_gather_mxfp8, blockwise and
    _all_gather_nvfp4 gather them; 0: e bytes, or 1 under `fp8`);
    `grad_gather_q`: the same for the backward's all-gathers of the row-parallel layers' output gradients, where
    Transformer Engine gathers both usages, two copies, for a quantizer that cannot gather rowwise only (MXFP8,
    blockwise, NVFP4) unless Userbuffers' TP overlap carries one (TE 366798ef base.py grad_output_preprocess,
    linear.py; zsim.zero.rank_states.scenario_workload); 0: as `gather_q`;
    `saved_q` and `proj_q`: the bytes an element of a
    linear input's saved FP8 (or NVFP4) copy takes, and of the output projection's extra copy where one is kept
    (zsim.compute.fp8.saved_bytes; 0: 16-bit, layer_saved_tensors). The forward's elementwise traffic
    (fwd_hbm_bytes) stays that of the 16-bit tensors: the quantize kernels are priced on their own
    (zsim.compute.fp8)."""
    shape = Shape.of(model)
    h, s, b, L = model.hidden, model.seq_len // cp, model.micro_batch, model.layers
    t = mp
    sp = sequence_parallel and t > 1
    r = t if sp else 1  # SP splits what MP replicates
    e = 4 if dtype == "fp32" else 2  # activation element bytes
    v = model_vocab(model, t)
    sbh = s * b * h
    mp_bytes = e * sbh if t > 1 else 0  # activations of shape (s, b, h) [S19 §3]
    gather_scale = (gather_q or (1.0 if fp8 else e)) / e  # an SP all-gather's bytes over the e-byte tensor's
    grad_gather_scale = grad_gather_q / e if grad_gather_q else gather_scale  # the output gradients' gathers

    block_flops = layer_fwd_flops(shape, s, b, t)  # 24bsh² + 4bs²h for GPT [N21 §5.1], split t ways
    mlp_re = "mlp" in recompute  # a dense block's MLP checkpointed whole [MC transformer_layer.py recompute_mlp]
    up_re = "mla_up_proj" in recompute and shape.mla is not None  # MLA's Q, K, V recomputed (layer_saved_tensors)
    saved_tensors = layer_saved_tensors(shape, s, b, t, e, sp=sp, selective=selective, mlp_recompute=mlp_re,
                                        q=saved_q, proj_q=proj_q, mla_up_recompute=up_re)  # [K22 §4.2, eq. 2]
    block_saved = sum(saved_tensors)
    block_traffic = sum(layer_saved_tensors(shape, s, b, t, e, sp=sp, selective=selective, mlp_recompute=mlp_re))
    dense_recompute = sum(layer_saved_tensors(shape, s, b, t, e, sp=sp, selective=selective, q=saved_q,
                                              proj_q=proj_q)) - block_saved
    tensors = layer_tensors(shape, t)
    core = attention_core_flops(shape, s, b, t)
    if cp > 1:  # s/cp queries against all cp·s keys: cp × the core of s tokens [MC get_batch_on_this_cp_rank]
        block_flops += (cp - 1) * core
        core *= cp
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

    block_sp = _sp_collectives("block", mp_bytes, gather_scale, grad_gather_scale) if sp else {}
    etp = t if etp is None else etp
    # [MC] with each expert whole (expert_tensor_parallel_size 1) every MP rank routes its own sequence-parallel
    # share to its EP group and gets its own share back (token_dispatcher.py: no gather over the experts' TP
    # group of one), so a MoE block's MLP needs neither the all-gather before it nor the reduce-scatter after
    # it; the attention's stay. Shared experts run on the gathered sequence as the dense MLP (shared_experts.py).
    # So does DeepEP with split experts, whose dispatch over the TP × EP group replaces the gather (Moe.over_tp_ep).
    no_tp_gather = etp == 1 or (moe is not None and moe.over_tp_ep(t, etp))  # none around the experts
    moe_sp = (_sp_collectives("attention", mp_bytes, gather_scale, grad_gather_scale)
              if sp and no_tp_gather and moe is not None and not moe.shared else block_sp)
    if sp and etp == t and moe is not None and not no_tp_gather:
        # [MC] with each expert split across the MP group (expert_tensor_parallel_size = tp) the alltoall
        # dispatcher all-gathers the routed token copies over the TP group after the EP all-to-all and
        # reduce-scatters the experts' output before the combine (token_dispatcher.py MoEAlltoAllTokenDispatcher
        # dispatch_postprocess / combine_preprocess: gather_from_sequence_parallel_region and
        # reduce_scatter_to_sequence_parallel_region over tp_group): e·R·h for the R copies the rank's experts
        # compute (top_k·T × load), in place of the dense MLP's e·T·h; shared experts gather and scatter the
        # sequence as the dense MLP (shared_experts.py), so they keep that pair.
        routed = e * moe.routed_tokens(s * b, ep) * h
        pairs = (("all_gather", mp_bytes), ("reduce_scatter", mp_bytes), ("all_gather", routed), ("reduce_scatter", routed))
        pairs += (("all_gather", mp_bytes), ("reduce_scatter", mp_bytes)) if moe.shared else ()
        moe_sp = dict(mp_collectives_fwd=pairs, mp_collectives_bwd=pairs)
    variants: dict[tuple[bool, int], dict] = {}

    def fields(i: int) -> dict:
        n = shape.window_keys(i, s)
        key = (moe is not None and moe.is_moe(i), n)
        if key not in variants:  # one dict per kind of block (dense or MoE, global or its window)
            terms = attention_terms(n)
            # a recomputed MLP or MoE layer issues its forward's MP collectives again in backward: the MLP's
            # pair under SP (after the attention's), its all-reduce without
            if key[0]:
                again = moe_sp.get("mp_collectives_fwd", ())[2:] if "moe" in recompute else ()
                variants[key] = moe_block_fields(shape, moe, s, b, t, e, ep, sp, selective, terms["fwd_flops"],
                                            terms["fwd_hw_extra_flops"], terms["bwd_hw_extra_flops"], etp, recompute,
                                            saved_q, proj_q) | {
                    "window": terms["window"], "recompute_collectives": again} | moe_sp
            else:
                again = (block_sp["mp_collectives_fwd"][2:] if sp else (("all_reduce", mp_bytes),) if t > 1 else ()
                         ) if mlp_re else ()
                variants[key] = dict(params=sum(tensors), fwd_hbm_bytes=2.0 * block_traffic, saved_bytes=block_saved,
                                     tensors=tensors, saved_tensors=saved_tensors, recompute_bytes=dense_recompute,
                                     recompute_collectives=again) | terms
                if mlp_re:  # the dense MLP's forward GEMMs again in backward: hardware FLOPs
                    variants[key]["bwd_hw_extra_flops"] += (3 if shape.gated else 2) * 2 * s * b * h * shape.ffn / t
                if up_re:  # MLA's up projections again in backward
                    variants[key]["bwd_hw_extra_flops"] += shape.mla.up_flops(s * b, h, shape.heads, t)
        return variants[key]

    # each rank's K and V for its s/cp tokens (MLA: the up-projected per-head keys and values), cp of them gathered
    kv_width = shape.heads * (shape.mla.qk_head + shape.mla.v) if shape.mla is not None else 2 * shape.kv_dim
    cp_kv = cp * e * s * b * kv_width // t if cp > 1 else 0
    block = [
        Module(
            name=f"layer.{i}", cp_kv_bytes=cp_kv,
            checkpoint_bytes=e * sbh // r,  # the block's input, replicated across MP [K22 §5] (split by SP)
            mp_allreduce_bytes=mp_bytes,
            # Two all-reduces in forward (after attention and after the MLP) and two in backward
            # (the 'f' operators of the column-parallel inputs) [S19 §3, Fig. 4].
            mp_allreduces_fwd=2 if t > 1 else 0, mp_allreduces_bwd=2 if t > 1 else 0, layer=i,
            **(block_sp | fields(i)),
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
    bwd_loss = loss_backward_tensors(s * b, v, t, shape.loss)
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
        fwd_work_tensors=loss_work, held_tensors=loss_held,
        bwd_work_tensors=(bwd_loss + (e * sbh // r,)) if bwd_loss else (),
        **(_sp_collectives("head", mp_bytes) if sp else {}),
    )
    mtp = tuple(_mtp_module(k, base=fields(L - 1), shape=shape, s=s, b=b, t=t, e=e, r=r, q=saved_q,
                            gather_scale=gather_scale, head=head) for k in range(getattr(model, "mtp_layers", 0)))
    modules = (embed, *block, *mtp, head)
    if sp:  # the reduce-scatters and all-gathers replace every MP all-reduce but the loss's
        modules = tuple(replace(m, mp_allreduces_fwd=0, mp_allreduces_bwd=0) for m in modules)
    return Workload(
        modules=modules,
        total_params=total_params(model, v),
        padded_vocab=v,
        tokens_per_micro_batch=b * s,  # this rank's: s/cp under context parallelism
        shape=shape,
    )
