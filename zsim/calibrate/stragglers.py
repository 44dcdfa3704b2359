"""The slowest rank's pace: how much longer the slowest of a host's ranks computes per step than
the ranks' mean, measured in real traces.

Ranks meet at every collective, so a step goes at the pace of whichever rank is slowest since the
last meeting; on a shared CPU host which rank that is changes from step to step (another process,
the hypervisor's steal time, interrupts on one core). The simulator's ranks are symmetric and run at
the calibrated (median-over-ranks) pace, so without this they predict the mean rank, not the slowest:
in this machine's held-out replays every step came out short (docs/calibrate.md).

The factor is the ratio max_r C(r, s) / mean_r C(r, s) of each rank r's compute seconds C in each
step s after the warm-up (the same op times the compute fit uses: zsim.calibrate.host_calibration
aligned_ops), median over the steps of every calibration run. It is a measured property of the host
under its load, like its matmul rate, and the host model multiplies every compute op by it
(zsim.engine.compute.host_seconds). The ratio of per-step sums understates the effect in runs that
meet more often than once a step; it is the conservative choice.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

MIN_STEPS = 3  # fewer per-step ratios than this leave the factor to the base profile


def step_ratios(rank_steps: dict[tuple[int, int], float]) -> list[float]:
    """max over ranks / mean over ranks of the compute seconds of each step with two or more ranks.

    `rank_steps` maps (step, rank) to that rank's compute seconds in that step."""
    by_step: dict[int, list[float]] = defaultdict(list)
    for (step, _), seconds in sorted(rank_steps.items()):
        by_step[step].append(seconds)
    return [max(times) / float(np.mean(times)) for times in by_step.values()
            if len(times) > 1 and float(np.mean(times)) > 0]


def slowest_rank_factor(ratios: list[float]) -> float | None:
    """The median of the per-step ratios (at least 1), or None when fewer than MIN_STEPS steps had two
    or more ranks: one-rank runs have no other rank to wait for, and simulated traces already run at
    their profile's pace (their ranks are symmetric), so the fitted terms carry it and the factor is 1."""
    if len(ratios) < MIN_STEPS:
        return None
    return max(1.0, float(np.median(ratios)))
