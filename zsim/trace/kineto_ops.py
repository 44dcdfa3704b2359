"""GPU time by zsim op in a Kineto trace: each GPU kernel is charged to the innermost `record_function`
label that launched it (zsim.trace.kineto_links), where the labels are zsim's op names
(docs/trace-schema.md: `fwd/layer.3`, `bwd/head`, `recompute/layer.3`, `optimizer/step`,
`all_gather/params.layer.3`, ...), as the runtime writes them under `--torch-profiler`. A `bwd/layer.3`
that holds a `recompute/layer.3` is charged only its own kernels, as a measured span's own time is
`dur - nested_us`.

Kernels are told apart by name (`kernel_kind`): NCCL (communication, never compute time), GEMM
(cuBLAS / CUTLASS / cuDNN GEMM kernels), reductions, copies (`gpu_memcpy`, `gpu_memset`) and the rest
(elementwise and other memory-bound kernels). For traces without zsim's labels (a foreign
transformer job), `gemm_samples` reads the GEMMs by the ATen op that launched them: `aten::mm` and
`aten::addmm` with their `Input Dims` (torch.profiler's `record_shapes=True`) give m, n, k.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zsim.trace.intervals import length, union
from zsim.trace.kineto_links import Launches
from zsim.trace.samples import ComputeSample

# zsim's op names (docs/trace-schema.md, "Complete events"). `wait/...` labels are waiting, not ops, but
# they own what is launched inside them, so that it is not charged to the op around the wait.
OP_LABEL = re.compile(r"^((fwd|bwd)/(embed|head|layer\.\d+)|recompute/layer\.\d+|optimizer/\w+|"
                      r"(all_reduce|reduce_scatter|all_gather|broadcast|reduce|all_to_all)/[\w.]+|wait/[\w./]+)$")
COMPUTE_PHASES = ("fwd", "bwd", "recompute", "optimizer")
_NCCL = re.compile(r"^nccl(Dev)?Kernel")
# GEMM kernels by their library's naming: cuBLAS (volta_sgemm_*, ampere_*gemm*, sm80_xmma_gemm_*,
# gemmSN_*, gemv*; on Hopper and Blackwell cuBLAS 12's `nvjet_*` family, e.g.
# nvjet_hsh_256x128_64x4_2x1_v_bz_coopA_NNT), cuBLASLt (Kernel2, cublasLt*), CUTLASS
# (cutlass::Kernel<...gemm...>, cutlass3x_sm90_*), and the cuDNN implicit-GEMM convolution kernels
# (xmma_*implicit_gemm*). Names seen in the traces of ../shared/data/kineto (V100 and A100) and in
# published H100/B200 profiles (nvjet).
_GEMM = re.compile(r"gemm|gemv|cublas|cutlass|xmma|nvjet|^Kernel2$", re.IGNORECASE)
_REDUCE = re.compile(r"reduce_kernel|Reduce|reduction|softmax|norm", re.IGNORECASE)
KINDS = ("nccl", "gemm", "reduce", "copy", "elementwise")
_DTYPES = {"float": "fp32", "c10::Half": "fp16", "c10::BFloat16": "bf16"}
_GEMM_OPS = ("aten::mm", "aten::addmm")  # batch 1: what the GEMM model's tables hold (zsim.calibrate.gemm_fit)


def kernel_kind(event: dict[str, Any]) -> str:
    """One of KINDS for a GPU event of a Kineto trace (by category, then by kernel name)."""
    if event.get("cat") in ("gpu_memcpy", "gpu_memset"):
        return "copy"
    name = str(event.get("name", ""))
    if _NCCL.match(name):
        return "nccl"
    if _GEMM.search(name):
        return "gemm"
    if _REDUCE.search(name):
        return "reduce"
    return "elementwise"


@dataclass(slots=True)
class KinetoOp:
    """One zsim-labelled region of a rank's Kineto trace: its name, the training step it ran in (from
    the `ProfilerStep#N` span around it; None where the trace has none), its occurrence among the
    same name in that step (or in the whole trace), and the GPU kernels it launched itself."""

    name: str
    step: int | None
    occurrence: int
    host_ts: float  # µs
    kernels: list[dict[str, Any]] = field(default_factory=list)

    def gpu_us(self, kinds: tuple[str, ...] = ("gemm", "reduce", "copy", "elementwise")) -> float:
        """µs the GPU spent on its kernels of `kinds` (the union of their intervals: kernels on two
        streams at once count once). NCCL kernels are left out by default: communication."""
        return length(union([(k["ts"], k["ts"] + k["dur"]) for k in self.kernels if kernel_kind(k) in kinds]))

    @property
    def is_compute(self) -> bool:
        return self.name.split("/")[0] in COMPUTE_PHASES


@dataclass(slots=True)
class LabelledTrace:
    """The zsim ops of one rank's Kineto trace, and what could not be charged to any."""

    path: Path
    ops: list[KinetoOp]
    steps: list[int]  # the ProfilerStep numbers, in order (empty when the trace has none)
    unlabelled_kernels: int  # GPU kernels launched outside any zsim label
    gpu_kernels: int  # all GPU kernels, copies and NCCL included


