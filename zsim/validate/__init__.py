"""Validation suites: simulated against measured or published numbers, with criteria that can fail.

SUITES maps a suite's name (`zsim validate NAME`) to the module that runs it; each module has
`run(progress) -> report` with `.table()`, `.as_dict()` and `.passed`.
"""

from __future__ import annotations

SUITES: dict[str, str] = {
    "paper": "zsim.validate.paper",  # the ZeRO paper's evaluation (docs/validation.md)
    "megatron": "zsim.validate.megatron",  # Megatron-LM 2019's V100 scaling, out of sample (docs/validation.md)
    "scale": "zsim.validate.scale",  # published multi-node runs, calibration and held-out halves (docs/validation.md)
    "modern": "zsim.validate.modern",  # published PP / SP / selective-recompute runs, the same way (docs/validation.md)
    "replay": "zsim.validate.replay",  # held-out replay of real runtime runs on this machine (docs/calibrate.md)
}
