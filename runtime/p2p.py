"""Traced point-to-point transfers between pipeline stages: `send/pp.fwd`, `recv/pp.fwd`,
`send/pp.bwd`, `recv/pp.bwd` (docs/runtime.md "Pipeline parallelism").

A send is posted at once and waited for at the end of the step (`finish`); a receive is waited for at
once. Every directed link (sender -> receiver) has its own process group (`Links`), so the transfers
of one direction never queue behind the other's: on NCCL all transfers of one communicator run in
order on one NCCL stream, and with one shared communicator the 1F1B steady state deadlocks (stage 0's
send of micro-batch i+1 waits for stage 1's receive, which stage 1 posts after its send of gradient i,
which waits for stage 0's receive, queued behind that send). Megatron-LM avoids this by posting each
send together with the next receive (megatron/core/pipeline_parallel/p2p_communication.py
`_communicate`, one `batch_isend_irecv`); a communicator per direction does it without tying a send
to a receive, for every schedule, and keeps a posted send from holding up its rank (gloo, too,
delivers a posted send only when the peer's receive is posted: waiting for it at once deadlocks the
interleaved schedule).

An event per transfer, on the `comm` track, timed as runtime/comm.py times collectives: CPU, issue to
completion (`timing: "host"`; gloo's p2p works have no future, so a send's end is the first time it is
seen complete, `poll`, checked at every receive and compute boundary: an upper bound by at most one
op); CUDA, events on the link's side stream around the transfer (`timing: "cuda_event"`). Args:
`group: "pp"`, `bytes` (what this rank sends or receives), `dtype`, `peer` (the other global rank),
`step` and `micro_batch` (of the transfer, when it was asked for), `seq` (its index on the link, the
same on both ends). `group` is the name of the pipeline group, not a list of ranks: runtime/merge.py
lines up collectives only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from .comm import DTYPE_NAMES, Pending
from .tracer import Tracer


@dataclass
class Links:
    """The process group of each directed link (sender, receiver) of global ranks this rank uses; made
    by every rank in the same order (torch.distributed.new_group), see `make`."""

    groups: dict[tuple[int, int], dist.ProcessGroup] = field(default_factory=dict)

    @classmethod
    def make(cls, pipelines: list[list[int]], me: int) -> Links:
        """The links between neighbouring stages of every pipeline (global ranks in stage order; the
        last stage and the first are neighbours too: interleaved chunks wrap round), both directions."""
        links = cls()
        for ranks in pipelines:
            pairs = {(ranks[i], ranks[(i + 1) % len(ranks)]) for i in range(len(ranks))}
            for a, b in sorted(pairs | {(b, a) for a, b in pairs}):
                group = dist.new_group([a, b])
                if me in (a, b):
                    links.groups[(a, b)] = group
        return links


class PointToPoint:
    """This rank's traced sends and receives to and from other pipeline stages (global ranks)."""

    stream = "comm"

    def __init__(self, tracer: Tracer, links: Links, *, on_cuda: bool = False):
        self.tracer = tracer
        self.links = links
        self.on_cuda = on_cuda
        self.side_streams = {link: torch.cuda.Stream() for link in links.groups} if on_cuda else {}
        self._sending: list[Pending] = []  # posted sends not yet waited for
        self._send_buffers: list[torch.Tensor] = []  # alive until their send is waited for
        self._seqs: dict[tuple[int, int], int] = {}  # link -> transfers so far

    def send(self, tensor: torch.Tensor, peer: int, what: str) -> None:
        """Post `tensor` to global rank `peer` as `send/<what>`. The caller must not change `tensor`
        before `finish`."""
        link = (dist.get_rank(), peer)
        self._sending.append(self._post(dist.isend, tensor, link, peer, f"send/{what}"))
        self._send_buffers.append(tensor)

    def recv(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, peer: int, what: str
             ) -> torch.Tensor:
        """A tensor of `shape` from global rank `peer` (`recv/<what>`); returns once it is in (CUDA:
        once the compute stream waits for it)."""
        out = torch.empty(shape, dtype=dtype, device=device)
        self.poll()
        self._post(dist.irecv, out, (peer, dist.get_rank()), peer, f"recv/{what}").wait()
        self.poll()
        return out

    def flush(self) -> None:
        """Before a compute: note the sends done so far."""
        self.poll()

    def finish(self) -> None:
        """At the end of the step: every send is done (and recorded)."""
        self.poll()
        for pending in self._sending:
            pending.wait()
        self._sending.clear()
        self._send_buffers.clear()

    def poll(self) -> None:
        """CPU: stamp the sends that completed since the last look (their end time)."""
        if self.on_cuda:
            return
        now = self.tracer.now_us()
        for pending in self._sending:
            if not pending.done_us and pending.work.is_completed():
                pending.done_us.append(now)

    def _post(self, op, tensor: torch.Tensor, link: tuple[int, int], peer: int, name: str) -> Pending:
        seq = self._seqs.get(link, 0)
        self._seqs[link] = seq + 1
        args = {"bytes": tensor.numel() * tensor.element_size(),
                "dtype": DTYPE_NAMES.get(tensor.dtype, str(tensor.dtype).removeprefix("torch.")),
                "group": "pp", "peer": peer, "seq": seq, "step": self.tracer.step,
                "micro_batch": self.tracer.micro_batch}
        group = self.links.groups[link]
        issued = self.tracer.now_us()
        if not self.on_cuda:
            return Pending(self, op(tensor, peer, group=group), name, args, issued)
        side = self.side_streams[link]  # issued as runtime/comm.py issues a collective on CUDA
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            start = self.tracer.stamp()
            work = op(tensor, peer, group=group)
            work.wait()  # on NCCL: the side stream waits, the host does not
            end = self.tracer.stamp()
        tensor.record_stream(side)
        return Pending(self, work, name, {**args, "timing": "cuda_event"}, issued, device_span=(start, end))
