"""FlashAttention's kernel speed: the fraction of the GPU's 16-bit tensor peak that its fused attention
kernel reaches, by GPU generation, FlashAttention version, pass and sequence length, fitted to the
published benchmark tables.

Sources (throughput in TFLOPs/s, batch × seqlen = 16k tokens, hidden 2048 (16 heads of 128, 32 of 64, 8 of
256); the FLOPs counted as flash-attn's benchmarks count them: forward 4·b·s²·a·d, halved when causal;
backward 2.5 × the forward, for its five s×s×d matmuls, one of them the recomputed QKᵀ):
  [FA3] Shah, Bikshandi, Zhang, Thakkar, Ramani & Dao 2024, "FlashAttention-3: Fast and Accurate
        Attention with Asynchrony and Low-precision" (arXiv 2407.08608), §4.1, H100 80GB SXM5, BF16:
        Fig. 5 (forward, causal panels: head dims 64, 128 and 256) and Fig. 6 (backward, head dims 64 and
        128). The values are the labels the figure prints above its bars; those of head dims 64 and 256 were
        read from text transcriptions of the figure's panels (subtext.edge.nugit.net, whose head-dim-128
        panels give back the values read from the paper for zsim before, bar for bar). No causal backward
        panel and no backward panel at head dim 256 is published: the causal backward is the full-mask rate
        times the causal/full ratio measured on an H200 ([H200] below; until 2026-11-27 the full-mask rate
        alone, up to 94% too fast at 512 tokens), and the backward at head dim 256 is the head-dim-128 panel
        times the head-dim-256/128 ratio measured there (before commit ac0386f every head dim ran on the
        head-dim-128 panels, too fast on the H200 by up to 42% forward and 62% backward).
  [A100] held out, nothing fitted: flash-attn's FA2 forward timed on an A100 by a third party (A100_MEASURED_FWD,
        `a100_forward_check`; tests/test_flash_a100.py).
  [B200] Blackwell, measured by NVIDIA: github.com/NVIDIA/cudnn-frontend @ cb560b9 (v1.13.0, 2025-07-16),
        benchmark/sdpa_benchmark_training/artifacts/sdpa_bf16_benchmark_results_NVIDIA_B200.csv and
        sample_b200_bf16_run.txt: one B200, NGC PyTorch 25.06 (torch 2.8, cuDNN 9.10.2), flash-attn 2.7.4.post1;
        Llama 3.1 405B's attention (batch 1, 128 query heads, 8 KV heads, head dim 128), causal, bf16, forward and
        backward TFLOPs/s counted as flash-attn's (B200_MEASURED). FlashAttention-3 does not run on Blackwell (the
        README there: "FlashAttention-3 is currently not supported on NVIDIA's Blackwell generation GPUs"); what
        Transformer Engine runs there is cuDNN's fused attention, which zsim prices as `flash3` ("the FA3 class", as
        cuDNN's kernel on Hopper already is: [H200] below); `flash2` is flash-attn 2's own kernels (its Ampere code,
        about a third of cuDNN's rate on a B200). Both are the table's rates, interpolated in log2(sequence) (no curve:
        cuDNN's rate falls past 64k), as fractions of the B200's 2250 TFLOPs; held out: every other length predicted
        from its neighbours (`blackwell_report`, tests/test_flash_blackwell.py).
  [GB300] Blackwell Ultra (B300, GB300: compute capability 10.3) against Blackwell, measured by NVIDIA on both at once:
        the same repository @ 3929da2 (2026-05-08), benchmark/sdpa_benchmark_training/results/llama3.1/gb200/
        llama3.1_20260424_100750.csv and gb300/llama3.1_20260424_100757.csv (cuDNN 9.22, one GB200 and one GB300,
        Llama 3.1 at 64 query heads and 8 KV heads, head dim 128, batch 2, causal, bf16, non-deterministic
        backward): the GB300's rate over the GB200's (ULTRA_OVER_BLACKWELL), 1.08-1.25x: what its doubled SFU
        exponential rate buys (NVIDIA's "2x attention-layer acceleration" is the softmax's share, not the
        kernel's). zsim prices a Blackwell Ultra GPU's attention as the [B200] table's fraction of the peak times
        that ratio (interpolated in log2(sequence), the ends' beyond them): the table's era (cuDNN 9.10) with the
        generation's measured step. The B300 (HGX, 1100 W) takes the GB300's ratio (an assumption).
  [B200 FP8] cuDNN's FP8 fused attention on a B200 against its bf16 one, measured in one run: the same repository @
        cb560b9, benchmark/sdpa_benchmark_training/artifacts/sdpa_fp8_benchmark_results_NVIDIA_B200.csv and
        sample_b200_fp8_run.txt (cuDNN 9.10.2, Llama 3.1 405B's attention, causal, 512-131,072 tokens): FP8 over
        bf16 TFLOPs/s (FP8_OVER_BF16), 0.79-1.46x (below 1 at 1k tokens and less, where the casts cost more than the
        matmuls save). precision.fp8_attention prices a Blackwell GPU's `flash3` kernel at its rate times that ratio.
The model (one per GPU, version and pass): rate(s) = r_max · s / (s + s_half), a saturating curve
(occupancy grows with the number of query blocks per head until the SMs are full); 1/rate is linear
in 1/s, so (r_max, s_half) is an ordinary least-squares fit. It is fitted on the published points at
512, 2k and 8k tokens and checked on 1k, 4k and 16k, which it never saw (tests/test_attention_recompute_sp.py;
the held-out error is printed by `fit_report`). Between the published head dims the efficiency is
interpolated linearly in log2(head dim); below 64 the 64 panel is taken (flash-attn runs no head dim
above 256: MAX_HEAD_DIM). FlashAttention-3 is Hopper-only (flash-attn hopper/README: "H100 / H800 GPU");
FlashAttention-2 needs Ampere or newer (flash-attn README: "Ampere, Ada, or Hopper GPUs"); neither runs fp32
(fp16 and bf16 only). On Blackwell (compute capability 10.x) both versions are the [B200] table's (above).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

# Published points: (sequence length, TFLOPs/s). H100 SXM5 at 989 dense 16-bit TFLOPs (datasheet).
H100_PEAK_TFLOPS = 989.0
A100_PEAK_TFLOPS = 312.0  # NVIDIA A100 datasheet: FP16/BF16 tensor core, dense
HEAD_DIMS = (64, 128, 256)  # the published panels' head dims
MAX_HEAD_DIM = 256  # flash-attn csrc/flash_attn/flash_api.cpp: "FlashAttention forward only supports head dimension at most 256"
PUBLISHED: dict[tuple[int, str, int], tuple[tuple[int, float], ...]] = {
    # [FA3] Fig. 5, forward, causal, H100: (version, 'fwd', head dim)
    (3, "fwd", 64): ((512, 197.0), (1024, 265.0), (2048, 371.0), (4096, 420.0), (8192, 460.0), (16384, 473.0)),
    (2, "fwd", 64): ((512, 180.0), (1024, 229.0), (2048, 262.0), (4096, 284.0), (8192, 295.0), (16384, 299.0)),
    (3, "fwd", 128): ((512, 292.0), (1024, 423.0), (2048, 521.0), (4096, 579.0), (8192, 602.0), (16384, 616.0)),
    (2, "fwd", 128): ((512, 191.0), (1024, 260.0), (2048, 298.0), (4096, 319.0), (8192, 333.0), (16384, 335.0)),
    (3, "fwd", 256): ((512, 286.0), (1024, 427.0), (2048, 537.0), (4096, 612.0), (8192, 628.0), (16384, 642.0)),
    (2, "fwd", 256): ((512, 208.0), (1024, 251.0), (2048, 278.0), (4096, 293.0), (8192, 297.0), (16384, 298.0)),
    # [FA3] Fig. 6, backward (full mask), H100
    (3, "bwd", 64): ((512, 272.0), (1024, 363.0), (2048, 422.0), (4096, 453.0), (8192, 472.0), (16384, 474.0)),
    (2, "bwd", 64): ((512, 198.0), (1024, 238.0), (2048, 264.0), (4096, 279.0), (8192, 287.0), (16384, 291.0)),
    (3, "bwd", 128): ((512, 316.0), (1024, 424.0), (2048, 501.0), (4096, 542.0), (8192, 559.0), (16384, 561.0)),
    (2, "bwd", 128): ((512, 214.0), (1024, 260.0), (2048, 291.0), (4096, 310.0), (8192, 318.0), (16384, 322.0)),
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
# The backward at head dim 256, measured: [H200] data/device/20261127-h200-attention-hd, the same kernels and
# tokens at head dim 256 (8 heads): (seq, full-mask TFLOPs/s). Its ratio to MEASURED_BWD's full-mask rate at
# FIT_LENGTHS, averaged, scales the published head-dim-128 backward (`backward_head_dim_factor`).
MEASURED_BWD_HD256: dict[int, tuple[tuple[int, float], ...]] = {
    2: ((512, 158.505), (1024, 194.900), (2048, 224.456), (4096, 243.134), (8192, 254.035), (16384, 257.892)),
    3: ((512, 222.493), (1024, 274.285), (2048, 305.231), (4096, 386.610), (8192, 367.895), (16384, 361.930)),
}
# [FA2] §4.1: the plateaus on A100, as fractions of its peak.
A100_PLATEAU = {"fwd": 0.73, "bwd": 0.63}
# An A100 table the A100 construction never saw (held out; found 2026-11-27): flash-attn's FA2 forward timed on
# an A100 (SM80, "peak frequency is 1410MHZ and it will drop to ~1200MHZ" under its power limit), github.com/
# liangan1/GPU_travel @ 07d0469, performance/flash-attn/README.md, the causal table's rows with seqlen_q =
# seqlen_kv: (seq, kv heads, TFLOPs/s), 32 query heads of 128 (the head dim the rows' ms and TFLOPs/s imply:
# 4·b·s²·32·128/2 over the time), batch 16 at 1k and 1 at 4k. Its q 1k / kv 4k rows are left out: zsim prices
# a causal mask on a square score matrix only, and the file's versions disagree on them (98.10 and 171 at the
# same 1.401 ms).
A100_MEASURED_FWD = ((1024, 32, 143.70), (1024, 8, 140.59), (4096, 32, 156.27), (4096, 8, 159.41))

# [B200] (module docstring): (sequence length, forward TFLOPs/s, backward TFLOPs/s), causal, head dim 128, of
# 'pyt_cudnn' (cuDNN 9.10.2 through PyTorch SDPA: zsim's `flash3` on Blackwell) and 'flash_attention' (flash-attn
# 2.7.4's own kernels: `flash2`).
B200_PEAK_TFLOPS = 2250.0  # NVIDIA HGX B200 datasheet: BF16 36 PFLOPS sparse per 8 GPUs, dense per GPU
B200_MEASURED: dict[int, tuple[tuple[int, float, float], ...]] = {
    3: ((512, 54.727, 38.041), (1024, 189.172, 150.773), (2048, 485.444, 367.518), (4096, 874.116, 694.726),
        (8192, 1197.391, 939.954), (16384, 1349.763, 1072.799), (32768, 1429.616, 1124.432),
        (65536, 1448.032, 1058.154), (131072, 1330.234, 1023.503)),
    2: ((512, 45.922, 28.068), (1024, 134.579, 105.048), (2048, 246.384, 203.160), (4096, 345.894, 287.865),
        (8192, 401.998, 334.416), (16384, 427.981, 354.469), (32768, 438.671, 363.686), (65536, 443.073, 366.239),
        (131072, 445.094, 365.770)),
}

# [GB300] (module docstring): (sequence length, forward, backward) GB300 TFLOPs/s over GB200 TFLOPs/s, cuDNN 9.22,
# causal bf16, batch 2 (GB300 / GB200 rows: 2048: 1373/1097, 967/885; 4096: 1703/1408, 1248/1148; 8192: 1856/1574,
# 1435/1332; 16384: 1915/1708, 1507/1328; 32768: 1953/1622, 1490/1226)
ULTRA_OVER_BLACKWELL = ((2048, 1373 / 1097, 967 / 885), (4096, 1703 / 1408, 1248 / 1148), (8192, 1856 / 1574, 1435 / 1332),
                        (16384, 1915 / 1708, 1507 / 1328), (32768, 1953 / 1622, 1490 / 1226))

# [B200 FP8] (module docstring): (sequence length, forward, backward) cuDNN FP8 TFLOPs/s over bf16 TFLOPs/s, one B200,
# causal (FP8 / bf16 rows: 512: 120.971/133.318, 135.341/171.986; 1024: 338.827/346.368, 306.416/329.692; 2048:
# 717.023/670.199, 588.690/499.822; 4096: 1095.271/996.425, 911.167/801.509; 8192: 1370.101/1248.265, 1214.331/987.670;
# 16384: 1559.697/1365.371, 1434.799/1136.796; 32768: 1651.456/1434.986, 1561.247/1175.410; 65536: 1690.274/1423.556,
# 1610.145/1205.278; 131072: 1705.223/1329.590, 1601.969/1097.918)
FP8_OVER_BF16 = ((512, 120.971 / 133.318, 135.341 / 171.986), (1024, 338.827 / 346.368, 306.416 / 329.692),
                 (2048, 717.023 / 670.199, 588.690 / 499.822), (4096, 1095.271 / 996.425, 911.167 / 801.509),
                 (8192, 1370.101 / 1248.265, 1214.331 / 987.670), (16384, 1559.697 / 1365.371, 1434.799 / 1136.796),
                 (32768, 1651.456 / 1434.986, 1561.247 / 1175.410), (65536, 1690.274 / 1423.556, 1610.145 / 1205.278),
                 (131072, 1705.223 / 1329.590, 1601.969 / 1097.918))

# Compute capabilities (CUDA): 80 Ampere, 90 Hopper, 100 Blackwell, 103 Blackwell Ultra (B300, GB300: sm_103).
AMPERE, HOPPER, BLACKWELL, BLACKWELL_ULTRA = 80, 90, 100, 103


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
def h100_curve(version: int, phase: str, head_dim: int = 128) -> Curve:
    """The fitted H100 curve of FlashAttention `version` (2 or 3) and `phase` ('fwd' or 'bwd') at a published
    `head_dim` (HEAD_DIMS); the backward at 256, which is not published, is the 128 curve scaled by
    `backward_head_dim_factor`. Raises KeyError for a head dim with no panel (`h100_efficiency` interpolates)."""
    if phase == "bwd" and (version, phase, head_dim) not in PUBLISHED:
        if head_dim != 256:
            raise KeyError((version, phase, head_dim))
        base = h100_curve(version, phase, 128)
        return Curve(base.peak_fraction * backward_head_dim_factor(version), base.s_half)
    points = tuple(p for p in PUBLISHED[(version, phase, head_dim)] if p[0] in FIT_LENGTHS)
    return fit_curve(points, H100_PEAK_TFLOPS)


@functools.lru_cache(maxsize=None)
def backward_head_dim_factor(version: int) -> float:
    """The full-mask backward's rate at head dim 256 over its rate at 128, measured on an H200 ([H200]:
    MEASURED_BWD_HD256 over MEASURED_BWD), the mean of its ratios at FIT_LENGTHS: FA2 0.90, the FA3 class
    (cuDNN) 0.67. Held out: the other lengths, and the same construction at head dim 64 against the
    published 64 panel (tests/test_flash_measured.py)."""
    full_128 = {s: full for s, _, full in MEASURED_BWD[version]}
    ratios = [r / full_128[s] for s, r in MEASURED_BWD_HD256[version] if s in FIT_LENGTHS]
    return sum(ratios) / len(ratios)


def h100_efficiency(version: int, phase: str, seq: int, head_dim: int = 128) -> float:
    """The H100 curve's fraction of peak at `seq` tokens and `head_dim`: a published panel's curve, linear in
    log2(head dim) between the two panels around it, the nearest panel below 64 or above 256."""
    if head_dim <= HEAD_DIMS[0] or head_dim >= HEAD_DIMS[-1] or head_dim in HEAD_DIMS:
        nearest = min(HEAD_DIMS, key=lambda d: abs(math.log2(head_dim / d)))
        return h100_curve(version, phase, nearest).at(seq)
    lo = max(d for d in HEAD_DIMS if d < head_dim)
    hi = min(d for d in HEAD_DIMS if d > head_dim)
    t = math.log2(head_dim / lo) / math.log2(hi / lo)
    return (1 - t) * h100_curve(version, phase, lo).at(seq) + t * h100_curve(version, phase, hi).at(seq)


@functools.lru_cache(maxsize=None)
def causal_backward(version: int) -> Curve:
    """The causal backward's rate over the full-mask backward's, ratio(s) = a · s / (s + s_half), fitted
    (fit_curve, peak 1) on the measured ratios at FIT_LENGTHS (MEASURED_BWD); 1k, 4k, 16k and the head
    dimensions 64 and 256 (data/device/20261127-h200-attention-hd) are held out (tests/test_flash_measured.py).
    The same ratio is taken for FlashAttention-2 on Ampere (an assumption: measured on Hopper only)."""
    points = tuple((s, causal / full) for s, causal, full in MEASURED_BWD[version] if s in FIT_LENGTHS)
    return fit_curve(points, 1.0)


def supported(version: int, compute_capability: int) -> str:
    """'' when FlashAttention `version` runs on a GPU of `compute_capability`, else why not (`flash3` on Blackwell
    is cuDNN's fused attention, the FA3 class: the module docstring)."""
    if version == 3 and compute_capability // 10 not in (HOPPER // 10, BLACKWELL // 10):
        return ("FlashAttention-3 runs on Hopper GPUs only (compute capability 9.x; flash-attn hopper/README), and "
                "zsim's flash3 on Blackwell is cuDNN's fused attention")
    if compute_capability < AMPERE:
        return ("FlashAttention-2 needs an Ampere or newer GPU (compute capability >= 8.0; flash-attn README); "
                "use model.attention: standard")
    return ""


def efficiency(version: int, phase: str, compute_capability: int, seq: int, head_dim: int = 128,
               fp8: bool = False) -> float:
    """Fraction of the GPU's 16-bit tensor peak FlashAttention `version` reaches in `phase` ('fwd' or
    'bwd') at `seq` tokens per sequence and `head_dim` (a head's width). Hopper: the H100 fit
    (`h100_efficiency`); Ampere (and anything between, e.g. Ada): FA2's A100 plateau with the FA2-on-H100
    shape at head dim 128, times FA2-on-H100's rate at `head_dim` over its rate at 128 (an assumption: no
    A100 panel at other head dims is used). `fp8`: cuDNN's FP8 attention on Blackwell, the rate times
    FP8_OVER_BF16 ([B200 FP8]). Raises ValueError where it does not run (`supported`); the scenario loader
    checks that first and names the key."""
    why = supported(version, compute_capability)
    if why:
        raise ValueError(why)
    assert not fp8 or (version == 3 and compute_capability // 10 == BLACKWELL // 10), "FP8 attention: the loader refuses it"
    if compute_capability // 10 == BLACKWELL // 10:  # the measured B200 table (causal already), by head dim as Hopper's
        ultra = ultra_ratio(phase, seq) if compute_capability >= BLACKWELL_ULTRA else 1.0
        ultra *= fp8_ratio(phase, seq) if fp8 else 1.0
        return (blackwell_rate(version, phase, seq) / B200_PEAK_TFLOPS * ultra
                * _head_dim_factor(version, phase, seq, head_dim))
    causal = causal_backward(version).at(seq) if phase == "bwd" else 1.0  # the forward's fit is causal already
    if compute_capability // 10 == HOPPER // 10:
        return h100_efficiency(version, phase, seq, head_dim) * causal
    shape = h100_curve(2, phase)
    by_head_dim = h100_efficiency(2, phase, seq, head_dim) / shape.at(seq)
    return Curve(A100_PLATEAU[phase], shape.s_half).at(seq) * by_head_dim * causal


def _head_dim_factor(version: int, phase: str, seq: int, head_dim: int) -> float:
    """A head of `head_dim` against one of 128, as the H100 fit has it (an assumption off Hopper)."""
    return 1.0 if head_dim == 128 else h100_efficiency(version, phase, seq, head_dim) / h100_efficiency(version, phase, seq, 128)


def _interpolate(points: tuple[tuple[int, float], ...], seq: int) -> float:
    """The rate at `seq`, linear in log2(seq) between the measured lengths, the end's rate beyond them."""
    if seq <= points[0][0]:
        return points[0][1]
    for (s0, r0), (s1, r1) in zip(points, points[1:]):
        if seq <= s1:
            t = math.log2(seq / s0) / math.log2(s1 / s0)
            return r0 + t * (r1 - r0)
    return points[-1][1]


def blackwell_rate(version: int, phase: str, seq: int) -> float:
    """TFLOPs/s of FlashAttention `version` (2: flash-attn 2; 3: cuDNN's fused attention) on a B200 at `seq` tokens,
    head dim 128, causal: B200_MEASURED interpolated."""
    col = 1 if phase == "fwd" else 2
    return _interpolate(tuple((row[0], row[col]) for row in B200_MEASURED[version]), seq)


def ultra_ratio(phase: str, seq: int) -> float:
    """A Blackwell Ultra GPU's attention rate over a Blackwell one's at `seq` tokens ([GB300], ULTRA_OVER_BLACKWELL
    interpolated in log2(seq))."""
    col = 1 if phase == "fwd" else 2
    return _interpolate(tuple((row[0], row[col]) for row in ULTRA_OVER_BLACKWELL), seq)


def fp8_ratio(phase: str, seq: int) -> float:
    """cuDNN's FP8 attention rate over its bf16 one on a B200 at `seq` tokens ([B200 FP8], FP8_OVER_BF16 interpolated in
    log2(seq))."""
    col = 1 if phase == "fwd" else 2
    return _interpolate(tuple((row[0], row[col]) for row in FP8_OVER_BF16), seq)


def blackwell_report() -> list[tuple[int, str, int, float, float]]:
    """(version, phase, seq, measured TFLOPs/s, predicted from its two neighbours alone) for every interior length
    of B200_MEASURED whose neighbours sit a factor 2 either side: the interpolation's held-out error."""
    rows = []
    for version, table in sorted(B200_MEASURED.items()):
        for phase, col in (("fwd", 1), ("bwd", 2)):
            pts = [(row[0], row[col]) for row in table]
            for i in range(1, len(pts) - 1):
                rows.append((version, phase, pts[i][0], pts[i][1], _interpolate((pts[i - 1], pts[i + 1]), pts[i][0])))
    return rows


def a100_forward_check(sustained_ratio: float) -> list[tuple[int, int, float, float]]:
    """(seq, kv heads, measured TFLOPs/s, zsim's TFLOPs/s) for each row of A100_MEASURED_FWD: zsim's rate is
    the A100 construction (`efficiency`, FA2 forward, head dim 128) × A100_PEAK_TFLOPS × `sustained_ratio`,
    the A100 profile's power-capped share of peak that tensor-core work runs at (zsim.compute.model)."""
    return [(seq, kv, measured, efficiency(2, "fwd", AMPERE, seq, 128) * A100_PEAK_TFLOPS * sustained_ratio)
            for seq, kv, measured in A100_MEASURED_FWD]


def fit_report() -> list[tuple[int, str, int, int, float, float]]:
    """(version, phase, head dim, seq, published TFLOPs/s, fitted TFLOPs/s) for every held-out H100 point."""
    rows = []
    for (version, phase, head_dim), points in sorted(PUBLISHED.items()):
        curve = h100_curve(version, phase, head_dim)
        rows += [(version, phase, head_dim, s, r, curve.at(s) * H100_PEAK_TFLOPS)
                 for s, r in points if s not in FIT_LENGTHS]
    return rows
