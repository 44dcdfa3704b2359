"""The DGX-1 (V100) NVLink hybrid cube-mesh, and what remains of it on a node with fewer GPUs.

The table is NVIDIA's: DGX-1 with Tesla V100 System Architecture whitepaper (WP-08437-002), Fig. 5,
as `nvidia-smi topo -m` prints it (NV1/NV2): 8 GPUs, 6 NVLinks each, to 4 neighbours, 2 of them
doubled. The mesh connects exactly 8 GPUs. A node of n < 8 GPUs (a DGX-1 job that sees GPUs 0..n-1,
e.g. CUDA_VISIBLE_DEVICES=0,1,2,3) keeps the links among those GPUs: the induced sub-mesh. A node of
more than 8 GPUs has no cube-mesh (zsim.fabric.cluster rejects it).
"""

from __future__ import annotations

MESH_GPUS = 8
# (gpu, gpu, NVLinks between them)
CUBE_MESH = ((0, 1, 1), (0, 2, 1), (0, 3, 2), (0, 4, 2), (1, 2, 2), (1, 3, 1), (1, 5, 2), (2, 3, 2),
             (2, 6, 1), (3, 7, 1), (4, 5, 1), (4, 6, 1), (4, 7, 2), (5, 6, 2), (5, 7, 1), (6, 7, 2))


def cube_mesh_edges(gpus: int) -> tuple[tuple[int, int, int], ...]:
    """The NVLink edges among GPUs 0..gpus-1 (the induced sub-mesh). Raises ValueError above 8."""
    if not 0 < gpus <= MESH_GPUS:
        raise ValueError(f"the hybrid cube-mesh connects 1 to {MESH_GPUS} GPUs, not {gpus}")
    return tuple(e for e in CUBE_MESH if e[0] < gpus and e[1] < gpus)


def cube_mesh_links_per_gpu(gpus: int) -> int:
    """NVLinks of the least-connected GPU of the sub-mesh of `gpus` GPUs (6 on a full DGX-1, 0 for
    one GPU): NCCL builds its rings over links every member has, so this bounds its channels."""
    links = [0] * gpus
    for a, b, count in cube_mesh_edges(gpus):
        links[a] += count
        links[b] += count
    return min(links)
