"""Fit the memory-bound terms of the compute model (docs/compute.md: `kernel_us`, `hbm_efficiency`) to a
real Kineto (PyTorch profiler) trace, and say how well the fit predicts kernels it never saw.

What is read: every GPU kernel of PyTorch's elementwise and reduction families (`at::native::
*elementwise_kernel*`, `at::native::reduce_kernel*`), linked to the aten op that launched it (kernel
`correlation` → the `cudaLaunchKernel` runtime event → the innermost `cpu_op` on the same thread
enclosing it), whose `Input Dims` and `Input type` give the bytes moved:
  - every tensor input is read once (numel × element size), the output written once (numel of the
    largest input, the first tensor's element size);
  - an in-place op (`add_`, `addcmul_`, ...) writes its first input; `fill_`/`zero_` only write it and
    `copy_` writes its first input and reads its second;
  - an out-of-place op given more tensors than its arity (`mul(self, other, out)`) writes the last;
  - Python scalars (empty dims) move nothing.
Kernel classes: `stream` (elementwise), `reduce` (sum, mean, norm, softmax, log_softmax) and `rng`
(dropout, bernoulli); a class is fitted only where the trace holds enough distinct sizes.

Model per class: duration = a + bytes / B (least squares, numpy.linalg.lstsq), but only where the class
holds kernels that move more than the GPU's L2 cache (`l2_bytes`; V100: 6 MiB, V100 whitepaper) and
at least MIN_SIZES distinct sizes: below that, operands written by the previous kernel are still in L2
and the slope measures L2, not HBM. Otherwise only a is fitted, as the mean duration of the class's
kernels of at most SMALL_BYTES (where bytes/B adds < 0.1 µs at any HBM rate), and B is reported as
not determined. The launch gap g is the
median time between the end of one kernel and the start of the next on the same stream when the next
was already queued (its cudaLaunchKernel returned before the previous kernel ended): the GPU-side cost
of starting a kernel that the host is not holding up. The profile's `kernel_us` is a + g;
`hbm_efficiency` is B over the datasheet HBM bandwidth.

Held-out error: kernels are split by the rank file they come from (even ranks, odd ranks; 2-fold,
fixed): each half is fitted and predicts the other's durations; the report gives the median and 90th
percentile |predicted/measured − 1| (over kernels of at most SMALL_BYTES where only the fixed time is
fitted: that is all it claims to predict). Durations in Kineto traces are whole microseconds, so small
kernels carry ±0.5 µs of rounding.
"""

from __future__ import annotations

import bisect
import math
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from zsim.errors import ZsimError

ELEMENT_BYTES = {"float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "long int": 8, "int": 4,
                 "short int": 2, "signed char": 1, "unsigned char": 1, "bool": 1}
# Tensor arity of out-of-place ops (a further tensor input is their `out`).
ARITY = {"aten::mul": 2, "aten::add": 2, "aten::sub": 2, "aten::div": 2, "aten::threshold_backward": 2,
         "aten::sqrt": 1, "aten::neg": 1, "aten::exp": 1, "aten::log": 1, "aten::sigmoid": 1,
         "aten::clamp_min": 1, "aten::relu": 1, "aten::gelu": 1, "aten::tanh": 1, "aten::rsqrt": 1,
         "aten::abs": 1, "aten::sum": 1, "aten::mean": 1, "aten::norm": 1, "aten::_softmax": 1,
         "aten::_log_softmax": 1, "aten::softmax": 1, "aten::log_softmax": 1, "aten::to": 1,
         "aten::_to_copy": 1}
WRITE_ONLY = {"aten::fill_", "aten::zero_", "aten::normal_", "aten::uniform_"}
REDUCE_OPS = re.compile(r"aten::(sum|mean|norm|_?softmax|_?log_softmax|amax|max|min)\b")
RNG_OPS = re.compile(r"aten::(dropout|native_dropout|_fused_dropout|fused_dropout|bernoulli_?)\b")
KERNEL_FAMILY = re.compile(r"at::native::(\w+::)?(vectorized_|unrolled_)?elementwise_kernel|at::native::reduce_kernel"
                           r"|at::native::\(anonymous namespace\)::(cunn_|softmax)")
MIN_SIZES = 4  # distinct byte counts a class needs before its bandwidth is fitted
SMALL_BYTES = 64 * 1024  # kernels this small measure the fixed time alone (64 KiB / 900 GB/s = 0.07 us)
V100_L2_BYTES = 6 * 2**20  # V100 whitepaper: 6144 KB L2 cache


@dataclass(frozen=True, slots=True)
class KernelSample:
    """One measured memory-bound kernel: its class, the aten op, bytes moved, duration (s), rank."""

    cls: str
    op: str
    bytes: float
    seconds: float
    rank: int


