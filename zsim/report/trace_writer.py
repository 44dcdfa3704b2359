"""Writing a simulated run's trace in the shared schema (docs/trace-schema.md)."""

from __future__ import annotations

import sys
from pathlib import Path

from zsim import __version__
from zsim.engine.result import Result
from zsim.config.struct import dump
from zsim.trace import schema


def simulated_trace(result: Result) -> dict:
    """The trace document of `result`: one process per rank class, one track per stream."""
    s = result.scenario
    gpus = s.layout.world
    metadata = {
        "source": "simulated",
        "scenario": s.name,
        "model": dump(s.model),
        "params": result.workload.total_params,  # Ψ of the whole model (all MP ranks)
        "params_per_mp_rank": result.workload.params_per_mp_rank,  # what ZeRO partitions
        "zero": dump(s.zero),
        "precision": s.precision.dtype,
        "world_size": gpus, "dp": s.layout.dp, "mp": s.layout.mp,
        "hardware": {"profile": s.hardware.profile, "nodes": s.hardware.nodes, "gpu": s.cluster.gpu.name},
        "versions": {"zsim": __version__, "python": ".".join(map(str, sys.version_info[:3]))},
        "rank_classes": [{"pid": 0, "ranks": f"0-{gpus - 1}", "count": gpus}],
        # the representative rank's process groups, named by the collectives' `group` arg
        "groups": {"dp": list(s.layout.dp_group(0)), "mp": list(s.layout.mp_group(0)),
                   **({k: s.layout.group_members(k, 0) for k in ("ep", "edp", "tpep")} if s.model.moe is not None
                      else {})},
    }
    if result.pipeline is None:
        events = schema.process_meta(0, f"rank class 0 (ranks 0-{gpus - 1}, {gpus} GPUs)") + result.events
        return schema.document(events, metadata)
    # pipeline parallelism: one process per stage's representative rank (zsim.zero.pipeline_plan)
    lay, stages = s.layout, result.pipeline["per_stage"]
    metadata.update(pp=lay.pp, pipeline_schedule=s.parallel.pipeline_schedule,
                    virtual_stages=s.parallel.virtual_stages,
                    rank_classes=[{"pid": lay.first_rank(st["stage"]), "ranks": st["ranks"], "count": lay.stage_ranks}
                                  for st in stages])
    metadata["groups"]["pp"] = [lay.first_rank(st) for st in range(lay.pp)]
    meta = [e for st in stages for e in schema.process_meta(
        lay.first_rank(st["stage"]), f"pipeline stage {st['stage']} (ranks {st['ranks']}, {lay.stage_ranks} GPUs)")]
    return schema.document(meta + result.events, metadata)


def write_trace(result: Result, path: Path) -> Path:
    """Write the trace compactly with msgspec's JSON encoder: the same bytes as json.dumps with
    compact separators, 10x faster (2.6 ms against 28 ms for the flagship's 2,700 events, 640 KB)."""
    import msgspec

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(msgspec.json.encode(simulated_trace(result)))
    return path
