"""What a device-check folder (runtime/device_check.py, data/device/<run>/) says about zsim's GPU terms:
the GEMM model fitted on DeepBench's shapes and judged on the traced GPT shapes it never saw, the
caching allocator's measured peaks beside zsim's simulated ones, the price of an allocator flush, and
how much of a traced step the GPU sat idle waiting for the host.

All figures come from the folder; nothing here is fitted to the numbers it reports except where a
function says "fit". Used by tests/test_device_data.py and benchmarks/device_report.py.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zsim.errors import ConfigError

GIB = 1 << 30


@dataclass(frozen=True)
class DeviceRun:
    """One device-check folder: its manifest and where it lives."""

    folder: Path
    manifest: dict[str, Any]

    @classmethod
    def read(cls, folder: Path) -> DeviceRun:
        """Raises ConfigError when the folder has no readable manifest.json."""
        path = folder / "manifest.json"
        try:
            manifest = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"not a device-check folder: {exc}", source=str(path)) from None
        if not isinstance(manifest, dict) or "provenance" not in manifest or "parts" not in manifest:
            raise ConfigError("not a device-check manifest (no provenance/parts)", source=str(path))
        return cls(folder, manifest)

    @property
    def parts(self) -> dict[str, dict[str, Any]]:
        return self.manifest["parts"]

    @property
    def gpu(self) -> str:
        return self.manifest["provenance"]["device"].get("gpu", "cpu")

    def steady_steps(self, part: str) -> list[float]:
        """Step seconds after the first (warm-up) step."""
        return list(self.parts[part].get("step_seconds") or [])[1:]

    def run_dir(self, part: str) -> Path:
        return self.folder / "runs" / part


def device_runs(root: Path) -> list[DeviceRun]:
    """Every device-check folder under `root` (data/device/), oldest first; none when it is absent."""
    if not root.is_dir():
        return []
    return [DeviceRun.read(p) for p in sorted(root.iterdir()) if (p / "manifest.json").is_file()]


# --- (c) GEMMs -------------------------------------------------------------------------------------
def gemm_holdout(run: DeviceRun, dtype: str, gpu_profile: str, with_2fold: bool = False) -> dict[str, Any]:
    """Fit the GEMM model (docs/compute.md) on DeepBench's rows of the table and predict the traced GPT
    shapes' rows (source "GPT ..."), which the fit never saw. Returns the fitted values, the held-out
    errors (predicted / measured - 1) and their median of absolute values; `with_2fold` adds `zsim
    gemm-fit`'s even/odd held-out median over all rows (three more fits)."""
    from zsim.calibrate.gemm_fit import errors, fit, read_gemm_csv

    table = run.folder / f"gemm_{dtype}.csv"
    rows = read_gemm_csv(table)
    import csv

    with table.open(newline="", encoding="utf-8") as fh:
        sources = [r["source"] for r in csv.DictReader(fh)]
    train = [r for r, s in zip(rows, sources) if not s.startswith("GPT ")]
    test = [r for r, s in zip(rows, sources) if s.startswith("GPT ")]
    hw = _hardware(gpu_profile, dtype)
    fitted = fit(train, hw)
    held = errors(test, fitted.terms, hw)
    return {"dtype": dtype, "train_rows": len(train), "test_rows": len(test), "values": fitted.values,
            "heldout_errors": list(held), "heldout_median_abs": statistics.median(abs(e) for e in held),
            "heldout_max_abs": max(abs(e) for e in held),
            "all_rows_2fold_median": fit(rows, hw).heldout_median if with_2fold else None}


def _hardware(gpu_profile: str, dtype: str):
    from zsim.calibrate.gemm_fit import GemmHardware
    from zsim.config.profile_files import GpuFile, load_profile
    from zsim.fabric.cluster import compute_terms
    from zsim.config.profiles import Profiles

    spec = load_profile(Profiles.from_environment([]), "gpu", gpu_profile, GpuFile)
    peak = {"fp16": spec.peak_fp16_tflops, "bf16": spec.peak_bf16_tflops, "fp32": spec.peak_fp32_tflops}[dtype]
    terms = compute_terms(spec.compute)
    return GemmHardware(sms=terms.sms, tiles=terms.tiles, peak_flops=peak * 1e12,
                        hbm_bytes_per_s=spec.hbm_GBps * 1e9, elem_bytes=4 if dtype == "fp32" else 2)


