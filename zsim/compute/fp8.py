"""FP8 linear layers as Transformer Engine runs them under Megatron-Core (`precision.fp8`; docs/models.md, "FP8").

With `--fp8-format hybrid` every linear layer of a transformer block is a Transformer Engine module (TELinear,
TELayerNormColumnParallelLinear, TERowParallelLinear, TEGroupedLinear for the experts) run inside
`te.fp8_autocast`, and its three GEMMs take FP8 operands (E4M3 forward, E5M2 gradients) with a 16-bit
output: forward Y = X·Wᵀ, dgrad dX = dY·W, wgrad dW = dYᵀ·X (TE's `general_gemm` on quantized tensors;
Micikevicius et al., "FP8 Formats for Deep Learning", 2022, §3-4). What stays in 16 bits: the attention
core (DotProductAttention; FP8 attention is a separate option, not modelled), the router (a plain
torch linear in Megatron-Core's moe/router.py), the embedding and the output layer (a tensor-parallel
ColumnParallelLinear, not a TE module).

Before each FP8 GEMM its 16-bit operands are quantized by a memory-bound kernel that reads the e-byte
tensor and writes two 1-byte copies: the row-wise one for one GEMM and the column-wise (on Hopper,
transposed) one for the other, as Hopper's FP8 tensor cores take only the TN layout (TE's
`cast_transpose`; cuBLASLt FP8 requirements). Per linear layer and micro-batch that is the input X in
forward and the output gradient dY in backward; the wgrad reuses both copies. The weights are quantized
once per optimizer step (TE caches them across the micro-batches: `is_first_microbatch`, which
Megatron-Core sets at the first micro-batch of each step) and their two FP8 copies stay allocated: 2
bytes per linear weight element beside the 16-bit parameters.

The recipes differ in how a tensor's scale is found:
  - delayed: from an amax history of earlier steps; the cast kernel records the new amax itself;
  - current: from the tensor's own amax, a reduction that reads it once more before the cast;
  - mxfp8: one E8M0 scale per 32 consecutive elements, found inside the cast kernel (Blackwell, OCP MX
    specification v1.0): one scale byte per 32 values per copy.

Not modelled: FP8 all-gathers under sequence parallelism (TE gathers the quantized input: zsim's gathers
stay 16-bit), FP8 parameters (`--fp8-param-gather`), the activation memory saved in FP8 (zsim keeps the
16-bit count, an over-estimate where the layers' inputs are saved), the amax reductions across ranks.
"""

from __future__ import annotations

import dataclasses

from zsim.compute.kernel_list import Kernel, mem, red

# The GEMMs of Transformer Engine modules, by the kernel lists' names (zsim.compute.kernels, mla_kernels):
# QKV, the attention's output projection, the dense MLP's two layers, the routed and shared experts', MLA's
# projections. Their ".dgrad"/".wgrad" backward GEMMs and "recompute." copies follow.
FP8_LINEARS = ("qkv", "attention.dense", "mlp.h_to_4h", "mlp.4h_to_h", "moe.experts.fc1", "moe.experts.fc2",
               "moe.shared.fc1", "moe.shared.fc2", "mla.q_down", "mla.q_up", "mla.kv_down", "mla.kv_up")
RECIPES = ("delayed", "current", "mxfp8")
# MXFP8: one 1-byte E8M0 scale per 32 elements (OCP Microscaling Formats (MX) v1.0, §5.1: block size 32)
MX_BLOCK = 32


def _linear(name: str) -> tuple[str, str] | None:
    """(the linear layer's name, 'fwd' | 'dgrad' | 'wgrad') of an FP8 GEMM's kernel name; None otherwise."""
    if name.startswith("recompute."):
        name = name[len("recompute."):]
    for suffix in ("dgrad", "wgrad"):
        if name.endswith("." + suffix) and name[:-len(suffix) - 1] in FP8_LINEARS:
            return name[:-len(suffix) - 1], suffix
    return (name, "fwd") if name in FP8_LINEARS else None


def quantize(name: str, elements: int, recipe: str, e: int) -> list[Kernel]:
    """The kernels that quantize an `elements`-element e-byte tensor into its row- and column-wise FP8
    copies under `recipe`: the cast (e read, 2 × 1 written; MX: and a scale byte per 32 per copy) and, for
    current scaling, the amax reduction before it (e read)."""
    assert recipe in RECIPES, recipe
    written = 2 + (2 / MX_BLOCK if recipe == "mxfp8" else 0)
    ks = [red(f"{name}.amax", e * elements)] if recipe == "current" else []
    return ks + [mem(f"{name}.quantize", (e + written) * elements)]


def with_fp8(kernels: tuple[Kernel, ...], recipe: str, e: int) -> tuple[Kernel, ...]:
    """`kernels` (a module's list) with its linear layers' GEMMs in FP8 and the quantize kernels before
    them: the input's before each forward GEMM (M × K, batch), the output gradient's before each dgrad
    (its M × K: the dgrad's K is the layer's output width)."""
    out: list[Kernel] = []
    for k in kernels:
        which = _linear(k.name) if k.kind == "gemm" else None
        if which is None:
            out.append(k)
            continue
        layer, pass_ = which
        prefix = "recompute." if k.name.startswith("recompute.") else ""
        if pass_ == "fwd":
            out += quantize(f"{prefix}{layer}.input", k.m * k.k * k.batch, recipe, e)
        elif pass_ == "dgrad":
            out += quantize(f"{layer}.grad_output", k.m * k.k * k.batch, recipe, e)
        out.append(dataclasses.replace(k, fp8=True))
    return tuple(out)


def weight_kernels(elements: int, recipe: str, e: int) -> tuple[Kernel, ...]:
    """Quantizing `elements` linear weight elements into their two FP8 copies, once per step."""
    return tuple(quantize("fp8.weights", elements, recipe, e))


def weight_cache_bytes(elements: int, recipe: str) -> int:
    """Bytes of the cached FP8 weight copies (row- and column-wise, MX: with their scales)."""
    return int(elements * (2 + (2 / MX_BLOCK if recipe == "mxfp8" else 0)))
