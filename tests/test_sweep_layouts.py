"""Which layouts a sweep skips (issue 28, part 8): docs/sweep.md said an MP group across nodes is refused,
while zsim accepts one that fills whole nodes (docs/fabric.md, "MP across nodes"). The docs now say what
the loader does: MP over whole nodes runs; MP that neither divides a node nor fills whole nodes is refused."""

from __future__ import annotations

from tests.conftest import ROOT
from zsim.sweep.points import plan_sweep
from zsim.sweep.spec import sweep_from_mapping

BASE = ROOT / "scenarios" / "paper" / "7.5B-64gpu-stage3.yaml"  # DGX-2: 16 GPUs a node, 32 heads


def test_mp_over_whole_nodes_runs_and_mp_across_part_of_a_node_is_skipped():
    spec = sweep_from_mapping({
        "base": str(BASE), "skip_invalid": True,
        "set": {"model.global_batch": None, "model.grad_accum": 1},
        # MP 32 fills 2 of 4 nodes; MP 24 would take a node and a half of 3
        "zip": [{"parallel.mp": [32, 24], "parallel.dp": [2, 2], "hardware.nodes": [4, 3]}],
    })
    plan = plan_sweep(spec, "<test>", ROOT)
    (point,) = plan.points
    assert point.values["parallel.mp"] == 32 and point.scenario.layout.mp_shape.spans_nodes
    (reason,) = plan.skipped
    assert reason.startswith("parallel.mp: N must divide the N GPUs of a node, or be a multiple of them"), reason


def test_the_sweep_docs_say_what_is_skipped():
    text = " ".join((ROOT / "docs" / "sweep.md").read_text().split())
    assert "MP across nodes, heads" not in text  # the old claim: every MP group across nodes is refused
    assert "an MP degree that neither divides a node's GPUs nor fills whole nodes" in text
    assert "An MP group over whole nodes (MP 32 on 16-GPU nodes) is a valid layout" in text