# --- (b) memory --------------------------------------------------------------------------------------
def measured_memory(run: DeviceRun, part: str) -> dict[str, int]:
    """The caching allocator's peaks over the steady steps, and what setup left allocated beside the
    ledger's model states (bytes)."""
    stats = (run.parts[part].get("cuda_memory_stats") or [])[1:]
    if not stats:
        raise ConfigError(f"{part}: no memory stats after the warm-up step", source=str(run.folder))
    meta = json.loads((run.run_dir(part) / "rank0.trace.json").read_text())["metadata"]
    setup = meta.get("cuda_setup", {})
    return {"allocated_peak": max(s["allocated_bytes.all.peak"] for s in stats),
            "reserved_peak": max(s["reserved_bytes.all.peak"] for s in stats),
            "inactive_split_peak": max(s.get("inactive_split_bytes.all.peak", 0) for s in stats),
            "alloc_retries": sum(s.get("num_alloc_retries", 0) for s in stats),
            "setup_allocated": int(setup.get("allocated", 0)), "ledger_model_states": int(setup.get("ledger_total", 0))}


def simulated_memory(run: DeviceRun, part: str, profile: str) -> dict[str, int]:
    """zsim's allocated and reserved peaks (bytes) for the traced run rebuilt from its metadata
    (zsim replay's rebuild) and simulated on `profile`, as torch.cuda counts them: without what zsim holds
    outside the caching allocator for the whole run (category `context`: the CUDA context, NCCL's buffers;
    zsim.memory.context), which torch.cuda.memory_stats() does not see."""
    from zsim.calibrate.rebuild import rebuild
    from zsim.engine.simulation import simulate
    from zsim.trace.run_reader import read_run

    result = simulate(rebuild(read_run(run.run_dir(part)), profile))
    ledger = result.ledger
    outside = ledger.totals.get("context", 0)  # reserved at the start, held to the end
    return {"allocated_peak": int(ledger.peak - outside), "reserved_peak": int(ledger.peak_reserved - outside),
            "outside_allocator": int(outside),
            "by_category": {k: int(v) for k, v in ledger.peak_by_category.items()}}


# --- (d) allocator flushes ---------------------------------------------------------------------------
def flush_price(run: DeviceRun) -> dict[str, Any]:
    """The price of an allocator flush-and-retry, from the capped runs of one shape: the median steady
    step of the runs that retried against the median of those that ran under a cap without a retry
    (same shape, same cap mechanism, so only the retries differ), per retry a step. Runs that ran out
    of memory are listed, not priced."""
    capped = {k: v for k, v in run.parts.items() if k.startswith("flush-")}
    rows, retried, clean = [], [], []
    for key, part in sorted(capped.items()):
        stats = (part.get("cuda_memory_stats") or [])[1:]
        steps = run.steady_steps(key)
        row = {"part": key, "exit": part.get("exit"), "cap_gib": part.get("cap_bytes", 0) / GIB,
               "retries_per_step": (sum(s.get("num_alloc_retries", 0) for s in stats) / len(stats)) if stats else None,
               "median_step_ms": statistics.median(steps) * 1e3 if steps else None}
        rows.append(row)
        if part.get("exit") != 0 or not steps or not stats:
            continue
        (retried if row["retries_per_step"] else clean).append(row)
    price = None
    if retried and clean:
        base = statistics.median(r["median_step_ms"] for r in clean)
        price = statistics.median((r["median_step_ms"] - base) / r["retries_per_step"] for r in retried)
    return {"runs": rows, "ms_per_retry": price, "runs_with_retries": len(retried), "controls": len(clean)}


