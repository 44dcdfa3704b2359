"""The Module fields of a mixture-of-experts block (zsim.workload.moe) beside its attention: its tensors, FLOPs,
saved tensors, all-to-all bytes and what module-level recompute drops, for zsim.workload.transformer.build_workload.

Sources: [MC] Megatron-Core megatron/core/transformer/ (moe/, transformer_layer.py), as zsim.workload.moe cites it.
"""

from __future__ import annotations

from zsim.workload.activations import layer_saved_tensors
from zsim.workload.moe import Moe
from zsim.workload.parameters import moe_layer_tensors
from zsim.workload.shape import Shape


def moe_block_fields(shape: Shape, moe: Moe, s: int, b: int, t: int, e: int, ep: int, sp: bool, selective: bool,
                dense_flops: float, fwd_extra: float, bwd_extra: float, etp: int,
                recompute: frozenset[str] = frozenset(), q: float = 0.0, proj_q: float = 0.0) -> dict:
    """The Module fields of a MoE block (zsim.workload.moe): its dense tensors and local experts (split etp
    ways), its FLOPs (the dense MLP's replaced by the MoE MLP's model FLOPs; the busiest rank computes
    `load` × the routed part: hardware FLOPs), its saved tensors and all-to-all bytes. `recompute`:
    'layernorm' drops the pre-MLP norm's output, 'moe_act' the experts' activation output (both
    recomputed in backward: Megatron-Core CheckpointWithoutOutput, transformer_layer.py, experts.py), 'moe'
    every MoE MLP tensor but its input (moe_layer.py checkpoint: the layer's forward, its GEMMs' hardware
    FLOPs and all-to-alls included, again in backward), 'mla_up_proj' MLA's Q, K and V (the up projections' GEMMs
    again in backward: layer_saved_tensors); what they drop is `recompute_bytes`. Over the TP × EP
    group (Moe.over_tp_ep) a rank's T/t tokens go to all t TP ranks of each EP rank they reach: t × the bytes.
    `q`, `proj_q`: the saved FP8 copies' bytes an element (layer_saved_tensors, Moe.saved_tensors); the forward's
    elementwise traffic is that of the 16-bit tensors and the experts' output the combine reads."""
    h, tokens = shape.hidden, s * b
    dense_mlp = (3 if shape.gated else 2) * 2 * tokens * h * shape.ffn / t
    routed = moe.routed_flops(tokens, h, t)
    act_re = "moe_act" in recompute
    up_re = "mla_up_proj" in recompute and shape.mla is not None
    saved = layer_saved_tensors(shape, s, b, t, e, sp=sp, selective=selective, q=q, proj_q=proj_q,
                                mlp_inner=moe.saved_tensors(tokens, h, t, e, ep, etp, act_recompute=act_re, q=q),
                                norm_recompute="layernorm" in recompute, mlp_recompute="moe" in recompute,
                                mla_up_recompute=up_re)
    traffic = sum(layer_saved_tensors(shape, s, b, t, e, sp=sp, selective=selective,
                                      mlp_inner=moe.saved_tensors(tokens, h, t, e, ep, etp, act_recompute=act_re),
                                      norm_recompute="layernorm" in recompute, mlp_recompute="moe" in recompute))
    traffic += 0 if "moe" in recompute else moe.combine_bytes(tokens, h, t, e, ep, etp)
    kept = layer_saved_tensors(shape, s, b, t, e, sp=sp, selective=selective, q=q, proj_q=proj_q,
                               mlp_inner=moe.saved_tensors(tokens, h, t, e, ep, etp, q=q)) if recompute else saved
    tensors = moe_layer_tensors(shape, moe, t)
    mlp_flops = moe.fwd_flops(tokens, h, t) + (moe.load - 1) * routed  # the MoE MLP's forward, run again under 'moe'
    return dict(params=sum(tensors), fwd_flops=dense_flops - dense_mlp + moe.fwd_flops(tokens, h, t),
                fwd_hbm_bytes=2.0 * traffic, saved_bytes=sum(saved), tensors=tensors, saved_tensors=saved,
                recompute_bytes=sum(kept) - sum(saved), recompute_all_to_alls="moe" in recompute,
                fwd_hw_extra_flops=fwd_extra + (moe.load - 1) * routed,
                bwd_hw_extra_flops=bwd_extra + 2 * (moe.load - 1) * routed + (mlp_flops if "moe" in recompute else 0.0)
                + (shape.mla.up_flops(tokens, h, shape.heads, t) if up_re else 0.0),
                expert_tensors=moe.local_expert_tensors(h, etp, ep), ep_all_to_all_bytes=moe.all_to_all_bytes(tokens, h, e, ep, t) * (t if moe.over_tp_ep(t, etp) else 1),
                moe=True)
