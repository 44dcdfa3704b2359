"""Importing PyTorch profiler (Kineto) traces of real NCCL jobs: one Chrome-trace JSON per rank.

Two formats are read (both recorded by torch.profiler; see ../shared/data/README.md):

* **older** (PyTorch ≤ 2.0): a CPU `user_annotation` named `nccl:<op>` per collective with
  `args["Input Dims"]` (the input tensor's shape, elements) and `args["Input type"]`; the GPU
  kernel (`ncclKernel_<Op>_<ALGO>_<PROTO>_...`) carries no size. The k-th annotation of a rank
  launched its k-th NCCL kernel (NCCL enqueues one kernel per collective, in issue order).
* **newer** (PyTorch ≥ 2.1, `record_param_comms`): the GPU kernel itself carries
  `Collective name`, `In msg nelems`, `Out msg nelems`, `Group size` and `dtype`.

Across ranks, the k-th NCCL kernel of every rank is the same collective (NCCL requires every
member to issue collectives in the same order). Its kernel starts on each GPU when that rank
arrives and ends when the transfer ends; the **last rank to arrive waits for nobody**, so its
kernel duration is the transfer time, and every other rank's extra time is waiting. That needs all
ranks' files on one clock base (torch.profiler's timestamps are host wall-clock microseconds).
"""

from __future__ import annotations

import gzip
import json
import math
import os
import re
import stat
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zsim.config.limits import json_values_bound, limit, lift, too_many
from zsim.errors import ConfigError, short
from zsim.trace.samples import CollectiveSample, ComputeSample

# Bytes per element of the dtype names torch.profiler writes (Input type / dtype).
DTYPE_BYTES = {
    "float": 4, "Float": 4, "double": 8, "Double": 8, "c10::Half": 2, "Half": 2, "c10::BFloat16": 2,
    "BFloat16": 2, "long int": 8, "Long": 8, "int": 4, "Int": 4, "short int": 2, "Short": 2,
    "unsigned char": 1, "Byte": 1, "signed char": 1, "Char": 1, "bool": 1, "Bool": 1,
}
_SHORT_DTYPE = {4: "fp32", 2: "fp16", 8: "fp64", 1: "int8"}
# Collective names: the annotation (`nccl:all_reduce`), record_param_comms (`allreduce`), kernel.
_OPS = {"all_reduce": "all_reduce", "allreduce": "all_reduce", "all_gather": "all_gather",
        "allgather": "all_gather", "allgather_into_tensor": "all_gather", "_allgather_base": "all_gather",
        "reduce_scatter": "reduce_scatter", "reducescatter": "reduce_scatter",
        "reduce_scatter_tensor": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter",
        "broadcast": "broadcast", "reduce": "reduce", "all_to_all": "all_to_all", "alltoall": "all_to_all",
        "alltoall_base": "all_to_all", "all_to_allv": "all_to_all"}
_KERNEL = re.compile(r"^nccl(?:Dev)?Kernel_(\w+?)_(RING|TREE|COLLNET\w*|NVLS\w*)?_?(LL128|LL|SIMPLE)?")


@dataclass(frozen=True, slots=True)
class KinetoCollective:
    """One NCCL kernel of one rank: op, payload S (bytes, nccl-tests convention), group size, and
    its kernel's start and duration (µs, on the trace's clock)."""

    op: str
    nbytes: int
    group: int
    dtype: str
    start_us: float
    dur_us: float
    algorithm: str


@dataclass(slots=True)
class KinetoRank:
    """One rank's file: its NCCL collectives in issue order, its other GPU kernels, its steps."""

    path: Path
    rank: int
    world_size: int
    backend: str
    device: str
    collectives: list[KinetoCollective] = field(default_factory=list)
    kernels: list[dict[str, Any]] = field(default_factory=list)  # non-NCCL GPU kernels and copies
    steps: list[tuple[float, float]] = field(default_factory=list)  # ProfilerStep spans (start, dur) µs


def is_kineto(doc: Any) -> bool:
    """Whether a parsed JSON document looks like a torch.profiler trace."""
    return isinstance(doc, dict) and "traceEvents" in doc and ("distributedInfo" in doc or "deviceProperties" in doc)


MAX_TRACE_BYTES = 1 << 31  # one trace file, decompressed: never above this (zsim.config.limits JSON_BYTES, lower, applies)
MAX_WORLD = 1 << 20  # ranks of one job: far above any recorded one, and a set of them stays small
MAX_BYTES = 1 << 44  # one collective's payload: as zsim.trace.nccl_tests.MAX_SIZE (16 TiB)


