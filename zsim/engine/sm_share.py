"""A GPU's SMs, shared by its compute kernels and the communication kernels running beside them
(`fabric.sm_contention`).

A collective on a GPU is itself a kernel. NCCL runs one CTA per channel and each holds an SM to itself:
"NCCL CTAs won't share an SM with compute kernels" (S. Jeaugey, NVIDIA/nccl#689, 2023-08). A GEMM launched
beside it spreads its tiles over the SMs that are left, so while the collective runs the compute stream
advances at (SMs − held) / SMs of its speed alone. What holds how many SMs:
  - an NCCL collective (DP, MP, EP with the alltoall dispatcher) on a side stream: its channels, zsim's count of
    them (zsim.fabric.collective.nccl_channels: one per NVLink of a GPU, the count its cost model uses);
  - DeepEP's dispatch and combine: 20 SMs (deep_ep/buffer.py `Buffer.num_sms = 20`; Megatron-Core's
    `moe_deepep_num_sms` default 20);
  - Transformer Engine's userbuffers beside a GEMM (`parallel.tp_comm_overlap`): 16 SMs for the pipelined and
    bulk reduce-scatters, 1 for the ring-exchange all-gathers, whose copies run on the copy engines
    (TransformerEngine v1.8 pytorch/module/base.py initialize_ub L229: `num_sm` 1 for ring_exchange, else 16;
    `use_ce` True).

Modelled as a fluid rate: a compute op's work (its seconds alone) drains at the SM share left to it, recomputed
whenever a collective beside it starts or ends. Not modelled: the HBM bandwidth a collective's copies take
from memory-bound kernels (nccl#1428: "very likely, they're competing for memory bandwidth"), wave
quantisation (a one-wave GEMM that loses a few SMs runs a second, nearly empty wave), pipeline sends and
receives (a channel or two), and a collective in line on the compute stream (nothing computes beside it).
Published measurements put the whole effect above this share alone: overlapped compute ran 18.9% slower on
average, 40% at most, on 4 A100/H100/MI250/MI210 (Lee et al., arXiv:2507.03114, 2025)."""

from __future__ import annotations

from collections.abc import Generator

import simpy

from zsim.fabric.cluster import Cluster
from zsim.fabric.collective import nccl_channels
from zsim.zero.ops import EP_GROUPS, Op

DEEPEP_SMS = 20  # deep_ep/buffer.py Buffer.num_sms; Megatron-Core TransformerConfig.moe_deepep_num_sms
TE_BULK_SMS = 16  # TransformerEngine v1.8 module/base.py L229: num_sm for the pipeline and bulk methods
TE_RING_SMS = 1  # ... and for ring_exchange (its copies run on the copy engines: use_ce True)


def held_sms(op: Op, cluster: Cluster, dispatcher: str) -> int:
    """SMs collective `op` holds while it runs beside compute: 0 for one in line on the compute stream or a
    pipeline send/receive; `dispatcher` is the MoE token dispatcher ('alltoall' or 'deepep')."""
    if not op.is_collective or op.stream == "compute" or op.group == "pp":
        return 0
    if op.stream == "tp":  # Transformer Engine's userbuffers (zsim.zero.tp_overlap)
        return TE_RING_SMS if op.collective == "all_gather" else TE_BULK_SMS
    if op.group in EP_GROUPS and op.collective == "all_to_all" and dispatcher == "deepep":
        return DEEPEP_SMS
    return nccl_channels(cluster)


class SmShare:
    """The SMs of one simulated GPU (a pipeline stage's representative): `sms` in all, `held` by the
    collectives running now."""

    def __init__(self, env: simpy.Environment, sms: int) -> None:
        self.env = env
        self.sms = sms
        self.held = 0
        self._changed = simpy.Event(env)

    def hold(self, sms: int) -> None:
        """A collective holding `sms` SMs starts."""
        self.held += sms
        self._signal()

    def release(self, sms: int) -> None:
        """A collective holding `sms` SMs ended."""
        self.held -= sms
        assert self.held >= 0, "an SM release without its hold"
        self._signal()

    def _signal(self) -> None:
        if self._changed.callbacks:  # a compute op is waiting on the share: wake it to re-rate its work
            changed, self._changed = self._changed, simpy.Event(self.env)
            changed.succeed()

    def rate(self) -> float:
        """The compute stream's speed now, as a fraction of its speed alone (at least one SM's)."""
        return max(1, self.sms - self.held) / self.sms

    def compute(self, seconds: float) -> Generator[simpy.Event, None, None]:
        """Run a compute op that takes `seconds` alone, at the share the collectives leave it."""
        env, left = self.env, seconds
        while left > 0.0:
            rate, begun, changed = self.rate(), env.now, self._changed
            timer = simpy.Timeout(env, left / rate)
            yield timer | changed
            if timer.processed:
                return
            left -= (env.now - begun) * rate
            if left <= seconds * 1e-12:  # round-off: the timer was due now
                return
