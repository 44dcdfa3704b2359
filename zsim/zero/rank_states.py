"""What one rank of a ZeRO plan holds and owns: its workload, its stage 1-2 pieces, its model-state
bytes and partition, and the tags of its gradient tensors (shared by the plan's modules)."""

from __future__ import annotations

import dataclasses

from zsim.compute import fp8
from zsim.compute.fp8 import copies, weight_cache_bytes
from zsim.zero.inputs import Scenario
from zsim.workload.moe import Moe
from zsim.workload.transformer import Workload, build_workload
from zsim.zero.buckets import flat_pieces
from zsim.zero.megatron_ddp import chunk_buckets, grad_bytes
from zsim.zero.model_states import PARAM_BYTES, ModelStates, model_states, optimizer_k, stage_partition


def recompute_modules(scenario: Scenario) -> frozenset[str]:
    """The parts each layer recomputes under selective recompute: zero.recompute_modules, by default the
    attention core alone [K22 §5; Megatron-Core transformer_config.py recompute_modules, default
    ["core_attn"]]; none unless checkpointing is on at 'selective' granularity."""
    z = scenario.zero
    if not (z.activation_checkpointing and z.recompute_granularity == "selective"):
        return frozenset()
    return frozenset(["core_attn"] if z.recompute_modules is None else z.recompute_modules)


def selective(scenario: Scenario) -> bool:
    """Selective recompute of the attention core [K22 §5] in effect ('core_attn' among recompute_modules)."""
    return "core_attn" in recompute_modules(scenario)


def scenario_workload(scenario: Scenario) -> Workload:
    """The workload of `scenario`: its model under its MP degree, dtype, sequence parallelism and
    recompute granularity (zsim.workload.transformer.build_workload)."""
    recipe = scenario.precision.linear_recipe
    return build_workload(scenario.model, scenario.parallel.mp, scenario.precision.dtype,
                          sequence_parallel=scenario.parallel.sequence_parallel, selective=selective(scenario),
                          ep=scenario.parallel.ep, etp=scenario.layout.expert_mp,
                          recompute=recompute_modules(scenario) - {"core_attn"}, cp=scenario.parallel.cp,
                          fp8=scenario.precision.fp8 != "none",
                          saved_q=fp8.saved_bytes(recipe), proj_q=fp8.proj_copy_bytes(recipe),
                          gather_q=fp8.saved_bytes(recipe), grad_gather_q=fp8.gathered_grad_bytes(
                              recipe, scenario.parallel.tp_comm_overlap))


def rank_pieces(scenario: Scenario, workload: Workload) -> list[int] | None:
    """Stages 1-2: the pieces of the flat buffer (zsim.zero.buckets.flat_pieces); None otherwise."""
    z = scenario.zero
    if z.stage not in (1, 2):
        return None
    if z.implementation == "megatron-core":  # Megatron-Core's buckets, padded (zsim.zero.megatron_ddp)
        return [b.elements for b in chunk_buckets(scenario, workload.modules)]
    return flat_pieces(z.stage, [m.params for m in workload.modules], scenario.layout.dp, z.reduce_bucket_elements,
                       z.constant_buffers)


def rank_model_states(scenario: Scenario, workload: Workload) -> ModelStates:
    """Model-state bytes of one rank as the plan lays them out (padding included, as the runtime
    allocates them): zsim.zero.model_states with the plan's stage 1-2 pieces and stage 3 tensors."""
    k = optimizer_k(scenario.precision.dtype, scenario.precision.master_weights, scenario.precision.adam_moments)
    dense = model_states(workload.params_per_mp_rank, scenario.layout.dp, scenario.zero.stage,
                         scenario.precision.dtype, k=k, tensors=workload.tensors, pieces=rank_pieces(scenario, workload))
    if scenario.zero.implementation == "megatron-core":
        # its gradient buffer: the padded buffer (stage 1) or Ψ, in its own dtype (zsim.zero.megatron_ddp)
        pieces = rank_pieces(scenario, workload)
        laid_out = sum(pieces) if pieces else workload.params_per_mp_rank
        dense = dataclasses.replace(dense, grads=grad_bytes(scenario.precision.dtype,
                                                           scenario.zero.grad_reduce_in_fp32) * laid_out)
    if scenario.precision.fp8_params:  # the linear weights held in FP8, 1 byte, no 16-bit copy (zsim.compute.fp8)
        e = PARAM_BYTES[scenario.precision.dtype]
        dense = dataclasses.replace(dense, params=dense.params - (e - 1) * sum(m.params for m in workload.blocks))
    if not workload.expert_params_per_rank:
        return dense
    # a MoE model's local experts: ZeRO partitions them over the expert-data-parallel group (dp/ep ranks)
    experts = model_states(workload.expert_params_per_rank, expert_dp(scenario), scenario.zero.stage,
                           scenario.precision.dtype, k=k)
    if scenario.precision.fp8_params:
        e = PARAM_BYTES[scenario.precision.dtype]
        experts = dataclasses.replace(experts, params=experts.params - (e - 1) * workload.expert_params_per_rank)
    return ModelStates(params=dense.params + experts.params, grads=dense.grads + experts.grads,
                       optimizer=dense.optimizer + experts.optimizer)


