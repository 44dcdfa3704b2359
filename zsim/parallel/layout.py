"""The parallel layout: DP x MP ranks on nodes, and the process groups they form.

Ranks are ordered Megatron-style: the MP ranks of one model replica are consecutive, so
rank = dp_rank * mp + mp_rank (Megatron-LM mpu/initialize.py: model-parallel groups are ranges of
consecutive ranks). An MP group either divides a node (mp | GPUs per node, the usual case, Shoeybi et
al. 2019 §3) or spans whole nodes (GPUs per node | mp): Megatron allows it, and the ZeRO paper's
Megatron-LM baseline of Figure 2 ran MP 16+ across DGX-2 nodes, its all-reduces on the network.
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
        assert self.gpus_per_node % self.mp == 0 or self.mp % self.gpus_per_node == 0, "MP group splits a node"

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
    def mp_spans_nodes(self) -> bool:
        return self.mp > self.gpus_per_node

    @property
    def dp_shape(self) -> GroupShape:
        """A DP group's members are mp ranks apart: gpus_per_node / mp of them per node, or one per node
        when MP spans nodes; every GPU of a node is in a different DP group when mp >= GPUs per node."""
        per_node = max(1, self.gpus_per_node // self.mp)
        return GroupShape(size=self.dp, per_node=min(per_node, self.dp), nodes=max(1, self.dp // per_node),
                          concurrent_per_node=min(self.mp, self.gpus_per_node))

    @property
    def mp_shape(self) -> GroupShape:
        """An MP group: inside one node (gpus_per_node / mp such groups per node) or over mp / gpus_per_node
        whole nodes (one group per node)."""
        if self.mp_spans_nodes:
            return GroupShape(size=self.mp, per_node=self.gpus_per_node, nodes=self.mp // self.gpus_per_node,
                              concurrent_per_node=1)
        return GroupShape(size=self.mp, per_node=self.mp, nodes=1, concurrent_per_node=self.gpus_per_node // self.mp)
