"""Parameter counts of a model: a MoE block's dense tensors, the GPT block's closed form, Ψ of the whole
model and the parameters one token passes through.

Sources: [N21] Narayanan et al. 2021, §5.1 (parameter count); [S19] Shoeybi et al. 2019, §3 (which
tensors MP splits); [DV3] DeepSeek-AI 2024, "DeepSeek-V3", §2.2 and [MC] Megatron-Core
multi_token_prediction.py @ 2edffadb5 (the multi-token prediction modules); zsim.workload.moe for the experts;
zsim.workload.shape for the block's tensors.
"""

from __future__ import annotations

from zsim.config.model_section import ModelSection
from zsim.workload.moe import Moe
from zsim.workload.shape import Shape, attention_tensors, layer_tensors


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
    # multi-token prediction [DV3 §2.2; MC multi_token_prediction.py]: per depth a layer of the last kind, eh_proj
    # 2h × h (no bias) and three norms (enorm, hnorm, final_layernorm); the embedding and output layer are shared
    last = moe_block if moe is not None and model.layers > moe.dense_layers else shape.layer_params
    mtp = getattr(model, "mtp_layers", 0) * (last + 2 * h * h + 3 * sum(shape.norm_tensors))
    return blocks + v * h + head + shape.positions * h + sum(shape.norm_tensors) + embed_norm + mtp


def active_params(model: ModelSection) -> int:
    """Parameters one token passes through: Ψ less the routed experts it is not sent to, (E − top_k)
    experts in each MoE block (zsim.workload.moe); Ψ for a dense model."""
    moe = Moe.of(model)
    if moe is None:
        return total_params(model)
    idle = (moe.experts - moe.top_k) * sum(moe.expert_tensors(model.hidden, moe.ffn, 1))
    mtp = getattr(model, "mtp_layers", 0) if model.layers > moe.dense_layers else 0  # MTP layers are MoE layers here
    moe_layers = model.layers - moe.dense_layers + mtp
    return total_params(model) - moe_layers * idle
