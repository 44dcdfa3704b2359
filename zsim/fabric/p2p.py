"""Pipeline parallelism's point-to-point transfers as phases on the fabric's links, and the per-stage
links of class mode.

A send of S bytes from a rank of stage a to its peer of stage b (the same position in the next or
previous stage, Megatron-LM's p2p_communication) is one phase: NCCL's fixed cost of a call, then S bytes
over the sender's links:
  inside a node: the sender's NVLinks, at NCCL's Simple-protocol share of them (NCCL src/enqueue.cc
      addP2pToPlan: LL only up to NCCL_P2P_LL_THRESHOLD, 16 KiB per channel, since 2.14; a pipeline's
      activations are megabytes, so Simple);
  across nodes: the sender's node's NIC pool, shared by the `concurrent` transfers its node's ranks of the
      stage make at once (class mode: every rank of the stage sends to its peer at the same moment), and no
      more than the sender's own NIC (a pipeline communicator has one rank a node, so no peer to reach another
      NIC through: zsim.fabric.collective.own_nics_Bps), plus one network step's latency
      (zsim.fabric.cluster.Cluster.network_step_s on 2 nodes).
Where the stages sit follows Megatron's rank order (tensor fastest, then data, then pipeline:
zsim.parallel.layout): stage s holds ranks s·dp·mp to (s+1)·dp·mp - 1; with Layout.dp_last (Megatron-Core's
'tp-cp-ep-pp-dp') a replica's stages are consecutive blocks of mp·cp ranks.
"""

from __future__ import annotations

from collections.abc import Hashable

from zsim.fabric.cluster import Cluster
from zsim.fabric.collective import Phase, own_nics_Bps
from zsim.parallel.layout import GroupShape, Layout


def stage_link(link: Hashable, stage: int) -> Hashable:
    """Class mode: the link `link` of stage `stage`'s representative rank. Stage 0 keeps the links as
    they are (a run without pipeline parallelism is unchanged); another stage's representative sits on
    other GPUs (and, when a stage fills whole nodes, other nodes), so its links are its own."""
    return link if stage == 0 else (*link, stage)  # type: ignore[misc]


def stage_capacities(capacities: dict[Hashable, float], stages: int) -> dict[Hashable, float]:
    """`capacities` (class mode's links of nodes 0 and 1) with a copy for each stage's representative."""
    out = dict(capacities)
    for s in range(1, stages):
        out.update({stage_link(link, s): cap for link, cap in capacities.items()})
    return out


def p2p_phases(nbytes: float, cluster: Cluster, layout: Layout, src: int, dst: int) -> tuple[str, list[Phase]]:
    """('p2p/nvlink' or 'p2p/net', phases) of a send of `nbytes` from a rank of stage `src` to its peer on
    stage `dst`, on class mode's per-stage links (stage_link)."""
    kern = cluster.nccl
    same_node = layout.stage_node(src) == layout.stage_node(dst)
    if nbytes <= 0:
        return "none", []
    if same_node:
        links = ((stage_link(("nvlink", 0), src), 1.0 / kern.share("Simple", "broadcast")),)
        return "p2p/nvlink", [Phase(kern.latency_s["Simple"], nbytes, links)]
    concurrent = layout.stage_ranks_per_node  # ranks of the stage on one node, sending at once
    links = ((stage_link(("nic", 0), src), float(concurrent)),)
    latency = kern.latency_s["Simple"] + cluster.network_step_s(2, "ring", "Simple")
    return "p2p/net", [Phase(latency, nbytes, links, own_nics_Bps(GroupShape(2, 1, 2, 1), cluster))]
