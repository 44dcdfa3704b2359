"""The kernels of multi-head latent attention's projections on one MP rank (zsim.workload.mla; DeepSeek-V2's
MLA as Megatron-Core's MLASelfAttention runs it), for zsim.compute.kernels' block lists."""

from __future__ import annotations

from zsim.compute.kernel_list import Kernel, gemm, mem
from zsim.compute.kernel_shape import Shape


def mla_forward(x: Shape) -> list[Kernel]:
    """MLA's projections on one MP rank (zsim.workload.mla; Megatron-Core MLASelfAttention): the
    replicated down projections whole (q_a, kv_a with the RoPE key), the latents' RMSNorms, the
    column-parallel up projections ÷ t."""
    q_rank, kv_rank, nope, rope, vd = x.mla
    T, e, h, heads = x.s * x.b, x.e, x.h, max(1, x.a // x.t)
    ks = [gemm("mla.q_down", T, q_rank, h), mem("mla.q_norm", 2 * e * T * q_rank)] if q_rank else []
    ks += [gemm("mla.q_up", T, heads * (nope + rope), q_rank or h), gemm("mla.kv_down", T, kv_rank + rope, h),
           mem("mla.kv_norm", 2 * e * T * kv_rank), gemm("mla.kv_up", T, heads * (nope + vd), kv_rank)]
    return ks


def mla_backward(x: Shape) -> list[Kernel]:
    """mla_forward's backward, in reverse: each GEMM's input and weight gradients, the norms'."""
    ks = []
    for k in reversed(mla_forward(x)):
        if k.kind == "gemm":
            ks += [gemm(f"{k.name}.dgrad", k.m, k.k, k.n), gemm(f"{k.name}.wgrad", k.n, k.k, k.m)]
        else:
            ks.append(mem(f"{k.name}.bwd", 5 * k.bytes / 2, count=2))
    return ks


def mla_up_recompute(x: Shape) -> list[Kernel]:
    """--recompute-modules mla_up_proj: the up projections' GEMMs (Q from its latent, K^C and V from c^KV) run
    again in backward before the attention core's backward needs Q, K and V (Megatron-Core
    multi_latent_attention.py: qkv_up_proj_and_rope_apply under CheckpointWithoutOutput, its outputs discarded
    after the core attention's forward); the RoPE kernels are the block's own (zsim.compute.kernels)."""
    return [k for k in mla_forward(x) if k.name in ("mla.q_up", "mla.kv_up")]
