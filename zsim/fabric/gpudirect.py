"""A node's NICs with and without GPUDirect RDMA.

With GPUDirect RDMA (NCCL's `GDRDMA` transport, the nvidia-peermem / nv_peer_mem module loaded and the
NIC within NCCL_NET_GDR_LEVEL of the GPU) the NIC reads and writes GPU memory directly, and a NIC carries
the network's achieved share of its line rate (`efficiency`, hwprofiles/networks/). Without it, NCCL's
network proxy stages every byte through host memory: the GPU's kernel writes the send buffer into pinned
host memory and the NIC sends from there; received bytes land in host memory and the GPU reads them back
(src/transport/net.cc, `useGdr` = 0). Two published facts bound what a NIC then carries:

* the staged path itself: "If the NIC is attached to the CPU getting 16 GB/s is normal", where the same
  HDR NIC next to the GPU with GPUDirect RDMA gets 24 GB/s (NCCL maintainer, github.com/NVIDIA/nccl/issues/412,
  2023-04-24): STAGED_SHARE = 16/24 of the direct rate;
* the PCIe switch the NIC shares with GPUs (DGX-1, DGX-2, DGX A100, HGX: a NIC and its GPUs behind one
  switch, `intra_node.gpus_per_pcie_switch`): "GPU direct RDMA is very important for NIC and GPUs on the
  same PCI switch because otherwise the data would need to transit through the CPU" (github.com/NVIDIA/nccl/
  issues/1151, 2024-01-19). Staged, each direction of the switch's uplink to the CPU carries two streams of
  a ring's node at once (up: the GPU's send into host memory and the NIC's receive into it; down: the
  NIC's send out of host memory and the GPU's read of the received bytes), so a NIC gets at most half the
  uplink. The uplink's rate is taken as the GPU's own host link (the profile's `offload_link`: DGX-1/DGX-2
  put x16 gen3 switches under x16 gen3 uplinks), an assumption.

What it leaves out: the staging's extra latency per step (a PCIe round trip; NCCL's tuner has no term for
it either, tuning.cc), and the uplink's sharing with CPU offload traffic (ZeRO-Offload, Pa+cpu) at the same
moment. Nothing in ../shared/data was measured without GPUDirect RDMA, so no term here is fitted.
"""

from __future__ import annotations

# The staged path's share of the direct one: 16 of 24 GB/s on an HDR NIC (github.com/NVIDIA/nccl/issues/412).
STAGED_SHARE = 16.0 / 24.0
# A staged byte crosses the NIC's PCIe switch uplink twice per direction (module docstring).
UPLINK_STREAMS = 2


def nic_bytes_per_s(direct_Bps: float, gpudirect_rdma: bool, uplink_Bps: float) -> float:
    """Bytes per second one NIC carries per direction: `direct_Bps` (its line rate × the network's
    efficiency) with GPUDirect RDMA; without it, the staged rate, min(STAGED_SHARE × direct, uplink / 2),
    `uplink_Bps` being the NIC's PCIe switch uplink per direction (module docstring, with sources)."""
    if gpudirect_rdma:
        return direct_Bps
    return min(direct_Bps * STAGED_SHARE, uplink_Bps / UPLINK_STREAMS)
