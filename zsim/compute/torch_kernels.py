"""The embedding's and the cross-entropy's kernels under `model.kernels: pytorch-2`: plain PyTorch >= 2.0
modules on a GPU at MP 1, as zsim's runtime builds them (runtime/model.py: nn.Embedding, and
`F.cross_entropy(logits.float())` for model.loss torch-fp32, `F.cross_entropy(logits)` for torch).
The block's lists differ from Megatron's only in the bias adds, which zsim.compute.kernels leaves out.

Read from the runtime's Kineto traces on an H200 (data/device/20261126-h200-kineto, PyTorch 2.13; the counts
and times below from h1024 and h4096, the runs the fits see, V = 50,304) and from ATen's source, which the
names below follow:
  - embedding forward: one gather per table (`vectorized_gather_kernel`), the position ids by an
    arange kernel, and their sum; no masks (Megatron's VocabParallelEmbedding masks ids out of range).
  - embedding backward (aten/src/ATen/native/cuda/Embedding.cu embedding_dense_backward_cuda): the
    gradient table is zero-filled, then up to 3,072 indices go to `embedding_backward_feature_kernel`
    (the position table: its gradient first summed over the batch by a reduction, the broadcast add's
    backward), and more go to the sort-based path (EmbeddingBackwardKernel.cu): a cub radix sort of
    the indices (10 kernels and 10 memsets in the traces), unique-by-key and segment offsets (7 kernels),
    `compute_grad_weight` (per-segment fp32 partial sums of the token gradients) and `sum_and_scatter`;
    with a tied head, autograd's sum of the table's two gradients (the head's and the embedding's: one
    add over V×h, 293 µs on h4096's trace).
  - cross-entropy forward: the `.float()` cast (torch-fp32), `cunn_SoftMaxForward` for log_softmax
    (aten/src/ATen/native/cuda/SoftMax.cu: a max pass and a sum-of-exp pass over the row, then the
    write pass reading it again: three reads and a write of each logit), and nll_loss's gather.
  - cross-entropy backward: nll_loss_backward zero-fills its fp32 gradient and scatters −1/N into it,
    `cunn_SoftMaxBackward` (a sum pass over the incoming gradient, then a pass reading it and the saved
    output to write the input gradient: three reads and a write), and the cast back to e bytes.
"""

from __future__ import annotations

from zsim.compute.kernel_list import UNROLLED_SHARE, Kernel, gemm, mem, red
from zsim.compute.kernel_shape import Shape

# embedding_dense_backward_cuda (Embedding.cu): `num_indices <= 3072 && !scale_grad_by_freq` takes the
# direct feature kernel, anything larger the sort-based path.
FEATURE_KERNEL_MAX_INDICES = 3072
# The sort-based path's small kernels, counted on the H200 traces (h1024 and h4096, the same in both): the
# radix sort's histogram, exclusive scan and 8 onesweep passes with their 10 memsets (20), then
# unique-by-key, the scans and the partial-segment kernels (7). Their time is their launches: 0.7-9 µs each.
SORT_KERNELS = 20
SEGMENT_KERNELS = 7

TORCH_LOSSES = ("torch", "torch-fp32")


def applies(x: Shape, module: str) -> bool:
    """Whether `module` ('embed', 'head') of shape `x` takes this file's lists rather than Megatron's:
    pytorch-2 kernels at MP 1 (the head also needs PyTorch's cross-entropy, model.loss torch or torch-fp32)."""
    if x.kernels != "pytorch-2" or x.t != 1:
        return False
    return module == "embed" or x.loss in TORCH_LOSSES


def embed_forward(x: Shape) -> tuple[Kernel, ...]:
    """nn.Embedding's gather (reads the T ids, writes T·h), a learned position table's arange, gather
    and add, an embedding norm, dropout."""
    T, th, e = x.s * x.b, x.s * x.b * x.h, x.e
    ks = [mem("embed.word", 8 * T + 2 * e * th)]
    if not x.rotary and not x.alibi:
        ks += [mem("embed.position_ids", 8 * x.s), mem("embed.position", 8 * x.s + 2 * e * x.s * x.h),
               mem("embed.add", 3 * e * th)]
    if x.embedding_norm:
        ks.append(mem("embed.layernorm", 2 * e * th))
    return tuple(ks + [mem("embed.dropout", (2 * e + 1) * th)])


