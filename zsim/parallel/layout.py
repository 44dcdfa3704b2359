"""The parallel layout: DP x MP (x PP) ranks on nodes, and the process groups they form.

Ranks are ordered Megatron-style: the MP ranks of one model replica are consecutive, so
rank = pp_rank * dp * mp + dp_rank * mp + mp_rank (Megatron-LM mpu/initialize.py: model-parallel groups
are ranges of consecutive ranks; megatron/core/parallel_state.py order 'tp-dp-pp':
zsim.parallel.pipeline.pipeline_rank). A pipeline stage is dp * mp consecutive ranks; the DP and MP
groups below are those of one stage (every stage has the same shape). An MP group either divides a node (mp | GPUs per node, the usual case, Shoeybi et
al. 2019 §3) or spans whole nodes (GPUs per node | mp): Megatron allows it, and the ZeRO paper's
Megatron-LM baseline of Figure 2 ran MP 16+ across DGX-2 nodes, its all-reduces on the network.

With `dp_last` the ranks follow Megatron-Core's other order, 'tp-cp-ep-pp-dp' (--use-tp-pp-dp-mapping,
megatron/training/initialize.py): one model replica's mp·cp·pp ranks are consecutive, a stage's mp·cp of them
stage·mp·cp on, and the DP index is outermost, so a pipeline stays inside a node as large as a replica (an NVL72
rack) and only the DP traffic crosses nodes. Pipeline runs only (with pp 1 the two orders are one); class mode
reads group shapes, stage_node and stage_ranks_per_node, which follow the order.
"""

from __future__ import annotations