def load_json(path: Path) -> Any:
    """Parse a JSON or gzipped JSON file of at most MAX_TRACE_BYTES (decompressed).

    Raises:
        ConfigError: not a regular file (a FIFO would be waited on), unreadable, truncated, too large,
        not JSON or nested too deeply (naming the file).
    """
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would block, a device never ends
            raise ConfigError("not a regular file, expected a trace", source=str(path))
        cap = min(MAX_TRACE_BYTES, limit("JSON_BYTES"))
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rb") as fh:
            raw = _read_at_most(fh, cap + 1)  # streamed and bounded: a gzip bomb stops here
    except FileNotFoundError:
        raise ConfigError("no such file", source=str(path)) from None
    except (OSError, EOFError, zlib.error) as exc:  # gzip.BadGzipFile is an OSError
        raise ConfigError(f"cannot read ({exc}); a truncated or damaged file?", source=str(path)) from None
    if len(raw) > cap:
        raise ConfigError(f"larger than {cap:,} bytes{' decompressed' if path.suffix == '.gz' else ''}: not a trace "
                          f"this reader takes ({lift('JSON_BYTES')})", source=str(path))
    if json_values_bound(raw) > limit("JSON_VALUES"):  # a small file of tiny values parses to many times its size
        raise ConfigError(too_many("JSON_VALUES", json_values_bound(raw), "JSON values (at most)"), source=str(path))
    try:
        return json.loads(raw)
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an integer of more than 4300 digits
        reason = str(exc).split(";")[0][:120]
        raise ConfigError(f"not valid JSON ({reason}); a truncated trace?", source=str(path)) from None
    except RecursionError:
        raise ConfigError("not valid JSON: nested too deeply", source=str(path)) from None


def _read_at_most(fh: Any, limit: int) -> bytearray:
    """Up to `limit` bytes of binary file `fh`, read in 16 MiB pieces (no `limit`-sized buffer up front)."""
    data = bytearray()
    while len(data) < limit:
        piece = fh.read(min(1 << 24, limit - len(data)))
        if not piece:
            break
        data += piece
    return data


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _count(value: Any, what: str, path: Path) -> int:
    """`value` as a non-negative integer (an int, or its decimal string). Raises ConfigError naming `what`."""
    try:
        number = int(value) if not isinstance(value, (bool, float)) else None
    except (TypeError, ValueError):
        number = None
    if number is None or number < 0:
        raise ConfigError(f"{what}: {str(value)[:40]!r} is not a count", source=str(path))
    return number


def _distributed(doc: dict[str, Any], path: Path) -> tuple[int, int]:
    """(rank, world size) from `distributedInfo`.

    Raises:
        ConfigError: missing, not counts, a world size outside 1..MAX_WORLD or a rank outside it.
    """
    info = doc.get("distributedInfo")
    if not isinstance(info, dict) or "rank" not in info or "world_size" not in info:
        raise ConfigError("no distributedInfo {rank, world_size}: not a trace of a distributed job",
                          source=str(path))
    rank = _count(info["rank"], "distributedInfo.rank", path)
    world = _count(info["world_size"], "distributedInfo.world_size", path)
    if not 1 <= world <= MAX_WORLD or not 0 <= rank < world:
        raise ConfigError(f"distributedInfo: rank {rank} of world_size {world} (world_size 1 to {MAX_WORLD:,})",
                          source=str(path))
    return rank, world


def _spans(doc: dict[str, Any], path: Path) -> list[dict[str, Any]]:
    """The complete ("X") events, each checked once here (the rest reads them as numbers and mappings).

    Raises:
        ConfigError: traceEvents not a list; a span without finite ts and dur >= 0, or whose args is not
        a mapping (naming the span).
    """
    events = doc.get("traceEvents")
    if not isinstance(events, list):
        raise ConfigError(f"traceEvents is {type(events).__name__}, not a list of events", source=str(path))
    spans = [e for e in events if isinstance(e, dict) and e.get("ph") == "X"]
    for e in spans:
        if not (_finite(e.get("ts")) and _finite(e.get("dur")) and e["dur"] >= 0):
            raise ConfigError(f"traceEvents: {str(e.get('name'))[:60]!r}: ts {str(e.get('ts'))[:20]!r} and dur "
                              f"{str(e.get('dur'))[:20]!r} must be finite numbers (dur >= 0)", source=str(path))
        if not isinstance(e.get("args", {}), dict):
            raise ConfigError(f"traceEvents: {str(e.get('name'))[:60]!r}: args is not a mapping", source=str(path))
    return spans


