"""Stage 2, Pos+g (ZeRO paper §5.2): optimizer states and gradients partitioned.

Each rank keeps all fp16/bf16 parameters (es·Ψ, laid out bucket by bucket, runtime/zero/partition.py)
but only its gradient chunks (es·Ψ/Nd) and optimizer chunks (KΨ/Nd): memory (2 + 14/Nd)Ψ mixed
(Table 1). During backward, as soon as a unit's gradient is complete it is copied into its bucket and
freed; a full bucket is reduce-scattered while backward continues, and each rank adds the summed
chunk it owns to its gradient partition (so gradient accumulation over micro-batches reduces every
micro-batch). After the step each rank's partition is all-gathered in DeepSpeed v0.2's shards of
allgather_bucket_elements (zsim.zero.buckets.allgather_shards), as the simulator's plan does.
Communication per step (one micro-batch): reduce-scatter Ψ + all-gather Ψ = 2Ψ (§7.2.1).
"""

from __future__ import annotations

import torch

from .buckets import PartitionReducer
from .engine import PartitionedGradients
from .optimizer import FlatAdam, Segment
from .partition import BucketPartition
from .stage1 import flat_params
from zsim.zero.buckets import allgather_shards


class Stage2(PartitionedGradients):
    stage = 2
    partitioned = frozenset({"optimizer", "grads"})

    def setup(self, init32: list[torch.Tensor]) -> FlatAdam:
        numels = [u.layout.numel for u in self.units]
        # fp32 initial values, a local: the optimizer's master copies them and drops it (no hidden 4 B/param)
        flat32 = flat_params(self, init32, BucketPartition.of(numels, self.options.bucket_elements, self.dp))
        part = self.part
        self.grad_partition = torch.zeros(part.shard, dtype=self.dtype, device=self.device)
        self.ledger.add("grads", self.grad_partition.nbytes)
        self.grad_chunks, at = [], 0
        for b in range(part.pieces):
            self.grad_chunks.append(self.grad_partition[at:at + part.chunk(b)])
            at += part.chunk(b)
        self.reducer = PartitionReducer(part, self.comm, self.ledger, self._deliver, self.dtype, self.device)
        return self._optimizer([Segment(part.own(self.flat, b, self.rank), self.grad_chunks[b],
                                        part.own(flat32, b, self.rank)) for b in range(part.pieces)])

    def _deliver(self, bucket: int, out: torch.Tensor) -> None:
        self.grad_chunks[bucket].add_(out)

    def after_step(self) -> None:
        """Gather every rank's updated partition (its chunks, bucket by bucket) in shards, one after
        another (DeepSpeed v0.2 step(): a list all_gather per shard); each rank's rows go back into
        its chunks of the flat parameter buffer."""
        part, start = self.part, 0
        for j, n in enumerate(allgather_shards(part.shard, self.dp, self.options.allgather_bucket_elements)):
            mine = torch.empty(n, dtype=self.dtype, device=self.device)
            for at, offset, length in part.partition_pieces(start, n, self.rank):
                mine[offset:offset + length].copy_(self.flat[at:at + length])
            rows = torch.empty(self.dp * n, dtype=self.dtype, device=self.device)
            self.ledger.add("buffers", mine.nbytes + rows.nbytes)
            self.comm.all_gather(rows, mine, f"params.bucket.{j}").wait()
            for rank in range(self.dp):
                for at, offset, length in part.partition_pieces(start, n, rank):
                    self.flat[at:at + length].copy_(rows[rank * n + offset:rank * n + offset + length])
            self.ledger.add("buffers", -(mine.nbytes + rows.nbytes))
            start += n
