"""The inter-node terms a network profile's fit sets (zsim.calibrate.net_fit, docs/fabric.md), their fitting
bounds, and InfiniBand's published efficiency; apart from the fit so that commands can check a `--hold`
without scipy (the `fit` extra)."""

from __future__ import annotations

# The terms, in profile units (efficiency and shares: fractions; latencies: µs)
TERMS = ("efficiency", "tree_efficiency", "ll128_share", "latency_us", "latency_growth_us", "nvls_tree_share")
BOUNDS = {"efficiency": (0.05, 1.0), "tree_efficiency": (0.05, 1.0), "ll128_share": (0.05, 120 / 128),
          "latency_us": (0.0, 500.0), "latency_growth_us": (0.0, 500.0), "nvls_tree_share": (0.05, 1.0)}
# InfiniBand's `efficiency` where a cluster's tables do not reach the sizes that set it (ABCI's stop at
# 32 MiB, where NCCL 2.8 still runs LL128: the fit then pinned ll128_share at its 120/128 bound and
# `efficiency` at whatever LL128's rows allowed, 0.657). The share of line rate NCCL's maintainers
# publish for large all_reduce on GPUDirect InfiniBand, every generation: EDR 12.2 GB/s on one 100 Gb/s
# NIC and 48 GB/s on DGX-1's 4 EDR (github.com/NVIDIA/nccl-tests/issues/29, 2019: 0.976, 0.96); HDR 24
# GB/s a NIC (github.com/NVIDIA/nccl/issues/412, 2023: 0.96) and 192 GB/s on DGX A100's 8 HDR
# (github.com/NVIDIA/nccl/issues/812, 2023: 0.96); NDR 48-49 GB/s a NIC
# (github.com/NVIDIA/nccl-tests/issues/267, 2025: 0.96-0.98). The lowest of them, held in the fit
# (`zsim nccl-fit --hold efficiency=0.96`, zsim.validate.network's ABCI split); docs/fabric.md.
IB_EFFICIENCY = 0.96
