"""How long a host copy takes on a GPU's host link (Pa+cpu's checkpoints, ZeRO §6.1)."""

from __future__ import annotations

from zsim.fabric.cluster import Tier


def transfer_seconds(nbytes: float, link: Tier) -> float:
    """Seconds to move `nbytes` one way over `link` (the cluster's offload tier: achieved bandwidth
    per direction and latency). The link is one GPU's own (a PCIe x16 port); copies of the other GPUs
    sharing a PCIe switch are not modelled (docs/memory.md)."""
    return link.latency_s + nbytes / link.bytes_per_s if nbytes else 0.0
