"""FlashAttention's kernel speed: the fraction of the GPU's 16-bit tensor peak that its fused attention
kernel reaches, by GPU generation, FlashAttention version, pass and sequence length, fitted to the
published benchmark tables.

Sources (throughput in TFLOPs/s at head dim 128, batch × seqlen = 16k tokens, 16 heads; the FLOPs
counted as flash-attn's benchmarks count them: forward 4·b·s²·a·d, halved when causal; backward 2.5 ×
the forward, for its five s×s×d matmuls, one of them the recomputed QKᵀ):
  [FA3] Shah, Bikshandi, Zhang, Thakkar, Ramani & Dao 2024, "FlashAttention-3: Fast and Accurate
        Attention with Asynchrony and Low-precision", §4.1, Fig. 5 (forward, causal, head dim 128,
        H100 80GB SXM5, BF16) and Fig. 6 (backward, head dim 128; no causal panel is published for
        the backward: the full-mask rate times the causal/full ratio measured on an H200, [H200] below;
        until 2026-11-27 the full-mask rate alone, up to 94% too fast at 512 tokens).
  [FA2] Dao 2023, "FlashAttention-2: Faster Attention with Better Parallelism and Work Partitioning",
        abstract and §4.1: on A100 the forward reaches up to 73% of the theoretical maximum, the
        backward up to 63%. No A100 table is used here: the A100 curve takes those plateaus with the
        FA2-on-H100 curve's shape (its half-saturation length), an assumption stated in docs/compute.md.
The model (one per GPU, version and pass): rate(s) = r_max · s / (s + s_half), a saturating curve
(occupancy grows with the number of query blocks per head until the SMs are full); 1/rate is linear
in 1/s, so (r_max, s_half) is an ordinary least-squares fit. It is fitted on the published points at
512, 2k and 8k tokens and checked on 1k, 4k and 16k, which it never saw (tests/test_flash.py; the
held-out error is printed by `fit_report`). FlashAttention-3 is Hopper-only (flash-attn hopper/
README: "H100 / H800 GPU"); FlashAttention-2 needs Ampere or newer (flash-attn README: "Ampere, Ada,
or Hopper GPUs"); neither runs fp32 (fp16 and bf16 only).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

# Published points: (sequence length, TFLOPs/s). H100 SXM5 at 989 dense 16-bit TFLOPs (datasheet).
H100_PEAK_TFLOPS = 989.0
A100_PEAK_TFLOPS = 312.0  # NVIDIA A100 datasheet: FP16/BF16 tensor core, dense
PUBLISHED: dict[tuple[int, str], tuple[tuple[int, float], ...]] = {
    # [FA3] Fig. 5, forward, causal, head dim 128, H100
    (3, "fwd"): ((512, 292.0), (1024, 423.0), (2048, 521.0), (4096, 579.0), (8192, 602.0), (16384, 616.0)),
    (2, "fwd"): ((512, 191.0), (1024, 260.0), (2048, 298.0), (4096, 319.0), (8192, 333.0), (16384, 335.0)),
    # [FA3] Fig. 6, backward, head dim 128, H100
    (3, "bwd"): ((512, 316.0), (1024, 424.0), (2048, 501.0), (4096, 542.0), (8192, 559.0), (16384, 561.0)),
    (2, "bwd"): ((512, 214.0), (1024, 260.0), (2048, 291.0), (4096, 310.0), (8192, 318.0), (16384, 322.0)),
}
FIT_LENGTHS = (512, 2048, 8192)  # the fit's half; 1k, 4k and 16k are held out
# The causal backward, measured: no causal backward panel is published, and a causal mask costs the
# backward more than its halved FLOPs (the diagonal blocks are partly masked and the key blocks' work is
# uneven). [H200] zsim's device check, part (e), on an H200 (989 dense TFLOPs, the H100's), 2026-11-27,
# data/device/20261127-h200-attention: PyTorch 2.11's FlashAttention-2 ('flash') and cuDNN 9.19's fused
# attention ('cudnn', the FlashAttention-3 class zsim prices on Hopper), head dim 128, hidden 2048, 16k
# tokens, bf16: (seq, causal TFLOPs/s, full-mask TFLOPs/s), FLOPs counted as the published tables count them.
MEASURED_BWD: dict[int, tuple[tuple[int, float, float], ...]] = {
    2: ((512, 110.286, 172.620), (1024, 155.040, 212.744), (2048, 195.098, 248.385), (4096, 235.819, 272.090),
        (8192, 269.201, 290.822), (16384, 300.293, 299.128)),
    3: ((512, 199.368, 316.450), (1024, 282.683, 413.582), (2048, 364.586, 481.223), (4096, 436.108, 522.439),
        (8192, 506.034, 555.878), (16384, 545.320, 583.341)),
}
# [FA2] §4.1: the plateaus on A100, as fractions of its peak.
A100_PLATEAU = {"fwd": 0.73, "bwd": 0.63}

# Compute capabilities (CUDA): 80 Ampere, 90 Hopper.
AMPERE, HOPPER = 80, 90


@dataclass(frozen=True, slots=True)
class Curve:
    """rate(s) = peak_fraction · s / (s + s_half): the fraction of the 16-bit tensor peak at s tokens."""

    peak_fraction: float
    s_half: float

    def at(self, seq: int) -> float:
        return self.peak_fraction * seq / (seq + self.s_half)


def fit_curve(points: tuple[tuple[int, float], ...], peak_tflops: float) -> Curve:
    """Least squares of 1/rate = 1/r_max + (s_half/r_max)·(1/s) over `points` (s, TFLOPs/s)."""
    xs = [1.0 / s for s, _ in points]
    ys = [1.0 / r for _, r in points]
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    r_max = 1.0 / (my - slope * mx)
    return Curve(peak_fraction=r_max / peak_tflops, s_half=slope * r_max)


@functools.lru_cache(maxsize=None)
def h100_curve(version: int, phase: str) -> Curve:
    """The fitted H100 curve of FlashAttention `version` (2 or 3) and `phase` ('fwd' or 'bwd')."""
    points = tuple(p for p in PUBLISHED[(version, phase)] if p[0] in FIT_LENGTHS)
    return fit_curve(points, H100_PEAK_TFLOPS)


@functools.lru_cache(maxsize=None)
def causal_backward(version: int) -> Curve:
    """The causal backward's rate over the full-mask backward's, ratio(s) = a · s / (s + s_half), fitted
    (fit_curve, peak 1) on the measured ratios at FIT_LENGTHS (MEASURED_BWD); 1k, 4k, 16k and the head
    dimensions 64 and 256 (data/device/20261127-h200-attention-hd) are held out (tests/test_flash_measured.py).
    The same ratio is taken for FlashAttention-2 on Ampere (an assumption: measured on Hopper only)."""
    points = tuple((s, causal / full) for s, causal, full in MEASURED_BWD[version] if s in FIT_LENGTHS)
    return fit_curve(points, 1.0)


def supported(version: int, compute_capability: int) -> str:
    """'' when FlashAttention `version` runs on a GPU of `compute_capability`, else why not."""
    if version == 3 and compute_capability // 10 != HOPPER // 10:
        return "FlashAttention-3 runs on Hopper GPUs only (compute capability 9.x; flash-attn hopper/README)"
    if compute_capability < AMPERE:
        return ("FlashAttention-2 needs an Ampere or newer GPU (compute capability >= 8.0; flash-attn README); "
                "use model.attention: standard")
    return ""


def efficiency(version: int, phase: str, compute_capability: int, seq: int) -> float:
    """Fraction of the GPU's 16-bit tensor peak FlashAttention `version` reaches in `phase` ('fwd' or
    'bwd') at `seq` tokens per sequence. Hopper: the H100 fit; Ampere (and anything between, e.g.
    Ada): FA2's A100 plateau with the FA2-on-H100 shape. Raises ValueError where it does not run
    (`supported`); the scenario loader checks that first and names the key."""
    why = supported(version, compute_capability)
    if why:
        raise ValueError(why)
    causal = causal_backward(version).at(seq) if phase == "bwd" else 1.0  # the forward's fit is causal already
    if compute_capability // 10 == HOPPER // 10:
        return h100_curve(version, phase).at(seq) * causal
    shape = h100_curve(2, phase)
    return Curve(A100_PLATEAU[phase], shape.s_half).at(seq) * causal


def fit_report() -> list[tuple[int, str, int, float, float]]:
    """(version, phase, seq, published TFLOPs/s, fitted TFLOPs/s) for every held-out H100 point."""
    rows = []
    for (version, phase), points in sorted(PUBLISHED.items()):
        curve = h100_curve(version, phase)
        rows += [(version, phase, s, r, curve.at(s) * H100_PEAK_TFLOPS) for s, r in points if s not in FIT_LENGTHS]
    return rows