def read_rank(path: Path, doc: Any | None = None) -> KinetoRank:
    """One Kineto file: its rank's NCCL collectives (with sizes) and other GPU kernels.

    Raises:
        ConfigError: not a Kineto trace, no distributedInfo, a span without numeric times, or an NCCL
        kernel whose size cannot be found or is out of range (naming the file and the kernel).
    """
    doc = load_json(path) if doc is None else doc
    if not is_kineto(doc):
        raise ConfigError("not a PyTorch profiler (Kineto) trace: no traceEvents/distributedInfo", source=str(path))
    rank, world = _distributed(doc, path)
    info, props = doc["distributedInfo"], doc.get("deviceProperties") or [{}]
    name = props[0].get("name", "unknown") if isinstance(props, list) and isinstance(props[0], dict) else "unknown"
    out = KinetoRank(path, rank, world, str(info.get("backend", "nccl")), str(name))
    events = _spans(doc, path)
    annotations = sorted((e for e in events if e.get("cat") == "user_annotation"
                          and str(e.get("name", "")).startswith("nccl:")), key=lambda e: e["ts"])
    nccl_kernels = []
    for e in sorted(events, key=lambda e: e["ts"]):
        cat, name = e.get("cat"), str(e.get("name", ""))
        if cat == "kernel" and _KERNEL.match(name):
            nccl_kernels.append(e)
        elif cat in ("kernel", "gpu_memcpy", "gpu_memset"):
            _count(e.get("args", {}).get("stream", e.get("tid", 0)), f"{name[:40]}: stream", path)
            out.kernels.append(e)
        elif name.startswith("ProfilerStep#"):
            out.steps.append((float(e["ts"]), float(e["dur"])))
    new_format = all("Collective name" in k.get("args", {}) for k in nccl_kernels)
    if not new_format and len(annotations) != len(nccl_kernels):
        raise ConfigError(f"{len(nccl_kernels)} NCCL kernels but {len(annotations)} nccl:* annotations with sizes; "
                          "cannot tell which kernel moved what", source=str(path))
    for i, kernel in enumerate(nccl_kernels):
        op, elements, width, group = (_new_format_size(kernel, world, path) if new_format
                                      else _old_format_size(annotations[i], world, path))
        what = f"{str(kernel['name'])[:40]} at ts {kernel['ts']}"
        if not 1 <= group <= world:
            raise ConfigError(f"{what}: Group size {group} is not 1 to world_size {world}", source=str(path))
        if elements * width > MAX_BYTES:
            raise ConfigError(f"{what}: {short(elements)} elements of {width} bytes: more than {MAX_BYTES:,} bytes in "
                              "one collective", source=str(path))
        out.collectives.append(KinetoCollective(op, elements * width, group, _SHORT_DTYPE.get(width, "fp32"),
                                                float(kernel["ts"]), float(kernel["dur"]),
                                                _algorithm(kernel["name"])))
    return out


def _new_format_size(kernel: dict[str, Any], world: int, path: Path) -> tuple[str, int, int, int]:
    """(op, elements, bytes per element, group size) from a kernel's record_param_comms args.

    Raises:
        ConfigError: an unknown collective or element type, or counts that are not counts.
    """
    args, what = kernel.get("args", {}), str(kernel["name"])[:40]
    elements = max(_count(args.get("In msg nelems", 0), f"{what}: In msg nelems", path),
                   _count(args.get("Out msg nelems", 0), f"{what}: Out msg nelems", path))
    return (_op(args["Collective name"], path), elements, _dtype_bytes(args.get("dtype"), path),
            _count(args.get("Group size", world), f"{what}: Group size", path))


def _old_format_size(ann: dict[str, Any], world: int, path: Path) -> tuple[str, int, int, int]:
    """(op, elements, bytes per element, group size) from an older trace's `nccl:<op>` annotation.

    Raises:
        ConfigError: no Input Dims, dimensions that are not counts, an unknown collective or type.
    """
    what = str(ann["name"])[:40]
    op = _op(str(ann["name"]).split(":", 1)[1], path)
    args = ann.get("args", {})
    dims, types = args.get("Input Dims"), args.get("Input type")
    if not isinstance(dims, list) or not dims or not isinstance(dims[0], list):
        raise ConfigError(f"{what} at ts {ann['ts']}: no Input Dims", source=str(path))
    width = _dtype_bytes(types[0] if isinstance(types, list) and types else types, path)
    elements = math.prod(_count(d, f"{what}: Input Dims", path) for d in dims[0]) if dims[0] else 1
    if op == "all_gather":
        elements *= world  # the annotation's input is one rank's chunk; S is the gathered buffer
    return op, elements, width, world  # the older format does not say; DLRM-style jobs use the world group


def _op(name: Any, path: Path) -> str:
    key = name.strip().lower() if isinstance(name, str) else None
    if key not in _OPS:
        raise ConfigError(f"unknown collective {str(name)[:40]!r} (known: {', '.join(sorted(set(_OPS.values())))})",
                          source=str(path))
    return _OPS[key]


def _dtype_bytes(name: Any, path: Path) -> int:
    if not isinstance(name, str) or name not in DTYPE_BYTES:
        raise ConfigError(f"unknown element type {str(name)[:40]!r} of an NCCL collective", source=str(path))
    return DTYPE_BYTES[name]