def _table_backward(name: str, indices: int, rows: int, x: Shape) -> list[Kernel]:
    """embedding_dense_backward_cuda of one table: zero-fill its rows×h gradient, then the feature kernel
    (reads the indices' gradients, adds them into the table) or the sort-based path."""
    e, h = x.e, x.h
    ks = [mem(f"{name}.zero_grad", e * rows * h)]
    if indices <= FEATURE_KERNEL_MAX_INDICES:
        return ks + [mem(f"{name}.scatter_add", 3 * e * indices * h)]
    return ks + [mem(f"{name}.sort", 2 * 16 * indices, count=SORT_KERNELS),
                 mem(f"{name}.segments", 4 * 8 * indices, count=SEGMENT_KERNELS),
                 mem(f"{name}.compute_grad_weight", (e + 4) * indices * h),  # token grads in, fp32 partials out
                 mem(f"{name}.sum_and_scatter", 4 * indices * h + 2 * e * indices * h)]


def embed_backward(x: Shape) -> tuple[Kernel, ...]:
    """Dropout's and an embedding norm's backward, the word table's dense backward over the T ids (and the
    tied head's gradient added to it), and a
    learned position table's: its gradient summed over the micro-batch (the broadcast add), then its
    dense backward over the s ids."""
    T, th, e = x.s * x.b, x.s * x.b * x.h, x.e
    ks = [mem("embed.dropout.bwd", (2 * e + 1) * th)]
    if x.embedding_norm:
        ks.append(mem("embed.layernorm.bwd", 5 * e * th, count=2))
    ks += _table_backward("embed.word", T, x.v, x)
    if x.tied:  # the head's gradient of the shared weight and the embedding's, summed by autograd (one add)
        ks.append(mem("embed.word.tied_grad_sum", 3 * e * x.v * x.h))
    if not x.rotary and not x.alibi:
        ks.append(red("embed.position.batch_sum", e * th + e * x.s * x.h))
        ks += _table_backward("embed.position", x.s, x.s, x)
    return tuple(ks)


def _loss_bytes(x: Shape) -> int:
    """Bytes per logit the cross-entropy's kernels read or write: 4 after the fp32 upcast, else e."""
    return 4 if x.loss == "torch-fp32" else x.e


def head_forward(x: Shape) -> tuple[Kernel, ...]:
    """Final norm, the logits GEMM (T×V×h), the fp32 upcast (torch-fp32), log_softmax (three reads and a
    write per logit), nll_loss's gather of T targets."""
    T, th, e, f = x.s * x.b, x.s * x.b * x.h, x.e, _loss_bytes(x)
    tv = T * x.v
    ks = [mem("final_layernorm", 2 * e * th), gemm("logits", T, x.v, x.h)]
    if f != e:
        ks.append(mem("logits.float", (e + f) * tv, efficiency=UNROLLED_SHARE[4]))  # bf16 -> fp32: unrolled
    return tuple(ks + [red("cross_entropy.log_softmax", 4 * f * tv), red("cross_entropy.nll_loss", 8 * T + f * T)])


def head_backward(x: Shape) -> tuple[Kernel, ...]:
    """nll_loss's backward (zero-fill, scatter), log_softmax's (three reads and a write per logit), the
    cast back to e bytes, the logits GEMM's input and weight gradients, the final norm's backward."""
    T, th, e, f = x.s * x.b, x.s * x.b * x.h, x.e, _loss_bytes(x)
    tv = T * x.v
    ks = [mem("cross_entropy.nll_loss.bwd.zero", f * tv), mem("cross_entropy.nll_loss.bwd", 8 * T + f * T),
          red("cross_entropy.log_softmax.bwd", 4 * f * tv)]
    if f != e:
        ks.append(mem("logits.float.bwd", (e + f) * tv))
    return tuple(ks + [gemm("logits.dgrad", T, x.h, x.v), gemm("logits.wgrad", x.v, x.h, T),
                       mem("final_layernorm.bwd", 5 * e * th, count=2)])
