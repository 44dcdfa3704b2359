"""The checks of a mixture-of-experts layout (model.moe with parallel.ep and parallel.expert_mp), as a whole:
what Megatron-Core or DeepSpeed refuse, zsim refuses with their reason; what zsim does not model is refused
saying so (docs/moe.md).
"""

from __future__ import annotations

from zsim.config.schema import ScenarioFile
from zsim.errors import Fail


def check_moe(spec: ScenarioFile, fail: Fail) -> None:
    """Expert parallelism as Megatron-Core lays it out (zsim.parallel.layout): ep divides dp and the
    experts; each expert's FFN splits across MP as the dense MLP does, or (expert_mp 1) stays whole with the
    EP group folded over MP and DP (ep then divides dp × mp). ZeRO stage 3 with experts runs
    as FSDP shards it (zero.implementation 'paper'); DeepSpeed's implementations refuse it as DeepSpeed does.

    Raises:
        ConfigError (through `fail`, naming the key): expert keys without experts, an expert MP degree other than
        mp or 1, DeepEP with experts split over MP and no EP, an EP degree that does not divide, MoE with MP but without
        sequence parallelism, widths that do not split, ZeRO-3 with experts under DeepSpeed's implementations."""
    moe, par = spec.model.moe, spec.parallel
    check_ep_overlap(spec, fail)
    if moe is None:
        if par.ep > 1:
            raise fail("parallel.ep", f"{par.ep} splits experts, but the model has none (model.moe)")
        if par.expert_mp is not None:
            raise fail("parallel.expert_mp", f"{par.expert_mp} splits experts, but the model has none (model.moe)")
        return
    etp = par.mp if par.expert_mp is None else par.expert_mp
    if etp not in (1, par.mp):
        # Megatron-Core allows any expert TP size; zsim prices the two its MP collectives can say: the experts
        # split as the dense MLP (the MP group) or whole (no collective inside the MoE MLP).
        raise fail("parallel.expert_mp", f"{etp}: zsim models expert_mp {par.mp} (each expert split across the MP "
                   "group, the default) or 1 (each expert whole on one rank); an expert tensor-parallel group inside "
                   "the MP group is not modelled")
    if etp == par.mp > 1 and moe.dispatcher == "deepep" and par.ep == 1:
        # token_dispatcher.py MoEFlexTokenDispatcher: with the experts split over TP, DeepEP dispatches over the
        # TP × EP group (zsim.zero.rank_states.ep_dispatch); with EP 1 that is every token to every TP rank, a
        # gather zsim does not price as a dispatch
        raise fail("model.moe.dispatcher", f"deepep with parallel.ep 1 and each expert split across parallel.mp "
                   f"{par.mp}: Megatron-Core's DeepEP dispatcher then sends every token to every MP rank, which zsim "
                   "does not model; use dispatcher alltoall, or parallel.ep above 1")
    # Megatron-Core's expert ranks cover a stage's tp × cp × dp ranks (parallel_state.py: the expert RankGenerator
    # spans the same ranks as the dense 'tp-cp-ep-dp-pp' order), so CP ranks hold experts as DP ranks do
    dp, cp = par.dp * par.cp, (f" × cp {par.cp} = {par.dp * par.cp}" if par.cp > 1 else "")
    if etp == par.mp and dp % par.ep:
        raise fail("parallel.ep", f"{par.ep} must divide dp {par.dp}{cp} (expert parallelism is carved out of DP; "
                   "with parallel.expert_mp 1 it folds over the MP ranks too)")
    if etp == 1 and (dp * par.mp) % par.ep:
        raise fail("parallel.ep", f"{par.ep} must divide dp × {'cp × ' if par.cp > 1 else ''}mp = {dp * par.mp} (with expert_mp 1 an EP group "
                   "folds over a stage's MP and DP ranks)")
    if par.mp > 1 and not par.sequence_parallel:
        raise fail("parallel.sequence_parallel", "false with model.moe and mp > 1: Megatron-LM requires sequence "
                   "parallelism for MoE with tensor parallelism (megatron/training/arguments.py: 'When using MoE "
                   "and tensor parallelism, sequence parallelism must be used')")
    if moe.experts % par.ep:
        raise fail("parallel.ep", f"{par.ep} must divide model.moe.experts {moe.experts} (each EP rank holds "
                   "experts / ep of them)")
    ffn = moe.expert_ffn_hidden or spec.model.ffn_hidden or 4 * spec.model.hidden
    for key, width, ways in (("model.moe.expert_ffn_hidden", ffn, etp),
                             ("model.moe.shared_ffn_hidden", moe.shared_ffn_hidden or ffn, par.mp)):
        if width % ways:
            raise fail(key, f"{width} cannot be split evenly across {ways} ranks")
    if spec.zero.stage == 3 and spec.zero.implementation != "paper":
        # deepspeed/runtime/engine.py _configure_zero_optimizer, every release read from v0.5.0 (DeepSpeed-MoE's
        # first) to v0.16.4: under ZeroStageEnum.weights, assert not self.has_moe_layers, "MoE not supported with
        # Stage 3" (v0.16.4 line 1675). Megatron-Core's distributed optimizer is ZeRO-1 (docs/parallel.md).
        # FSDP2 with expert parallelism (torchtitan, NeMo AutoModel) shards the experts over their own group:
        # zero.implementation 'paper' (docs/moe.md, "ZeRO").
        raise fail("zero.implementation", f"{spec.zero.implementation} with model.moe at stage 3: 'MoE not "
                   "supported with Stage 3' (DeepSpeed's runtime/engine.py, v0.5.0-v0.16.4); use stage 0-2, or "
                   "implementation 'paper' (experts sharded FSDP-style over their expert-data-parallel group)")


