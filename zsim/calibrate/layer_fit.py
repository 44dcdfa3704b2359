"""Fit the HBM efficiency of memory-bound kernels (`compute.hbm_efficiency`, docs/compute.md) to
published whole-layer timings of a transformer layer on a real V100, with the GEMMs priced by the
DeepBench fit, and say how well one layer shape predicts the other.

Why: the Kineto trace that fits `kernel_us` (zsim.calibrate.kernel_fit) cannot determine the HBM
bandwidth of elementwise kernels (its largest fits in L2). A transformer layer's softmax, dropout,
layer-norm, bias, activation and residual kernels move hundreds of MB each; their time is what a
layer's measured time leaves after its GEMMs.

The data (`TIMINGS`): Ivanov et al., "Data Movement Is All You Need" (MLSys 2021), repository
github.com/spcl/substation, README "Current Performance", the "PyTorch" column: one BERT-large encoder
layer (h 1024, 16 heads, MLP 4096), forward + backward, median ms over 100 iterations timed with CUDA
events behind a 1 ms wait kernel (so launch latency is hidden: GPU time), fp16 (`.half()`), on Lassen's
V100-SXM2 (the same part as DeepBench's DGX-1). The layer is PyTorch's `nn.TransformerEncoderLayer`
(`pytorch_profiling/transformer_layer.py`), whose kernels zsim.compute.torch_layer lists. These are not
ZeRO or Megatron-LM numbers: nothing `zsim validate paper` judges is used.

Model (docs/compute.md): layer time = Σ GEMM (the DeepBench tile-model fit, fixed) + Σ kernel fixed
times (`kernel_us`, `reduce_kernel_us`, fixed) + bytes / (HBM bandwidth × η). The one unknown x =
1/(HBM·η) is fitted by least squares over the timings (closed form: x = Σ Bᵢrᵢ / Σ Bᵢ², rᵢ the time
left after GEMMs and fixed times). Held-out: each timing alone fits η and predicts the other (2-fold).
"""

from __future__ import annotations

from dataclasses import dataclass

from zsim.compute.model import kernel_seconds
from zsim.compute.terms import ComputeTerms
from zsim.compute.torch_layer import encoder_layer_backward, encoder_layer_forward
from zsim.errors import ZsimError


@dataclass(frozen=True, slots=True)
class LayerTiming:
    """One measured forward + backward of an encoder layer: b sequences of s tokens, hidden h, a heads,
    MLP width f; `ms` milliseconds of GPU time."""

    b: int
    s: int
    h: int
    a: int
    f: int
    ms: float
    activation: str = "relu"


# github.com/spcl/substation README (commit 59d6830, 2020-07-27), "PyTorch" column, V100-SXM2, fp16.
SOURCE = "Ivanov et al. 2021 (github.com/spcl/substation README, PyTorch column): BERT-large layer, V100-SXM2, fp16"
TIMINGS = (LayerTiming(b=8, s=512, h=1024, a=16, f=4096, ms=9.14),
           LayerTiming(b=96, s=128, h=1024, a=16, f=4096, ms=18.43))


@dataclass(frozen=True, slots=True)
class LayerParts:
    """A timing split as the model sees it: GEMM seconds, kernel fixed seconds, memory-bound bytes."""

    timing: LayerTiming
    gemm_s: float
    fixed_s: float
    bytes: float

    def predict(self, bytes_per_s: float) -> float:
        """Predicted seconds with memory-bound kernels streaming at `bytes_per_s`."""
        return self.gemm_s + self.fixed_s + self.bytes / bytes_per_s


@dataclass(frozen=True, slots=True)
class LayerFit:
    hbm_efficiency: float  # fitted on every timing
    parts: tuple[LayerParts, ...]
    heldout: tuple[tuple[float, float], ...]  # per timing: (η fitted on the others, |error| predicting it)
    hbm_bytes_per_s: float

    def error(self, i: int) -> float:
        """Signed in-sample error of timing i under the joint fit."""
        p = self.parts[i]
        return p.predict(self.hbm_bytes_per_s * self.hbm_efficiency) / (p.timing.ms * 1e-3) - 1.0


def layer_parts(t: LayerTiming, terms: ComputeTerms, peak_flops: float, hbm_bytes_per_s: float) -> LayerParts:
    """Split the layer's kernels (fp16) into GEMM time, fixed per-kernel time and memory-bound bytes."""
    gemm = fixed = nbytes = 0.0
    for kl in (encoder_layer_forward(t.b, t.s, t.h, t.a, t.f, 2, t.activation),
               encoder_layer_backward(t.b, t.s, t.h, t.a, t.f, 2, t.activation)):
        for k in kl.kernels:
            if k.kind == "gemm":
                gemm += kernel_seconds(k, terms, peak_flops, hbm_bytes_per_s, "fp16", 2)
            else:
                per = terms.reduce_kernel_s if k.kind == "reduce" and terms.reduce_kernel_s is not None else terms.kernel_s
                fixed += k.count * per
                nbytes += k.bytes
    return LayerParts(t, gemm, fixed, nbytes)


def _fit_x(parts: list[LayerParts]) -> float:
    """Least-squares seconds per byte over `parts`; raises ZsimError where GEMMs alone exceed a timing."""
    rest = [(p.bytes, p.timing.ms * 1e-3 - p.gemm_s - p.fixed_s) for p in parts]
    if any(r <= 0 for _, r in rest):
        raise ZsimError("layer timings shorter than their GEMMs alone: the GEMM terms do not fit this GPU")
    return sum(b * r for b, r in rest) / sum(b * b for b, _ in rest)


def fit(terms: ComputeTerms, peak_fp16_flops: float, hbm_bytes_per_s: float,
        timings: tuple[LayerTiming, ...] = TIMINGS) -> LayerFit:
    """Fit η on `timings` for a GPU with these compute terms and peaks (FLOP/s, bytes/s).

    Raises:
        ZsimError: fewer than two timings, or a timing its GEMMs alone already exceed.
    """
    if len(timings) < 2:
        raise ZsimError("the layer fit needs at least two timings (one to fit, one to check)")
    parts = [layer_parts(t, terms, peak_fp16_flops, hbm_bytes_per_s) for t in timings]
    eta = 1.0 / (_fit_x(parts) * hbm_bytes_per_s)
    heldout = []
    for i, p in enumerate(parts):
        x = _fit_x(parts[:i] + parts[i + 1:])
        heldout.append((1.0 / (x * hbm_bytes_per_s), abs(p.predict(1.0 / x) / (p.timing.ms * 1e-3) - 1.0)))
    return LayerFit(eta, tuple(parts), tuple(heldout), hbm_bytes_per_s)


def report(lf: LayerFit) -> str:
    """A few lines: the fitted η, and per timing the split, the fit's error and the held-out error."""
    lines = [f"hbm_efficiency {lf.hbm_efficiency:.3f} ({lf.hbm_efficiency * lf.hbm_bytes_per_s / 1e9:.0f} GB/s), "
             f"fitted on {len(lf.parts)} timings: {SOURCE}"]
    for i, (p, (eta_other, err)) in enumerate(zip(lf.parts, lf.heldout)):
        t = p.timing
        lines.append(f"  b{t.b} s{t.s}: measured {t.ms:.2f} ms = GEMM {p.gemm_s * 1e3:.2f} + fixed "
                     f"{p.fixed_s * 1e3:.2f} + {p.bytes / 1e6:.0f} MB memory-bound; joint fit {lf.error(i):+.1%}; "
                     f"held out (η {eta_other:.3f} from the other): {err:.1%}")
    return "\n".join(lines)
