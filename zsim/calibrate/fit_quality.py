"""Whether a fit is good enough to write: the causes of a poor fit, each named, and the verdict.

Issue 26 found calibrations written without a word that should have been questioned: a CPU fit with
the matmul rate at 4× what the host probe measured and the per-op overhead at 19× (in-sample median
error 42%), and DGX-2 tables on a DGX-1 base (62%). A fit is poor, and refused (exit 2, nothing
written) unless the user accepts it (`--accept-poor-fit`, which writes the causes into the profile as
its warning), when any of:

* a fitted term ends on an artificial bound of its fit (the model does not fit the data: an
  efficiency of 0.01, a GEMM operand bandwidth at its ceiling);
* an in-sample median error above MEDIAN_LIMIT (per collective, per gloo line, per compute fit);
* a fitted term more than FAR_FACTOR times from its reference, either way: for a host profile the
  base's compute terms and gloo lines, which `python -m zsim.runtime.hostprobe` measured (the probe);
  for a GPU system the base's terms, which are datasheet values times efficiencies from their own
  cited fits (an NCCL efficiency is achieved busbw over the datasheet's NVLink rate, docs/fabric.md).
  Terms that may physically be 0 (latencies, a launch or k-overhead too small to measure) have no
  meaningful ratio and are not compared.

Both limits are issue 26's acceptance criteria ("an in-sample median error above 15%, or terms more
than 3× from the probe or the datasheet"). For scale: the real DGX-2 nccl-tests fit has in-sample
medians of 0.9-2.6% per collective and DeepBench's V100 GEMM fits 4.7% (fp32) and 6.7% (fp16); the
round trip's base (tests/test_round_trip.py), made wrong by 25-150% on purpose, stays inside 3×.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from zsim.calibrate.collectives import Refusal

MEDIAN_LIMIT = 0.15  # issue 26: in-sample median relative error a written fit may have
FAR_FACTOR = 3.0  # issue 26: how far (either way) a fitted term may lie from the probe or the datasheet


def at_bounds(what: str, terms: Iterable[str]) -> list[str]:
    """The cause for fitted terms on artificial bounds (`terms`: 'name = value' texts), or none."""
    terms = list(terms)
    return [f"{what}: {', '.join(terms)} ended on the fit's bounds (the model does not fit these data)"] if terms else []


def high_error(what: str, median: float | None) -> list[str]:
    """The cause for an in-sample median relative error above MEDIAN_LIMIT, or none."""
    if median is None or median <= MEDIAN_LIMIT:
        return []
    return [f"{what}: in-sample median error {median:.0%} > {MEDIAN_LIMIT:.0%}"]


def far_terms(what: str, fitted: Mapping[str, float], reference: Mapping[str, Any], source: str) -> list[str]:
    """One cause per fitted term more than FAR_FACTOR times from `reference` (same keys, same units),
    named `source` in the message ('the probe', 'the base'); terms without a positive reference or
    value are not compared (see the module docstring)."""
    causes = []
    for name, value in fitted.items():
        ref = reference.get(name)
        if not isinstance(ref, (int, float)) or isinstance(ref, bool) or ref <= 0 or value <= 0:
            continue
        ratio = value / ref
        if ratio > FAR_FACTOR or ratio < 1 / FAR_FACTOR:
            how = f"{ratio:.3g}×" if ratio > 1 else f"1/{1 / ratio:.3g} of"
            causes.append(f"{what}: {name} = {value:.4g} is {how} {source}'s {ref:.4g} (more than {FAR_FACTOR:g}× "
                          "either way)")
    return causes


def verdict(causes: list[str], accept: bool) -> dict[str, Any] | None:
    """None for a good fit; for a poor one, the warning the profile carries when `accept`.

    Raises:
        Refusal: a poor fit not accepted (exit 2, every cause named, nothing written).
    """
    if not causes:
        return None
    if not accept:
        raise Refusal("poor fit, nothing written (--accept-poor-fit writes it with these causes as its warning)",
                      causes)
    return {"poor_fit": list(causes), "accepted": "--accept-poor-fit",
            "meaning": "this profile's fitted terms do not describe their measurements well (the causes); "
                       "predictions made with it carry that doubt"}
