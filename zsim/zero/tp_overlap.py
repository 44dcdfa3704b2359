"""Megatron-Core's `--tp-comm-overlap` (zsim: `parallel.tp_comm_overlap`): a block's sequence-parallel all-gathers
and reduce-scatters overlapped with the GEMMs next to them, as Transformer Engine's userbuffers run them (a MoE
block with whole experts: its attention's pair, ATTENTION_PAIRS).

Read from TransformerEngine v1.8 `transformer_engine/pytorch/module/base.py` (initialize_ub, L98-102: the
default method of each overlapped GEMM; L225-232: its defaults, 4 splits for `pipeline`):
  - `ring_exchange` (qkv_fprop, fc1_fprop, proj_dgrad, fc2_dgrad): the all-gather before a GEMM becomes a ring of
    tp − 1 point-to-point steps, the GEMM tp chunks of its tokens, each chunk computed while the next is
    received; the last chunk runs after the last receive. Time: (tp − 1)·max(GEMM/tp, AG/(tp − 1)) + GEMM/tp;
  - `pipeline` (proj_fprop, fc2_fprop): the GEMM before a reduce-scatter in 4 chunks of tokens, each chunk's
    reduce-scatter beside the next chunk's GEMM; the first chunk's GEMM runs alone, the last chunk's
    reduce-scatter after it. Time: GEMM/4 + 3·max(GEMM/4, RS/4) + RS/4;
  - `bulk` (qkv_dgrad/qkv_wgrad, fc1_dgrad/fc1_wgrad): the whole collective beside the whole GEMM: the input
    gradient's reduce-scatter beside the weight-gradient GEMM (and the input's re-gather beside the input-gradient
    GEMM, which zsim already leaves unpriced: zsim.workload.transformer SP_COLLECTIVES).

zsim plans each pair as the GEMM's overlapped part on the compute stream beside the collective's overlapped part
on the 'tp' stream (Transformer Engine's communication runs on its own streams and SMs), then what runs alone;
with the chunks' maxima taken once over their sums (the chunks are alike). The 16 SMs (`num_sm`, L229) the
pipeline and bulk methods' communication kernels take from the GPU while the GEMM runs (TE's default
`set_sm_margin` 0 launches the GEMM on every SM) are taken from the compute stream only under
`fabric.sm_contention` (zsim.engine.sm_share; off by default, the contention not measured). Not modelled: the
atomic-GEMM and FP8 variants.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from zsim.compute.kernel_list import KernelList
from zsim.workload.transformer import Module
from zsim.zero.ops import Alloc

RING, PIPELINE, BULK = "ring_exchange", "pipeline", "bulk"
PIPELINE_SPLITS = 4  # base.py @ v1.8 L231: num_splits 4 for `pipeline`

# A dense block's SP collectives, in zsim's order (zsim.workload.transformer SP_COLLECTIVES "block"), each with
# the GEMM kernel (zsim.compute.kernels block_forward / block_backward names) it overlaps and TE's method.
PAIRS = {
    "fwd": (("all_gather", "qkv", RING), ("reduce_scatter", "attention.dense", PIPELINE),
            ("all_gather", "mlp.h_to_4h", RING), ("reduce_scatter", "mlp.4h_to_h", PIPELINE)),
    "bwd": (("all_gather", "mlp.4h_to_h.dgrad", RING), ("reduce_scatter", "mlp.h_to_4h.wgrad", BULK),
            ("all_gather", "attention.dense.dgrad", RING), ("reduce_scatter", "qkv.wgrad", BULK)),
}
# A MoE block whose experts are whole (parallel.expert_mp 1, no shared expert: zsim.workload.transformer moe_sp)
# issues the attention's pair only; Megatron-Core builds its attention's linear_qkv and linear_proj with TE's
# userbuffers whatever the MLP (megatron/core/extensions/transformer_engine.py @ core_r0.11.0 L146-175, L329-354:
# ub_overlap_ag/rs from config.tp_comm_overlap, buffers 'qkv' and 'proj'), and the experts' grouped GEMMs have none.
ATTENTION_PAIRS = {"fwd": PAIRS["fwd"][:2], "bwd": PAIRS["bwd"][2:]}


@dataclass(frozen=True, slots=True)
class Piece:
    """One part of an overlapped block pass: `alone` kernels on the compute stream first; then, when `collective`
    is set (an index into the block's collectives), `beside` kernels on the compute stream while `share` of the
    collective's bytes move on the 'tp' stream; then `after` kernels, which wait for that part; then the
    collective's remaining 1 − share in line on the compute stream."""

    alone: KernelList
    collective: int | None = None
    beside: KernelList | None = None
    share: float = 1.0
    after: KernelList | None = None


@functools.cache
def pieces(kernels: KernelList, phase: str, tp: int, attention_only: bool = False) -> tuple[Piece, ...]:
    """The block pass `kernels` (a block's `phase` list, 'fwd' or 'bwd') cut at its overlapped GEMMs for TP
    degree `tp` (module docstring): a dense block's four (PAIRS), or with `attention_only` a MoE block's attention
    pair (ATTENTION_PAIRS), the experts running after or before them; cached per list, so the pieces' lists are
    shared as the list is.

    Raises ValueError when a GEMM the pairs name is missing from `kernels` (not a block's list)."""
    ks = list(kernels.kernels)
    names = [k.name for k in ks]
    out: list[Piece] = []
    start = 0
    for j, (_, gemm_name, method) in enumerate((ATTENTION_PAIRS if attention_only else PAIRS)[phase]):
        if gemm_name not in names[start:]:
            raise ValueError(f"{kernels.key}: no GEMM {gemm_name!r} to overlap ({phase})")
        at = names.index(gemm_name, start)
        g = ks[at]
        alone, beside, after, share = list(ks[start:at]), [g], [], 1.0
        if method == RING:  # tp chunks of tokens; the last after the last receive
            chunk = replace(g, m=max(1, g.m // tp))
            beside, after = [replace(chunk, count=tp - 1)], [chunk]
        elif method == PIPELINE:  # 4 chunks; the first alone, the last chunk's reduce-scatter after
            chunk = replace(g, m=max(1, g.m // PIPELINE_SPLITS))
            alone.append(chunk)
            beside, share = [replace(chunk, count=PIPELINE_SPLITS - 1)], (PIPELINE_SPLITS - 1) / PIPELINE_SPLITS
        out.append(Piece(_list(kernels, f"{j}.alone", alone), j, _list(kernels, f"{j}.beside", beside), share,
                         _list(kernels, f"{j}.after", after) if after else None))
        start = at + 1
    out.append(Piece(_list(kernels, "tail", ks[start:])))
    return tuple(out)


def _list(kernels: KernelList, part: str, ks: list) -> KernelList:
    return KernelList(f"{kernels.key}.tp_overlap.{part}", tuple(ks))


def _pairs(m: Module, phase: str) -> dict | None:
    """The pairs block `m`'s `phase` overlaps: PAIRS for a dense block's four SP collectives, ATTENTION_PAIRS for
    a MoE block's attention pair alone; None for any other set (not overlapped)."""
    collectives = tuple(op for op, _ in (m.mp_collectives_fwd if phase == "fwd" else m.mp_collectives_bwd))
    if collectives == tuple(op for op, _, _ in PAIRS[phase]) and not m.moe:
        return PAIRS
    if collectives == tuple(op for op, _, _ in ATTENTION_PAIRS[phase]) and m.moe:
        return ATTENTION_PAIRS
    return None


class TpOverlap:
    """A block's passes under parallel.tp_comm_overlap (mixed into zsim.zero.step_pass.StepPass)."""

    def _tp_overlapped(self, m: Module, phase: str) -> bool:
        """Whether `m`'s `phase` runs its SP collectives beside its GEMMs (parallel.tp_comm_overlap: a dense
        block's four, a MoE block's attention pair; zsim.zero.tp_overlap)."""
        return bool(self.s.parallel.tp_comm_overlap and m.layer is not None and _pairs(m, phase) is not None)

    def _overlapped(self, m: Module, phase: str, kernels: KernelList, deps: tuple[int, ...],
                    allocs: tuple[Alloc, ...], frees: tuple[str, ...], flops: float, hbm_bytes: float) -> int:
        """A block's `phase` under parallel.tp_comm_overlap (zsim.zero.tp_overlap): its kernel list cut at
        the overlapped GEMMs; each GEMM's overlapped part on the compute stream beside its collective's on the
        'tp' stream, then what runs alone, which waits for the collective. The first op (named as the pass's,
        `<phase>/<module>`) takes the deps, allocations, FLOPs and bytes; the last frees. Returns the last op."""
        name = f"{phase}/{m.name}"
        collectives = m.mp_collectives_fwd if phase == "fwd" else m.mp_collectives_bwd
        waits: tuple[int, ...] = ()  # a collective the next compute op waits for
        op = -1
        parts = pieces(kernels, phase, self.s.layout.mp, _pairs(m, phase) is ATTENTION_PAIRS)
        for i, piece in enumerate(parts):
            last = i == len(parts) - 1
            first = dict(deps=deps, flops=flops, hbm_bytes=hbm_bytes, allocs=allocs) if i == 0 else dict(deps=waits)
            op = self._add(name=name if i == 0 else f"{name}.part", stream="compute", kernels=piece.alone,
                           frees=frees if last else (), **first)
            waits = ()
            if piece.collective is None:
                continue
            kind, nbytes = collectives[piece.collective]
            beside = round(nbytes * piece.share)
            coll = self._add(name=f"{kind}/mp.{m.name}", stream="tp", deps=(op,), collective=kind, group="mp",
                             nbytes=beside)
            self._add(name=f"{name}.part", stream="compute", kernels=piece.beside)
            if piece.after is not None:
                self._add(name=f"{name}.part", stream="compute", deps=(coll,), kernels=piece.after)
            else:
                waits = (coll,)
            if nbytes > beside:  # what is left of the collective, in line (the pipeline method's last chunk)
                self._add(name=f"{kind}/mp.{m.name}", stream="compute", deps=waits, collective=kind, group="mp",
                          nbytes=nbytes - beside)
                waits = ()
        return op
