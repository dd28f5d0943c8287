"""The report's ROC figure stays legible at every FPR resolution: no two tick labels on an axis overlap (a handful
of non-members puts the axis within one decade, where matplotlib labels every minor tick)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from fedvit.audit.figures import roc_figure
from fedvit.audit.membership_stats import Roc


def roc(members: int, non_members: int, seed: int = 0) -> Roc:
    rng = np.random.default_rng(seed)
    return Roc(rng.normal(1.0, 1, members), rng.normal(0.0, 1, non_members), np.zeros(members, int),
               np.zeros(non_members, int), 1 / non_members)  # fmt: skip


@pytest.mark.parametrize("non_members", [3, 4, 6, 30, 300])
def test_no_two_tick_labels_of_a_roc_axis_overlap(non_members):
    from fedvit.core.plots import plt

    fig = roc_figure({"partition 0": [("round 1", roc(2 * non_members, non_members))]})
    try:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        (ax,) = [a for a in fig.axes if a.get_visible()]
        for axis in (ax.xaxis, ax.yaxis):
            low, high = sorted(axis.get_view_interval())
            shown = [t.label1 for t in axis.get_major_ticks() + axis.get_minor_ticks()
                     if t.label1.get_visible() and t.label1.get_text() and low <= t.get_loc() <= high]  # fmt: skip
            assert len(shown) >= 2, [t.get_text() for t in shown]  # a scale to read
            boxes = [t.get_window_extent(renderer) for t in shown]
            for a, b in itertools.combinations(boxes, 2):
                assert not a.overlaps(b), (non_members, [t.get_text() for t in shown])
    finally:
        plt.close(fig)
