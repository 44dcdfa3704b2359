"""The kernels of PyTorch's own `nn.TransformerEncoderLayer` (PyTorch 1.5, 2020), for checking the
compute model against an independent measurement of that layer on a V100 (zsim.compute.layer_fit).

Not a layer zsim simulates in a scenario (those run Megatron-LM's lists, zsim.compute.kernels): this is
the layer Ivanov et al. timed ("Data Movement Is All You Need", MLSys 2021; github.com/spcl/substation,
`pytorch_profiling/transformer_layer.py`): `nn.TransformerEncoderLayer(h, a, 4h, activation)` in
training mode, dropout 0.1, the module and its input cast to fp16 with `.half()` (no AMP), post-LN.

The kernels follow PyTorch 1.5's Python code (torch/nn/functional.py `multi_head_attention_forward`,
torch/nn/modules/transformer.py `TransformerEncoderLayer.forward`), T = b·s tokens, e = element bytes:

  in_proj: F.linear on a 3-D input is `matmul` then `output += bias` (T × 3h × h, bias add);
  `q = q * scaling` (reads the strided chunk, writes T·h); `k.contiguous()`, `v.contiguous()` copy the
  chunks (q is already contiguous); `bmm(q, kᵀ)` (b·a batches of s×s×d, strided: no copy);
  softmax; dropout (PyTorch's fused_dropout writes a 1-byte mask); `bmm(attn, v)`;
  `transpose(0, 1).contiguous()`; out_proj (T × h × h, bias add); dropout1 and the residual add;
  norm1; linear1 (T × f × h, bias add); the activation; dropout; linear2 (T × h × f, bias add);
  dropout2 and the residual add; norm2.

Backward is autograd's reverse: per linear two GEMMs and a bias-gradient sum; each elementwise op's
backward (dropout: grad·mask·scale; relu: threshold_backward reads grad and output; softmax: reads
grad and output); layer norm's input gradient (reads dY, X; writes dX) and its weight/bias gradient
reduction (reads dY, X); the chunk's backward concatenating the q, k, v gradients; the residual
branches' gradient sums; and `AccumulateGrad` adding every parameter's gradient into its `.grad`
(the benchmark zeroes `.grad` with `zero_grad()`, which in 1.5 fills it with zeros, not None).
"""

from __future__ import annotations

from zsim.compute.kernel_list import Kernel, KernelList, gemm, linear_bwd, linear_fwd, mem, red


def encoder_layer_forward(b: int, s: int, h: int, a: int, f: int, e: int = 2,
                          activation: str = "relu") -> KernelList:
    """Forward kernels of one `nn.TransformerEncoderLayer(h, a, f)`: b sequences of s tokens."""
    T, d, N = b * s, h // a, b * a * s * s  # tokens, head dim, attention-score elements
    th, tf = T * h, T * f
    ks: list[Kernel] = []
    ks += linear_fwd("in_proj", T, 3 * h, h, True, e)
    ks.append(mem("q.scaling", 2 * e * th))
    ks.append(mem("kv.contiguous", 2 * e * 2 * th, count=2))
    ks.append(gemm("scores", s, s, d, b * a))
    ks.append(mem("softmax", 2 * e * N))
    ks.append(mem("attn.dropout", (2 * e + 1) * N))
    ks.append(gemm("context", s, d, s, b * a))
    ks.append(mem("context.contiguous", 2 * e * th))
    ks += linear_fwd("out_proj", T, h, h, True, e)
    ks += [mem("dropout1", (2 * e + 1) * th), mem("residual1", 3 * e * th), mem("norm1", 2 * e * th)]
    ks += linear_fwd("linear1", T, f, h, True, e)
    ks.append(mem(activation, 2 * e * tf))
    ks.append(mem("dropout", (2 * e + 1) * tf))
    ks += linear_fwd("linear2", T, h, f, True, e)
    ks += [mem("dropout2", (2 * e + 1) * th), mem("residual2", 3 * e * th), mem("norm2", 2 * e * th)]
    return KernelList("torch_encoder.fwd", tuple(ks))


def encoder_layer_backward(b: int, s: int, h: int, a: int, f: int, e: int = 2,
                           activation: str = "relu") -> KernelList:
    """Backward kernels of the same layer, in the order autograd runs them."""
    T, d, N = b * s, h // a, b * a * s * s
    th, tf = T * h, T * f
    params = 4 * h * h + 2 * h * f + 8 * h + f  # in_proj 3h²+3h, out_proj h²+h, linear1 hf+f, linear2 fh+h, norms 4h
    act_bwd = 3 * e * tf  # relu: threshold_backward(grad, output); gelu_backward(grad, input)
    ks: list[Kernel] = [mem("norm2.bwd", 3 * e * th), red("norm2.weight_grad", 2 * e * th),
                        mem("dropout2.bwd", (2 * e + 1) * th)]
    ks += linear_bwd("linear2", T, h, f, True, e)
    ks += [mem("dropout.bwd", (2 * e + 1) * tf), mem(f"{activation}.bwd", act_bwd)]
    ks += linear_bwd("linear1", T, f, h, True, e)
    ks.append(mem("residual2.grad_sum", 3 * e * th))
    ks += [mem("norm1.bwd", 3 * e * th), red("norm1.weight_grad", 2 * e * th),
           mem("dropout1.bwd", (2 * e + 1) * th)]
    ks += linear_bwd("out_proj", T, h, h, True, e)
    ks += [gemm("context.dgrad_probs", s, s, d, b * a), gemm("context.dgrad_value", s, d, s, b * a)]
    ks += [mem("attn.dropout.bwd", (2 * e + 1) * N), mem("softmax.bwd", 3 * e * N)]
    ks += [gemm("scores.dgrad_q", s, d, s, b * a), gemm("scores.dgrad_k", s, d, s, b * a)]
    ks.append(mem("q.scaling.bwd", 2 * e * th))
    ks.append(mem("chunk.bwd", 2 * e * 3 * th))  # the q, k, v gradients concatenated into one
    ks += linear_bwd("in_proj", T, 3 * h, h, True, e)
    ks.append(mem("residual1.grad_sum", 3 * e * th))
    ks.append(mem("accumulate_grad", 3 * e * params, count=12))  # .grad += new, per parameter tensor (12)
    return KernelList("torch_encoder.bwd", tuple(ks))
