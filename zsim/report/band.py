"""The error band of an answer: how wrong zsim's step time has been on published runs of the same regime
(issue 25, item 5), from the validation suites' held-out points, never hand-set.

A regime is (topology, GPU generation, profile kind):
- topology: mixture-of-experts (any model.moe: its all-to-alls and expert states are a schedule of their
  own); pipeline parallelism (parallel.pp > 1: the bubble and the p2p sends); then, for the rest, one node;
  data parallel across nodes (ZeRO 0-2, MP inside a node); tensor parallelism across nodes (MP larger than
  a node); ZeRO-3 across nodes up to SCALE_GPUS GPUs; ZeRO-3 at scale (more); a ZeRO-3 topology names its
  `zero.implementation` when it is a DeepSpeed version ("... under deepspeed-0.5"): a run of another
  implementation gets that band only as the nearest;
- generation: the GPU's architecture (compute capability: Volta, Ampere, Hopper, Blackwell);
- profile kind: shipped (hwprofiles/ as written) or calibrated (`zsim calibrate` wrote it).

The residuals (error = simulated / published step time − 1; negative: zsim is faster than the run) come from
- `zsim validate scale`'s held-out half (zsim/validate/suites/scale.yaml);
- `zsim validate megatron`'s per-GPU throughput points (no zsim term was fitted to them: docs/validation.md);
- `zsim validate paper`'s per-run chart points (CHART, CHART_MEGATRON: no term fitted to them), except the
  runs the scale suite declares (they enter through it, in their half);
- `zsim validate modern`'s held-out half (zsim/validate/suites/modern.yaml: Megatron-LM's pipeline, sequence
  parallel and selective-recompute runs on Selene's A100s, BLOOM-176B on Jean Zay, Megatron-Core's
  Qwen3-235B-A22B mixture-of-experts runs on 256 H100s from NVIDIA's Megatron-MoE-ModelZoo).
`python -m zsim.validate.band_table --write` simulates them (the suites sit above report) and rewrites
band_table.json beside this file; tests/test_band.py checks that the stored table is the one its residuals
give, and (slow) that the residuals are current.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TABLE = Path(__file__).resolve().with_name("band_table.json")
REGENERATE = ".venv/bin/python -m zsim.validate.band_table --write"
# ZeRO-3 "at scale" starts above this many GPUs: the edge between the largest held-out ZeRO-3 run of the
# MosaicML tables (128 GPUs) and the smallest of Narayanan et al.'s (384); any edge from 128 to 383 gives
# the same table. A bin edge where the data has a gap, not a fit.
SCALE_GPUS = 256
GENERATIONS = {70: "Volta", 80: "Ampere", 90: "Hopper", 100: "Blackwell"}  # compute capability // 10 * 10
IMPLEMENTATION_MARK = " under "  # "ZeRO-3 ... GPUs) under deepspeed-0.5": the zero.implementation of a ZeRO-3 regime


def base_topology(topology: str) -> str:
    """The topology without its ZeRO-3 implementation: what a 'nearest' band must share."""
    return topology.split(IMPLEMENTATION_MARK)[0]


@dataclass(frozen=True, slots=True)
class Regime:
    """Where a run sits: `topology`, `generation` (GPU architecture), `profile` ('shipped' or 'calibrated')."""

    topology: str
    generation: str
    profile: str

    @property
    def key(self) -> str:
        return f"{self.topology} | {self.generation} | {self.profile} profile"


def regime_of(scenario) -> Regime:
    """The regime of a Scenario (module docstring)."""
    lay, cluster = scenario.layout, scenario.cluster
    if scenario.model.moe is not None:
        topology = "mixture-of-experts"
    elif lay.pp > 1:
        topology = "pipeline parallelism"
    elif lay.mp > cluster.gpus_per_node:
        topology = "tensor parallelism across nodes"
    elif cluster.nodes == 1:
        topology = "one node"
    elif scenario.zero.stage == 3:
        topology = (f"ZeRO-3 at scale (over {SCALE_GPUS} GPUs)" if lay.world > SCALE_GPUS
                    else f"ZeRO-3 across nodes (up to {SCALE_GPUS} GPUs)")
        # a DeepSpeed version's stage 3 is another schedule (zsim.zero.implementation): its residuals
        # say nothing exact about the paper plan's, nor the other way round
        if scenario.zero.implementation != "paper":
            topology += f"{IMPLEMENTATION_MARK}{scenario.zero.implementation}"
    else:
        topology = "data parallel across nodes (ZeRO 0-2)"
    cc = cluster.gpu.compute_capability
    generation = GENERATIONS.get(cc // 10 * 10, f"compute capability {cc}") if cc else "CPU"
    return Regime(topology, generation, "calibrated" if cluster.calibration is not None else "shipped")


@dataclass(frozen=True, slots=True)
class Band:
    """The held-out residuals of one regime: `n` runs, their median, lowest and highest error. `match`
    says how the asking run relates to it: 'exact', or 'nearest' (same topology, another generation or
    profile kind: the run itself is outside every validated regime)."""

    regime: str
    n: int
    median: float
    low: float
    high: float
    points: tuple[str, ...]
    match: str = "exact"

    def step_range(self, step_s: float) -> tuple[float, float, float]:
        """(low, median, high) step times, seconds, that the published runs of the regime imply for a
        simulated `step_s`: published = simulated / (1 + error)."""
        return step_s / (1 + self.high), step_s / (1 + self.median), step_s / (1 + self.low)

    def words(self, step_s: float) -> str:
        """One line: the band in seconds and where it comes from."""
        lo, mid, hi = self.step_range(step_s)
        where = (f"{self.n} held-out published run{'s' if self.n > 1 else ''} of {self.regime}"
                 if self.match == "exact" else
                 f"outside every validated regime; nearest: {self.n} held-out run{'s' if self.n > 1 else ''} of "
                 f"{self.regime}")
        if self.low == self.high:  # one run, or runs that agree: one figure, not a range of one
            return f"{mid:.3g} s: {where} took {1 / (1 + self.high):.2f}x zsim's step"
        return (f"{lo:.3g}-{hi:.3g} s (median {mid:.3g} s): {where} took {1 / (1 + self.high):.2f}x to "
                f"{1 / (1 + self.low):.2f}x zsim's step")

    def as_dict(self, step_s: float) -> dict[str, Any]:
        lo, mid, hi = self.step_range(step_s)
        return {"regime": self.regime, "match": self.match, "n": self.n, "error_median": self.median,
                "error_low": self.low, "error_high": self.high, "step_low_s": lo, "step_median_s": mid,
                "step_high_s": hi, "points": list(self.points), "table": str(TABLE.name)}


def read_table(path: Path = TABLE) -> dict[str, Any]:
    """The stored table. Raises ConfigError for an unreadable one."""
    from zsim.config.yamlfile import read_json
    from zsim.errors import ConfigError

    data = read_json(path, what="band table")
    if not isinstance(data, dict) or not isinstance(data.get("regimes"), dict):
        raise ConfigError(f"not a band table (no 'regimes'); regenerate it: {REGENERATE}", source=str(path))
    return data


def band_for(scenario, table: dict[str, Any] | None = None) -> Band | None:
    """The band of `scenario`'s regime; else the nearest (same topology, another generation or profile
    kind, most runs first), marked 'nearest'; None when no held-out run shares its topology. A ZeRO-3
    topology includes its implementation: another version's errors are not borrowed (at scale the
    versions' steps differ by several times, docs/zero-implementations.md)."""
    regimes = (table or read_table())["regimes"]
    regime = regime_of(scenario)
    if regime.key in regimes:
        return _band(regime.key, regimes[regime.key], "exact")
    near = [(k, v) for k, v in regimes.items() if k.split(" | ")[0] == regime.topology]
    if not near or regime.generation == "CPU":  # no GPU run's error says anything about a CPU host's
        return None
    key, row = max(near, key=lambda kv: (kv[1]["n"], kv[0].split(" | ")[2] == regime.key.split(" | ")[2]))
    return _band(key, row, "nearest")


