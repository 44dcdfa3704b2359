"""Device memory held outside PyTorch's caching allocator: the CUDA context, the cuBLAS workspace and
NCCL's communication buffers. Reserved once per GPU at start (category `context`), for the whole run.

Sources, per term:
  CUDA context: the device memory a PyTorch process holds before its first tensor (kernel images of
      libtorch_cuda and its libraries, the context's own heap). Measured with PyTorch 1.4/1.5 and CUDA
      10.x, the stack of the ZeRO paper's time: a process that has made one 4-byte tensor shows
      723 MiB in nvidia-smi (discuss.pytorch.org/t/73021, March 2020), "~700+ MB ... allocated by the
      CUDA context", "happens in 1.4 and 1.5" (discuss.pytorch.org/t/81330, May 2020). zsim takes
      723 MiB − the allocator's first 2 MiB segment = 721 MiB. Newer CUDA (>= 11.7, lazy module
      loading) needs less; that is not measured here, so the same figure is used for every GPU.
  cuBLAS workspace: PyTorch's default per (handle, stream) that runs GEMMs, CUBLAS_WORKSPACE_CONFIG
      ":4096:2:16:8" = 2 × 4096 KiB + 8 × 16 KiB (aten/src/ATen/cuda/CublasHandlePool.cpp); one
      stream (compute) runs GEMMs. cuDNN holds nothing: a GPT layer calls no cuDNN kernel (Megatron-LM's
      layer norm and softmax are its own/apex kernels).
  NCCL: every communicator, on every channel, allocates receive buffers for each peer that sends to
      this rank, one per protocol: LL 8 lines × 512 threads × 8 steps × 16 B = 512 KiB, LL128
      120 × 640 × 8 × 8 B = 4,915,200 B, Simple NCCL_BUFFSIZE = 4 MiB (NCCL 2.7.8 src/init.cc
      DEFAULT_LL_BUFFSIZE, DEFAULT_LL128_BUFFSIZE, DEFAULT_BUFFSIZE; src/include/devcomm.h), with
      cudaMalloc (src/transport/p2p.cc p2pRecvSetup; net.cc netRecvSetup with GPUDirect RDMA), so
      outside PyTorch's allocator. init.cc connects, per channel, the ring's previous rank and the
      tree's parent and children (ncclTransportP2pSetup for ring.prev, treeUp.down, treeDn.up), each
      (channel, peer) once. Inside a node the tree is a chain (one child, one parent); NCCL searches it
      on the same topology as the ring and it usually follows the ring's order, so zsim counts 2
      distinct sending peers per channel (1 in a group of 2). Where the chain's order differs from the
      ring's, a rank has 3 and this undercounts by a third; node heads of a multi-node tree also
      receive from up to 2 remote children (not counted). Channels: NCCL finds one ring per NVLink of the GPU and then duplicates the
      channels (src/graph/connect.cc ncclTopoPostset: nChannels = min(MAXCHANNELS = 32, 2 × rings)).
      Communicators: PyTorch's ProcessGroupNCCL creates one per process group on its first
      collective; Megatron-LM (mpu/initialize.py) makes a data-parallel and a model-parallel group
      and uses the default (world) group for its barriers, so a rank holds up to 3 (a group of one
      rank has no peers and no buffers). Send-side buffers of inter-node connections (one rank per
      node and channel) are not counted.
"""

from __future__ import annotations

from dataclasses import dataclass

MiB = 1 << 20

CUDA_CONTEXT_BYTES = 721 * MiB  # measured, PyTorch 1.4/1.5 + CUDA 10.x (module docstring)
CUBLAS_WORKSPACE_BYTES = 2 * 4096 * 1024 + 8 * 16 * 1024  # ":4096:2:16:8" (CublasHandlePool.cpp)
NCCL_LL_BYTES = 8 * 512 * 8 * 16  # NCCL_LL_LINES_PER_THREAD × NCCL_LL_MAX_NTHREADS × NCCL_STEPS × 16 B
NCCL_LL128_BYTES = 120 * 640 * 8 * 8  # NCCL_LL128_ELEMS_PER_THREAD × MAX_NTHREADS × NCCL_STEPS × 8 B
NCCL_SIMPLE_BYTES = 4 * MiB  # NCCL_BUFFSIZE default
NCCL_CONNECTION_BYTES = NCCL_LL_BYTES + NCCL_LL128_BYTES + NCCL_SIMPLE_BYTES  # 9,633,792 B per peer
NCCL_MAX_CHANNELS = 32  # MAXCHANNELS (devcomm.h)


@dataclass(frozen=True, slots=True)
class ContextMemory:
    """Bytes one GPU holds outside the caching allocator, by what holds them."""

    cuda_context: int
    cublas_workspace: int
    nccl: dict[str, int]  # communicator ('world', 'dp', 'mp') -> its buffers

    def items(self) -> list[tuple[str, int]]:
        """(name, bytes) of each reservation, for the ledger (zero-byte ones left out)."""
        rows = [("context.cuda", self.cuda_context), ("context.cublas", self.cublas_workspace)]
        rows += [(f"context.nccl.{name}", n) for name, n in self.nccl.items()]
        return [(name, n) for name, n in rows if n > 0]

    @property
    def total(self) -> int:
        return self.cuda_context + self.cublas_workspace + sum(self.nccl.values())


def nccl_channels(nvlink_links: int) -> int:
    """NCCL's channels on a GPU with `nvlink_links` NVLinks: one ring per link, duplicated (module
    docstring); at least one ring (PCIe) before duplication."""
    return min(NCCL_MAX_CHANNELS, 2 * max(1, nvlink_links))


def nccl_communicator_bytes(ranks: int, channels: int) -> int:
    """Receive buffers one rank of a communicator of `ranks` ranks holds: channels × distinct
    sending peers (2, or 1 in a pair, 0 alone) × the three protocols' buffers."""
    peers = min(2, ranks - 1)
    return channels * peers * NCCL_CONNECTION_BYTES


def context_memory(world: int, dp: int, mp: int, nvlink_links: int) -> ContextMemory:
    """What one GPU of a DP × MP job (`world` ranks) holds outside the caching allocator."""
    channels = nccl_channels(nvlink_links)
    groups = {"world": world, "dp": dp, "mp": mp}
    return ContextMemory(
        cuda_context=CUDA_CONTEXT_BYTES,
        cublas_workspace=CUBLAS_WORKSPACE_BYTES,
        nccl={name: nccl_communicator_bytes(n, channels) for name, n in groups.items() if n > 1},
    )
