"""What `zsim calibrate` reads: any mix of measurement inputs, each recognised by its content.

| input | recognised by | gives |
|---|---|---|
| runtime traces (`zsim trace -o DIR`) | a folder of `rank<R>.trace.json` | collectives (transfer, waiting excluded) and compute phases |
| Kineto traces (torch.profiler) | `*.json[.gz]` files (or a folder of them) with `traceEvents` and `distributedInfo` | NCCL collectives (transfer, waiting excluded across the members of each process group; send/recv counted, not fitted); GEMM timings by shape (`aten::mm`/`aten::addmm` with Input Dims) |
| nccl-tests output | a folder of `<collective>.txt`, or one such file | collectives (time per call; GPUs and `-g` from the header) |
| GEMM tables (DeepBench) | a `.csv` with M, N, K, time_ms columns | GEMM timings by shape |
| a simulated trace (`zsim run`) | one `trace.json` in the zsim schema with `source: simulated` | its collectives and compute ops (round trips: calibrating from a simulation must give back its profile) |

Anything else is a ConfigError naming the input: nothing is skipped silently.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zsim.errors import ConfigError, short
from zsim.fabric.nccl import FUNCTIONS
from zsim.trace.samples import CollectiveSample, ComputeSample
from zsim.trace.schema import SCHEMA, group_ranks

KINDS = ("runtime", "kineto", "nccl-tests", "gemm-table", "simulated")


@dataclass(slots=True)
class Inputs:
    """Samples from every input, and one provenance line per input."""

    collectives: list[CollectiveSample] = field(default_factory=list)
    compute: list[ComputeSample] = field(default_factory=list)
    sources: list[dict[str, Any]] = field(default_factory=list)
    runs: list[Any] = field(default_factory=list)  # MeasuredRun of runtime and simulated traces (phase fits)
    machines: list[Any] = field(default_factory=list)  # zsim.calibrate.machines.Machine, one per input or table


def kind_of(path: Path) -> str:
    """The input kind of `path` (one of KINDS).

    Raises:
        ConfigError: the path does not exist or is none of the known formats.
    """
    from zsim.trace.deepbench import is_gemm_table
    from zsim.trace.xla_gemm import is_xla_table
    from zsim.trace.json_file import load_json
    from zsim.trace.kineto import is_kineto
    from zsim.trace.nccl_tests import is_table
    from zsim.trace.run_reader import is_run_folder

    if not path.exists():
        raise ConfigError("no such file or folder", source=str(path))
    if not path.is_dir() and not path.is_file():  # a FIFO would be waited on, a device read forever
        raise ConfigError("not a regular file or a folder (a FIFO or a device?)", source=str(path))
    if path.is_dir():
        if is_run_folder(path):
            return "runtime"
        if any((path / f"{fn}.txt").is_file() for fn in FUNCTIONS):
            return "nccl-tests"
        traces = [p for p in path.iterdir() if p.name.endswith((".json", ".json.gz"))]
        if traces and is_kineto(load_json(traces[0])):
            return "kineto"
        raise ConfigError("unknown input format: a folder with neither rank<R>.trace.json files, nor nccl-tests "
                          f"tables ({', '.join(f + '.txt' for f in FUNCTIONS[:3])}, ...), nor Kineto traces",
                          source=str(path))
    if is_gemm_table(path) or is_xla_table(path):
        return "gemm-table"
    if is_table(path):
        return "nccl-tests"
    if path.name.endswith((".json", ".json.gz")):
        doc = load_json(path)
        if is_kineto(doc):
            return "kineto"
        meta = doc.get("metadata") if isinstance(doc, dict) else None
        if isinstance(meta, dict) and doc.get("schema") == SCHEMA and meta.get("source") == "simulated":
            return "simulated"
        if isinstance(doc, dict) and "schema" in doc:
            raise ConfigError(f"a single {short(doc['schema'])} trace file: give the folder of every rank's trace "
                              "instead", source=str(path))
    raise ConfigError("unknown input format (expected a runtime trace folder, Kineto traces, nccl-tests tables or "
                      "a GEMM table .csv)", source=str(path))


def read_inputs(paths: list[Path], allow_missing_ranks: bool = False) -> Inputs:
    """Read every input into samples.

    Raises:
        ConfigError: an input of unknown format, or one that fails its own checks (see the readers).
    """
    from zsim.calibrate.machines import Machine, kineto_machine, run_machine, table_machine
    from zsim.config.yamlfile import read_text
    from zsim.trace.deepbench import read_gemm_table
    from zsim.trace.kineto_run import read_kineto
    from zsim.trace.nccl_tests import MAX_TABLE_BYTES, checked, read_nccl_tests, recording_of
    from zsim.trace.run_reader import read_run
    from zsim.trace.run_samples import collective_samples, compute_samples

    out = Inputs()
    for path in paths:
        kind = kind_of(path)
        before = (len(out.collectives), len(out.compute), len(out.machines))
        skipped: dict[str, int] = {}
        kernels: dict[str, int] = {}  # a Kineto input's GPU kernels by kind (zsim.trace.kineto_ops.KINDS)
        if kind == "runtime":
            run = read_run(path)
            out.runs.append(run)
            out.collectives += collective_samples(run, skipped)
            out.compute += compute_samples(run)
            out.machines.append(run_machine(str(path), run.metadata))
        elif kind == "kineto":
            run = read_kineto([path], allow_missing_ranks)
            out.machines.append(kineto_machine(str(path), [r.device for r in run.ranks]))
            samples = run.samples()
            out.collectives += [s for s in samples if s.nbytes > 0]
            if any(s.nbytes <= 0 for s in samples):
                skipped["zero bytes"] = sum(1 for s in samples if s.nbytes <= 0)
            out.compute += [g for r in run.ranks for g in r.gemms]  # GEMMs by their ATen op's shape
            for r in run.ranks:
                for what, n in r.kinds.items():
                    kernels[what] = kernels.get(what, 0) + n
            p2p = sum(len(r.p2p) for r in run.ranks)
            if p2p:  # communication, but no collective of a group: nothing in the model prices it
                skipped["point-to-point send/recv kernels"] = p2p
        elif kind == "nccl-tests":
            files = [path / f"{fn}.txt" for fn in FUNCTIONS if (path / f"{fn}.txt").is_file()] if path.is_dir() else [path]
            for f in files:
                op = f.stem if f.stem in FUNCTIONS else None
                if op is None:
                    raise ConfigError(f"cannot tell the collective of an nccl-tests table from its name (use "
                                      f"{', '.join(FUNCTIONS)}.txt)", source=str(f))
                recorded = recording_of(f)
                if recorded is None:
                    raise ConfigError("the header does not list the ranks ('#  Rank  0 ... device ...' lines): "
                                      "how many GPUs ran it is unknown", source=str(f))
                gpus, per_process = recorded
                rows, failed = checked(read_nccl_tests(f))
                if failed:  # no measurement of the collective: its result was wrong
                    why = "nccl-tests' own check failed (#wrong > 0)"
                    skipped[why] = skipped.get(why, 0) + len(failed)
                out.machines.append(table_machine(f, read_text(f, what="nccl-tests table", max_bytes=MAX_TABLE_BYTES)))
                out.collectives += [CollectiveSample(op, r.size, gpus, r.time_us * 1e-6, "nccl", str(f), per_process)
                                    for r in rows if r.size > 0 and r.time_us > 0]
                empty = sum(1 for r in rows if r.size <= 0 or r.time_us <= 0)
                if empty:  # nccl-tests rounds small all_gather/reduce_scatter sizes down to 0 bytes
                    skipped["zero bytes"] = skipped.get("zero bytes", 0) + empty
        elif kind == "simulated":
            from zsim.trace.json_file import load_json
            from zsim.trace.run_reader import check_events

            doc = load_json(path)
            check_events(doc.get("traceEvents"), path)  # every event once, as a runtime trace's
            collectives, compute = simulated_samples(path, doc)
            out.collectives += collectives
            out.compute += compute
            out.runs.append(simulated_run(path, doc))
            out.machines.append(run_machine(str(path), doc.get("metadata") or {}))
        else:
            from zsim.trace.xla_gemm import is_xla_table, read_xla_table

            out.compute += read_xla_table(path) if is_xla_table(path) else read_gemm_table(path)
            out.machines.append(Machine(str(path)))  # neither a DeepBench nor an XLA table names its GPU
        source = {"path": str(path), "kind": kind, "collectives": len(out.collectives) - before[0],
                  "compute": len(out.compute) - before[1]}
        if kernels:
            source["gpu_kernels"] = dict(sorted(kernels.items()))
        source["machine"] = {m.source: m.facts() for m in out.machines[before[2]:]} if kind == "nccl-tests" \
            else out.machines[-1].facts()
        if skipped:
            source["skipped"] = skipped  # calls that say nothing about the link, counted rather than dropped
        out.sources.append(source)
    return out


def _group_ranks(args: dict[str, Any], metadata: dict[str, Any]) -> list[int] | None:
    """A collective's ranks, whether the trace lists them per event or names a group of
    `metadata.groups` (zsim.trace.schema.group_ranks); None when neither is there."""
    try:
        return group_ranks(args, metadata)
    except (KeyError, TypeError):
        return None


def simulated_run(path: Path, doc: dict[str, Any]) -> Any:
    """A simulated trace as a MeasuredRun (one "rank" per rank class or rank, its `pid`), so that its
    compute ops can be lined up with a rebuilt plan like a runtime trace's (zsim.calibrate)."""
    from zsim.trace.run_reader import MeasuredRun

    events: dict[int, list[dict[str, Any]]] = {}
    for e in doc.get("traceEvents") or []:
        if isinstance(e, dict) and e.get("ph") == "X" and isinstance(e.get("pid"), int):
            events.setdefault(e["pid"], []).append(e)
    return MeasuredRun(path, dict(doc.get("metadata") or {}), events or {0: []}, {}, {})