def check_ep_overlap(spec: ScenarioFile, fail: Fail) -> None:
    """parallel.ep_overlap as Megatron-Core accepts --overlap-moe-expert-parallel-comm (transformer_config.py
    __post_init__ @ d98e8a6 L3002-3046: expert parallelism, the alltoall or flex dispatcher, no full recompute, no
    `moe` in --recompute-modules, bf16 or fp16, and a virtual pipeline size when pp > 1), and where zsim models it:
    the interleaved pipeline schedule, and at pp 1 combined_1f1b_schedule_for_no_pipelining with ZeRO stages 0-1.

    Raises:
        ConfigError (through `fail`, naming the key) for each of those."""
    par, zero = spec.parallel, spec.zero
    if not par.ep_overlap:
        return
    if spec.model.moe is None or par.ep == 1:
        raise fail("parallel.ep_overlap", "true overlaps the EP all-to-alls, but " + (
            "the model has no experts (model.moe)" if spec.model.moe is None else "parallel.ep is 1: "
            "'overlap_moe_expert_parallel_comm is only supported with expert model parallelism' (Megatron-Core)"))
    if zero.activation_checkpointing and zero.recompute_granularity == "full":
        raise fail("zero.recompute_granularity", "full with parallel.ep_overlap: 'disable full recomputation when "
                   "enabling overlap_moe_expert_parallel_comm' (Megatron-Core); use selective")
    if "moe" in (zero.recompute_modules or ()):
        raise fail("zero.recompute_modules", "moe with parallel.ep_overlap: 'disable moe in recompute_modules when "
                   "enabling overlap_moe_expert_parallel_comm' (Megatron-Core)")
    if spec.precision.dtype not in ("bf16", "fp16"):
        raise fail("precision.dtype", f"{spec.precision.dtype} with parallel.ep_overlap: "
                   "'overlap_moe_expert_parallel_comm is only supported with bf16 or fp16 model' (Megatron-Core)")
    if par.pp > 1 and par.pipeline_schedule != "interleaved":
        raise fail("parallel.pipeline_schedule", f"{par.pipeline_schedule} with parallel.ep_overlap: Megatron-Core "
                   "requires a virtual pipeline size when pp > 1; set interleaved")
    if par.pp == 1 and zero.stage >= 2:
        raise fail("zero.stage", f"{zero.stage} with parallel.ep_overlap at pp 1 is not modelled: the combined 1F1B "
                   "schedule without pipelining is modelled for ZeRO stages 0-1 (Megatron-Core's distributed "
                   "optimizer), whose gradients reduce once, after the last backward")
