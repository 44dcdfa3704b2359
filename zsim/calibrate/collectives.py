"""Calibrating the collective model of a profile from measured collectives, or refusing to.

Two model kinds, one per backend:
* **nccl** on a GPU system profile: NCCL's tuner and the fitted kernel terms (zsim.calibrate.nccl_fit).
* **gloo** on a host profile: a latency-bandwidth (α-β) line per collective and group size
  (zsim.calibrate.alpha_beta; Hockney 1994), because gloo on a CPU runs none of NCCL's algorithms
  (it implements reduce_scatter as a whole all_reduce, DESIGN.md).

A profile is written only when the data determine what is fitted. Refusals (CalibrationError, exit 2):
a backend that does not match the model kind, and fewer distinct samples than twice the free terms.
Terms no sample moves are kept from the base and listed (all of them, when the samples sit under the
launch floor). Fitted terms on an artificial bound are returned (`at_bounds`) for the poor-fit verdict
(zsim.calibrate.fit_quality), which refuses them unless accepted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from zsim.fabric.cluster import Cluster
from zsim.errors import ZsimError
from zsim.trace.samples import CollectiveSample

SAMPLES_PER_TERM = 2  # distinct (op, bytes, group) samples per free term, at least


class CalibrationError(ZsimError):
    """The data cannot determine the model (exit 2): the message says which term and why."""


class Refusal(CalibrationError):
    """A fit refused for one or more named causes (exit 2): `headline` says what was refused, `causes`
    each reason in a line; the message holds both (the CLI prints every cause on its own line)."""

    def __init__(self, headline: str, causes: list[str]) -> None:
        super().__init__(f"{headline}: {'; '.join(causes)}")
        self.headline = headline
        self.causes = list(causes)


@dataclass(slots=True)
class CollectiveCalibration:
    """The fitted `nccl:` values (profile units), what was fitted and kept, and per-sample errors."""

    values: dict[str, float]
    fitted: tuple[str, ...]
    kept: tuple[str, ...]
    at_zero: tuple[str, ...]
    residuals: list = field(default_factory=list)  # nccl_fit.Residual
    at_bounds: tuple[str, ...] = ()  # fitted terms on an artificial bound: the model does not fit these data

    def summary(self) -> dict[str, dict[str, float]]:
        """Per collective: samples, median and max |busbw error| (sizes ≥ 1 MiB where there are any)."""
        out = {}
        for fn in sorted({r.fn for r in self.residuals}):
            rows = [r for r in self.residuals if r.fn == fn]
            big = [abs(r.error) for r in rows if r.size >= 1 << 20] or [abs(r.error) for r in rows]
            big.sort()
            out[fn] = {"samples": len(rows), "median_error": round(float(np.median(big)), 4),
                       "max_error": round(big[-1], 4)}
        return out


def check_backend(samples: list[CollectiveSample], model_kind: str, profile: str) -> None:
    """Refuse to fit `model_kind` ('nccl' or 'gloo') to samples of another backend."""
    backends = sorted({s.backend for s in samples})
    wrong = [b for b in backends if b != model_kind]
    if wrong:
        hint = ("calibrate a host profile instead (--profile <host>, hwprofiles/hosts/)" if model_kind == "nccl"
                else "calibrate a GPU system profile instead (--profile dgx2, ...)")
        sources = sorted({s.source for s in samples if s.backend in wrong})
        raise CalibrationError(f"the collectives in {', '.join(sources)} ran on {'/'.join(wrong)}, but profile "
                               f"'{profile}' models {model_kind}: its terms would mean nothing for them; {hint}")


def calibrate_nccl(cluster: Cluster, samples: list[CollectiveSample], profile: str) -> CollectiveCalibration:
    """Fit the NCCL kernel terms the samples determine; keep the base profile's others (all of them,
    listed as kept, when no term moves any sample's time: every sample under the launch floor).

    Raises:
        CalibrationError: a non-NCCL backend, or too few distinct samples for the terms they touch.
    """
    from zsim.calibrate.nccl_fit import NAMES, fit_samples, residuals_of, sensitive_terms, values_of

    check_backend(samples, "nccl", profile)
    base = values_of(cluster.nccl)
    free = sensitive_terms(cluster, samples, base)
    distinct = len({(s.op, s.nbytes, s.group, s.gpus_per_process) for s in samples})
    if not free:  # the data determine no term: keep and list them all, do not refuse the other fits
        return CollectiveCalibration(base, (), NAMES, (), residuals_of(cluster, samples))
    if distinct < SAMPLES_PER_TERM * len(free):
        raise CalibrationError(f"{distinct} distinct collectives (op, size, group) cannot determine the {len(free)} "
                               f"NCCL terms they touch ({', '.join(free)}); need at least {SAMPLES_PER_TERM * len(free)}: "
                               "add nccl-tests tables or traces with more sizes")
    result = fit_samples(cluster, samples, free=free)
    at_zero = tuple(n for n in result.fitted if result.values[n] == 0.0)
    return CollectiveCalibration(result.values, result.fitted, result.kept, at_zero, result.residuals,
                                 result.at_bounds)
