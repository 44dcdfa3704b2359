"""What the ZeRO plan reads of a scenario: the validated sections, the cluster, the layout and the
micro-batches per step. zsim.scenario.scenario.Scenario has all of them; zero names them here, as a
Protocol, instead of importing that class, because the layer that builds scenarios sits above zero (its
cross-checks price model states with zsim.zero.cost) and packages import only downwards
(docs/architecture.md, tests/test_layers.py)."""

from __future__ import annotations

from typing import Protocol

from zsim.config.model_section import ModelSection

from zsim.config.schema import FabricSection, ParallelSection, PrecisionSection, RunSection, ZeroSection
from zsim.fabric.cluster import Cluster
from zsim.parallel.layout import Layout


class Scenario(Protocol):
    """A validated scenario as the plan sees it (read-only)."""

    @property
    def model(self) -> ModelSection: ...

    @property
    def parallel(self) -> ParallelSection: ...

    @property
    def zero(self) -> ZeroSection: ...

    @property
    def precision(self) -> PrecisionSection: ...

    @property
    def fabric(self) -> FabricSection: ...

    @property
    def run(self) -> RunSection: ...

    @property
    def cluster(self) -> Cluster: ...

    @property
    def layout(self) -> Layout: ...

    @property
    def grad_accum(self) -> int:
        """Micro-batches per optimizer step."""
