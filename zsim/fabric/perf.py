"""A simulated nccl-tests run: one collective at a time on a cluster's fabric, timed as nccl-tests
times it (NVIDIA/nccl-tests src/common.cu: back-to-back iterations, average time per call)."""

from __future__ import annotations

from dataclasses import dataclass

import simpy

from zsim.fabric.cluster import Cluster
from zsim.fabric.collective import Placement, plan_collective, uncontended_time
from zsim.fabric.nccl import bus_factor
from zsim.fabric.sharing import Fabric
from zsim.fabric.topology import healthy_capacities
from zsim.errors import ZsimError
from zsim.parallel.layout import GroupShape
from zsim.trace.nccl_tests import NcclRow

# Bytes per element of nccl-tests' -d types.
DTYPE_BYTES = {"float": 4, "half": 2, "bfloat16": 2, "double": 8, "int8": 1, "int32": 4}


@dataclass(frozen=True, slots=True)
class PerfRow(NcclRow):
    """A simulated nccl-tests row, and the algorithm/protocol that ran it."""

    algorithm: str


def group_of(cluster: Cluster, gpus: int) -> tuple[GroupShape, list[int]]:
    """`gpus` GPUs spread evenly over the cluster's nodes: their shape and global ranks.

    Raises:
        ZsimError: `gpus` does not divide evenly over the nodes or exceeds a node.
    """
    per_node, rest = divmod(gpus, cluster.nodes)
    if rest or not 0 < per_node <= cluster.gpus_per_node:
        raise ZsimError(f"--gpus {gpus} must be a multiple of --nodes {cluster.nodes} with at most "
                         f"{cluster.gpus_per_node} per node")
    members = [node * cluster.gpus_per_node + i for node in range(cluster.nodes) for i in range(per_node)]
    return GroupShape(gpus, per_node, cluster.nodes, 1), members


def nccl_tests_size(fn: str, size: int, n: int, dtype_bytes: int) -> tuple[int, int]:
    """(payload bytes, count) as nccl-tests rounds a requested size: all_gather and reduce_scatter
    move n equal chunks of whole elements (src/all_gather.cu AllGatherGetCollByteCount)."""
    if fn in ("all_gather", "reduce_scatter", "all_to_all"):
        per_rank = size // (n * dtype_bytes)
        return per_rank * n * dtype_bytes, per_rank
    return size // dtype_bytes * dtype_bytes, size // dtype_bytes


def run_collective(cluster: Cluster, fn: str, size: int, gpus: int, gpus_per_process: int = 1,
                   algorithm: str = "auto", dtype: str = "float", simulate: bool = True,
                   capacity: dict | None = None) -> PerfRow:
    """Time one collective of `size` requested bytes on `gpus` GPUs as nccl-tests would: the kernel
    on the fabric (simulated with simpy, or the closed form when `simulate` is False), after and no
    faster than the host launching `gpus_per_process` kernels per call (NcclKernel.call_seconds)."""
    shape, members = group_of(cluster, gpus)
    nbytes, count = nccl_tests_size(fn, size, gpus, DTYPE_BYTES[dtype])
    if capacity is None:
        capacity = healthy_capacities(cluster)  # = aggregate_capacities(build_topology(cluster), cluster)
    label, phases = plan_collective(fn, nbytes, shape, cluster, algorithm, Placement(members, class_mode=False),
                                    in_place=False)
    if simulate:
        env = simpy.Environment()
        fabric = Fabric(env, capacity)

        def body():
            for p in phases:
                if p.latency_s:
                    yield env.timeout(p.latency_s)
                if p.nbytes:
                    yield from fabric.transfer(p.links, p.nbytes, p.cap_Bps)
        env.process(body())
        env.run()
        kernel = env.now
    else:
        kernel = uncontended_time(phases, capacity)
    seconds = cluster.nccl.call_seconds(kernel, gpus_per_process)
    algbw = nbytes / seconds / 1e9 if seconds > 0 else 0.0
    return PerfRow(nbytes, count, dtype, seconds * 1e6, algbw, algbw * bus_factor(fn, gpus), label)
