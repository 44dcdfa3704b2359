"""memory.png's labels stay inside the plot (issue 28, part 8): an out-of-memory run peaks at its failing
allocation, often near the end of the run, where a label reading rightwards ran onto the legend."""

from __future__ import annotations

import numpy as np
import pytest

from zsim.report.plots import CATEGORIES, MemorySeries, memory_figure

GB = 1e9


def series(peak_s: float, end_s: float = 10.0, oom: bool = True) -> MemorySeries:
    """A run whose allocated and reserved peaks (36.8 GB, over a 34.4 GB GPU) fall at `peak_s`."""
    times = np.array([0.0, peak_s * 0.5, peak_s, min(peak_s + 0.1, end_s)])
    layers = np.zeros((len(times), len(CATEGORIES) + 1))
    layers[:, 0] = [5e9, 20e9, 36.8e9, 10e9]
    return MemorySeries(times=times, layers=layers, end_s=end_s, capacity=34.4e9, peak=(36.8e9, peak_s),
                        reserved_peak=(36.8e9, peak_s), oom=(peak_s, "activations") if oom else None,
                        title="oom: memory per GPU")


@pytest.mark.parametrize("peak_s", [0.2, 5.0, 9.99, 10.0])
def test_peak_and_oom_labels_stay_inside_the_axes_and_off_the_legend(peak_s):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = memory_figure(series(peak_s))
    renderer = FigureCanvasAgg(fig).get_renderer()
    (ax,) = fig.axes
    legend = ax.get_legend().get_window_extent(renderer)
    box = ax.get_window_extent(renderer)
    labels = [t for t in ax.texts if "peak" in t.get_text() or "OOM" in t.get_text()]
    assert len(labels) == 3
    for text in labels:
        extent = text.get_window_extent(renderer)
        assert not extent.overlaps(legend), (text.get_text(), extent, legend)
        assert box.x0 - 1 <= extent.x0 and extent.x1 <= box.x1 + 1, (text.get_text(), extent, box)
