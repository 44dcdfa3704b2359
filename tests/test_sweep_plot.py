"""The sweep plot shows what the summary says (issue 28, part 8): a circled knee for every knee the
text reports on the plotted x, in curves whose key is zipped with another (the layout sweep's MP with
DP), and one y scale across panels."""

from __future__ import annotations

import pytest

from tests.conftest import ROOT
from zsim.config.struct import replace
from zsim.sweep.plot import sweep_figure
from zsim.sweep.points import plan_sweep
from zsim.sweep.runner import run_sweep
from zsim.sweep.spec import load_sweep_file

LAYOUT = ROOT / "scenarios" / "whatif" / "layout-1T.yaml"


@pytest.fixture(scope="module")
def layout_sweep():
    """The shipped layout sweep narrowed to 2 stages × 2 MP degrees × 4 micro-batches (16 points); at
    stage 3, MP 1 and 2 have knees in micro-batch (the full sweep's summary says 2 and 4)."""
    spec = load_sweep_file(LAYOUT)
    spec = replace(spec, axes={**spec.axes, "zero.stage": [2, 3]},
                   zip=[{"parallel.mp": [1, 2], "parallel.dp": [1024, 512]}])
    return run_sweep(plan_sweep(spec, str(LAYOUT), LAYOUT.parent), None, workers=1)


def knee_markers(ax) -> list[tuple[float, float]]:
    """The circled points of an axes: hollow markers of size 13 (zsim.sweep.plot)."""
    return [(line.get_xdata()[0], line.get_ydata()[0]) for line in ax.get_lines()
            if line.get_markersize() == 13 and line.get_markerfacecolor() == "none"]


def test_every_reported_knee_is_circled(layout_sweep):
    import matplotlib.pyplot as plt

    reported = [k for k in layout_sweep.knees if k.x is not None]
    assert layout_sweep.knee_axis == "model.micro_batch" and reported, layout_sweep.knees
    assert all("parallel.dp" in k.group for k in reported)  # the zipped key the plot does not name
    fig, _ = sweep_figure(layout_sweep)
    try:
        circled = sorted(p for ax in fig.axes for p in knee_markers(ax))
        assert circled == sorted((k.x, k.value) for k in reported)
        # each circle in the panel of its stage
        for ax in fig.axes:
            stage = int(ax.get_title().split("=")[1])
            expected = sorted((k.x, k.value) for k in reported if k.group["zero.stage"] == stage)
            assert sorted(knee_markers(ax)) == expected, ax.get_title()
    finally:
        plt.close(fig)


def test_panels_share_one_y_scale(layout_sweep):
    import matplotlib.pyplot as plt

    fig, _ = sweep_figure(layout_sweep)
    try:
        first, *others = [ax for ax in fig.axes if ax.get_visible()]
        assert others, "two stages, two panels"
        assert all(first.get_shared_y_axes().joined(first, ax) for ax in others)
        assert all(ax.get_ylim() == first.get_ylim() for ax in others)
    finally:
        plt.close(fig)
