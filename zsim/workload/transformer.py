"""The workload of a GPT-style transformer: parameters, FLOPs and activation bytes per module.

Every figure is per micro-batch and per MP rank (Megatron tensor parallelism divides the GEMMs, and
some activations, by the MP degree t). Sources:
  [N21] Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
        Megatron-LM", §5.1 (parameter count and FLOPs).
  [K22] Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", §4
        (activation bytes per layer, fp16, with tensor parallelism and no sequence parallelism; for
        fp32 training the 2-byte tensors become 4-byte ones and the 1-byte dropout masks stay).
  [S19] Shoeybi et al. 2019, "Megatron-LM", §3 (which tensors MP splits; the MP all-reduces).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from zsim.config.schema import ModelSection

# Megatron-LM pads the vocabulary to a multiple of 128 × t (arguments.make_vocab_size_divisible_by,
# megatron/training/tokenizer: _vocab_size_with_padding) so the embedding splits evenly over MP.
VOCAB_MULTIPLE = 128


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

    @property
    def params_per_mp_rank(self) -> int:
        """Ψ as the DP group sees it: the parameters one MP rank holds (what ZeRO partitions)."""
        return sum(m.params for m in self.modules)

    @property
    def blocks(self) -> tuple[Module, ...]:
        return tuple(m for m in self.modules if m.layer is not None)

    @property
    def largest_module_params(self) -> int:
        return max(m.params for m in self.modules)

    @property
    def tensors(self) -> tuple[int, ...]:
        """Element counts of every parameter tensor of this MP rank (they sum to params_per_mp_rank)."""
        return tuple(n for m in self.modules for n in m.tensors)


def padded_vocab(vocab: int, mp: int) -> int:
    """Vocabulary rounded up to a multiple of 128 × mp (Megatron-LM _vocab_size_with_padding)."""
    multiple = VOCAB_MULTIPLE * mp
    return math.ceil(vocab / multiple) * multiple


def block_params(h: int, t: int = 1) -> int:
    """Parameters of one transformer block held by one of t MP ranks.

    Whole block (t = 1): 12h² + 13h [N21 §5.1]: QKV 3h² + 3h, attention output h² + h,
    MLP 4h² + 4h and 4h² + h, two layer norms 4h. Under MP [S19 §3] the column-parallel QKV and
    first MLP matmul split weights and biases; the row-parallel output matmuls split weights but
    keep their biases whole; layer norms are replicated: 12h²/t + 7h/t + 6h.
    """
    assert (4 * h) % t == 0 and (3 * h) % t == 0
    return 12 * h * h // t + 7 * h // t + 6 * h


def block_tensors(h: int, t: int = 1) -> tuple[int, ...]:
    """The parameter tensors of one block on one of t MP ranks, in elements (they sum to
    block_params(h, t)): QKV weight and bias, attention output weight and bias, MLP weights and
    biases, two layer norms' weight and bias [S19 §3 for which are split]."""
    return (3 * h * h // t, 3 * h // t, h * h // t, h, 4 * h * h // t, 4 * h // t, 4 * h * h // t, h, h, h, h, h)


def block_saved_tensors(s: int, b: int, h: int, a: int, t: int, e: int = 2) -> tuple[int, ...]:
    """The tensors one block saves for backward on one of t MP ranks, in bytes, with e-byte
    activations [K22 §4.1-4.2]. Attention: layer-norm input, QKV input (replicated, e·sbh each), Q and
    K (2e·sbh/t), softmax output (e·as²b/t), its dropout mask (as²b/t bytes), dropout output and V
    (e·as²b/t, e·sbh/t), output-projection input (e·sbh/t), dropout mask (sbh). MLP: layer-norm
    input, first-matmul input (e·sbh each), GeLU input and output (4e·sbh/t each), dropout mask (sbh).
    Their sum is K22 eq. 2 for e = 2: sbh(10 + 24/t + 5as/(ht)); in general
    sbh(4e + 2 + 12e/t) + as²b(2e + 1)/t."""
    sbh, as2b = s * b * h, a * s * s * b
    return (e * sbh, e * sbh, 2 * e * sbh // t, e * as2b // t, as2b // t, e * as2b // t, e * sbh // t,
            e * sbh // t, sbh, e * sbh, e * sbh, 4 * e * sbh // t, 4 * e * sbh // t, sbh)


def block_saved_bytes(s: int, b: int, h: int, a: int, t: int, e: int = 2) -> int:
    """Activation bytes one block saves for backward on one of t MP ranks [K22 §4.2, eq. 2]: the sum
    of block_saved_tensors."""
    return sum(block_saved_tensors(s, b, h, a, t, e))


def total_params(model: ModelSection, vocab: int | None = None) -> int:
    """Ψ = L(12h² + 13h) + (V + s)h + 2h: blocks, word and position embeddings, final layer norm, with
    the LM head tied to the word embedding [N21 §5.1]; an untied head (`model.tied_head` false) adds
    its own V·h."""
    h, v = model.hidden, model.vocab if vocab is None else vocab
    head = 0 if getattr(model, "tied_head", True) else v * h
    return model.layers * block_params(h) + (v + model.seq_len) * h + 2 * h + head


def build_workload(model: ModelSection, mp: int, dtype: str = "fp16") -> Workload:
    """Per-MP-rank modules of `model` under MP degree `mp`, with activations in `dtype` (fp16 and
    bf16: 2 bytes, fp32: 4); see the module docstring for sources."""
    h, s, a, b, L = model.hidden, model.seq_len, model.heads, model.micro_batch, model.layers
    t = mp
    e = 4 if dtype == "fp32" else 2  # activation element bytes
    v = padded_vocab(model.vocab, t)
    sbh = s * b * h
    mp_bytes = e * sbh if t > 1 else 0  # activations of shape (s, b, h) [S19 §3]

    # Forward FLOPs of one block: 24bsh² + 4bs²h [N21 §5.1: 24Bsh²(1 + s/6h)], split t ways.
    block_flops = (24 * b * s * h * h + 4 * b * s * s * h) / t
    saved_tensors = block_saved_tensors(s, b, h, a, t, e)  # [K22 §4.2, eq. 2]
    block_saved = sum(saved_tensors)
    block = [
        Module(
            name=f"layer.{i}", params=block_params(h, t), fwd_flops=block_flops, fwd_hbm_bytes=2.0 * block_saved,
            saved_bytes=block_saved,
            checkpoint_bytes=e * sbh,  # the block's input, replicated across MP [K22 §5]
            mp_allreduce_bytes=mp_bytes,
            # Two all-reduces in forward (after attention and after the MLP) and two in backward
            # (the 'f' operators of the column-parallel inputs) [S19 §3, Fig. 4].
            mp_allreduces_fwd=2 if t > 1 else 0, mp_allreduces_bwd=2 if t > 1 else 0, layer=i,
            tensors=block_tensors(h, t), saved_tensors=saved_tensors,
        )
        for i in range(L)
    ]
    embed = Module(
        # Vocab-parallel word embedding (V/t rows) + replicated position embedding [S19 §3].
        name="embed", params=v * h // t + s * h, fwd_flops=0.0, fwd_hbm_bytes=2.0 * 2 * sbh,
        saved_bytes=sbh,  # dropout mask, 1 byte per element [K22 §4.3]
        checkpoint_bytes=0,
        # Vocab-parallel embedding all-reduces its output in forward only [S19 §3].
        mp_allreduce_bytes=mp_bytes, mp_allreduces_fwd=1 if t > 1 else 0, mp_allreduces_bwd=0,
        tensors=(v * h // t, s * h), saved_tensors=(sbh,),
    )
    # The head: final layer norm, logits against the word embedding (tied) or its own vocab-parallel
    # V/t x h weight (untied) (2bshV/t FLOPs [N21 §5.1]), cross-entropy in fp32 on the vocab-parallel
    # logits: 4sbV/t bytes [K22 §4.3] plus its input.
    head_saved = 4 * s * b * v // t + e * sbh
    tied = getattr(model, "tied_head", True)
    lm_weight = () if tied else (v * h // t,)
    head = Module(
        name="head", params=2 * h + sum(lm_weight), fwd_flops=2 * b * s * h * v / t, fwd_hbm_bytes=2.0 * head_saved,
        saved_bytes=head_saved, checkpoint_bytes=head_saved,  # the head is not checkpointed
        # Its input gradient is all-reduced across MP in backward (the 'f' operator) [S19 §3].
        mp_allreduce_bytes=mp_bytes, mp_allreduces_fwd=0, mp_allreduces_bwd=1 if t > 1 else 0,
        tensors=(h, h) + lm_weight,  # the final layer norm's weight and bias (+ the untied LM weight)
        saved_tensors=(e * sbh, 4 * s * b * v // t),
        # Megatron's vocab_parallel_cross_entropy all-reduces the per-token max logit, target logit
        # and sum of exponentials over MP, in fp32 (megatron/core/tensor_parallel/cross_entropy.py).
        mp_loss_allreduce_bytes=(4 * s * b,) * 3 if t > 1 else (),
    )
    return Workload(
        modules=(embed, *block, head),
        total_params=total_params(model, v),
        padded_vocab=v,
        tokens_per_micro_batch=b * s,
    )
