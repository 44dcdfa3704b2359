"""Fit the GEMM model's terms (zsim.compute.terms.GemmTerms) to measured GEMM times, and say how well
the fit predicts shapes it never saw.

Input: a DeepBench-style CSV (columns M, N, K, time_ms; optional `batch`; other columns ignored), e.g.
../shared/data/deepbench-v100/gemm_fp16_tensorcore.csv, or an XLA GEMM table (b, m, n, k, dtype,
flops_per_s; zsim.trace.xla_gemm), e.g. ../shared/data/gemm-xla/xla-sm_90.csv, of which the rows of one
dtype are fitted. The structure (tiles, waves, split-K, the HBM
roofline; zsim.compute.gemm) is fixed; five terms are free. They are fitted by robust least squares on
log(time) (scipy.optimize.least_squares, trust-region reflective with bounds, soft-L1 loss with a 10%
scale: one odd shape, such as a transposed memory-bound GEMM twice as slow as its twin, does not drag
the rest), so small and large GEMMs weigh alike.

Held-out error: the rows are split by position, even rows and odd rows (2-fold, fixed and documented
in docs/compute.md); each half is fitted and predicts the other; the report gives the median, 90th
percentile and maximum |predicted/measured − 1| over the predictions of rows a fit never saw.
A second split, by shape family (`family_holdout`), fits the single GEMMs (batch 1) and predicts the
batched ones, which the tile model prices as batch × the tiles (XLA's tables have b = 1, 2, 4).
"""

from __future__ import annotations

import csv
import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from zsim.calibrate.optimizer import scipy_optimize
from zsim.compute.gemm import gemm_seconds
from zsim.compute.terms import GemmTerms
from zsim.errors import ConfigError, ZsimError, short
from zsim.trace.deepbench import gemm_row

# name, initial value, lower, upper bound, in profile units (docs/compute.md).
PARAMS = (
    ("efficiency", 0.9, 0.3, 1.0),
    ("tile_TBps", 2.0, 0.1, 50.0),
    ("k_overhead", 64.0, 0.0, 2048.0),
    ("fixed_us", 5.0, 0.0, 50.0),
    ("hbm_efficiency", 0.85, 0.3, 1.0),
)


@dataclass(frozen=True, slots=True)
class GemmRow:
    """One measured GEMM: batch × (M×N×K), seconds."""

    m: int
    n: int
    k: int
    batch: int
    seconds: float


@dataclass(frozen=True, slots=True)
class GemmHardware:
    """What the fit needs about the GPU: SMs, tile shapes, the dtype's peak, HBM bandwidth, element bytes."""

    sms: int
    tiles: tuple[tuple[int, int], ...]
    peak_flops: float
    hbm_bytes_per_s: float
    elem_bytes: float


@dataclass(frozen=True, slots=True)
class GemmFit:
    """Fitted values (profile units), the terms, and the held-out errors (fractions)."""

    values: dict[str, float]
    terms: GemmTerms
    heldout_errors: tuple[float, ...]
    insample_errors: tuple[float, ...]

    @property
    def heldout_median(self) -> float:
        return float(np.median(self.heldout_errors))

    def summary(self) -> dict[str, float]:
        e = np.array(self.heldout_errors)
        return {"rows": len(e), "heldout_median": float(np.median(e)), "heldout_p90": float(np.percentile(e, 90)),
                "heldout_max": float(e.max()), "insample_median": float(np.median(self.insample_errors))}


MAX_DIM = 1 << 31  # M, N, K, batch: past any GEMM a GPU holds, and inside the model's float arithmetic


def read_gemm_csv(path: Path, dtype: str | None = None) -> list[GemmRow]:
    """Rows of a DeepBench-style CSV, or the `dtype` rows of an XLA table (zsim.trace.xla_gemm; `dtype`
    may be left out when the table holds one). Raises ZsimError naming the file, row and column when a
    value is missing or not a positive number, and naming the table's dtypes when `dtype` is not one."""
    import io

    from zsim.config.limits import limit, too_many
    from zsim.config.yamlfile import read_text
    from zsim.trace.xla_gemm import is_xla_table, read_xla_table

    if is_xla_table(Path(path)):
        samples = read_xla_table(Path(path))
        present = sorted({s.dtype for s in samples})
        if dtype is None and len(present) == 1:
            dtype = present[0]
        chosen = [s for s in samples if s.dtype == dtype]
        if not chosen:
            raise ZsimError(f"{path}: no {dtype} rows; the table holds {', '.join(present)} (choose with --dtype)")
        return _enough([GemmRow(s.shape[0], s.shape[1], s.shape[2], s.shape[3], s.seconds) for s in chosen], path)

    text = read_text(Path(path), what="GEMM table (CSV)", max_bytes=64 << 20)  # decodes or fails with a message
    reader = csv.DictReader(io.StringIO(text, newline=""))
    try:
        missing = {"M", "N", "K", "time_ms"} - set(reader.fieldnames or ())
    except csv.Error as exc:
        raise ZsimError(f"{path}: not a CSV table: {exc}") from None
    if missing:
        raise ZsimError(f"{path}: missing column(s) {', '.join(sorted(missing))} (need M, N, K, time_ms)")
    rows = []
    try:
        for r in reader:
            where = f"line {reader.line_num}"
            m, n, k, seconds = gemm_row(r, where, Path(path))  # the DeepBench reader's checks, one message
            try:
                batch = int(r.get("batch") or 1)
            except ValueError:
                batch = 0
            if not 1 <= batch <= MAX_DIM:
                raise ZsimError(f"{path}: {where}: batch {short(r.get('batch'))} is not an integer 1 to {MAX_DIM:,}")
            rows.append(GemmRow(m, n, k, batch, seconds))
            if len(rows) > limit("TABLE_ROWS"):  # the fit evaluates every row at every iterate
                raise ConfigError(too_many("TABLE_ROWS", len(rows), "rows"), source=str(path))
    except csv.Error as exc:
        raise ZsimError(f"{path}: not a CSV table: {exc}") from None
    return _enough(rows, path)


