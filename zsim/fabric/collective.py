"""Collective algorithms as phases on the fabric's links, with latency (α) and bandwidth (β) terms.

A collective on a group of n ranks, k per node over N nodes, becomes one or more phases. Each phase
waits its latency, then moves its bytes per stream over its links, sharing them with whatever else
runs (zsim.fabric.sharing). Payload S follows nccl-tests: the whole buffer (the gathered buffer for
all_gather / reduce_scatter). Ring costs are the standard ones (Thakur, Rabenseifner & Gropp 2005,
"Optimization of Collective Communication Operations in MPICH", §3; Patarasuk & Yuan 2009):
    all_reduce      2(n-1) steps, 2(n-1)/n · S bytes per rank
    reduce_scatter   (n-1) steps,  (n-1)/n · S
    all_gather       (n-1) steps,  (n-1)/n · S
Hierarchical (NCCL's two-level / "tree" split; Sergeev & Del Balso 2018, Horovod §4): intra-node
reduce-scatter over k, inter-node collective on S/k over N nodes by k parallel rings, intra-node
all-gather over k. Links: ('nvlink', rank) is a GPU's switch port; ('nic', node) is a node's NICs
together (NCCL spreads its channels over all of them). A ring that leaves a node crosses that node's
NICs once per stream; `concurrent_per_node` identical groups (the other MP ranks' DP groups) share them.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

from zsim.config.hardware import Cluster
from zsim.parallel.layout import GroupShape

ALGORITHMS = ("ring", "hierarchical")


@dataclass(frozen=True, slots=True)
class Phase:
    """Wait `latency_s`, then move `nbytes` per stream over `links` [(link, streams)]."""

    latency_s: float
    nbytes: float
    links: tuple[tuple[Hashable, float], ...]


def _steps_and_fraction(op: str, n: int) -> tuple[int, float]:
    """Ring steps and bytes-per-rank fraction of S for `op` on n ranks (Thakur et al. 2005, §3)."""
    if n <= 1:
        return 0, 0.0
    if op == "all_reduce":
        return 2 * (n - 1), 2 * (n - 1) / n
    if op in ("reduce_scatter", "all_gather"):
        return n - 1, (n - 1) / n
    raise ValueError(f"collective op(={op!r}) is not modelled; use all_reduce, reduce_scatter or all_gather")


def ring(op: str, nbytes: float, shape: GroupShape, cluster: Cluster, rank: int = 0) -> list[Phase]:
    """A flat ring over all members; its steps are as slow as its slowest hop."""
    steps, fraction = _steps_and_fraction(op, shape.size)
    if steps == 0:
        return []
    node = rank // cluster.gpus_per_node
    links: list[tuple[Hashable, float]] = []
    if shape.per_node > 1:
        links.append((("nvlink", rank), 1.0))
    if shape.spans_nodes:
        links.append((("nic", node), float(shape.concurrent_per_node)))
        alpha = max(cluster.nic_pool.latency_s, cluster.nvlink.latency_s)
    else:
        alpha = cluster.nvlink.latency_s
    return [Phase(steps * alpha, fraction * nbytes, tuple(links))]


def hierarchical(op: str, nbytes: float, shape: GroupShape, cluster: Cluster, rank: int = 0) -> list[Phase]:
    """Intra-node reduce-scatter, inter-node `op` on S/k, intra-node all-gather (for all_reduce);
    reduce_scatter and all_gather keep only their own half."""
    k, n_nodes = shape.per_node, shape.nodes
    if k == 1 or n_nodes == 1:
        return ring(op, nbytes, shape, cluster, rank)
    node = rank // cluster.gpus_per_node
    intra = GroupShape(size=k, per_node=k, nodes=1, concurrent_per_node=shape.concurrent_per_node)
    inter_steps, inter_fraction = _steps_and_fraction(op, n_nodes)
    inter = Phase(inter_steps * cluster.nic_pool.latency_s, inter_fraction * nbytes / k,
                  ((("nic", node), float(k * shape.concurrent_per_node)),))
    if op == "all_reduce":
        return [*ring("reduce_scatter", nbytes, intra, cluster, rank), inter,
                *ring("all_gather", nbytes, intra, cluster, rank)]
    if op == "reduce_scatter":
        return [*ring("reduce_scatter", nbytes, intra, cluster, rank), inter]
    return [inter, *ring("all_gather", nbytes, intra, cluster, rank)]


def uncontended_time(phases: list[Phase], cluster: Cluster) -> float:
    """The α-β time of `phases` when nothing else shares their links."""
    def rate(links: tuple[tuple[Hashable, float], ...]) -> float:
        return min(_capacity(cluster, link) / weight for link, weight in links)
    return sum(p.latency_s + (p.nbytes / rate(p.links) if p.nbytes else 0.0) for p in phases)


def _capacity(cluster: Cluster, link: Hashable) -> float:
    kind = link[0]  # type: ignore[index]
    return cluster.nvlink.bytes_per_s if kind == "nvlink" else cluster.nic_pool.bytes_per_s


def plan_collective(op: str, nbytes: float, shape: GroupShape, cluster: Cluster, algorithm: str = "auto",
                    rank: int = 0) -> tuple[str, list[Phase]]:
    """(algorithm, phases) for a collective; 'auto' picks the faster when uncontended, as NCCL's
    tuner picks by its own cost model (NCCL src/graph/tuning.cc)."""
    if algorithm == "ring":
        return "ring", ring(op, nbytes, shape, cluster, rank)
    if algorithm == "hierarchical":
        return "hierarchical", hierarchical(op, nbytes, shape, cluster, rank)
    options = [(name, fn(op, nbytes, shape, cluster, rank)) for name, fn in (("ring", ring), ("hierarchical", hierarchical))]
    return min(options, key=lambda item: uncontended_time(item[1], cluster))


def link_capacities(cluster: Cluster, ranks: range | list[int]) -> dict[Hashable, float]:
    """The capacity of every link the given ranks can use."""
    caps: dict[Hashable, float] = {}
    for r in ranks:
        caps[("nvlink", r)] = cluster.nvlink.bytes_per_s
        caps[("nic", r // cluster.gpus_per_node)] = cluster.nic_pool.bytes_per_s
    return caps
