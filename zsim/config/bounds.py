"""Upper bounds of the scenario's numbers and texts (issue 13), shared by the schema's sections."""

from __future__ import annotations

from typing import Annotated

from zsim.config.struct import Meta

# Upper bounds (issue 13): far above any real training run, low enough that the closed-form checks
# and the per-layer workload stay cheap and no product overflows a float. Ψ of the largest bound
# model is ~12·L·h² = 12 · 1e5 · (1e6)² ≈ 1e18 parameters: still finite and still "does not fit".
MAX_LAYERS = 100_000
MAX_HIDDEN = 1_000_000
MAX_SEQ = 100_000_000  # 1e8 tokens: beyond any published context length
MAX_VOCAB = 100_000_000
MAX_BATCH = 100_000_000  # sequences (micro_batch, global_batch)
MAX_ACCUM = 1_000_000
MAX_GPUS = 1 << 24  # dp, nodes (16.7M GPUs)
MAX_MP = 1024
MAX_ELEMENTS = 1 << 50  # reduce_bucket_elements
MAX_STEPS = 1000  # simulated optimizer steps: each step is simulated in full
MAX_DEGRADE = 10_000  # degraded links listed

# Names and free text lose their control characters in the __post_init__ of the section holding them
# (zsim.config.struct Section._STRIP).
Name = Annotated[str, Meta(min_length=1, max_length=200)]
Text = Annotated[str, Meta(max_length=4000)]