def _enough(rows: list[GemmRow], path: Path) -> list[GemmRow]:
    """`rows`, when they hold enough distinct shapes to fit PARAMS; ZsimError otherwise."""
    shapes = len({(r.m, r.n, r.k, r.batch) for r in rows})  # repeated timings of one shape add no information
    if shapes < 2 * len(PARAMS):
        raise ZsimError(f"{path}: {shapes} distinct GEMM shapes in {len(rows)} rows; a fit of {len(PARAMS)} terms "
                        f"needs at least {2 * len(PARAMS)}")
    return rows


def terms_from(values: dict[str, float]) -> GemmTerms:
    """GemmTerms (SI) from profile-unit values keyed as in PARAMS."""
    return GemmTerms(efficiency=values["efficiency"], tile_bytes_per_s=values["tile_TBps"] * 1e12,
                     k_overhead=values["k_overhead"], fixed_s=values["fixed_us"] * 1e-6,
                     hbm_efficiency=values["hbm_efficiency"])


def predict(row: GemmRow, terms: GemmTerms, hw: GemmHardware) -> float:
    return gemm_seconds(row.m, row.n, row.k, row.batch, hw.elem_bytes, terms, hw.sms, hw.tiles, hw.peak_flops,
                        hw.hbm_bytes_per_s)


def errors(rows: list[GemmRow], terms: GemmTerms, hw: GemmHardware) -> tuple[float, ...]:
    """|predicted / measured − 1| per row."""
    return tuple(abs(predict(r, terms, hw) / r.seconds - 1) for r in rows)


def _fit_values(rows: list[GemmRow], hw: GemmHardware) -> dict[str, float]:
    names = [p[0] for p in PARAMS]

    def residuals(x: np.ndarray) -> list[float]:
        terms = terms_from(dict(zip(names, x)))
        return [math.log(predict(r, terms, hw) / r.seconds) for r in rows]

    optimize = scipy_optimize("the GEMM fit (zsim gemm-fit, zsim calibrate)")
    result = optimize.least_squares(residuals, [p[1] for p in PARAMS], bounds=([p[2] for p in PARAMS],
                                    [p[3] for p in PARAMS]), loss="soft_l1", f_scale=0.1)
    return dict(zip(names, (float(v) for v in result.x)))


def fit(rows: list[GemmRow], hw: GemmHardware) -> GemmFit:
    """Fit on all rows; held-out errors from the even/odd 2-fold split (module docstring)."""
    heldout: list[float] = []
    for fold in (0, 1):
        train = [r for i, r in enumerate(rows) if i % 2 != fold]
        test = [r for i, r in enumerate(rows) if i % 2 == fold]
        heldout += errors(test, terms_from(_fit_values(train, hw)), hw)
    values = _fit_values(rows, hw)
    terms = terms_from(values)
    return GemmFit(values=values, terms=terms, heldout_errors=tuple(heldout), insample_errors=errors(rows, terms, hw))


def family_holdout(rows: list[GemmRow], hw: GemmHardware) -> tuple[float, ...]:
    """|predicted/measured − 1| of the batched rows (batch > 1) from a fit of the single ones (batch 1):
    the shape-family split (module docstring), fixed before any table was fitted. Raises ZsimError when
    either family is empty or the single ones are too few to fit."""
    single = [r for r in rows if r.batch == 1]
    batched = [r for r in rows if r.batch > 1]
    if not batched or len({(r.m, r.n, r.k) for r in single}) < 2 * len(PARAMS):
        raise ZsimError(f"a batch split needs batched rows and {2 * len(PARAMS)}+ single shapes "
                        f"({len(batched)} batched, {len(single)} single rows)")
    return errors(batched, terms_from(_fit_values(single, hw)), hw)


def profile_yaml(dtype: str, values: dict[str, float]) -> str:
    """The `gemm.<dtype>:` entry of a profile's `compute:` section, in profile units."""
    return (f"    {dtype}: {{efficiency: {values['efficiency']:.4f}, tile_TBps: {values['tile_TBps']:.4f}, "
            f"k_overhead: {values['k_overhead']:.1f}, fixed_us: {values['fixed_us']:.3f}, "
            f"hbm_efficiency: {values['hbm_efficiency']:.4f}}}")


def fit_efficiency(rows: list[GemmRow], hw: GemmHardware, base: GemmTerms) -> float:
    """The one term `efficiency` fitted to `rows` by least squares on log(time), `base`'s other four terms held:
    for a table too small to fit five (the published FP4 GEMM table of a B200, data/published/gemm-fp4/;
    benchmarks/fp4_gemm_check.py). Bounded as PARAMS bounds it (0.3 to 1.0)."""
    def cost(e: float) -> float:
        terms = dataclasses.replace(base, efficiency=e)
        return sum(math.log(predict(r, terms, hw) / r.seconds) ** 2 for r in rows)

    optimize = scipy_optimize("the GEMM efficiency fit")
    lo, hi = PARAMS[0][2], PARAMS[0][3]
    return float(optimize.minimize_scalar(cost, bounds=(lo, hi), method="bounded",
                                          options={"xatol": 1e-6}).x)
