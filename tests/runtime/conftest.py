"""Helpers for the runtime tests: tiny models, and traced runs launched as real processes (gloo).

Runs are cached (`traced`), so that the parity, byte and volume tests read the same traces instead
of launching the same ranks again; the cache lives in the folder all pytest-xdist workers share,
and a lock file makes the first worker that needs a run launch it while the others wait.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from zsim.runtime.config import RunConfig
from zsim.runtime.launch import launch
from zsim.config.model_section import ModelSection

# 2 layers, hidden 30, 2 heads, seq 16, vocab 63: units of 2370 (embedding), 11190 (block) and
# 1950 (head) elements, none a multiple of 4, so a 4-way partition pads every unit (exact and
# padded bytes differ, and the tests check both).
TINY = dict(layers=2, hidden=30, heads=2, seq_len=16, vocab=63, micro_batch=2)


def tiny_model(**changes) -> ModelSection:
    return ModelSection(**{**TINY, **changes})


def run_config(out: Path, **changes) -> RunConfig:
    base = dict(model=tiny_model(), stage=0, precision="fp32", world_size=2, steps=10, out_dir=str(out),
                bucket_elements=10_000, seed=1, lr=1e-2, device="cpu")
    return RunConfig(**{**base, **changes})


def load_trace(out: Path, rank: int) -> dict:
    return json.loads((out / f"rank{rank}.trace.json").read_text())


@dataclass(frozen=True)
class Traced:
    out: Path
    summary: dict

    def trace(self, rank: int) -> dict:
        return load_trace(self.out, rank)


@pytest.fixture(scope="session")
def traced(tmp_path_factory):
    """traced(name, **config) -> Traced, launching each distinct run once for all xdist workers."""
    base = tmp_path_factory.getbasetemp()  # pytest-N/popen-gwK under xdist, pytest-N without
    root = (base.parent if base.name.startswith("popen-gw") else base) / "runtime-runs"  # this session's only
    root.mkdir(exist_ok=True)

    def run(name: str, **changes) -> Traced:
        out, done = root / name, root / f"{name}.done"
        try:
            os.close(os.open(root / f"{name}.lock", os.O_CREAT | os.O_EXCL))
        except FileExistsError:  # another worker launches it
            deadline = time.monotonic() + 300
            while not done.exists():
                assert time.monotonic() < deadline, f"run {name} never finished"
                time.sleep(0.1)
        else:
            result = launch(run_config(out, **changes))
            done.write_text(str(result.failure or "ok"))
        assert done.read_text() == "ok", f"run {name}: {done.read_text()}"
        return Traced(out, json.loads((out / "summary.json").read_text()))
    return run
