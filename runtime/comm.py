"""Traced collectives: every collective the engine issues goes through `Collectives`, which
records op, bytes, dtype, group (global ranks), issue and completion time as a `comm` event.

Bytes follow nccl-tests (docs/trace-schema.md): the whole buffer of an all_reduce, the whole
gathered buffer of an all_gather and the whole input of a reduce_scatter. Ops are issued async
(so they can overlap compute) and recorded when waited on.

How a collective is timed depends on the device (issue 26: on NCCL, the host's return from `wait()`
says when the host got round to waiting, not when the transfer ended):
- CPU (gloo): `ts` is the issue time, the end is when the op completed (its future's callback, or the
  return of `wait()` for gloo's reduce_scatter, which has no future); `timing: "host"`.
- CUDA (NCCL): the op is issued from a side stream that first waits for the compute stream; CUDA
  events recorded on that stream before the launch and after the side stream has waited for the
  NCCL work mark when the transfer could start and when it ended (`timing: "cuda_event"`). Waiting
  is the compute stream's: `wait()` makes it wait for the end event without blocking the host, and the
  `wait/<collective>` event spans the compute stream's stall (two events around the stream wait).
`blocked_us` is how long the host itself sat in `wait()` (0 on CUDA, where it never blocks).
For a collective on the `comm` track, the caller's wait is also its own event on the `compute`
track, `wait/<collective>` (args `for` and `seq`), so that waiting is never counted as compute.
Each event carries `seq`, its index among this group's collectives (on either track), which lets `merge` line up
the same collective on every rank and fill in `last_arrival_ts`.

Uses the torch >= 2.13 names `reduce_scatter_single` / `all_gather_single` where they exist, and the
older `reduce_scatter_tensor` / `all_gather_into_tensor` (torch 2.0-2.12) otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from .tracer import Tracer
from zsim.trace.schema import collective_event, wait_event

DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


@dataclass
class Pending:
    """An issued collective; `wait()` blocks until done and records its event once."""

    comm: Collectives
    work: dist.Work
    name: str
    args: dict
    issued_us: float
    done_us: list[float] = field(default_factory=list)  # set by the completion callback
    waited: bool = False
    device_span: tuple | None = None  # CUDA: (start, end) events on the side stream

    def wait(self) -> None:
        if self.waited:
            return
        self.waited = True
        if self.device_span is not None:
            self._wait_on_device()
            return
        tracer = self.comm.tracer
        enter = tracer.now_us()
        self.work.wait()
        left = tracer.now_us()
        end = min(self.done_us[0], left) if self.done_us else left
        tracer.complete(self.name, self.comm.stream, self.issued_us, end, blocked_us=left - enter,
                        timing="host", **self.args)
        if self.comm.stream != "compute":
            tracer.complete(wait_event(self.name), "compute", enter, left, seq=self.args["seq"], **{"for": self.name})

    def _wait_on_device(self) -> None:
        """CUDA: the compute stream waits for the collective's end event; the host does not block."""
        tracer = self.comm.tracer
        start, end = self.device_span
        enter = tracer.stamp()
        torch.cuda.current_stream().wait_event(end)
        left = tracer.stamp()
        tracer.complete(self.name, self.comm.stream, start, end, blocked_us=0.0, **self.args)
        if self.comm.stream != "compute":
            tracer.complete(wait_event(self.name), "compute", enter, left, seq=self.args["seq"], **{"for": self.name})


class Collectives:
    """The collectives of one process group, traced on `stream`. `group=None` is the world.

    ZeRO's collectives go on the `comm` track; Megatron's MP all-reduces on `compute`, because they
    block the layer's computation (docs/trace-schema.md)."""

    def __init__(self, tracer: Tracer, group: dist.ProcessGroup | None = None, *, on_cuda: bool = False,
                 stream: str = "comm", side_stream: torch.cuda.Stream | None = None):
        """`side_stream`: CUDA, the stream collectives are issued from (made here when not given)."""
        self.tracer = tracer
        self.stream = stream
        self.group = group
        self.ranks = dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))
        self.size = len(self.ranks)
        self.on_cuda = on_cuda
        self.side_stream = (side_stream or torch.cuda.Stream()) if on_cuda else None

    def inline(self) -> Collectives:
        """The same group's collectives traced on the `compute` track (the caller waits in line)."""
        return self if self.stream == "compute" else Collectives(self.tracer, self.group, on_cuda=self.on_cuda,
                                                                 stream="compute", side_stream=self.side_stream)

    def all_reduce(self, tensor: torch.Tensor, what: str, op: dist.ReduceOp = dist.ReduceOp.SUM) -> Pending:
        """In-place sum (or `op`) of `tensor` over the group."""
        return self._issue("all_reduce", what, tensor, lambda: dist.all_reduce(tensor, op=op, group=self.group,
                                                                               async_op=True), touches=(tensor,))

    def reduce_scatter(self, output: torch.Tensor, input: torch.Tensor, what: str) -> Pending:
        """Sum `input` (group size x output elements, rank-major) and keep this rank's slice in `output`."""
        assert input.numel() == output.numel() * self.size, "reduce_scatter input is not group x output"
        return self._issue("reduce_scatter", what, input, lambda: _REDUCE_SCATTER(
            output, input, group=self.group, async_op=True), touches=(output, input))

    def all_gather(self, output: torch.Tensor, input: torch.Tensor, what: str) -> Pending:
        """Concatenate every rank's `input` into `output` (may alias: input = this rank's slice)."""
        assert output.numel() == input.numel() * self.size, "all_gather output is not group x input"
        return self._issue("all_gather", what, output, lambda: _ALL_GATHER(
            output, input, group=self.group, async_op=True), touches=(output, input))

    def _issue(self, op: str, what: str, payload: torch.Tensor, launch, touches: tuple[torch.Tensor, ...] = ()
               ) -> Pending:
        args = {"op": op, "bytes": payload.numel() * payload.element_size(),
                "dtype": DTYPE_NAMES.get(payload.dtype, str(payload.dtype).removeprefix("torch.")),
                "group": self.ranks, "seq": self.tracer.next_seq(tuple(self.ranks)),
                "step": self.tracer.step, "micro_batch": self.tracer.micro_batch}  # when issued, not waited
        issued = self.tracer.now_us()
        if self.on_cuda:
            return self._issue_on_device(op, what, args, issued, launch, touches)
        work = launch()
        pending = Pending(self, work, collective_event(op, what), args, issued)
        origin = self.tracer.now_us

        def done(_fut, record=pending.done_us):
            record.append(origin())
        try:
            work.get_future().then(done)
        except RuntimeError:
            pass  # gloo's reduce_scatter has no future ("Work::getFuture not implemented"): end = wait
        return pending

    def _issue_on_device(self, op, what, args, issued, launch, touches) -> Pending:
        """CUDA: issue from the side stream, between two events on it (see the module docstring).
        The side stream waits for the NCCL work (`work.wait()` is a stream wait on NCCL, not a host
        block), so its end event fires when the transfer is done; the tensors are recorded on the side
        stream so that the caching allocator does not reuse them before then."""
        side = self.side_stream
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            start = self.tracer.stamp()
            work = launch()
            work.wait()
            end = self.tracer.stamp()
        for t in touches:
            t.record_stream(side)
        pending = Pending(self, work, collective_event(op, what), {**args, "timing": "cuda_event"}, issued)
        pending.device_span = (start, end)
        return pending


# torch >= 2.13 names, else the 2.0-2.12 ones (same semantics: one flat output / input tensor).
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
