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
    # 'flash': the fraction of the 16-bit peak it runs at (zsim.compute.flash); 'mem', 'reduce': its share of a
    # vectorized kernel's HBM rate (UNROLLED_SHARE, BOOL_REDUCE_SHARE), 0 meaning 1
    efficiency: float = 0.0
    # Launched by host work priced in another op (deepspeed-0.5's list copies, launched on the 'host' lane while
    # their collective runs): GPU time here, no launch (zsim.zero.implementation.list_copy_tail).
    prelaunched: bool = False
    # a GEMM on FP8 operands (precision.fp8: zsim.compute.fp8), at the FP8 peak and GEMM terms, 1-byte operands
    fp8: bool = False
    # a GEMM on NVFP4 operands (precision.fp4: zsim.compute.fp8), at the FP4 peak and 'fp4' GEMM terms, half-byte operands
    fp4: bool = False

    @property
    def rate_bytes(self) -> float:
        """The bytes a memory-bound kernel is priced at: its bytes over its share of the vectorized rate."""
        return self.bytes / self.efficiency if self.kind in ("mem", "reduce") and self.efficiency else self.bytes

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


# ATen's copy between dtypes it has no vectorized path for (bf16 -> fp32 or fp64: direct_copy_kernel_cuda runs
# `unrolled_elementwise_kernel` with dynamic casting, aten/src/ATen/native/cuda/CUDALoops.cuh) moves its bytes at
# a share of a vectorized kernel's rate, by the width it writes. Measured on the H200 with PyTorch 2.13
# (data/device/20261126-h200-kineto, h1024, a run the fits see): the runtime's bf16 -> fp32 copy of its
# 203M-element gradient segment took 577 us, the fp32 -> bf16 copy of the same elements and bytes
# (bfloat16_copy_kernel_cuda, vectorized) 280 us: 0.48; its bf16 -> fp64 cast (10 B an element) 811 us
# against that copy's 6 B in 280 us: 0.58.
UNROLLED_SHARE = {4: 0.48, 8: 0.58}
# A reduction over 1-byte bools (`.all()`) reads them at this share of a vectorized kernel's rate: on the same
# trace `all` over the 203M-element mask took 104 us, the `&` producing it (3 B an element) 150 us: 0.48.
BOOL_REDUCE_SHARE = 0.48


def mem(name: str, nbytes: float, count: int = 1, efficiency: float = 0.0) -> Kernel:
    """A memory-bound kernel moving `nbytes` over all `count` launches; `efficiency`: its share of a vectorized
    kernel's rate (0: 1)."""
    return Kernel(name, "mem", bytes=nbytes, count=count, efficiency=efficiency)


def red(name: str, nbytes: float, count: int = 1, efficiency: float = 0.0) -> Kernel:
    """A reduction kernel (PyTorch reduce_kernel: sum, max, norm): memory-bound, its own fixed time;
    `efficiency` as mem's."""
    return Kernel(name, "reduce", bytes=nbytes, count=count, efficiency=efficiency)


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
