"""How long a compute op takes on a GPU: the kernel-level compute model (zsim.compute, docs/compute.md)
prices the op's kernel list; an op without one (e.g. rebuilt from a trace that has only FLOPs and
bytes) runs its FLOPs at the GEMM model's large-tile rate and its bytes at the achieved HBM bandwidth
(a roofline per kernel class, Williams, Waterman & Patterson 2009), one after the other on a stream."""

from __future__ import annotations

from typing import TYPE_CHECKING

from zsim.compute.model import list_seconds
from zsim.fabric.cluster import Gpu
from zsim.zero.ops import Op

if TYPE_CHECKING:  # a GPU run never imports the host-profile models (tests/test_fast_start.py)
    from zsim.config.host import HostModel


def compute_seconds(op: Op, gpu: Gpu, dtype: str, host: HostModel | None = None) -> float:
    """Seconds of `op` on `gpu` computing in `dtype`; on a CPU host (`host`), host_seconds."""
    terms = gpu.compute
    if host is not None:
        return host_seconds(op, gpu, host, dtype)
    assert terms is not None, "a GPU without compute terms is a CPU host: pass its HostModel"
    if op.kernels is not None:
        return list_seconds(op.kernels, terms, gpu.peak_flops[dtype], gpu.hbm_bytes_per_s, dtype,
                            gpu.peak_flops.get("fp8", 0.0), gpu.peak_flops.get("fp4", 0.0))
    matmul = (op.flops / (gpu.peak_flops[dtype] * terms.tensor_rate * terms.gemm_terms(dtype).efficiency)
              if op.flops else 0.0)  # as zsim.compute.model.kernel_seconds: sustained, not burst, tensor rate
    memory = op.hbm_bytes / (gpu.hbm_bytes_per_s * terms.hbm_efficiency) if op.hbm_bytes else 0.0
    return matmul + memory


def host_seconds(op: Op, gpu: Gpu, host: HostModel, dtype: str) -> float:
    """Seconds of `op` on a CPU host (zsim.config.host), whose profile gives achieved rates: its FLOPs
    at the host's matmul rate, its bytes at the streaming rate, and the framework's time per aten op
    once per kernel of its kernel list (one for an op without a list), plus the runtime's time per op
    beyond its launches (`module_overhead_us`: module call, hooks, span; 0 unless calibrated). The optimizer's ops
    (`optimizer/...`: norms, the flat copy, Adam over the partition) stream host memory, not caches,
    and dispatch ops outside autograd: they have their own two terms (equal to the general ones in a
    profile that does not give them). Every op runs at the slowest rank's pace (the host's
    slowest_rank_factor, zsim.calibrate.stragglers): the ranks meet at every collective."""
    launches = op.kernels.launches if op.kernels is not None else 1
    matmul = op.flops / gpu.peak_flops[dtype] if op.flops else 0.0
    if op.name.startswith("optimizer/"):
        alone = matmul + op.hbm_bytes / host.optimizer_bytes_per_s + launches * host.optimizer_overhead_s
    else:
        alone = matmul + op.hbm_bytes / gpu.hbm_bytes_per_s + launches * host.op_overhead_s + host.module_overhead_s
    return alone * host.slowest_rank_factor
