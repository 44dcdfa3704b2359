"""Mixture-of-experts MLPs: parameters, FLOPs, activations and the all-to-all of one MoE block's MLP on
one rank (MP rank t, EP rank of ep).

Sources:
  [L20] Lepikhin et al. 2020, "GShard", §2.2 (top-k gating, expert capacity, tokens over capacity
        dropped, the all-to-all dispatch and combine).
  [F22] Fedus, Zoph & Shazeer 2022, "Switch Transformers", §2.2 (capacity factor: capacity =
        capacity_factor × tokens / experts, padded).
  [J24] Jiang et al. 2024, "Mixtral of Experts", §2 (8 SwiGLU experts, top 2, a linear router h × E).
  [D24] Dai et al. 2024, "DeepSeekMoE", §3 (fine-grained experts, shared experts every token passes).
  [Q24] transformers models/qwen2_moe/modeling_qwen2_moe.py Qwen2MoeSparseMoeBlock: gate h × E, the
        shared expert and its shared_expert_gate (h × 1, no bias: sigmoid(gate(x)) scales its output).
  [DV3] DeepSeek-AI 2024, "DeepSeek-V3 Technical Report", §2.1.2 eq. 16 (a per-expert bias b_i added to
        the affinities for top-k selection only: the router's e_score_correction_bias, E elements).
  [DEP] DeepEP v1.2.1 deep_ep/buffer.py Buffer.get_dispatch_layout: `is_token_in_rank` [tokens, ranks],
        "whether a token be sent to a rank", and `num_tokens_per_rank`: dispatch sends a token once to each
        rank holding any of its top-k experts, combine returns one reduced row per rank.
  [MC]  Megatron-Core transformer/moe/: experts split across EP ranks (num_local_experts = E / ep),
        each expert's FFN split across TP as the dense MLP is (expert_tensor_parallel_size = tp), the
        router's weight replicated (router.py TopKRouter: weight h × E), the alltoall token dispatcher
        (token_dispatcher.py: permute, all-to-all, expert GEMMs, all-to-all back, unpermute).
  [MCP] Megatron-Core 2659630721 (2025-04-09, "Memory efficient token permutation", in core_r0.12.0 and later):
        experts.py bias_act_func multiplies the activation by the permuted probabilities, and
        token_dispatcher.py token_unpermutation calls unpermute without them, so the combine's backward needs
        neither the experts' output nor the probabilities (read at 2edffadb5, Megatron-Bridge v0.4.2's).
  [TE]  Transformer Engine 366798ef (v2.14.1, Megatron-Bridge v0.4.2's pin) pytorch/module/grouped_linear.py
        L235-266: with FP8 a grouped linear saves its quantized inputs (update_usage(rowwise_usage=False,
        columnwise_usage=True): the copy the weight gradient reads) unless the module is set to save its
        original input, which Megatron-Core does for a shared expert's first GEMM and, under moe_act recompute,
        the second (experts.py, shared_experts.py @ 2edffadb5).
Model FLOPs count the active experts only (top_k per token: MoE FLOPs are active parameters per
token); the busiest rank computes `load` × the mean (dropless: the imbalance factor; with a capacity
factor: every expert padded to its capacity [F22]).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Moe:
    """A model's MoE MLP, defaults resolved (sizes in elements)."""

    experts: int  # routed experts E
    top_k: int
    ffn: int  # one routed expert's inner width
    shared: int  # shared experts
    shared_ffn: int  # one shared expert's inner width
    load: float  # the busiest expert's tokens over the mean: capacity_factor if set, else imbalance
    dense_layers: int  # first blocks with a dense MLP
    gated: bool
    bias: bool
    shared_gate: bool = False  # the shared experts' h × 1 sigmoid gate [Q24]
    router_bias: bool = False  # E per-expert selection biases [DV3]
    dispatcher: str = "alltoall"  # "alltoall" [MC] or "deepep" [DEP]

    @classmethod
    def of(cls, model) -> Moe | None:
        """From a ModelSection (None without model.moe)."""
        m = model.moe
        if m is None:
            return None
        ffn = m.expert_ffn_hidden or model.ffn_hidden or 4 * model.hidden
        return cls(experts=m.experts, top_k=m.top_k, ffn=ffn, shared=m.shared_experts, shared_ffn=m.shared_ffn_hidden or ffn,
                   load=m.capacity_factor if m.capacity_factor is not None else m.imbalance,
                   dense_layers=m.dense_layers, gated=model.gated_mlp, bias=model.linear_bias,
                   shared_gate=m.shared_expert_gate, router_bias=m.router_bias, dispatcher=m.dispatcher)

    def is_moe(self, layer: int) -> bool:
        return layer >= self.dense_layers

    def expert_tensors(self, h: int, width: int, t: int) -> tuple[int, ...]:
        """One expert FFN on one of t MP ranks [MC]: fc1 h × width (× 2 gated) and bias, fc2 width × h and bias."""
        fc1 = (2 if self.gated else 1) * width
        return (h * fc1 // t, *((fc1 // t,) if self.bias else ()), width * h // t, *((h,) if self.bias else ()))

    def local_expert_tensors(self, h: int, t: int, ep: int) -> tuple[int, ...]:
        """The routed experts this rank holds: E/ep of them [MC]."""
        return self.expert_tensors(h, self.ffn, t) * (self.experts // ep)

    def dense_tensors(self, h: int, t: int) -> tuple[int, ...]:
        """The MoE MLP's parameters every DP rank holds: the router h × E [J24; MC: replicated over TP]
        [and its E selection biases, DV3], the shared experts [D24] [and their h × 1 gate, Q24]."""
        return ((h * self.experts,) + ((self.experts,) if self.router_bias else ())
                + self.expert_tensors(h, self.shared_ffn, t) * self.shared + ((h,) if self.shared_gate else ()))

    def fwd_flops(self, tokens: int, h: int, t: int) -> float:
        """Model forward FLOPs of the MoE MLP on one MP rank: the router 2·T·h·E [and the shared gate's
        2·T·h, Q24], then per token top_k routed experts and every shared one, each 2·2·h·f (3 matmuls
        gated) [N21 §5.1 per matmul]."""
        per_expert = (3 if self.gated else 2) * 2 * tokens * h
        gate = 2 * tokens * h if self.shared_gate else 0
        return 2 * tokens * h * self.experts + gate + per_expert * (self.top_k * self.ffn + self.shared * self.shared_ffn) / t

    def routed_flops(self, tokens: int, h: int, t: int) -> float:
        """The routed experts' share of fwd_flops (what load scales on the busiest rank)."""
        return (3 if self.gated else 2) * 2 * tokens * h * self.top_k * self.ffn / t

    @staticmethod
    def expert_tokens(tokens: int, mp: int, etp: int) -> int:
        """The tokens one rank routes for its experts' GEMMs, in tokens_per_expert's unit: the micro-batch's T
        when each expert splits across the MP group (etp = mp: [MC] gathers the group's sequence-parallel
        shares after the dispatch, and each expert-MP rank computes them all at 1/mp of the width), T/mp when
        each expert is whole (etp = 1: every MP rank routes its own share, Megatron-Core's MoE parallel
        folding, Liu et al. 2025 arXiv 2504.14960 §3); T·etp/mp in general. The routed FLOPs a rank computes,
        load·T·top_k·f/mp, are the same either way; the shapes of its GEMMs are not."""
        return tokens * etp // mp

    def tokens_per_expert(self, tokens: int, ep: int) -> int:
        """Tokens one local expert computes on the busiest rank: load × the EP group's ep·T tokens × top_k
        spread over E experts [L20 §2.2, F22 §2.2]."""
        return max(1, round(self.load * ep * tokens * self.top_k / self.experts))

    def routed_tokens(self, tokens: int, ep: int) -> int:
        """Token copies this rank's local experts compute: tokens_per_expert × E/ep (= load · T · top_k)."""
        return self.tokens_per_expert(tokens, ep) * (self.experts // ep)

    def copies_per_token(self, ep: int) -> float:
        """Copies of a token the dispatch sends: top_k, one per routed expert [MC alltoall dispatcher]; with
        DeepEP one per EP rank holding any of its experts [DEP], under uniform routing (each token's top_k
        experts a uniform draw without replacement of the E, E/ep on each rank) the expected number of
        ranks hit, ep · (1 − C(E − E/ep, k) / C(E, k)) (the chance that a rank holds none of the k)."""
        if self.dispatcher != "deepep":
            return float(self.top_k)
        miss = math.comb(self.experts - self.experts // ep, self.top_k) / math.comb(self.experts, self.top_k)
        return ep * (1.0 - miss)

    def nic_share(self, ep: int, per_node: int) -> float:
        """What the dispatch sends across nodes relative to zsim's all-to-all, which spreads a rank's copies
        evenly over the EP group ((ep − per_node)/ep of them leave the node): 1 for the alltoall dispatcher;
        DeepEP's internode kernels send a token once to each other node holding any of its experts, over
        RDMA to the rank of the same local index, which forwards it over NVLink [DEP internode.cu: the RDMA
        ranks' `num_tokens_per_rdma_rank`], so (N − 1) · (1 − C(E − E/N, k)/C(E, k)) rows for N = ep/per_node
        nodes, under uniform routing, against copies_per_token · (ep − per_node)/ep. Its NVLink forwarding is
        not added: on a DGX H100 a GPU's NVLink moves 450 GB/s each way against its NDR NIC's 50 GB/s
        (NVIDIA's datasheets: NVLink 4 900 GB/s bidirectional, ConnectX-7 400 Gb/s), so the NICs bind."""
        nodes = ep // per_node if per_node else 1
        if self.dispatcher != "deepep" or nodes <= 1:
            return 1.0
        miss = math.comb(self.experts - self.experts // nodes, self.top_k) / math.comb(self.experts, self.top_k)
        return (nodes - 1) * (1.0 - miss) / (self.copies_per_token(ep) * (ep - per_node) / ep)

    def over_tp_ep(self, t: int, etp: int) -> bool:
        """Whether the dispatch runs over the experts' TP × EP group: DeepEP with each expert split over the MP
        group (Megatron-Core's flex dispatcher: one group over all TP and EP ranks, the routing map replicated
        over the TP ranks, token_dispatcher.py MoEFlexTokenDispatcher._initialize_metadata), so a token goes
        to every TP rank of each EP rank it reaches and no TP gather follows."""
        return self.dispatcher == "deepep" and etp == t > 1

    def all_to_all_bytes(self, tokens: int, h: int, e: int, ep: int, t: int = 1) -> int:
        """Bytes one rank's dispatch (and combine) all-to-all carries: its T token rows of h elements ×
        copies_per_token, × load (padded to capacity, or the busiest receiver's share) [L20 §2.2; MC
        alltoall dispatcher; DEP]; with MP t (which needs sequence parallelism) each MP rank sends its T/t
        tokens. 0 without EP."""
        return round(self.load * tokens * self.copies_per_token(ep) * h * e / t) if ep > 1 else 0

    def saved_tensors(self, tokens: int, h: int, t: int, e: int, ep: int, etp: int | None = None, *,
                      act_recompute: bool = False, q: float = 0.0) -> tuple[int, ...]:
        """What the MoE MLP keeps for backward, in bytes: the router's fp32 logits (4·T·E) and the top-k
        probabilities and indices (8·T·k) [MC router.py], the permuted tokens (the experts' input, e·R·h for R
        routed token copies), the experts' inner activations as the dense MLP's (layer_saved_tensors) and the
        permuted probabilities (4·R, counted in fp32), which the activation applies [MCP]; shared experts as a
        dense MLP of shared × shared_ffn. The experts' output is not kept: the combine's unpermute takes no
        probabilities since Megatron-Core core_r0.12 [MCP] (zsim assumes the same of the other MoE frameworks it
        prices). `etp`: the experts' MP degree (default t): the router runs on the tokens this rank routes,
        expert_tokens(T, t, etp) (T unless the experts are whole), and R routed copies of them are kept at width
        ffn/etp.
        `act_recompute` (Megatron-Core --recompute-modules moe_act): the activation's output, the second expert
        GEMM's input, is dropped and recomputed from the first GEMM's output in backward (experts.py:
        activation_checkpoint, CheckpointWithoutOutput). `q`: under FP8 (or NVFP4) linear layers, the bytes an
        element of a GEMM input's saved low-precision copy takes (zsim.compute.fp8.saved_bytes): Transformer
        Engine's grouped linears keep their inputs (the permuted tokens, the second GEMM's input) as that copy,
        not in 16 bits [TE]; a shared expert's first GEMM keeps the 16-bit input the router keeps too
        (shared_experts.py set_save_original_input [MCP]). 0: 16-bit GEMMs."""
        etp = t if etp is None else etp

        def gemm_input(elements: int) -> int:
            """Bytes of a grouped linear's saved input of `elements` elements: 16-bit or its q-byte copy [TE]."""
            return round(q * elements) if q else e * elements

        routed_here = self.expert_tokens(tokens, t, etp)
        r = self.routed_tokens(routed_here, ep)
        f, fs = self.ffn // etp, self.shared * self.shared_ffn // t
        inner = (2 * e * r * f if self.gated else e * r * f, gemm_input(r * f))
        if act_recompute:
            inner = inner[:1]
        shared = (2 * e * tokens * fs if self.gated else e * tokens * fs, gemm_input(tokens * fs)) \
            if self.shared else ()
        return (4 * routed_here * self.experts, 8 * routed_here * self.top_k, gemm_input(r * h), *inner, 4 * r, *shared)

    def combine_bytes(self, tokens: int, h: int, t: int, e: int, ep: int, etp: int | None = None) -> int:
        """Bytes of the experts' 16-bit output (e·R·h) that the combine's unpermute reads: forward traffic, not
        kept for backward (saved_tensors)."""
        etp = t if etp is None else etp
        return e * self.routed_tokens(self.expert_tokens(tokens, t, etp), ep) * h