def simulated_samples(path: Path, doc: dict[str, Any]) -> tuple[list[CollectiveSample], list[ComputeSample]]:
    """The collectives (transfer time: duration less `wait_us`) and compute ops of a simulated trace.

    Raises:
        ConfigError: a collective without bytes or group.
    """
    meta = doc.get("metadata") or {}
    dtype = str(meta.get("precision", "fp16"))
    collectives, compute = [], []
    for e in doc.get("traceEvents") or []:
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        args = e.get("args") or {}
        if "op" in args and "group" in args:
            ranks = _group_ranks(args, meta)
            if not isinstance(args.get("bytes"), int) or ranks is None:
                raise ConfigError(f"{e.get('name')}: bytes or group missing", source=str(path))
            seconds = (e["dur"] - args.get("wait_us", 0.0)) * 1e-6
            if args["bytes"] > 0 and len(ranks) > 1 and seconds > 0:
                collectives.append(CollectiveSample(args["op"], args["bytes"], len(ranks), seconds, "nccl",
                                                    str(path), 1, args.get("dtype", dtype)))
        elif e.get("cat") == "compute" and str(e.get("name", "")).split("/")[0] in ("fwd", "bwd", "recompute", "optimizer"):
            phase, _, what = e["name"].partition("/")
            compute.append(ComputeSample(f"{phase}/{what.split('.')[0]}", float(args.get("flops", 0.0)),
                                         e["dur"] * 1e-6, dtype, str(path), name=e["name"]))
    return collectives, compute
