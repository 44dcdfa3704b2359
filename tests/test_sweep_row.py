"""One sweep row, one number for one quantity (issue 28, part 8): a point whose model states alone exceed
the GPU said 264.0 GB in `oom` (the loader's closed form) and 265.0 GB in `bottleneck` (the plan's padded
layout) for the 1T flagship at stage 1."""

from __future__ import annotations

import re

from tests.conftest import ROOT
from zsim.config.struct import replace
from zsim.sweep.points import plan_sweep
from zsim.sweep.runner import run_sweep
from zsim.sweep.spec import load_sweep_file

IB = ROOT / "scenarios" / "whatif" / "ib-bandwidth-1T.yaml"


def test_a_states_oom_row_gives_one_figure_for_the_model_states():
    spec = load_sweep_file(IB)
    spec = replace(spec, axes={"hardware.nic_Gbps": [100], "zero.stage": [1, 2]})
    table = run_sweep(plan_sweep(spec, str(IB), IB.parent), None, workers=1).table
    for row in table.rows:
        assert row["status"] == "oom", row
        states = f"{row['model_states_bytes'] / 1e9:.1f}"
        said = re.findall(r"model states alone need ([\d.]+) GB", row["oom"] + " | " + row["bottleneck"])
        assert said == [states, states], (row["oom"], row["bottleneck"], states)
        assert "ZeRO stage 3 would need" in row["oom"]  # the loader's advice is kept
