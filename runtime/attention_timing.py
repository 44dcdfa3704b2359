"""Part (e) of the device check: fused attention timed on this GPU, in the layout of the published
FlashAttention benchmark tables that `zsim.compute.flash` is fitted to, so that the fit is checked on a
GPU and a build it never saw.

The layout is flash-attn's benchmark's (benchmarks/benchmark_flash_attention.py; FlashAttention-3
paper §4.1): batch × sequence = 16,384 tokens, hidden 2048 (16 heads of 128; 32 of 64 or 8 of 256 at the
other head dimensions, `head_dims`), bf16, causal and not, forward and backward, at 512 to 16k tokens. FLOPs are counted as those tables count them: forward 4·b·s²·a·d,
halved when causal; backward 2.5 × the forward. Each backend of
`torch.nn.functional.scaled_dot_product_attention` is forced in turn (`torch.nn.attention.sdpa_kernel`):
`flash` is FlashAttention-2 as vendored in PyTorch, `cudnn` cuDNN's fused attention, `efficient`
xFormers' memory-efficient kernel. A backend this GPU or build lacks is recorded with its error.
Times are CUDA-event medians of five timings of `reps` calls each.
"""

from __future__ import annotations

import csv
import time
from pathlib import Path
from typing import Any

TOKENS = 16_384
HIDDEN = 2048  # heads = HIDDEN // head dim, as the FlashAttention-3 paper's benchmarks keep it
HEAD_DIM = 128
LENGTHS = (512, 1024, 2048, 4096, 8192, 16384)
BACKENDS = ("flash", "cudnn", "efficient")
DRY_LENGTHS = (32, 64)
DRY_BACKENDS = ("math",)
COLUMNS = ("backend", "pass", "causal", "seq_len", "batch", "heads", "head_dim", "time_ms", "tflops", "error")


def flops(batch: int, seq: int, heads: int, head_dim: int, causal: bool, phase: str) -> float:
    """The benchmark's FLOP count (flash-attn benchmark_flash_attention.py, flops())."""
    f = 4 * batch * seq * seq * heads * head_dim / (2 if causal else 1)
    return f if phase == "fwd" else 2.5 * f


def _median_seconds(torch: Any, fn: Any, cuda: bool) -> float:
    fn()  # warm-up: kernel selection, workspace
    t0 = time.perf_counter()
    fn()
    if cuda:
        torch.cuda.synchronize()
    first = time.perf_counter() - t0
    reps = max(1, min(50, int(5e-3 / max(first, 1e-6))))

    def timed() -> float:
        if not cuda:
            t = time.perf_counter()
            for _ in range(reps):
                fn()
            return (time.perf_counter() - t) / reps
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1000.0 / reps
    return sorted(timed() for _ in range(5))[2]


def time_attention(torch: Any, backend: str, seq: int, causal: bool, device: Any, batch: int,
                   head_dim: int = HEAD_DIM) -> tuple[float, float]:
    """(forward seconds, backward seconds) of one fused attention call of `batch` × `seq` tokens."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    kernel = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
              "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}[backend]
    dtype = torch.bfloat16
    heads = HIDDEN // head_dim
    q, k, v = (torch.randn(batch, heads, seq, head_dim, dtype=dtype, device=device, requires_grad=True)
               for _ in range(3))
    grad = torch.randn(batch, heads, seq, head_dim, dtype=dtype, device=device)
    cuda = device.type == "cuda"
    sdpa = torch.nn.functional.scaled_dot_product_attention
    with sdpa_kernel(kernel):
        with torch.no_grad():
            fwd = _median_seconds(torch, lambda: sdpa(q, k, v, is_causal=causal), cuda)
        out = sdpa(q, k, v, is_causal=causal)
        bwd = _median_seconds(torch, lambda: torch.autograd.grad(out, (q, k, v), grad, retain_graph=True), cuda)
    return fwd, bwd


def attention_table(out: Path, dry: bool, deadline: float, head_dims: tuple[int, ...] = (HEAD_DIM,)) -> dict:
    """Write `attention.csv` (COLUMNS), one block of rows per head dimension in `head_dims`; returns what
    the manifest records."""
    import torch

    device = torch.device("cpu" if dry else "cuda")
    rows, skipped = 0, 0
    path = out / "attention.csv"
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(COLUMNS)
        for head_dim in head_dims:
            heads = HIDDEN // head_dim
            for backend in DRY_BACKENDS if dry else BACKENDS:
                for causal in (True, False):
                    for seq in DRY_LENGTHS if dry else LENGTHS:
                        if time.monotonic() > deadline:
                            skipped += 1
                            continue
                        batch = max(1, TOKENS // seq) if not dry else 1
                        try:
                            fwd, bwd = time_attention(torch, backend, seq, causal, device, batch, head_dim)
                        except Exception as exc:  # noqa: BLE001 - a backend this build lacks is data
                            writer.writerow([backend, "both", causal, seq, batch, heads, head_dim, "", "",
                                             f"{type(exc).__name__}: {str(exc)[:200]}"])
                            continue
                        for phase, seconds in (("fwd", fwd), ("bwd", bwd)):
                            f = flops(batch, seq, heads, head_dim, causal, phase)
                            writer.writerow([backend, phase, causal, seq, batch, heads, head_dim,
                                             f"{seconds * 1e3:.6f}", f"{f / seconds / 1e12:.6g}", ""])
                            rows += 1
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
    return {"table": path.name, "rows": rows, "skipped_for_time": skipped}
