"""The NCCL kernel fit judged out of sample on the real DGX-2 nccl-tests tables (issue 10): fit on half
the sizes (every other one), predict the other half, and the reverse. Sizes of 1 MiB and up are
judged: median |busbw error| ≤ 5% and worst ≤ 30% per collective. Skips without ../shared/data."""

import dataclasses
from functools import lru_cache

import numpy as np
import pytest

from zsim.calibrate.nccl_fit import evaluate, fit, kernel_from
from zsim.commands.nccl_fit import read_tables
from zsim.config.hardware import load_cluster

DGX2 = "nccl-tests/dgx2-v100-12gpu"
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce")
# all_reduce misses where NCCL switches protocol: the recording's NCCL (version not printed, early 2020)
# still ran LL128 at 16 MiB (the measured dip), NCCL 2.7's tuner constants, which the DGX-2 profile
# uses, switch to Simple between 8 and 16 MiB. (2.5's tuner, the recording's release by date, moves the
# switch where the table has it, but its fit misses the held-out 1 MiB row by 45%: docs/fabric.md.) Fitting on alternate sizes, the 16 MiB row is held out whenever the
# 1 MiB row is, and no term of the kernel model can move a tuner decision (docs/calibrate.md).
# (The other split's all_reduce median was 5.2% while the tables' zero-byte all_gather/reduce_scatter rows
# were fitted too; without them, as the strict reader reads the tables, it is 3.1%: no longer a miss.)
KNOWN_MISS = {("all_reduce", 0): "the held-out 16 MiB row ran LL128 where NCCL 2.7's tuner picks Simple (+39%)"}


@lru_cache(maxsize=None)
def _held_out(folder: str, parity: int) -> dict[str, tuple[float, float]]:
    from pathlib import Path

    tables = read_tables(Path(folder))
    cluster = load_cluster("dgx2", 1)
    train = {fn: rows[parity::2] for fn, rows in tables.items()}
    test = {fn: rows[1 - parity::2] for fn, rows in tables.items()}
    result = fit(cluster, train, gpus=12, gpus_per_process=12)
    fitted = dataclasses.replace(cluster, nccl=kernel_from(result.values))
    out = {}
    for fn in COLLECTIVES:
        errors = [abs(r.error) for r in evaluate(fitted, {fn: test[fn]}, 12, 12) if r.size >= 1 << 20]
        out[fn] = (float(np.median(errors)), float(max(errors)))
    return out


@pytest.mark.parametrize("parity", (0, 1), ids=("fit-odd-exponents", "fit-even-exponents"))
@pytest.mark.parametrize("fn", COLLECTIVES)
def test_fit_predicts_held_out_sizes(shared_data, fn, parity, request):
    if (fn, parity) in KNOWN_MISS:
        request.applymarker(pytest.mark.xfail(reason=KNOWN_MISS[(fn, parity)], strict=True))
    median, worst = _held_out(str(shared_data / DGX2), parity)[fn]
    assert median <= 0.05 and worst <= 0.30, f"{fn}: median {median:.1%}, worst {worst:.1%}"