@dataclass(frozen=True, slots=True)
class ClassFit:
    """duration = fixed_s + bytes / bytes_per_s for one kernel class (bytes_per_s None: not determined)."""

    cls: str
    samples: int
    sizes: int
    max_bytes: float
    fixed_s: float
    bytes_per_s: float | None
    heldout_median: float | None
    heldout_p90: float | None


@dataclass(frozen=True, slots=True)
class KernelFit:
    """The fit of one trace: per class, the launch gap (s, median and count of queued gaps)."""

    classes: dict[str, ClassFit]
    gap_s: float
    gaps: int


def _numel(dims) -> int | None:
    if not isinstance(dims, list) or not dims or not all(isinstance(d, int) for d in dims):
        return None
    return math.prod(dims)


def op_bytes(name: str, dims: list, types: list) -> float | None:
    """Bytes an elementwise/reduction aten op moves (rules in the module docstring); None if unknown."""
    tensors = []  # (numel, element bytes, position)
    for i, (d, t) in enumerate(zip(dims, types)):
        n = _numel(d)
        if n is not None and t in ELEMENT_BYTES:
            tensors.append((n, ELEMENT_BYTES[t], i))
    if not tensors:
        return None
    out_n, out_e = max(n for n, _, _ in tensors), tensors[0][1]
    if name in WRITE_ONLY:
        return float(tensors[0][0] * tensors[0][1])
    if name == "aten::copy_":
        return float(sum(n * e for n, e, _ in tensors[:2]))
    reads = tensors
    if not name.endswith("_") and name in ARITY and len(dims) > ARITY[name] and tensors[-1][2] >= ARITY[name]:
        out_n, out_e = tensors[-1][0], tensors[-1][1]
        reads = tensors[:-1]
    elif name.endswith("_"):
        out_n, out_e = tensors[0][0], tensors[0][1]
    if REDUCE_OPS.match(name) and "softmax" not in name:
        out_n = 1  # a reduction writes a small result
    return float(sum(n * e for n, e, _ in reads) + out_n * out_e)


def kernel_class(op: str) -> str:
    if RNG_OPS.match(op):
        return "rng"
    if REDUCE_OPS.match(op):
        return "reduce"
    return "stream"


def _load(path: Path) -> dict:
    """The parsed trace: streamed, decompressed and parsed within the JSON limits (zsim.trace.json_file.load_json).
    Raises ConfigError naming the file."""
    from zsim.trace.json_file import load_json

    return load_json(path)


def read_trace(path: Path, rank: int) -> tuple[list[KernelSample], list[float]]:
    """Memory-bound kernel samples and queued launch gaps (s) of one Kineto trace file."""
    data = _load(path)
    events = data.get("traceEvents") if isinstance(data, dict) else None
    if not isinstance(events, list):
        raise ZsimError(f"{path}: no traceEvents list (not a Kineto trace)")
    runtime, kernels = {}, []
    cpu_by_tid: dict = defaultdict(list)
    for e in events:
        cat = e.get("cat")
        if cat == "cuda_runtime" and "correlation" in e.get("args", {}):
            runtime[e["args"]["correlation"]] = e
        elif cat == "kernel":
            kernels.append(e)
        elif cat == "cpu_op":
            cpu_by_tid[e.get("tid")].append(e)
    for ops in cpu_by_tid.values():
        ops.sort(key=lambda o: o["ts"])
    starts = {tid: [o["ts"] for o in ops] for tid, ops in cpu_by_tid.items()}

    def launching_op(r):
        ops, ts = cpu_by_tid.get(r.get("tid"), []), starts.get(r.get("tid"), [])
        best = None
        end = bisect.bisect_right(ts, r["ts"])
        for o in (ops[i] for i in range(end - 1, max(-1, end - 201), -1)):  # innermost enclosing op
            if o["ts"] + o["dur"] >= r["ts"] + r["dur"] and (best is None or o["dur"] < best["dur"]):
                best = o
        return best

    samples = []
    for k in kernels:
        if not KERNEL_FAMILY.search(k.get("name", "")):
            continue
        r = runtime.get(k.get("args", {}).get("correlation"))
        op = launching_op(r) if r else None
        if op is None:
            continue
        a = op.get("args", {})
        nbytes = op_bytes(op["name"], a.get("Input Dims") or [], a.get("Input type") or [])
        if nbytes is None or nbytes <= 0:
            continue
        samples.append(KernelSample(kernel_class(op["name"]), op["name"], nbytes, k["dur"] * 1e-6, rank))

    gaps = []
    by_stream: dict = defaultdict(list)
    for k in kernels:
        by_stream[k.get("args", {}).get("stream")].append(k)
    for ks in by_stream.values():
        ks.sort(key=lambda k: k["ts"])
        for prev, nxt in zip(ks, ks[1:]):
            r = runtime.get(nxt.get("args", {}).get("correlation"))
            end = prev["ts"] + prev["dur"]
            if r is not None and r["ts"] + r["dur"] < end and nxt["ts"] >= end:
                gaps.append((nxt["ts"] - end) * 1e-6)
    return samples, gaps


