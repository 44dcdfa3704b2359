"""Traced collectives: every collective the engine issues goes through `Collectives`, which
records op, bytes, dtype, group (global ranks), issue and completion time as a `comm` event.

Bytes follow nccl-tests (docs/trace-schema.md): the whole buffer of an all_reduce, the whole
gathered buffer of an all_gather and the whole input of a reduce_scatter. Ops are issued async
(so they can overlap compute) and recorded when waited on: `ts` is the issue time, the end is when
the op completed (its future's callback on gloo, or the return of `wait()` for gloo's
reduce_scatter, which has no future; on CUDA the host time after waiting and synchronising the
stream, since an NCCL future completes at enqueue), and `blocked_us` is how long the caller itself sat in `wait()`.
For a collective on the `comm` track, the caller's wait is also its own event on the `compute`
track, `wait/<collective>` (args `for` and `seq`), so that waiting is never counted as compute.
Each event carries `seq`, its index among this group's collectives (on either track), which lets `merge` line up
the same collective on every rank and fill in `last_arrival_ts`.

Uses the torch >= 2.13 names `reduce_scatter_single` / `all_gather_single` (which replace the
deprecated `reduce_scatter_tensor` / `all_gather_into_tensor`; both work on gloo and NCCL).
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

    def wait(self) -> None:
        if self.waited:
            return
        self.waited = True
        tracer = self.comm.tracer
        enter = tracer.now_us()
        self.work.wait()
        if self.comm.on_cuda:
            torch.cuda.current_stream().synchronize()
        left = tracer.now_us()
        end = min(self.done_us[0], left) if self.done_us and not self.comm.on_cuda else left
        tracer.complete(self.name, self.comm.stream, self.issued_us, end, blocked_us=left - enter, **self.args)
        if self.comm.stream != "compute":
            tracer.complete(wait_event(self.name), "compute", enter, left, seq=self.args["seq"], **{"for": self.name})


class Collectives:
    """The collectives of one process group, traced on `stream`. `group=None` is the world.

    ZeRO's collectives go on the `comm` track; Megatron's MP all-reduces on `compute`, because they
    block the layer's computation (docs/trace-schema.md)."""

    def __init__(self, tracer: Tracer, group: dist.ProcessGroup | None = None, *, on_cuda: bool = False,
                 stream: str = "comm"):
        self.tracer = tracer
        self.stream = stream
        self.group = group
        self.ranks = dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))
        self.size = len(self.ranks)
        self.on_cuda = on_cuda

    def inline(self) -> Collectives:
        """The same group's collectives traced on the `compute` track (the caller waits in line)."""
        return self if self.stream == "compute" else Collectives(self.tracer, self.group, on_cuda=self.on_cuda,
                                                                 stream="compute")

    def all_reduce(self, tensor: torch.Tensor, what: str, op: dist.ReduceOp = dist.ReduceOp.SUM) -> Pending:
        """In-place sum (or `op`) of `tensor` over the group."""
        return self._issue("all_reduce", what, tensor, lambda: dist.all_reduce(tensor, op=op, group=self.group,
                                                                               async_op=True))

    def reduce_scatter(self, output: torch.Tensor, input: torch.Tensor, what: str) -> Pending:
        """Sum `input` (group size x output elements, rank-major) and keep this rank's slice in `output`."""
        assert input.numel() == output.numel() * self.size, "reduce_scatter input is not group x output"
        return self._issue("reduce_scatter", what, input, lambda: dist.reduce_scatter_single(
            output, input, group=self.group, async_op=True))

    def all_gather(self, output: torch.Tensor, input: torch.Tensor, what: str) -> Pending:
        """Concatenate every rank's `input` into `output` (may alias: input = this rank's slice)."""
        assert output.numel() == input.numel() * self.size, "all_gather output is not group x input"
        return self._issue("all_gather", what, output, lambda: dist.all_gather_single(
            output, input, group=self.group, async_op=True))

    def _issue(self, op: str, what: str, payload: torch.Tensor, launch) -> Pending:
        args = {"op": op, "bytes": payload.numel() * payload.element_size(),
                "dtype": DTYPE_NAMES.get(payload.dtype, str(payload.dtype).removeprefix("torch.")),
                "group": self.ranks, "seq": self.tracer.next_seq(tuple(self.ranks)),
                "step": self.tracer.step, "micro_batch": self.tracer.micro_batch}  # when issued, not waited
        issued = self.tracer.now_us()
        work = launch()
        pending = Pending(self, work, collective_event(op, what), args, issued)
        if not self.on_cuda:  # on NCCL a future completes at enqueue time, not when the transfer ends
            origin = self.tracer.now_us

            def done(_fut, record=pending.done_us):
                record.append(origin())
            try:
                work.get_future().then(done)
            except RuntimeError:
                pass  # gloo's reduce_scatter has no future ("Work::getFuture not implemented"): end = wait
        return pending
