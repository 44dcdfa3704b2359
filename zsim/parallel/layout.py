"""The parallel layout: DP x MP ranks on nodes, and the process groups they form.

Ranks are ordered Megatron-style: the MP ranks of one model replica are consecutive, so
rank = dp_rank * mp + mp_rank, and an MP group never leaves its node (Shoeybi et al. 2019, §3).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GroupShape:
    """Where a process group's members sit: `size` ranks, `per_node` of them in each of `nodes` nodes."""

    size: int
    per_node: int
    nodes: int
    concurrent_per_node: int  # groups of the same kind that have members in one node (they share its NICs)

    @property
    def spans_nodes(self) -> bool:
        return self.nodes > 1


@dataclass(frozen=True, slots=True)
class Layout:
    """DP x MP on `nodes` nodes of `gpus_per_node` GPUs; validated by `zsim.config.scenario`."""

    dp: int
    mp: int
    gpus_per_node: int
    nodes: int

    def __post_init__(self) -> None:
        assert self.dp * self.mp == self.gpus_per_node * self.nodes, "layout does not cover the cluster"
        assert self.gpus_per_node % self.mp == 0, "MP group crosses a node"

    @property
    def world(self) -> int:
        return self.dp * self.mp

    def node_of(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def dp_rank(self, rank: int) -> int:
        return rank // self.mp

    def mp_rank(self, rank: int) -> int:
        return rank % self.mp

    def dp_group(self, rank: int) -> range:
        """The ranks that hold the same model shard (same mp_rank): ZeRO partitions across them."""
        return range(self.mp_rank(rank), self.world, self.mp)

    def mp_group(self, rank: int) -> range:
        start = self.dp_rank(rank) * self.mp
        return range(start, start + self.mp)

    @property
    def dp_shape(self) -> GroupShape:
        per_node = self.gpus_per_node // self.mp
        return GroupShape(size=self.dp, per_node=min(per_node, self.dp), nodes=max(1, self.dp // per_node),
                          concurrent_per_node=self.mp)

    @property
    def mp_shape(self) -> GroupShape:
        return GroupShape(size=self.mp, per_node=self.mp, nodes=1, concurrent_per_node=self.gpus_per_node // self.mp)
