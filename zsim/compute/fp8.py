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
tensor and writes its FP8 copies: on Hopper a row-wise one for one GEMM and a column-wise (transposed) one
for the other, as Hopper's FP8 tensor cores take only the TN layout (TE's `cast_transpose`); on Blackwell
one copy serves both with per-tensor scales (TE v2.9 quantizer.cpp L331-345: no transpose where
`nvte_is_non_tn_fp8_gemm_supported`), two with MXFP8's blocks (scaled along rows, then along columns).
Per linear layer and micro-batch that is the input X in forward and the output gradient dY in backward;
the wgrad reuses both copies. The weights are quantized once per optimizer step (TE caches them across
the micro-batches: `is_first_microbatch`, which Megatron-Core sets at the first micro-batch of each step)
and their FP8 copies stay allocated beside the 16-bit parameters. With FP8 parameters (`--fp8-param-gather`,
precision.fp8_params) the parameters themselves are FP8 (1 byte, no 16-bit copy): the distributed
optimizer casts its fp32 master shard into them after each step (TE tensor/utils.py
cast_master_weights_to_fp8: an amax pass, then the cast) and, on Hopper, each step's first forward rebuilds
the transposed copy (TE v2.9 linear.py L393-395).

The recipes differ in how a tensor's scale is found:
  - delayed: from an amax history of earlier steps; the cast kernel records the new amax itself;
  - current: from the tensor's own amax, a reduction that reads it once more before the cast (TE v2.9
    csrc/quantizer.cpp L497-536: nvte_compute_amax, then nvte_quantize_v2);
  - blockwise: one fp32 scale per 1x128 block (128x128 for weights), found inside the cast kernel (DeepSeek-V3's
    recipe, Megatron-Core --fp8-recipe blockwise; Hopper): its GEMMs are priced as per-tensor FP8 GEMMs, which
    block-scaled kernels are slower than (DeepGEMM's H800 table: a median 7.4% slower than zsim's FP8 terms,
    docs/compute.md "FP8 GEMMs");
  - mxfp8: one E8M0 scale per 32 consecutive elements, found inside the cast kernel (Blackwell, OCP MX
    specification v1.0): one scale byte per 32 values per copy;
  - nvfp4 (precision.fp4, not an FP8 recipe but priced on the same path): E2M1 values, half a byte each, with an
    E4M3 scale per 16 consecutive elements and an fp32 scale per tensor from its amax (cuDNN's Block Scaling docs:
    "16 FP4 output values (E2M1) and 1 FP8 scaling factor (E4M3)"; TE's NVFP4BlockScaling): an amax read before
    each cast, as current scaling, and two copies on every GPU (rows, then columns: Blackwell's block-scaled FP4
    MMA takes K-major operands only, so dgrad and wgrad read a column-wise copy). The GEMMs run at the GPU's FP4
    peak (`Kernel.fp4`). TE's random Hadamard transform and stochastic rounding, where a recipe keeps them, are
    fused into that cast (the bytes the same); MLPerf v5.1's NVFP4 configs disable RHT, and their 405B configs also
    stochastic rounding and 2D weight scaling, which the 8B configs turn back on (config_common_8b.sh, sourced after
    config_common_fp4.sh). Under sequence parallelism zsim gathers the 16-bit inputs, not NVFP4
    (an assumption: whether TE v2.9 gathers NVFP4 shards was not read).

The saved activations: a linear layer keeps its input's low-precision copy for backward, not the 16-bit tensor
(`saved_bytes`; zsim.workload.activations.layer_saved_tensors says which tensors).

Not modelled: the norm kernels' fused amax (TE's LayerNormLinear with current scaling writes the 16-bit norm
output and its amax, then casts: zsim charges the separate amax read), the amax all-reductions across ranks.
"""

from __future__ import annotations

import dataclasses
import functools

from zsim.compute.kernel_list import Kernel, KernelList, mem, red

# The GEMMs of Transformer Engine modules, by the kernel lists' names (zsim.compute.kernels, mla_kernels):
# QKV, the attention's output projection, the dense MLP's two layers, the routed and shared experts', MLA's
# projections, multi-token prediction's eh_proj (Megatron-Core runs it under the FP8 context). Their ".dgrad"/".wgrad"
# backward GEMMs and "recompute." copies follow.
FP8_LINEARS = ("qkv", "attention.dense", "mlp.h_to_4h", "mlp.4h_to_h", "moe.experts.fc1", "moe.experts.fc2",
               "moe.shared.fc1", "moe.shared.fc2", "mla.q_down", "mla.q_up", "mla.kv_down", "mla.kv_up",
               "mtp.eh_proj")
RECIPES = ("delayed", "current", "blockwise", "mxfp8", "nvfp4")
# MXFP8: one 1-byte E8M0 scale per 32 elements (OCP Microscaling Formats (MX) v1.0, §5.1: block size 32)
MX_BLOCK = 32
# Blockwise (DeepSeek-V3 §3.3.2; TE's Float8BlockScaling): one fp32 scale per 1x128 block of an activation or gradient
# (128x128 of a weight, whose scales zsim counts as the activations' per 128: an over-count of 4 B per 128 elements)
BLOCK = 128
# NVFP4: an E2M1 value is half a byte; one 1-byte E4M3 scale per 16 elements (cuDNN Block Scaling, "NVFP4 recipe
# quantizes across 16 ... elements"); the per-tensor fp32 scale is not counted (4 bytes a tensor)
NVFP4_BLOCK = 16
FP4_BYTES = 0.5


def _linear(name: str) -> tuple[str, str] | None:
    """(the linear layer's name, 'fwd' | 'dgrad' | 'wgrad') of an FP8 GEMM's kernel name; None otherwise."""
    if name.startswith("recompute."):
        name = name[len("recompute."):]
    for suffix in ("dgrad", "wgrad"):
        if name.endswith("." + suffix) and name[:-len(suffix) - 1] in FP8_LINEARS:
            return name[:-len(suffix) - 1], suffix
    return (name, "fwd") if name in FP8_LINEARS else None


def copies(recipe: str, compute_capability: int) -> int:
    """The low-precision copies one quantize writes (module docstring): 2 on Hopper or with block scales (MXFP8,
    blockwise, NVFP4: scaled along rows, then along columns), 1 on Blackwell per tensor."""
    return 2 if recipe in ("mxfp8", "blockwise", "nvfp4") or compute_capability < 100 else 1


def _written(recipe: str, n: int) -> float:
    """Bytes written per element for `n` low-precision copies (MXFP8: and a scale byte per MX_BLOCK elements per
    copy; blockwise: a 4-byte scale per BLOCK; NVFP4: half a byte and a scale byte per NVFP4_BLOCK elements)."""
    if recipe == "nvfp4":
        return n * (FP4_BYTES + 1 / NVFP4_BLOCK)
    scales = 1 / MX_BLOCK if recipe == "mxfp8" else 4 / BLOCK if recipe == "blockwise" else 0
    return n * (1 + scales)


def saved_bytes(recipe: str) -> float:
    """Bytes an element of a linear layer's saved input takes under `recipe`: the one low-precision copy
    Transformer Engine keeps for the weight gradient (its column-wise usage, scales included: `_written`(recipe,
    1); TE 366798ef linear.py, layernorm_linear.py, grouped_linear.py); 0 for 16-bit GEMMs ('none')."""
    return 0.0 if recipe == "none" else _written(recipe, 1)


def gathered_grad_bytes(recipe: str, tp_comm_overlap: bool) -> float:
    """Bytes an element of a row-parallel layer's output gradient takes in its sequence-parallel all-gather under
    `recipe` (0 for 16-bit GEMMs). Transformer Engine (366798ef) quantizes it with both usages, the dgrad's rowwise
    and the wgrad's columnwise copy (linear.py backward: `set_usage(rowwise=True, columnwise=True)`), and
    `gather_along_first_dim` gathers every usage the quantizer has (distributed.py `_all_gather_mxfp8`, the
    blockwise and NVFP4 gathers): two copies and their scales, unless the quantizer gathers rowwise only and
    transposes after (`supports_only_rowwise_all_gather`: delayed and current scaling) or Userbuffers' TP overlap
    moves it, one usage at a time (`ub_overlap_ag`: rowwise only)."""
    if recipe == "none":
        return 0.0
    two = recipe in ("mxfp8", "blockwise", "nvfp4") and not tp_comm_overlap
    return _written(recipe, 2 if two else 1)


def proj_copy_bytes(recipe: str) -> float:
    """Bytes an element of the output projection's quantized copy of the attention output, kept beside the 16-bit
    output FlashAttention saves: Megatron-Core has the projection save the original instead, except under
    delayed scaling (attention.py set_save_original_input, since 781e765818, 2025-08-19); 0 otherwise."""
    return saved_bytes(recipe) if recipe == "delayed" else 0.0


def quantize(name: str, elements: int, recipe: str, e: int, n: int = 2) -> list[Kernel]:
    """The kernels that quantize an `elements`-element e-byte tensor into `n` low-precision copies under `recipe`:
    the cast (e read, the copies written: `_written`) and, for current scaling and NVFP4's per-tensor scale, the
    amax reduction before it (e read)."""
    assert recipe in RECIPES, recipe
    ks = [red(f"{name}.amax", e * elements)] if recipe in ("current", "nvfp4") else []
    return ks + [mem(f"{name}.quantize", (e + _written(recipe, n)) * elements)]


def with_fp8(kernels: tuple[Kernel, ...], recipe: str, e: int, n: int = 2) -> tuple[Kernel, ...]:
    """`kernels` (a module's list) with its linear layers' GEMMs in FP8 and the quantize kernels (into `n`
    copies) before them: the input's before each forward GEMM (M × K, batch), the output gradient's before each
    dgrad (its M × K: the dgrad's K is the layer's output width)."""
    out: list[Kernel] = []
    for k in kernels:
        which = _linear(k.name) if k.kind == "gemm" else None
        if which is None:
            out.append(k)
            continue
        layer, pass_ = which
        prefix = "recompute." if k.name.startswith("recompute.") else ""
        if pass_ == "fwd":
            out += quantize(f"{prefix}{layer}.input", k.m * k.k * k.batch, recipe, e, n)
        elif pass_ == "dgrad":
            out += quantize(f"{layer}.grad_output", k.m * k.k * k.batch, recipe, e, n)
        out.append(dataclasses.replace(k, fp4=True) if recipe == "nvfp4" else dataclasses.replace(k, fp8=True))
    return tuple(out)


# The distributed optimizer's cast of its fp32 master shard into FP8 parameters: an amax pass (4 B read) and the
# cast (4 B read, 1 B written) per shard element (TE tensor/utils.py cast_master_weights_to_fp8)
MASTER_CAST_BYTES = 4 + 4 + 1


@functools.lru_cache(maxsize=64)
def weight_kernels(elements: int, shard: int, recipe: str, e: int, n: int, params: bool) -> KernelList:
    """A step's weight quantize over this rank's `elements` linear weight elements (`shard` of them its optimizer
    partition): the 16-bit weights into their `n` cached copies, or with FP8 parameters (`params`) the master
    shard's cast into them and, where a second copy is needed, the transpose of each whole weight (1 B read,
    1 B written). Built once per arguments and shared (kernel lists compare by identity)."""
    if not params:
        return KernelList("fp8.weights", tuple(quantize("fp8.weights", elements, recipe, e, n)))
    ks = (mem("fp8.master_to_params", MASTER_CAST_BYTES * shard),)
    return KernelList("fp8.weights", ks + ((mem("fp8.weights.transpose", 2 * elements),) if n > 1 else ()))


def weight_cache_bytes(elements: int, recipe: str, n: int = 2, params: bool = False) -> int:
    """Bytes of the FP8 weight copies held beside the parameters: `n` of them, or with FP8 parameters (which are
    the first) the other n − 1 (their scales counted with each copy)."""
    return int(elements * _written(recipe, n - 1 if params else n))