def read_traces(paths: list[Path]) -> tuple[list[KernelSample], list[float]]:
    """All samples and gaps of the given trace files; rank = position in `paths` (sorted by the caller)."""
    if not paths:
        raise ZsimError("no Kineto trace files given")
    samples, gaps = [], []
    for rank, p in enumerate(paths):
        s, g = read_trace(p, rank)
        samples += s
        gaps += g
    return samples, gaps


def _lstsq(rows: list[KernelSample], with_bandwidth: bool) -> tuple[float, float | None]:
    """(fixed seconds, bytes per second or None) for `rows` (docstring: when the bandwidth is fitted)."""
    small = [r.seconds for r in rows if r.bytes <= SMALL_BYTES] or [min(r.seconds for r in rows)]
    if not with_bandwidth:
        return float(np.mean(small)), None
    t = np.array([r.seconds for r in rows])
    x = np.array([r.bytes for r in rows])
    (a, inv_b), *_ = np.linalg.lstsq(np.stack([np.ones_like(x), x], axis=1), t, rcond=None)
    if inv_b <= 0:
        return float(np.mean(small)), None
    return float(a), float(1.0 / inv_b)


def _predict(fixed: float, bw: float | None, r: KernelSample) -> float:
    return fixed + (r.bytes / bw if bw else 0.0)


def fit(samples: list[KernelSample], gaps: list[float], l2_bytes: float = V100_L2_BYTES) -> KernelFit:
    """Fit each kernel class (docstring); raise ZsimError when there is nothing to fit."""
    if not samples:
        raise ZsimError("the traces hold no elementwise or reduction kernels linked to aten ops with Input Dims "
                        "(record_shapes must be on)")
    by_class: dict = defaultdict(list)
    for s in samples:
        by_class[s.cls].append(s)
    classes = {}
    for cls, rows in sorted(by_class.items()):
        sizes = len({r.bytes for r in rows})
        with_bw = sizes >= MIN_SIZES and max(r.bytes for r in rows) > l2_bytes
        fixed, bw = _lstsq(rows, with_bw)
        errors = []
        for keep in (0, 1):
            train = [r for r in rows if r.rank % 2 == keep]
            test = [r for r in rows if r.rank % 2 != keep]
            if not train or not test:
                continue
            f, b = _lstsq(train, with_bw and len({r.bytes for r in train}) >= MIN_SIZES
                          and max(r.bytes for r in train) > l2_bytes)
            if b is None:  # a fixed time alone claims only the small kernels
                test = [r for r in test if r.bytes <= SMALL_BYTES]
            errors += [abs(_predict(f, b, r) / r.seconds - 1.0) for r in test]
        med = float(np.median(errors)) if errors else None
        p90 = float(np.percentile(errors, 90)) if errors else None
        classes[cls] = ClassFit(cls, len(rows), sizes, max(r.bytes for r in rows), fixed, bw, med, p90)
    gap = float(np.median(gaps)) if gaps else 0.0
    return KernelFit(classes, gap, len(gaps))


def profile_terms(kf: KernelFit) -> dict[str, float]:
    """The compute-section terms this fit determines, in profile units: `kernel_us` (streaming class
    fixed time + launch gap), `reduce_kernel_us` (reductions), `hbm_efficiency` only where fitted."""
    out = {}
    if "stream" in kf.classes:
        out["kernel_us"] = (kf.classes["stream"].fixed_s + kf.gap_s) * 1e6
    if "reduce" in kf.classes:
        out["reduce_kernel_us"] = (kf.classes["reduce"].fixed_s + kf.gap_s) * 1e6
    return out


def report(kf: KernelFit, hbm_bytes_per_s: float) -> str:
    """A few lines: per class the fixed time, bandwidth (and share of `hbm_bytes_per_s`), held-out error."""
    lines = [f"launch gap between queued kernels: median {kf.gap_s * 1e6:.2f} us ({kf.gaps} gaps)"]
    for c in kf.classes.values():
        bw = (f"{c.bytes_per_s / 1e9:.0f} GB/s = {c.bytes_per_s / hbm_bytes_per_s:.2f} of HBM"
              if c.bytes_per_s else "HBM bandwidth not determined (no kernel moves more than the L2 holds)")
        held = (f"held-out median {c.heldout_median:.1%}, p90 {c.heldout_p90:.1%}"
                if c.heldout_median is not None else "no held-out check")
        lines.append(f"{c.cls}: {c.samples} kernels, {c.sizes} sizes up to {c.max_bytes / 2**20:.1f} MiB; "
                     f"fixed {c.fixed_s * 1e6:.2f} us, {bw}; {held}")
    return "\n".join(lines)
