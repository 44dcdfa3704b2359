"""Fit a network profile's inter-node terms to multi-node nccl-tests tables, the node's own terms held.

Five terms, the ones NCCL's inter-node cost rests on (zsim.fabric.collective):
  efficiency         the share of a NIC's line rate NCCL's Simple protocol reaches across nodes
                     (LL reaches its wire share of it, zsim.fabric.nccl.WIRE_SHARE);
  tree_efficiency    the tree's share of the NICs relative to the ring's;
  ll128_share        LL128's share of the NICs relative to Simple's (at most 120/128);
  latency_us         one inter-node step's latency on 2 nodes: switch hops, NIC, NCCL's proxy thread
                     posting the send and polling its completion;
  latency_growth_us  added to every inter-node step per doubling of the nodes beyond 2;
  nvls_tree_share    NVLSTree's share of the NICs relative to the ring's Simple, on NVLink SHARP nodes
                     (fitted only where a table's all_reduce could run NVLSTree: zsim.fabric.nvls).
They are fitted by least squares on log(time) over every row of every table (all sizes, all node
counts given), with a soft-L1 loss so that the few rows a congested or failing fabric printed (Alps's
rows flagged `#wrong` or timed out, SOURCE.md) do not drag the rest. NCCL's own tuner (the system
profile's release) picks each row's algorithm and protocol, as for the in-node fit
(zsim.calibrate.nccl_fit); the in-node kernel terms stay as the system profile has them.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from zsim.calibrate.nccl_fit import Residual
from zsim.fabric.cluster import Cluster, Tier, load_cluster
from zsim.config.profiles import Profiles
from zsim.config.limits import limit, too_many
from zsim.errors import ConfigError, ZsimError
from zsim.fabric.collective import communicator
from zsim.fabric.gpudirect import nic_bytes_per_s
from zsim.fabric.nccl import FUNCTIONS, NcclTuner
from zsim.fabric.perf import group_of, nccl_tests_size, run_collective
from zsim.fabric.topology import healthy_capacities
from zsim.trace.nccl_tests import NcclRow, TableHeader, checked, header_of, read_nccl_tests
from zsim.calibrate.net_terms import BOUNDS as _BOUNDS, IB_EFFICIENCY, TERMS  # noqa: F401 (IB_EFFICIENCY: re-exported)

_START = {"efficiency": 0.8, "tree_efficiency": 0.8, "ll128_share": 0.8, "latency_us": 5.0, "latency_growth_us": 1.0,
          "nvls_tree_share": 0.8}
# Soft-L1 scale: residuals beyond ~25% in time count linearly (scipy least_squares f_scale).
_F_SCALE = 0.25


@dataclass(frozen=True, slots=True)
class TableRun:
    """One multi-node nccl-tests table: its collective, what its header says, its rows, and the
    algorithm NCCL was held to (`NCCL_ALGO`, which the table does not print: its provenance says it;
    "auto": NCCL's tuner chose)."""

    path: Path
    fn: str
    header: TableHeader
    rows: tuple[NcclRow, ...]
    algorithm: str = "auto"
    failed: tuple[NcclRow, ...] = ()  # rows nccl-tests' own check failed (#wrong > 0): left out of `rows`


def read_run(path: Path) -> TableRun:
    """A table named `<collective>[-<N>nodes].txt` (or `zsim collective`'s `.json`) with its header.

    Rows too small to give each rank one element of an all_gather, reduce_scatter or all_to_all (nccl-tests
    prints none: they are another collective's rows) are skipped, as read_nccl_tests skips damaged rows;
    rows whose result nccl-tests' own check found wrong go to `failed` (zsim.trace.nccl_tests.checked).

    Raises:
        ZsimError: the name does not start with a collective, the header lists no ranks, the name's node
            count is not the header's, or no row is left.
    """
    path = Path(path)
    fn = re.sub(r"-\d+nodes$", "", path.stem)
    if fn not in FUNCTIONS:
        raise ZsimError(f"{path}: the file name must start with the collective ({', '.join(FUNCTIONS)}), "
                        "e.g. all_reduce-8nodes.txt")
    header = header_of(path)
    if header is None:
        raise ZsimError(f"{path}: its header lists no '# Rank ... on HOST' lines, so its node count is unknown")
    named = re.search(r"-(\d+)nodes$", path.stem)
    if named and int(named.group(1)) != header.nodes:  # a renamed or mislabelled table: which count is right?
        raise ZsimError(f"{path}: named for {int(named.group(1)):,} nodes, but its header lists {header.nodes} hosts")
    # predict() times every row as float elements (run_collective's default): a row that rounds to no
    # element per rank would be a collective of 0 bytes, and its busbw 0
    rows, failed = checked([r for r in read_nccl_tests(path) if nccl_tests_size(fn, r.size, header.ranks, 4)[0] > 0])
    if not rows:
        raise ZsimError(f"{path}: no row moves an element per rank of a {header.ranks}-rank {fn}"
                        + (f" and passed nccl-tests' own check ({len(failed)} failed it)" if failed else ""))
    return TableRun(path, fn, header, tuple(rows), failed=tuple(failed))


def read_runs(folder: Path, max_nodes: int | None = None, min_nodes: int = 2,
              algorithm: str = "auto") -> list[TableRun]:
    """Every multi-node table in `folder` (`<collective>-<N>nodes.txt`), those spanning
    `min_nodes`..`max_nodes` nodes, run with NCCL held to `algorithm` ("ring", "tree"; "auto": its
    tuner's choice).

    Raises:
        ZsimError: there is none, or more than the TABLE_FILES limit (counted before any is read).
    """
    paths = sorted(p for p in Path(folder).glob("*-*nodes.*") if p.suffix in (".txt", ".json"))
    if len(paths) > limit("TABLE_FILES"):
        raise ConfigError(too_many("TABLE_FILES", len(paths), "multi-node tables (<collective>-<N>nodes.txt)"),
                          source=str(folder))
    runs = [dataclasses.replace(read_run(p), algorithm=algorithm) for p in paths]
    runs = [r for r in runs if min_nodes <= r.header.nodes <= (max_nodes or r.header.nodes)]
    if not runs:
        raise ZsimError(f"{folder}: no multi-node nccl-tests tables (<collective>-<N>nodes.txt) in "
                        f"{min_nodes}..{max_nodes or 'any'} nodes")
    return runs


def with_network(cluster: Cluster, values: dict[str, float]) -> Cluster:
    """`cluster` with the inter-node terms `values` (profile units) in place of its network's."""
    eff = values.get("efficiency", cluster.network_efficiency)
    nic = nic_bytes_per_s(cluster.nic_line_bytes_per_s * eff, cluster.gpudirect_rdma, cluster.offload.bytes_per_s)
    lat = values.get("latency_us", cluster.nic_pool.latency_s * 1e6) * 1e-6
    growth = values.get("latency_growth_us", cluster.nic_latency_growth_s * 1e6) * 1e-6
    tree = values.get("tree_efficiency", cluster.tree_efficiency)
    ll128 = values.get("ll128_share", cluster.ll128_share)
    return dataclasses.replace(cluster, nic_bytes_per_s=nic, network_efficiency=eff, tree_efficiency=tree,
                               ll128_share=ll128, nvls_tree_share=values.get("nvls_tree_share", cluster.nvls_tree_share),
                               nic_pool=Tier(cluster.nic_pool.name, nic * cluster.nics_per_node, lat),
                               nic_latency_growth_s=growth)


def _clusters(profile: str, runs: list[TableRun], profiles: Profiles | None) -> dict[int, Cluster]:
    return {n: load_cluster(profile, n, profiles) for n in {r.header.nodes for r in runs}}


def predict(clusters: dict[int, Cluster], runs: list[TableRun], values: dict[str, float]):
    """[(run, row, simulated PerfRow)] for every row (closed form, as the in-node fit)."""
    out = []
    for run in runs:
        c = with_network(clusters[run.header.nodes], values)
        cap = healthy_capacities(c)
        for row in run.rows:
            sim = run_collective(c, run.fn, row.size, run.header.ranks, run.header.gpus_per_process,
                                 algorithm=run.algorithm, simulate=False, capacity=cap)
            out.append((run, row, sim))
    return out


def residuals_of(profile: str, runs: list[TableRun], values: dict[str, float],
                 profiles: Profiles | None = None) -> list[Residual]:
    """Simulated against measured busbw of every row of `runs` under the inter-node terms `values`."""
    return [Residual(run.fn, row.size, row.busbw if row.busbw > 0 else sim.busbw * row.time_us / sim.time_us,
                     sim.busbw, sim.algorithm, run.header.ranks, f"{run.path.parent.name}/{run.path.name}")
            for run, row, sim in predict(_clusters(profile, runs, profiles), runs, values)]


@dataclass(frozen=True, slots=True)
class NetFit:
    """Fitted inter-node terms (profile units), the terms held, and every fitted row's residual."""

    values: dict[str, float]
    fitted: tuple[str, ...]
    residuals: list[Residual]
    nodes: tuple[int, int]


def fit_network(profile: str, runs: list[TableRun], profiles: Profiles | None = None,
                terms: tuple[str, ...] = TERMS, held: dict[str, float] | None = None) -> NetFit:
    """Fit `terms` of the profile's network to `runs` (soft-L1 least squares on log time); the other
    terms stay at `held` or the network profile's values.

    Raises:
        ZsimError: fewer rows than twice the terms, or a table whose ranks do not fit the profile's nodes.
    """
    rows = sum(len(r.rows) for r in runs)
    if rows < 2 * len(terms):
        raise ZsimError(f"{rows} rows in the multi-node tables; fitting {len(terms)} terms needs at least {2 * len(terms)}")
    clusters = _clusters(profile, runs, profiles)
    for run in runs:
        if run.header.gpus_per_node > clusters[run.header.nodes].gpus_per_node:
            raise ZsimError(f"{run.path}: {run.header.gpus_per_node} GPUs per node, but profile '{profile}' "
                            f"has {clusters[run.header.nodes].gpus_per_node}")
    held = dict(held or {})
    if len({r.header.nodes for r in runs}) == 1 and "latency_growth_us" in terms:
        terms = tuple(t for t in terms if t != "latency_growth_us")  # one node count cannot show growth
        held.setdefault("latency_growth_us", clusters[runs[0].header.nodes].nic_latency_growth_s * 1e6)
    if "tree_efficiency" in terms and not any(r.fn == "all_reduce" and r.algorithm in ("auto", "tree") for r in runs):
        terms = tuple(t for t in terms if t != "tree_efficiency")  # no row can run a tree (NCCL_ALGO=RING)
        held.setdefault("tree_efficiency", clusters[runs[0].header.nodes].tree_efficiency)
    if "nvls_tree_share" in terms and not any(
            r.fn == "all_reduce" and r.algorithm == "auto" and _runs_nvls_tree(clusters[r.header.nodes], r) for r in runs):
        terms = tuple(t for t in terms if t != "nvls_tree_share")  # no row can run NVLSTree: the network keeps its own
    measured = np.array([row.time_us for run in runs for row in run.rows])

    def resid(x: np.ndarray) -> np.ndarray:
        values = {**held, **dict(zip(terms, x))}
        sim = np.array([s.time_us for _, _, s in predict(clusters, runs, values)])
        return np.log(sim / measured)

    lo = np.array([_BOUNDS[t][0] for t in terms])
    hi = np.array([_BOUNDS[t][1] for t in terms])
    # Efficiency and latency trade off on rows that neither fully governs: start from a few corners of
    # the physical range and keep the least cost (a deterministic multi-start).
    starts = [{**_START, "efficiency": e, "latency_us": a} for e in (0.5, 0.9) for a in (5.0, 50.0)]
    solution = min((least_squares(resid, np.array([st[t] for t in terms]), bounds=(lo, hi), loss="soft_l1",
                                  f_scale=_F_SCALE, x_scale="jac", max_nfev=200) for st in starts),
                   key=lambda sol: sol.cost)
    values = {**held, **{t: float(v) for t, v in zip(terms, solution.x)}}
    nodes = (min(r.header.nodes for r in runs), max(r.header.nodes for r in runs))
    return NetFit(values, tuple(terms), residuals_of(profile, runs, values, profiles), nodes)


def _runs_nvls_tree(cluster: Cluster, run: TableRun) -> bool:
    """Whether NCCL's tuner enables NVLSTree for `run`'s all_reduce on `cluster` (zsim.fabric.nvls)."""
    shape, _ = group_of(cluster, run.header.ranks)
    return NcclTuner(communicator(shape, cluster)).predict("all_reduce", "nvls_tree", "Simple") is not None


# Bounds a term may physically sit on without the fit being suspect: a latency or its growth of 0.
_NATURAL = {("latency_us", 0), ("latency_growth_us", 0)}


def on_bounds(fit: NetFit) -> list[str]:
    """'term = value' for each fitted term that ended on a bound of its fit (_BOUNDS), but the natural
    zeros (_NATURAL): a share at 1.0 or at LL128's 120/128 means the model wanted more than the wire can
    give, a cause of a poor fit (zsim.calibrate.fit_quality)."""
    out = []
    for term in fit.fitted:
        value = fit.values[term]
        for side, edge in enumerate(_BOUNDS[term]):
            if (term, side) not in _NATURAL and abs(value - edge) <= 1e-4 * max(1.0, abs(edge)):
                out.append(f"{term} = {value:.4g}")
    return out


def error_summary(residuals: list[Residual], min_size: int = 1 << 20) -> tuple[float, float, int]:
    """(median |busbw error|, worst |busbw error|, rows) over rows of at least `min_size` bytes."""
    errors = [abs(r.error) for r in residuals if r.size >= min_size]
    if not errors:
        return math.nan, math.nan, 0
    return float(np.median(errors)), float(max(errors)), len(errors)