def generation_band(scenario, table: dict[str, Any] | None = None) -> Band | None:
    """The held-out residuals of `scenario`'s GPU generation and profile kind over every topology, pooled (match
    'generation'): what a run outside every validated regime sets beside a nearest band of another generation,
    since a generation's compute errors follow its runs whatever their layout. None without any."""
    table = table or read_table()
    regime = regime_of(scenario)
    suffix = f" | {regime.generation} | {regime.profile} profile"
    rows = [r for r in table.get("residuals", []) if r["regime"].endswith(suffix) and r["error"] is not None]
    if not rows or regime.generation == "CPU":
        return None
    errors = [r["error"] for r in rows]
    return Band(f"{regime.generation} ({regime.profile} profile), any topology", len(rows), statistics.median(errors),
                min(errors), max(errors), tuple(f"{r['suite']}:{r['point']}" for r in rows), "generation")


def _band(key: str, row: dict[str, Any], match: str) -> Band:
    return Band(key, row["n"], row["error_median"], row["error_low"], row["error_high"], tuple(row["points"]), match)


def outside_words(scenario, table: dict[str, Any] | None = None) -> str:
    """What `zsim run` prints when no held-out run shares the run's topology; for a ZeRO-3 run, which
    other implementations of its topology have held-out runs."""
    topology = regime_of(scenario).topology
    words = (f"outside every validated regime: no held-out published run of {topology} "
             "(docs/validation.md, 'Error band'); the step time has no measured error")
    if scenario.zero.stage != 3 or regime_of(scenario).generation == "CPU":
        return words
    others = sorted({k.split(" | ")[0] for k in (table or read_table())["regimes"]
                     if base_topology(k.split(" | ")[0]) == base_topology(topology) and k.split(" | ")[0] != topology})
    if others:
        words += "; held-out runs exist as " + ", ".join(others) + " (zero.implementation)"
    return words


def build_table(residuals: list[dict[str, Any]]) -> dict[str, Any]:
    """The table from residuals ({'suite', 'point', 'regime', 'error'}): per regime, n, the median,
    lowest and highest error and the points. A residual without an error (the run did not simulate or
    did not fit) is listed under 'unsimulated', not in a band."""
    regimes: dict[str, Any] = {}
    for key in sorted({r["regime"] for r in residuals if r["error"] is not None}):
        rows = [r for r in residuals if r["regime"] == key and r["error"] is not None]
        errors = [r["error"] for r in rows]
        regimes[key] = {"n": len(rows), "error_median": round(statistics.median(errors), 4),
                        "error_low": round(min(errors), 4), "error_high": round(max(errors), 4),
                        "points": [f"{r['suite']}:{r['point']}" for r in rows]}
    return {"generated_by": REGENERATE,
            "error": "simulated / published step time - 1 (negative: zsim faster than the published run)",
            "regimes": regimes,
            "unsimulated": [f"{r['suite']}:{r['point']}" for r in residuals if r["error"] is None],
            "residuals": residuals}
