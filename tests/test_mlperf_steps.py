"""The MLPerf Training points of `zsim validate modern` hold the step their logs time: every `mlperf*` point's
published step_s is recomputed from data/published/mlperf (the submissions' per-step timers, SOURCE.md), and its
scenario runs the global batch and accumulation the logs print."""

from __future__ import annotations

import csv
import gzip
import statistics
from collections import defaultdict

from tests.conftest import ROOT
from zsim.validate import modern
from zsim.validate.scale import _scenario, load_suite

DATA = ROOT / "data" / "published" / "mlperf"


def _logged():
    """(round, system, benchmark) -> {log: [(kind, seconds, tokens)]} and -> the system's logged facts (a system folder
    can hold two benchmarks: v5.1's theia_ngpu512 and tyche_ngpu512 ran Llama 3.1 405B and 8B)."""
    steps: dict[tuple[str, str], dict[str, list]] = defaultdict(lambda: defaultdict(list))
    with gzip.open(DATA / "steps.csv.gz", "rt", newline="") as f:
        for row in csv.DictReader(f):
            steps[row["round"], row["system"], row["benchmark"]][row["log"]].append(
                (row["kind"], float(row["seconds"]), row["tokens"]))
    with open(DATA / "systems.csv", newline="") as f:
        facts = {(r["round"], r["system"], r["benchmark"]): r for r in csv.DictReader(f)}
    return steps, facts


def _published(logs: dict[str, list], fact: dict[str, str]) -> float:
    """SOURCE.md's rule: the median of every log's steps after its first three; for logs of blocks, the median
    block interval over the steps a block holds."""
    kinds = {kind for rows in logs.values() for kind, _, _ in rows}
    if kinds == {"step"}:
        return statistics.median(s for rows in logs.values() for _, s, _ in rows[3:])
    assert kinds == {"block"}, kinds
    tokens = {int(t) for rows in logs.values() for _, _, t in rows}
    assert len(tokens) == 1, tokens
    steps = tokens.pop() / (int(fact["global_batch_size"]) * int(fact["seq_len"]))
    return statistics.median(s for rows in logs.values() for _, s, _ in rows) / steps


def test_every_mlperf_point_is_its_logs_median_step():
    steps, facts = _logged()
    points, _ = load_suite(modern.default_suite())
    mlperf = [p for p in points if p.id.startswith("mlperf")]
    assert len(mlperf) == len(facts) == 72
    seen = set()
    for p in mlperf:
        rnd = f"v{p.id[6]}.{p.id[7]}"  # mlperf31-... -> v3.1
        system = p.quote.split(":")[0].split(" ")[0]
        key = (rnd, system, "gpt3" if "-gpt3-" in p.id else "llama31_405b" if "-llama405b-" in p.id else "llama31_8b")
        assert key in facts and key not in seen, (p.id, key)
        seen.add(key)
        logs = 10 if facts[key]["benchmark"] == "llama31_8b" else 3  # MLPerf's runs a system
        assert len(steps[key]) == logs, (p.id, sorted(steps[key]))
        published = p.published["step_s"]
        digits = len(str(published).split(".")[1])
        assert round(_published(steps[key], facts[key]), digits) == published, p.id
        sc = _scenario(p, modern.default_suite())
        fact = facts[key]
        assert sc.model.global_batch == int(fact["global_batch_size"]), p.id
        assert sc.grad_accum == int(float(fact["gradient_accumulation_steps"])), p.id
        assert sc.model.seq_len == int(fact["seq_len"]), p.id