from collections import Counter
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
    """DP x MP (x PP stages) on `nodes` nodes of `gpus_per_node` GPUs; validated by `zsim.scenario.scenario`."""

    dp: int
    mp: int
    gpus_per_node: int
    nodes: int
    # Expert parallelism as Megatron-Core lays it out (parallel_state.py, RankGenerator with the expert order
    # 'tp-ep-dp-pp' over a stage's ranks, tp there the experts' own tensor-parallel size `etp`): a stage's
    # dp × mp ranks are numbered etp fastest, then ep, then the expert-data-parallel index. An EP group is
    # `ep` ranks etp apart (the experts' all-to-all runs in it); the expert-data-parallel group ("edp") the
    # dp·mp/(ep·etp) ranks ep·etp apart holding the same experts (ZeRO partitions those). With etp = mp (the
    # default, 0 here) an EP group is ep consecutive DP ranks of one MP rank, carved out of DP as
    # DeepSpeed-MoE also does; with etp = 1 it folds over MP and DP ranks (MoE parallel folding). The
    # "tpep" group is an EP group with its etp expert-TP ranks: ep·etp consecutive ranks of the stage
    # (parallel_state.py _EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP), where Megatron-Core's flex (DeepEP)
    # dispatcher sends.
    ep: int = 1
    pp: int = 1  # pipeline stages, each of dp × mp consecutive ranks
    etp: int = 0  # the experts' tensor-parallel degree; 0: mp
    # Context parallelism (Megatron-Core's order 'tp-cp-ep-dp-pp'): `dp` here is Megatron's dp × cp group, where
    # gradients are reduced and the distributed optimizer shards (finalize_model_grads.py, with_context_parallel),
    # so a stage's rank is dp_index·cp·mp + cp_index·mp + mp_rank and a CP group ("cp") is cp consecutive members
    # of a DP group, mp ranks apart.
    cp: int = 1
    dp_last: bool = False  # Megatron-Core's order 'tp-cp-ep-pp-dp' (--use-tp-pp-dp-mapping): see the module docstring

    def __post_init__(self) -> None:
        assert self.dp * self.mp * self.pp == self.gpus_per_node * self.nodes, "layout does not cover the cluster"
        assert self.gpus_per_node % self.mp == 0 or self.mp % self.gpus_per_node == 0, "MP group splits a node"
        assert self.stage_ranks % (self.ep * self.expert_mp) == 0, "EP x expert MP divides a stage (scenario loader)"
        assert self.dp % self.cp == 0, "the DP group is dp x cp ranks"
        assert not self.dp_last or self.ep == 1, "dp_last with expert parallelism (refused by the scenario loader)"

    @property
    def expert_mp(self) -> int:
        """The experts' tensor-parallel degree: etp, or mp when unset."""
        return self.etp or self.mp

    @property
    def world(self) -> int:
        return self.dp * self.mp * self.pp

    @property
    def stage_ranks(self) -> int:
        """Ranks of one pipeline stage: dp × mp."""
        return self.dp * self.mp

    @property
    def stage_stride(self) -> int:
        """Ranks between a rank and its peer in the next pipeline stage: dp·mp (a stage's consecutive block), or
        mp·cp with dp_last."""
        return self.mp * self.cp if self.dp_last else self.stage_ranks

    def stage_of(self, rank: int) -> int:
        """The pipeline stage of `rank` (zsim.parallel.pipeline.pipeline_rank)."""
        return rank // self.stage_stride % self.pp

    def first_rank(self, stage: int) -> int:
        """Pipeline stage `stage`'s lowest rank (its representative in class mode)."""
        return stage * self.stage_stride

    def stage_node(self, stage: int) -> int:
        """The node of pipeline stage `stage`'s first rank (its representative in class mode)."""
        return self.node_of(self.first_rank(stage))

    def stage_rank_text(self, stage: int) -> str:
        """Which ranks stage `stage` holds, for reports: 'a-b', or with dp_last 'a-b + k·R' (each replica's)."""
        first = self.first_rank(stage)
        if not self.dp_last or self.pp == 1:
            return f"{first}-{first + self.stage_ranks - 1}"
        block = self.mp * self.cp
        return f"{first}-{first + block - 1} + k·{block * self.pp} (k < {self.dp // self.cp})"

    @property
    def stage_ranks_per_node(self) -> int:
        """Ranks of one stage on one node (they send their pipeline transfers at the same moment)."""
        if not self.dp_last or self.pp == 1:
            return min(self.stage_ranks, self.gpus_per_node)
        return self.mp * self.per_node(self.dp_group(0))  # each DP group's members there, one per MP rank

    def node_of(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def dp_rank(self, rank: int) -> int:
        return rank % self.stage_ranks // self.mp

    def mp_rank(self, rank: int) -> int:
        return rank % self.mp

    def dp_group(self, rank: int) -> range | list[int]:
        """The ranks that hold the same model shard (same mp_rank): ZeRO partitions across them."""
        if self.dp_last and self.pp > 1:  # cp blocks mp apart, one per replica (mp·cp·pp apart)
            start, replica = self.first_rank(self.stage_of(rank)) + self.mp_rank(rank), self.mp * self.cp * self.pp
            return [start + k * replica + c * self.mp for k in range(self.dp // self.cp) for c in range(self.cp)]
        start = self.stage_of(rank) * self.stage_ranks
        return range(start + self.mp_rank(rank), start + self.stage_ranks, self.mp)

    def per_node(self, ranks) -> int:
        """The most of `ranks` that one node holds."""
        return max(Counter(self.node_of(r) for r in ranks).values())

    def mp_group(self, rank: int) -> range:
        start = rank - self.mp_rank(rank)
        return range(start, start + self.mp)

    def group_size(self, kind: str) -> int:
        """Members of a group of `kind`: 'dp', 'mp', 'ep' (expert parallel), 'edp' (expert data parallel),
        'tpep' (an EP group with its experts' TP ranks), 'pp' (the pipeline: one rank per stage), 'embed' (a
        tied head's first and last stage) or 'cp' (context parallel)."""
        return {"dp": self.dp, "mp": self.mp, "ep": self.ep, "edp": self.stage_ranks // (self.ep * self.expert_mp),
                "tpep": self.ep * self.expert_mp, "pp": self.pp, "embed": 2 if self.pp > 1 else 1, "cp": self.cp}[kind]

    def group_index(self, kind: str, rank: int) -> int:
        """Which group of `kind` holds `rank` (0-based; groups of one kind are disjoint)."""
        if kind == "dp":
            return self.mp_rank(rank)
        if kind == "mp":
            return self.dp_rank(rank)
        if kind == "cp":  # cp consecutive members of a DP group: its block of cp DP indices, then the MP rank
            return self.dp_rank(rank) // self.cp * self.mp + self.mp_rank(rank)
        t = self.expert_mp
        q = rank % self.stage_ranks  # a stage's ranks in the experts' order: etp fastest, then ep, then edp
        if kind == "tpep":
            return q // (self.ep * t)
        e, block = q % t, q // t
        if kind == "ep":  # ep ranks etp apart (with etp = mp: consecutive DP ranks of one MP rank)
            return (block // self.ep) * t + e
        return (block % self.ep) * t + e  # edp: ranks ep·etp apart

    def group_ranks(self, kind: str, index: int) -> range:
        """Global ranks of group `index` of `kind` (group_index's inverse), as a range: DP and MP groups,
        and EP groups (ep ranks etp apart) and EDP groups (ranks ep·etp apart), are each evenly spaced."""
        if kind == "dp":
            return self.dp_group(index)
        if kind == "mp":
            return self.mp_group(index * self.mp)
        if kind == "cp":
            block, e = divmod(index, self.mp)
            return range(block * self.cp * self.mp + e, (block + 1) * self.cp * self.mp + e, self.mp)
        t = self.expert_mp
        if kind == "tpep":
            return range(index * self.ep * t, (index + 1) * self.ep * t)
        block, e = divmod(index, t)
        if kind == "ep":
            return range(block * self.ep * t + e, (block + 1) * self.ep * t + e, t)
        step = self.ep * t
        return range(block * t + e, self.stage_ranks, step)

    def group_members(self, kind: str, index: int) -> list[int]:
        """Global ranks of group `index` of `kind`, as a list (group_ranks)."""
        return list(self.group_ranks(kind, index))

    def group_shape(self, kind: str) -> GroupShape:
        """Where a group of `kind` sits (see dp_shape, mp_shape); EP and EDP groups are DP groups' slices,
        their members mp and ep·mp ranks apart."""
        if kind == "dp":
            return self.dp_shape
        if kind == "mp":
            return self.mp_shape
        size = self.group_size(kind)
        # members' rank distance: EP etp apart (consecutive DP ranks, mp apart, by default), EDP ep·etp apart,
        # the pipeline one stage (dp·mp; mp·cp with dp_last) apart, the tied embedding's group the first and last stage
        # (Megatron-LM _EMBEDDING_GROUP)
        stride = {"ep": self.expert_mp, "edp": self.expert_mp * self.ep, "tpep": 1, "pp": self.stage_stride, "cp": self.mp,
                  "embed": max(1, self.pp - 1) * self.stage_stride}[kind]
        per_node = min(max(1, self.gpus_per_node // stride), size)
        return GroupShape(size=size, per_node=per_node, nodes=max(1, size // per_node),
                          concurrent_per_node=max(1, min(self.gpus_per_node, self.world) // per_node))

    @property
    def mp_spans_nodes(self) -> bool:
        return self.mp > self.gpus_per_node

    @property
    def dp_shape(self) -> GroupShape:
        """A DP group's members are mp ranks apart: gpus_per_node / mp of them per node, or one per node
        when MP spans nodes; every GPU of a node is in a different DP group when mp >= GPUs per node. With
        dp_last (pipelines only) counted from a group's members: cp of them a replica, replicas mp·cp·pp apart."""
        if self.dp_last and self.pp > 1:
            per_node = self.per_node(self.dp_group(0))
            return GroupShape(size=self.dp, per_node=per_node, nodes=self.dp // per_node,
                              concurrent_per_node=max(1, min(self.gpus_per_node, self.world) // per_node))
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
