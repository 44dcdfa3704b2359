"""The error band beside a step time: how wrong zsim has been on held-out published runs of the run's regime
(zsim.report.band; docs/validation.md, "Error band"). It replaces the memory-margin caution of earlier
versions, which blamed the misses on memory pressure: issue 25 showed the misses are not the allocator
(zsim predicts no cache flush in any of the 22 chart runs; misses of 3.5-4.7x with 20-64% of memory free),
and an allocator flush-and-retry measured ~3.7 ms on an H200 (docs/device-check.md).

The run summary (zsim.report.summary), result.json (`band`), the sweep rows (`band_*`) and the plots use it.
"""

from __future__ import annotations

from typing import Any


def band_facts(scenario, step_s: float) -> dict[str, Any]:
    """result.json's `band`: the regime's held-out error and the step range it implies (seconds), with
    `match` 'exact', 'nearest' (the run is outside every validated regime; the band is its topology's on
    another GPU generation or profile kind) or 'outside' (no held-out run shares its topology: no band)."""
    from zsim.report.band import band_for, generation_band, outside_words, regime_of

    band = band_for(scenario)
    if band is None:
        return {"regime": regime_of(scenario).key, "match": "outside", "words": outside_words(scenario)}
    facts = {**band.as_dict(step_s), "words": band.words(step_s)}
    generation = regime_of(scenario).generation
    if band.match == "nearest" and band.regime.split(" | ")[1] != generation:
        # the nearest band is another generation's: its own generation's held-out runs, any layout, beside it
        own = generation_band(scenario)
        if own is not None:
            lo, _, hi = own.step_range(step_s)
            facts["own_generation"] = own.as_dict(step_s)
            facts["words"] += (f"; {own.n} held-out {generation} run{'s' if own.n > 1 else ''} of other layouts took "
                               f"{1 / (1 + own.high):.2f}x to {1 / (1 + own.low):.2f}x zsim's step ({lo:.3g}-{hi:.3g} s)")
    return facts


def band_line(band: dict[str, Any]) -> str:
    """The summary's line for result.json's `band`."""
    return f"  band      {band['words']}"
