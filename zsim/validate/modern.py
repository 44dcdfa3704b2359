"""`zsim validate modern`: published runs with pipeline parallelism, sequence parallelism and selective
recompute against zsim's step time (issue 27, item 8).

The points, their sources and halves are in zsim/validate/suites/modern.yaml (declared before zsim could
simulate them). They are run and judged exactly as `zsim validate scale`'s (zsim.validate.scale): the
held-out half's median |step-time error| <= 15%, none beyond 35%, every held-out series' trend within
15% of its ratio; calibration points are printed, not judged.
"""

from __future__ import annotations

from pathlib import Path

from zsim.validate import scale
from zsim.validate.report import Report


def default_suite() -> Path:
    """zsim/validate/suites/modern.yaml."""
    return Path(__file__).resolve().parent / "suites" / "modern.yaml"


def run(progress: bool = False, suite_file: Path | None = None, overrides: tuple[str, ...] = (),
        only: tuple[str, ...] = ()) -> Report:
    """Simulate every point of the modern suite (or those whose id matches a pattern of `only`, `zsim validate
    --point`), each with `overrides` (`zsim validate --set`), and judge its held-out half (zsim.validate.scale.run).

    Raises:
        ConfigError: a malformed suite file, an override its first point refuses, or a pattern no point matches.
    """
    return scale.run(progress=progress, suite_file=suite_file or default_suite(), name="modern", overrides=overrides,
                     only=only)
