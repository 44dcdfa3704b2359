"""Timings quoted in the README and docs are today's and say the same in every place (issue 28, part 8:
the per-rank flagship's 24.6 s and a sweep point's ~100 ms were stale). When a measurement changes,
change it everywhere it is quoted; this test fails on a place left behind."""

from __future__ import annotations

import re

from tests.conftest import ROOT


def text(name: str) -> str:
    return " ".join((ROOT / name).read_text().split())


def test_per_rank_flagship_time_is_the_same_in_readme_and_fabric_docs():
    readme = re.search(r"per-rank mode ([\d.]+) s for the 1024-GPU flagship", text("README.md"))
    table = re.search(r"\| 1024 \| [\d,]+ \| [\d.]+ \| [\d,]+ \| ([\d.]+) \|", text("docs/fabric.md"))
    assert readme and table and readme.group(1) == table.group(1), (readme, table)
    assert "~24 s for the 1024-GPU flagship" not in text("README.md")


def test_sweep_point_cost_is_the_same_in_readme_and_sweep_docs():
    readme = re.search(r"the 1000-point sweep at about (\d+) s of CPU, (\d+) ms a point", text("README.md"))
    docs = re.search(r"~(\d+) ms of simulation \(issue 28's audit: the 1000-point flagship sweep in about (\d+) s",
                     text("docs/sweep.md"))
    assert readme and docs, (readme, docs)
    assert readme.group(2) == docs.group(1) and readme.group(1) == docs.group(2)
    assert "~100 ms of simulation" not in text("docs/sweep.md")
