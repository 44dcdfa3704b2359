"""The pipeline layout's checks (parallel.pp, pipeline_schedule, virtual_stages, pp_layers), as a whole.

What the frameworks refuse, zsim refuses with the same reason; what zsim does not model (yet) is
refused with a message that says so. docs/parallel.md lists both.
"""

from __future__ import annotations

from zsim.fabric.cluster import Cluster
from zsim.config.schema import ScenarioFile
from zsim.errors import Fail


def check_pipeline(spec: ScenarioFile, cluster: Cluster, micro_batches: int, fail: Fail) -> None:
    """Check the pipeline keys of `spec` against its model, ZeRO stage and cluster; `micro_batches` is m
    (the scenario's grad_accum). Nothing to check at pp 1 beyond virtual_stages and pp_layers.

    Raises:
        ConfigError (through `fail`, naming the key): a schedule option without its schedule, layers that
        do not split into the virtual stages, interleaving with m not a multiple of pp, ZeRO-2/3 with
        pp > 1 (DeepSpeed refuses it), or a combination zsim does not model with pp > 1.
    """
    par, z = spec.parallel, spec.zero
    p, v, m = par.pp, par.virtual_stages, micro_batches
    if v > 1 and par.pipeline_schedule != "interleaved":
        raise fail("parallel.virtual_stages", f"{v} model chunks per stage need parallel.pipeline_schedule "
                   f"interleaved, not {par.pipeline_schedule}")
    layers, virtual = spec.model.layers, p * v
    if par.pp_layers is not None:
        counts = par.pp_layers
        if len(counts) != virtual or sum(counts) != layers:
            raise fail("parallel.pp_layers", f"{len(counts)} counts adding to {sum(counts)}, but pp {p} × "
                       f"virtual_stages {v} = {virtual} virtual stages must hold the {layers} layers")
        if 0 in counts[1:-1] or (virtual == 1 and counts == [0]):
            raise fail("parallel.pp_layers", f"{counts}: only the first and the last virtual stage may hold no "
                       "layer (the embedding's or the head's own stage)")
    elif layers % virtual:
        raise fail("parallel.pp", f"{p} stages × virtual_stages {v} = {virtual} do not divide the {layers} "
                   "layers evenly (Megatron-LM requires it: get_num_layers_to_build); give parallel.pp_layers "
                   "for an uneven split")
    if p == 1:
        return
    k = z.checkpoint_every
    if z.activation_checkpointing and k > 1 and any(n % k for n in (par.pp_layers or [layers // virtual])):
        raise fail("zero.checkpoint_every", f"{k} layers per recomputed segment, but the virtual stages hold "
                   f"{par.pp_layers or layers // virtual} layers: a segment must not straddle two stages (a multiple "
                   "of checkpoint_every per virtual stage)")
    if par.pipeline_schedule == "interleaved" and m % p:
        # Megatron-LM schedules.py forward_backward_pipelining_with_interleaving: "number of microbatches
        # is not divisible by pipeline-model-parallel-size when using interleaved schedule"
        raise fail("parallel.pipeline_schedule", f"interleaved needs the micro-batches per step (grad_accum "
                   f"{m}) to be a multiple of pp {p} (Megatron-LM's interleaved schedule requires it)")
    if z.stage >= 2:
        # deepspeed/runtime/pipe/engine.py PipelineEngine.__init__, from v0.3.16 to v0.16.4 (the newest
        # release read): assert self.zero_optimization_stage() < 2 (ZeroStageEnum.gradients),
        # "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism".
        raise fail("zero.stage", f"{z.stage} with parallel.pp {p}: DeepSpeed's pipeline engine refuses ZeRO-2 and "
                   "ZeRO-3 with pipeline parallelism (deepspeed/runtime/pipe/engine.py, v0.3.16 to v0.16.4: "
                   "'ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism'); use stage 0 or 1 "
                   "(DeepSpeed's 3D parallelism, Megatron's distributed optimizer)")
    stage_ranks, gpn = par.dp * par.cp * par.mp, cluster.gpus_per_node
    if par.rank_order == "tp-cp-pp-dp":
        replica = par.mp * par.cp * p
        if par.ep > 1:
            raise fail("parallel.rank_order", "tp-cp-pp-dp with parallel.ep > 1: zsim lays experts out in Megatron-Core's "
                       "default order only (docs/parallel-layouts.md); use tp-cp-dp-pp")
        if replica % gpn and gpn % replica or gpn % (par.mp * par.cp):
            raise fail("parallel.rank_order", f"tp-cp-pp-dp: a model replica's mp {par.mp} × cp {par.cp} × pp {p} = "
                       f"{replica} ranks straddle the {gpn}-GPU nodes: zsim models replicas that fill whole nodes or "
                       f"share one node evenly, each stage's mp × cp ranks inside one node")
    elif stage_ranks % gpn and gpn % stage_ranks:
        cp = f" × cp {par.cp}" if par.cp > 1 else ""
        raise fail("parallel.pp", f"{p} stages of dp {par.dp}{cp} × mp {par.mp} = {stage_ranks} ranks each straddle "
                   f"the {gpn}-GPU nodes: zsim models stages that fill whole nodes or share one node evenly")
    unmodelled = (
        ("fabric.mode", spec.fabric.mode == "per_rank" or bool(spec.fabric.degrade),
         "per-rank mode (and degraded links, which need it); use fabric.mode class"),
        ("zero.defragment", z.defragment, "MD's contiguous arenas"),
        ("zero.cpu_offload_activations", z.cpu_offload_activations, "Pa+cpu"),
        ("hardware.profile", cluster.host is not None, "a CPU host"),
        ("zero.setup_residue", z.setup_residue != "none", "a setup residue (each stage's setup is its own)"),
    )
    for key, used, what in unmodelled:
        if used:
            raise fail(key, f"with parallel.pp {p}: zsim does not model pipeline parallelism with {what} "
                       "(docs/parallel.md)")
