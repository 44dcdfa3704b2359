"""A kernel and a list of kernels, the unit zsim.compute prices, and the constructors every kernel list
is written with: a GEMM (M, N, K, batch), a memory-bound elementwise kernel or a reduction (the bytes it
reads and writes), and F.linear forward and backward (PyTorch 1.x functional.linear: a matmul plus a
separate bias add; backward two GEMMs and a reduction per bias)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Kernel:
    """One kernel (or `count` identical ones). GEMMs: m, n, k, batch (each launch); others: `bytes`
    moved by all `count` launches together."""

    name: str
    # 'gemm', 'mem' (elementwise), 'reduce' (a reduction: sum, max, norm), 'flash' (FlashAttention) or
    # 'host' (a host-only op such as a narrow: no GPU time, one host op; zsim.zero.implementation)
    kind: str
    m: int = 0
    n: int = 0
    k: int = 0
    batch: int = 1
    bytes: float = 0.0
    count: int = 1
    efficiency: float = 0.0  # 'flash': the fraction of the 16-bit peak it runs at (zsim.compute.flash)
    # Launched by host work priced in another op (deepspeed-0.5's list copies, launched on the 'host' lane while
    # their collective runs): GPU time here, no launch (zsim.zero.implementation.list_copy_tail).
    prelaunched: bool = False

    @property
    def flops(self) -> float:
        """2·m·n·k·batch per launch: a GEMM's; a 'flash' kernel is written as one GEMM of m queries × n
        keys × k (head dim × its s×s×d matmuls: 2 forward, 5 backward), flash-attn's FLOP count."""
        return 2.0 * self.m * self.n * self.k * self.batch * self.count if self.kind in ("gemm", "flash") else 0.0


@dataclass(frozen=True, eq=False, slots=True)
class KernelList:
    """The kernels of one module and pass, in launch order. Compared and hashed by identity (lists
    are built once per shape and pass and shared by every op that runs them)."""

    key: str
    kernels: tuple[Kernel, ...] = field(default=())

    @property
    def launches(self) -> int:
        """Host ops the list issues: every kernel's launches but those launched elsewhere (`prelaunched`)."""
        return sum(k.count for k in self.kernels if not k.prelaunched)

    @property
    def flops(self) -> float:
        return sum(k.flops for k in self.kernels)

    @property
    def bytes(self) -> float:
        """Bytes the non-GEMM kernels move (all launches)."""
        return sum(k.bytes for k in self.kernels if k.kind != "gemm")


def gemm(name: str, m: int, n: int, k: int, batch: int = 1) -> Kernel:
    return Kernel(name, "gemm", m=m, n=n, k=k, batch=batch)


def mem(name: str, nbytes: float, count: int = 1) -> Kernel:
    return Kernel(name, "mem", bytes=nbytes, count=count)


def red(name: str, nbytes: float, count: int = 1) -> Kernel:
    """A reduction kernel (PyTorch reduce_kernel: sum, max, norm): memory-bound, its own fixed time."""
    return Kernel(name, "reduce", bytes=nbytes, count=count)


def linear_fwd(name: str, tokens: int, n_out: int, k_in: int, bias: bool, e: int) -> list[Kernel]:
    """F.linear on (T, k_in) → (T, n_out): matmul, then the bias add (reads and writes T·n_out)."""
    out = [gemm(name, tokens, n_out, k_in)]
    if bias:
        out.append(mem(f"{name}.bias", 2 * e * tokens * n_out))
    return out


def linear_bwd(name: str, tokens: int, n_out: int, k_in: int, bias: bool, e: int) -> list[Kernel]:
    """Input gradient (T×k_in×n_out), weight gradient (n_out×k_in×T), bias gradient (a sum over T)."""
    out = [gemm(f"{name}.dgrad", tokens, k_in, n_out), gemm(f"{name}.wgrad", n_out, k_in, tokens)]
    if bias:
        out.append(red(f"{name}.bias_grad", e * tokens * n_out))
    return out