def _algorithm(kernel_name: str) -> str:
    """`ring/LL` from `ncclKernel_AllReduce_RING_LL_Sum_float(...)`; `?` where the name does not say."""
    m = _KERNEL.match(kernel_name)
    algo = (m.group(2) or "?").lower() if m else "?"
    proto = (m.group(3) or "?") if m else "?"
    return f"{algo}/{'Simple' if proto == 'SIMPLE' else proto}"


@dataclass(slots=True)
class KinetoRun:
    """All ranks of one job: `collectives[k]` is the k-th collective, one entry per rank."""

    ranks: list[KinetoRank]

    @property
    def world_size(self) -> int:
        return self.ranks[0].world_size

    def matched(self) -> list[list[KinetoCollective]]:
        """The k-th collective of every rank, checked to agree on op and size."""
        return [list(c) for c in zip(*(r.collectives for r in self.ranks))]

    def samples(self) -> list[CollectiveSample]:
        """One transfer time per collective: the duration of the last-arriving rank's kernel."""
        out = []
        for k, members in enumerate(self.matched()):
            last = max(members, key=lambda c: c.start_us)
            out.append(CollectiveSample(last.op, last.nbytes, last.group, last.dur_us * 1e-6, "nccl",
                                        str(self.ranks[0].path.parent), 1, last.dtype))
        return out

    def waiting_us(self) -> list[list[float]]:
        """Per collective, per rank: µs spent waiting for the last rank (kernel time − transfer)."""
        out = []
        for members in self.matched():
            last = max(members, key=lambda c: c.start_us)
            out.append([max(0.0, c.dur_us - last.dur_us) for c in members])
        return out

    def compute_samples(self) -> list[ComputeSample]:
        """Every non-NCCL GPU kernel of every rank as a measured duration (for trace-driven replay)."""
        return [ComputeSample("kernel", 0.0, float(k["dur"]) * 1e-6, "?", str(r.path), name=str(k["name"]))
                for r in self.ranks for k in r.kernels]


def read_kineto(paths: list[Path], allow_missing_ranks: bool = False) -> KinetoRun:
    """The ranks of one job from their Kineto files (or folders of `*.json`/`*.json.gz`).

    Raises:
        ConfigError: a file is not a Kineto trace; two files claim one rank; files of different jobs
        (world sizes differ); ranks missing (unless `allow_missing_ranks`: then waiting cannot be
        told apart from transfer, and the kernel durations include it); ranks that disagree on the
        sequence of collectives.
    """
    files: list[Path] = []
    for p in paths:
        files += sorted(q for q in p.iterdir() if q.name.endswith((".json", ".json.gz"))) if p.is_dir() else [p]
    if not files:
        raise ConfigError("no Kineto trace files (*.json, *.json.gz)", source=", ".join(map(str, paths)))
    ranks: dict[int, KinetoRank] = {}
    for f in files:
        r = read_rank(f)
        if r.rank in ranks:
            raise ConfigError(f"rank {r.rank} also in {ranks[r.rank].path}: files of two jobs mixed?", source=str(f))
        first = next(iter(ranks.values()), None)
        if first is not None and r.world_size != first.world_size:
            raise ConfigError(f"world size {r.world_size}, but {first.path} has {first.world_size}: "
                              "files of different jobs", source=str(f))
        ranks[r.rank] = r
    world = next(iter(ranks.values())).world_size
    missing = sorted(set(range(world)) - set(ranks))
    if missing and not allow_missing_ranks:
        raise ConfigError(f"ranks {_ranges(missing)} of {world} missing: without every rank the waiting for the "
                          "last one cannot be separated from the transfer (pass --allow-missing-ranks to use "
                          "kernel durations as they are, waiting included)", source=str(files[0].parent))
    run = KinetoRun([ranks[r] for r in sorted(ranks)])
    counts = {r.rank: len(r.collectives) for r in run.ranks}
    if len(set(counts.values())) > 1:
        raise ConfigError(f"ranks recorded different numbers of NCCL collectives {counts}: truncated or mixed traces",
                          source=str(files[0].parent))
    for k, members in enumerate(run.matched()):
        kinds = {(c.op, c.nbytes) for c in members}
        if len(kinds) > 1:
            raise ConfigError(f"collective #{k} differs between ranks ({sorted(kinds)}): mixed or misordered traces",
                              source=str(files[0].parent))
    return run


def _ranges(values: list[int]) -> str:
    out, start = [], values[0]
    for a, b in zip(values, values[1:] + [None]):
        if b != a + 1:
            out.append(f"{start}" if start == a else f"{start}-{a}")
            start = b
    return ", ".join(out)