def _gpu_events(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]


def labelled_ops(path: Path, events: list[dict[str, Any]]) -> LabelledTrace:
    """The zsim-labelled ops of one rank's Kineto events (complete events, checked by the reader),
    with the kernels each launched, in host order."""
    labels = sorted((e for e in events if e.get("cat") == "user_annotation" and OP_LABEL.match(str(e.get("name", "")))),
                    key=lambda e: e["ts"])
    steps = sorted(((e["ts"], e["ts"] + e["dur"], int(m.group(1))) for e in events
                    for m in [re.match(r"^ProfilerStep#(\d+)$", str(e.get("name", "")))] if m))
    ops, seen = {}, defaultdict(int)
    for e in labels:
        step = next((n for a, b, n in steps if a <= e["ts"] < b), None)
        if steps and step is None:
            continue  # outside the profiled steps (before the first, between a schedule's windows)
        key = (e["name"], step)
        ops[id(e)] = KinetoOp(e["name"], step, seen[key], e["ts"])
        seen[key] += 1
    links = Launches(events, lambda e: id(e) in ops)
    gpu = _gpu_events(events)
    unlabelled = 0
    for k in gpu:
        owner = links.owner(k)
        if owner is None:
            unlabelled += 1
        else:
            ops[id(owner)].kernels.append(k)
    return LabelledTrace(path, list(ops.values()), [n for _, _, n in steps], unlabelled, len(gpu))


def gemm_samples(path: Path, events: list[dict[str, Any]]) -> tuple[list[ComputeSample], dict[str, int]]:
    """GEMM timings of a trace without zsim labels: per `aten::mm` / `aten::addmm` with Input Dims that
    launched at least one GEMM kernel, the summed duration of the kernels it launched (a split-K GEMM
    adds a reduction kernel) with its shape (m, n, k) and dtype. Also the count of GPU kernels by kind
    (KINDS), for the report."""
    ops = Launches(events, lambda e: e.get("cat") == "cpu_op" and e.get("name") in _GEMM_OPS)
    launched: dict[int, list[dict[str, Any]]] = defaultdict(list)
    owners: dict[int, dict[str, Any]] = {}
    counts: dict[str, int] = defaultdict(int)
    for k in _gpu_events(events):
        counts[kernel_kind(k)] += 1
        owner = ops.owner(k)
        if owner is not None:
            launched[id(owner)].append(k)
            owners[id(owner)] = owner
    out = []
    for key, kernels in launched.items():
        shape_dtype = _gemm_shape(owners[key])
        if shape_dtype is None or not any(kernel_kind(k) == "gemm" for k in kernels):
            continue
        (m, n, k), dtype = shape_dtype
        seconds = sum(float(x["dur"]) for x in kernels) * 1e-6
        if seconds > 0:
            out.append(ComputeSample("gemm", 2.0 * m * n * k, seconds, dtype, str(path), shape=(m, n, k),
                                     name=str(owners[key]["name"])))
    return out, dict(counts)


def _gemm_shape(op: dict[str, Any]) -> tuple[tuple[int, int, int], str] | None:
    """((m, n, k), dtype) of `aten::mm` ([m, k], [k, n]) or `aten::addmm` (bias, [m, k], [k, n]) from its
    Input Dims and Input type; None when they are absent or not two matrices of matching k."""
    args = op.get("args") or {}
    dims, types = args.get("Input Dims"), args.get("Input type")
    if not isinstance(dims, list) or not isinstance(types, list):
        return None
    first = 1 if op["name"] == "aten::addmm" else 0
    if len(dims) < first + 2 or len(types) < first + 1:
        return None
    a, b = dims[first], dims[first + 1]
    ok = all(isinstance(d, list) and len(d) == 2 and all(isinstance(x, int) and x > 0 for x in d) for d in (a, b))
    if not ok or a[1] != b[0] or types[first] not in _DTYPES:
        return None
    m, k, n = a[0], a[1], b[1]
    return (m, n, k), _DTYPES[types[first]]
