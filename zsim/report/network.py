"""What a run's inter-node answer rests on: the network profile's terms, where they were fitted, and
whether this run lies inside what the fit saw (result.json `inter_node`, the summary's `network` line)."""

from __future__ import annotations

from typing import Any

from zsim.fabric.cluster import Cluster
from zsim.fabric.nccl import ll_net_cap_Bps


def network_facts(cluster: Cluster) -> dict[str, Any]:
    """{'network', 'terms', 'll_ceiling_GBps', 'fitted_on', 'fit_nodes', 'fitted_terms', 'held_terms',
    'gpudirect_rdma', 'nic_bytes_per_s', 'status', 'line'} for `cluster` (ll_ceiling_GBps: NCCL's ceiling on an LL
    collective's busbw across this many nodes under the profile's tuner, None where it has none,
    zsim.fabric.nccl.ll_net_cap_Bps; held_terms: term -> the published source it was held at instead of fitted;
    nic_bytes_per_s: what one NIC carries per direction, staged through host memory when gpudirect_rdma is false,
    zsim.fabric.gpudirect).

    status: 'single node' (no inter-node term used), 'fitted' (the run's node count lies within the
    fit's), 'extrapolated' (more nodes than the fit saw) or 'assumed' (the network has no fit, or a
    scenario override replaced its rate or latency)."""
    terms = {"efficiency": cluster.network_efficiency, "tree_efficiency": cluster.tree_efficiency,
             "latency_us": cluster.nic_pool.latency_s * 1e6 if cluster.nic_pool else 0.0,
             "latency_growth_us": cluster.nic_latency_growth_s * 1e6}
    fit = cluster.network_fit
    name = cluster.nic_pool.name if cluster.nic_pool else ""
    ceiling = ll_net_cap_Bps(cluster.nccl_tuner, cluster.nodes)
    base = {"network": cluster.network_profile, "terms": terms,
            "ll_ceiling_GBps": ceiling / 1e9 if ceiling else None,
            "fitted_on": fit.cluster if fit else None, "fit_nodes": list(fit.nodes) if fit else None,
            "fitted_terms": list(fit.terms) if fit else [], "held_terms": dict(fit.held) if fit else {},
            "gpudirect_rdma": cluster.gpudirect_rdma, "nic_bytes_per_s": cluster.nic_bytes_per_s}
    if cluster.nodes <= 1:
        return {**base, "status": "single node", "line": "one node: no inter-node term"}
    staged = "" if cluster.gpudirect_rdma else (
        f"; no GPUDirect RDMA: NIC traffic staged through host memory, {cluster.nic_bytes_per_s / 1e9:.1f} GB/s a NIC "
        f"(with it {cluster.nic_line_bytes_per_s * cluster.network_efficiency / 1e9:.1f})")
    if fit is None:
        return {**base, "status": "assumed",
                "line": f"{name} terms are assumptions (no fit for this network, or overridden); "
                        f"this run spans {cluster.nodes} nodes{staged}"}
    lo, hi = fit.nodes
    status = "fitted" if lo <= cluster.nodes <= hi else "extrapolated"
    rest = "within the fit" if status == "fitted" else "extrapolated"
    held = f", {' and '.join(fit.held)} held at published figures" if fit.held else ""
    return {**base, "status": status,
            "line": f"{name} terms fitted on {fit.cluster} ({lo}–{hi} nodes){held}; this run spans {cluster.nodes} "
                    f"nodes: {rest}{staged}"}
