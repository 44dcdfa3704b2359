"""The quick fuzz profile (issue 13): every fuzz target of tests/fuzz_targets.py with a few dozen
derandomized examples (seconds), in `make test`. `benchmarks/fuzz_long.py` runs the same targets long."""

from __future__ import annotations

import resource
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from tests.fuzz_targets import TARGETS, check

QUICK = {"scenario_cli": 6, "nccl_cli": 4, "cli_arguments": 25}  # these run simulations or fits: fewer


@pytest.fixture(autouse=True)
def short_runs(monkeypatch):
    monkeypatch.setenv("ZSIM_MAX_SECONDS", "3")  # the cost guard refuses runs estimated longer


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_fuzz_quick(name):
    strategy, target = TARGETS[name]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)

        @settings(max_examples=QUICK.get(name, 25), deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(strategy)
        def run(item):
            check(target(item, work))

        run()
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss < 4 << 20  # kB: this worker stayed under 4 GiB
