"""Cross-check (issue 5): torch's own ZeroRedundancyOptimizer (ZeRO-1) and FSDP2 (ZeRO-3 style)
train the runtime's model on the runtime's data to the losses of the runtime's stage 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from zsim.runtime.launch import free_port
from tests.runtime.conftest import TINY
from tests.runtime.reference_run import TINY as REFERENCE_TINY

ROOT = Path(__file__).resolve().parents[2]


def test_reference_uses_the_test_model():
    assert REFERENCE_TINY == TINY


def test_torch_zero1_and_fsdp2_match_runtime(traced, tmp_path):
    ours = traced("s0r2", stage=0, world_size=2).summary["losses"]
    out = tmp_path / "losses.json"
    env = dict(os.environ, WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    procs = [subprocess.Popen([sys.executable, "-m", "tests.runtime.reference_run", "10", "1e-2", "1", str(out),
                               "zero1", "fsdp2"], cwd=ROOT, env=dict(env, RANK=str(rank))) for rank in range(2)]
    try:
        assert [p.wait(timeout=120) for p in procs] == [0, 0]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    theirs = json.loads(out.read_text())
    # Same math, different summation order (DDP averages after the all-reduce; the runtime scales
    # the loss by 1/Nd first): agreement to float tolerance.
    assert theirs["zero1"] == pytest.approx(ours, rel=1e-5)
    assert theirs["fsdp2"] == pytest.approx(ours, rel=1e-5)