def fp8_weight_elements(workload: Workload) -> int:
    """The linear weight elements whose FP8 copies Transformer Engine caches on this rank (precision.fp8;
    zsim.compute.fp8): its blocks' and multi-token prediction modules' parameters, routed experts included (their
    norms and biases, a few hidden-wide vectors a layer, counted with them)."""
    return sum(m.params + m.expert_params for m in workload.modules if m.layer is not None or m.mtp)


def fp8_cache_bytes(scenario: Scenario, workload: Workload) -> int:
    """Bytes of this rank's FP8 weight copies beside its parameters (zsim.compute.fp8.weight_cache_bytes); 0
    without FP8."""
    p = scenario.precision
    if p.linear_recipe == "none":
        return 0
    n = copies(p.linear_recipe, scenario.cluster.gpu.compute_capability)
    return weight_cache_bytes(fp8_weight_elements(workload), p.linear_recipe, n, p.fp8_params)


def param_bytes_per_element(scenario: Scenario, workload: Workload) -> float:
    """Mean bytes of one of this rank's dense (non-expert) parameter elements, what the distributed optimizer's
    bucketed all-gathers carry: e, or with FP8 parameters (precision.fp8_params) 1 for the blocks' weights and e
    for the rest (Megatron-Core keeps FP8 parameters in their own uint8 buffer, param_and_grad_buffer.py; zsim
    spreads the mean over the buckets). The routed experts are gathered apart (expert_param_bytes)."""
    e = PARAM_BYTES[scenario.precision.dtype]
    total = workload.params_per_mp_rank
    if not scenario.precision.fp8_params or not total:
        return float(e)
    return (e * total - (e - 1) * sum(m.params for m in workload.blocks)) / total


def expert_param_bytes(scenario: Scenario) -> int:
    """Bytes of one routed-expert parameter element as its all-gather carries it: 1 with FP8 parameters (every
    expert weight is a linear layer's), else e."""
    return 1 if scenario.precision.fp8_params else PARAM_BYTES[scenario.precision.dtype]


def expert_dp(scenario: Scenario) -> int:
    """Ranks of the expert-data-parallel group: dp·mp / (ep·expert_mp), dp / ep when the experts split across
    MP (Megatron-Core; DeepSpeed-MoE's expert data parallel)."""
    return scenario.layout.group_size("edp")


def expert_partition(scenario: Scenario, workload: Workload) -> int:
    """Elements of this rank's partition of its local experts' states (zsim.zero.model_states)."""
    return stage_partition(workload.expert_params_per_rank, expert_dp(scenario), scenario.zero.stage)


def rank_partition(scenario: Scenario, workload: Workload) -> int:
    """Elements of this rank's model-state partition (Ψ at stage 0), as rank_model_states lays it out."""
    dense = stage_partition(workload.params_per_mp_rank, scenario.layout.dp, scenario.zero.stage, workload.tensors,
                            rank_pieces(scenario, workload))
    return dense + (expert_partition(scenario, workload) if workload.expert_params_per_rank else 0)



def full_grad_tag(module: str, step: int) -> str:
    """Stages 0/1: a module's full fp16 gradient, from its first backward of the step to the step."""
    return f"grad.{module}.s{step}"


def partition_grad_tag(step: int) -> str:
    """Stages 2/3: the rank's fp16 gradient partition (DeepSpeed grads_in_partition)."""
    return f"grads.partition.s{step}"


def ep_dispatch(scenario: Scenario) -> tuple[str, int, float]:
    """Where a MoE block's dispatch and combine run: (group kind, the factor on the copies a token makes, what
    they send across nodes against an even spread, Moe.nic_share). The EP group; or, with DeepEP and the experts split over MP
    (Moe.over_tp_ep), the TP × EP group, where a token reaches all t TP ranks of each EP rank but crosses to
    another node once (DeepEP forwards it over NVLink there), so t times the copies and 1/t the NIC share.
    ("ep", 0, 1.0) without expert parallelism."""
    lay = scenario.layout
    if scenario.model.moe is None or lay.ep <= 1:
        return "ep", 0, 1.0
    moe = Moe.of(scenario.model)
    share = moe.nic_share(lay.ep, lay.group_shape("ep").per_node)
    if moe.over_tp_ep(lay.mp, lay.expert_mp):
        return "tpep", lay.mp, share / lay.mp
    return "ep", 1, share