# --- host-bound steps --------------------------------------------------------------------------------
def gpu_busy_share(run: DeviceRun, part: str) -> list[float]:
    """Per steady step: the share of the step's span (first to last compute event) that device-timed
    compute-track spans cover (outermost spans only). Below 1, the GPU waited for the host."""
    events = json.loads((run.run_dir(part) / "rank0.trace.json").read_text())["traceEvents"]
    spans = [e for e in events if e.get("ph") == "X" and e.get("cat") == "compute"]
    shares = []
    for step in sorted({e["args"].get("step", 0) for e in spans})[1:]:
        mine = sorted(((e["ts"], e["ts"] + e["dur"]) for e in spans if e["args"].get("step") == step))
        if not mine:
            continue
        covered, end = 0.0, float("-inf")
        for lo, hi in mine:  # union of intervals (nested spans are inside their parent)
            if hi <= end:
                continue
            covered += hi - max(lo, end)
            end = hi
        shares.append(covered / (mine[-1][1] - mine[0][0]) if mine[-1][1] > mine[0][0] else 1.0)
    return shares


# --- (e) fused attention ------------------------------------------------------------------------------
ATTENTION_VERSION = {"flash": 2, "cudnn": 3}  # PyTorch's FlashAttention-2; cuDNN's sm90 kernel, the FA3 class


def attention_errors(run: DeviceRun, hopper: int = 90) -> list[dict[str, Any]]:
    """zsim.compute.flash's rate over the measured one, minus one, per (backend, pass, mask, head dim) of
    the run's `attention.csv`, by sequence length. zsim prices a causal GPT's kernel (its forward fit is
    causal; its backward is the full-mask rate times the measured causal ratio), so full-mask rows compare
    the forward's causal curve with a full-mask kernel and are listed, not judged."""
    import csv

    from zsim.compute.flash import H100_PEAK_TFLOPS, causal_backward, efficiency

    path = run.folder / "attention.csv"
    if not path.is_file():
        return []
    with path.open(newline="", encoding="utf-8") as fh:
        rows = [r for r in csv.DictReader(fh) if r["tflops"] and r["backend"] in ATTENTION_VERSION]
    groups: dict[tuple[str, str, str, str], dict[int, float]] = {}
    for r in rows:
        version, seq = ATTENTION_VERSION[r["backend"]], int(r["seq_len"])
        model = efficiency(version, r["pass"], hopper, seq, int(r["head_dim"])) * H100_PEAK_TFLOPS
        if r["pass"] == "bwd" and r["causal"] == "False":  # the full-mask backward: without the causal ratio
            model /= causal_backward(version).at(seq)
        groups.setdefault((r["backend"], r["pass"], r["causal"], r["head_dim"]), {})[seq] = model / float(r["tflops"]) - 1
    return [{"backend": b, "pass": p, "causal": c == "True", "head_dim": int(d), "errors": errors}
            for (b, p, c, d), errors in sorted(groups.items())]


def causal_ratio_errors(run: DeviceRun) -> list[dict[str, Any]]:
    """zsim.compute.flash.causal_backward's ratio over the measured causal/full-mask backward ratio, minus one,
    per (backend, head dim) of the run's `attention.csv`, by length, with the lengths the fit used marked
    (`fitted`: head dim 128 at FIT_LENGTHS of the table MEASURED_BWD was copied from)."""
    import csv

    from zsim.compute.flash import FIT_LENGTHS, causal_backward

    path = run.folder / "attention.csv"
    if not path.is_file():
        return []
    with path.open(newline="", encoding="utf-8") as fh:
        rows = [r for r in csv.DictReader(fh) if r["tflops"] and r["backend"] in ATTENTION_VERSION and r["pass"] == "bwd"]
    rates: dict[tuple[str, int], dict[int, dict[bool, float]]] = {}
    for r in rows:
        rates.setdefault((r["backend"], int(r["head_dim"])), {}).setdefault(int(r["seq_len"]), {})[
            r["causal"] == "True"] = float(r["tflops"])
    out = []
    for (backend, head_dim), by_len in sorted(rates.items()):
        curve = causal_backward(ATTENTION_VERSION[backend])
        errors = {s: curve.at(s) / (v[True] / v[False]) - 1 for s, v in sorted(by_len.items()) if len(v) == 2}
        fitted = {s for s in errors if head_dim == 128 and s in FIT_LENGTHS and run.folder.name.endswith("-attention")}
        out.append({"backend": backend, "head_dim": head_dim, "errors": errors, "fitted": fitted})
    return out
