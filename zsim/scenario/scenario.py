"""The validated Scenario: a scenario file, its --set overrides, the cluster and the layout, checked once."""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from pathlib import Path

import msgspec

from zsim.fabric.cluster import Cluster, load_cluster
from zsim.config.hf import resolve_from_hf
from zsim.config.overrides import apply_overrides
from zsim.scenario.context_checks import check_context_parallel
from zsim.scenario.moe_checks import check_moe
from zsim.scenario.pipeline_checks import check_pipeline
from zsim.scenario.recompute_checks import check_recompute_modules
from zsim.config.profiles import Profiles
from zsim.config.model_section import ModelSection
from zsim.config.bounds import MAX_ACCUM
from zsim.config.schema import (FabricSection, HardwareSection, ParallelSection, PrecisionSection, RunSection,
                                 ScenarioFile, ZeroSection)
from zsim.config.shipped import command_name, find_file, is_sweep_mapping
from zsim.config.struct import replace as replace_struct
from zsim.config.validation import validate
from zsim.config.yamlfile import read_yaml_mapping
from zsim.errors import ConfigError, ModelStatesError
from zsim.parallel.layout import Layout
from zsim.workload.transformer import mp_problems


@dataclass(frozen=True, slots=True)
class Scenario:
    """Everything a simulation needs, validated. Build it with `load_scenario` or `build_scenario`."""

    name: str
    description: str | None
    model: ModelSection
    parallel: ParallelSection
    zero: ZeroSection
    precision: PrecisionSection
    hardware: HardwareSection
    fabric: FabricSection
    run: RunSection
    cluster: Cluster
    layout: Layout
    grad_accum: int  # micro-batches per optimizer step (derived from global_batch if given)
    source: str

    @property
    def output_dir(self) -> Path:
        """run.output, else out/<name> with the name made a safe file name (no '/', no leading '.'):
        a scenario name cannot write outside out/ (issue 13)."""
        return Path(self.run.output) if self.run.output else Path("out") / safe_name(self.name)


def safe_name(name: str) -> str:
    """`name` as one file-name component: characters other than letters, digits, '.', '_', '+', '-'
    become '_', leading dots are dropped; never empty, '.' or '..'."""
    clean = "".join(c if c.isalnum() or c in "._+-" else "_" for c in name).lstrip(".")[:100]
    return clean or "scenario"


def find_scenario(text: str | Path) -> Path:
    """A scenario the user named: an existing file, else a shipped scenario's name (with or without
    'scenarios/' and '.yaml', so `zsim run scenarios/1T-1024gpu.yaml` works from any folder). A
    shipped sweep's name finds its file too; reading it says to use `zsim sweep`.

    Raises:
        ConfigError: neither a file nor a shipped scenario.
    """
    return find_file(text, "scenario")


def load_scenario(path: str | Path, overrides: list[str] | None = None, *,
                  profiles: Profiles | None = None, profile: str | None = None) -> Scenario:
    """Read, override, validate and cross-check a scenario file (or a shipped scenario's name), with
    hardware profiles from `profiles` (default: $ZSIM_PROFILE_PATH, then the built-in ones); `profile`
    (the command line's `--profile`) replaces hardware.profile after the overrides.

    Raises:
        ConfigError: naming the file, the dotted key and the bad value; a key an override set is blamed
        on that `--set` (blame_override), not on the file.
    """
    path = find_scenario(path)
    profile_set = [f"hardware.profile={profile}"] if profile else []
    data = apply_overrides(read_yaml_mapping(path), [*(overrides or []), *profile_set])
    try:
        return build_scenario(data, source=str(path), default_name=path.stem, base_dir=path.parent,
                              profiles=profiles)
    except ConfigError as exc:
        raise blame_override(exc, set_by(overrides or [], path, profile)) from None


def set_by(overrides: list[str], path: Path | None = None, profile: str | None = None) -> list[tuple[str, str]]:
    """(dotted key, `--set K=V (on FILE)`) for each `--set` override, then ('hardware.profile',
    `--profile NAME`) when `profile` replaces it, for blame_override."""
    from zsim.config.overrides import parse_override
    from zsim.errors import short

    setters = [(".".join(parse_override(text)[0]), f"--set {short(text)} (on {path})") for text in overrides]
    return setters + ([("hardware.profile", f"--profile {short(profile)}")] if profile else [])


def blame_override(exc: ConfigError, setters: list[tuple[str, str]]) -> ConfigError:
    """`exc` re-addressed to the last of `setters` (dotted key, its name) that wrote the key of `exc`
    or a section holding it; `exc` itself when none did (the file is then to blame, also for a section
    an override only changed a key of)."""
    key = exc.path
    blamed = next((name for set_key, name in reversed(setters)
                   if key and (set_key == key or key.startswith(f"{set_key}."))), None)
    if blamed is None:
        return exc
    return ConfigError(exc.message, source=blamed, path=exc.path)


def build_scenario(data: dict, *, source: str = "<scenario>", default_name: str = "scenario",
                   gpu_memory_bytes: int | None = None, base_dir: str | Path | None = None,
                   profiles: Profiles | None = None) -> Scenario:
    """Validate a scenario given as a mapping (the parsed YAML). `gpu_memory_bytes` replaces the
    profile's GPU memory (what-if calculators such as `zsim maxsize --gpu-mem`); a relative
    `model.from_hf` is read from `base_dir` (default: the working directory). Raises ConfigError."""
    if is_sweep_mapping(data):  # `zsim run whatif/x` would otherwise say "base: unknown key"
        name = command_name(Path(source)) if source and not source.startswith("<") else "FILE"
        raise ConfigError(f"a sweep file (it has `base:`), not a scenario: run it with `zsim sweep {name}` "
                          "(docs/sweep.md)", source=source)
    data = resolve_from_hf(data, source=source, base_dir=base_dir)
    spec: ScenarioFile = validate(ScenarioFile, data, source)  # type: ignore[assignment]

    def fail(key: str, message: str) -> ConfigError:
        return ConfigError(message, source=source, path=key)

    try:
        cluster = load_cluster(spec.hardware.profile, spec.hardware.nodes, profiles, **spec.hardware.overrides())
    except ConfigError as exc:
        raise fail(exc.path or "hardware.profile", str(exc).removeprefix(f"{exc.path}: ")) from None
    if gpu_memory_bytes is not None:
        cluster = replace(cluster, gpu=replace(cluster.gpu, memory_bytes=gpu_memory_bytes))

    model, par = spec.model, spec.parallel
    gpus = cluster.world
    if par.dp * par.mp * par.cp * par.pp != gpus:
        pp = (f" × cp {par.cp}" if par.cp > 1 else "") + (f" × pp {par.pp}" if par.pp > 1 else "")
        raise fail("parallel.dp", f"{par.dp} × mp {par.mp}{pp} = {par.dp * par.mp * par.cp * par.pp} GPUs, but the cluster has "
                   f"{gpus} ({spec.hardware.nodes} node{'s' if spec.hardware.nodes != 1 else ''} × {cluster.gpus_per_node} "
                   f"GPU{'s' if cluster.gpus_per_node != 1 else ''})")
    gpn = cluster.gpus_per_node
    if gpn % par.mp and par.mp % gpn:
        raise fail("parallel.mp", f"{par.mp} must divide the {gpn} GPUs of a node, or be a multiple of them "
                   "(an MP group fills part of one node or whole nodes)")
    for key, message in mp_problems(model, par.mp):  # the same rule as the runtime's
        raise fail(key, message)
    if spec.precision.dtype not in cluster.gpu.peak_flops:
        raise fail("precision.dtype", f"{spec.precision.dtype} is not supported by {cluster.gpu.name}")
    grad_accum = _grad_accum(model, par.dp, fail)
    _check_fabric(spec, cluster, fail)
    _check_zero_r(spec.zero, fail)
    _check_implementation(spec.zero, fail)
    _check_modern(spec, cluster, fail)
    check_pipeline(spec, cluster, grad_accum, fail)
    resolved = _resolve_attention(model, spec.precision.dtype, cluster)
    check_context_parallel(spec, resolved, cluster.host is not None, fail)
    # with stages the check is on their mean (a lower bound of the busiest); the simulation reports each's
    _check_model_states_fit(spec, cluster, fail)
    return Scenario(
        name=spec.name or default_name,
        description=spec.description,
        model=resolved,
        parallel=par,
        zero=spec.zero,
        precision=spec.precision,
        hardware=spec.hardware,
        fabric=spec.fabric,
        run=spec.run,
        cluster=cluster,
        # Megatron-Core's dp × cp group (gradients, the distributed optimizer) is zsim's DP group: ranks ordered
        # tp-cp-dp-pp (parallel_state.py), so a CP group is cp consecutive members of it (Layout.cp)
        layout=Layout(dp=par.dp * par.cp, mp=par.mp, gpus_per_node=cluster.gpus_per_node, nodes=cluster.nodes, ep=par.ep,
                      pp=par.pp, etp=par.expert_mp or 0, cp=par.cp, dp_last=par.rank_order == "tp-cp-pp-dp"),
        grad_accum=grad_accum,
        source=source,
    )


def _check_fabric(spec: ScenarioFile, cluster: Cluster, fail) -> None:
    """Degraded links need per-rank mode and must name links that exist; SM contention is modelled for GPUs
    in class mode."""
    from zsim.fabric.topology import Degradation, build_topology, degrade

    if spec.fabric.sm_contention and cluster.host is not None:
        raise fail("fabric.sm_contention", "true is for GPUs: on a CPU host the rank's compute already shares its "
                   "cores with gloo (docs/host-profiles.md, gloo_core_share)")
    if spec.fabric.sm_contention and (spec.fabric.mode == "per_rank" or spec.fabric.degrade):
        raise fail("fabric.sm_contention", "true is modelled in class mode only (fabric.mode class, no "
                   "fabric.degrade)")
    if spec.fabric.degrade and spec.fabric.mode == "class":
        raise fail("fabric.mode", "class mode assumes identical ranks; degraded links need per_rank (or auto)")
    if spec.fabric.degrade:
        items = [Degradation(d.link, d.factor, d.index, d.gpu, d.node) for d in spec.fabric.degrade]
        try:
            degrade(build_topology(cluster), cluster, items)
        except ConfigError as exc:
            raise fail("fabric.degrade", str(exc).removeprefix("fabric.degrade: ")) from None


def _grad_accum(model: ModelSection, dp: int, fail) -> int:
    """global_batch = micro_batch × dp × grad_accum; either may be given, or neither (grad_accum 1)."""
    per_pass = model.micro_batch * dp
    if model.global_batch is None:
        return model.grad_accum or 1
    if model.global_batch % per_pass:
        raise fail("model.global_batch", f"{model.global_batch} is not a multiple of micro_batch "
                   f"{model.micro_batch} × dp {dp} = {per_pass}")
    accum = model.global_batch // per_pass
    if accum > MAX_ACCUM:  # the bound model.grad_accum has, for the count global_batch implies (issue 28)
        raise fail("model.global_batch", f"{model.global_batch} = micro_batch {model.micro_batch} × dp {dp} × "
                   f"{accum:,} micro-batches per step: more than {MAX_ACCUM:,} (model.grad_accum's bound)")
    if model.grad_accum is not None and model.grad_accum != accum:
        raise fail("model.grad_accum", f"{model.grad_accum} contradicts global_batch {model.global_batch} "
                   f"= micro_batch {model.micro_batch} × dp {dp} × {accum}")
    return accum


# deepspeed-0.5's coordinator limits (zsim.zero.implementation.coordinator): they change nothing elsewhere
COORDINATOR_KEYS = ("prefetch_bucket_elements", "max_live_elements", "max_reuse_elements")


@functools.cache
def _coordinator_defaults() -> dict[str, int]:
    """The schema's defaults of COORDINATOR_KEYS (read once: msgspec.structs.fields costs ~1 ms a call, and
    every scenario build checks them)."""
    return {f.name: f.default for f in msgspec.structs.fields(ZeroSection) if f.name in COORDINATOR_KEYS}


def _check_implementation(zero: ZeroSection, fail) -> None:
    """zero.implementation deepspeed-0.2 has no stage 3: ZeRO-3 first shipped in DeepSpeed v0.3.13; megatron-core
    has stages 0-1 and none of DeepSpeed's buffer options, and its own keys need it; and the
    coordinator's keys, set away from their defaults, need deepspeed-0.5 at stage 3 (nothing else reads them)."""
    if zero.implementation == "deepspeed-0.2" and zero.stage == 3:
        raise fail("zero.implementation", "deepspeed-0.2 with zero.stage 3: DeepSpeed v0.2 had stages 0-2 only "
                   "(stage 3 shipped in v0.3.13); use deepspeed-0.5, deepspeed-0.14 or paper")
    if zero.setup_residue != "none" and zero.implementation != "paper":
        raise fail("zero.setup_residue", f"'{zero.setup_residue}' is zsim's runtime's setup, which runs the 'paper' "
                   f"schedules: not zero.implementation {zero.implementation}")
    megatron = zero.implementation == "megatron-core"
    if megatron and zero.stage >= 2:
        raise fail("zero.implementation", f"megatron-core with zero.stage {zero.stage}: Megatron-Core's distributed "
                   "optimizer partitions the optimizer states only (stage 1; stage 0 without it); use paper or a "
                   "DeepSpeed version for stages 2-3")
    if megatron and (not zero.constant_buffers or zero.defragment):
        key = "constant_buffers" if not zero.constant_buffers else "defragment"
        raise fail(f"zero.{key}", f"{getattr(zero, key)} is a DeepSpeed option; megatron-core keeps its gradients "
                   "in one contiguous buffer cut into buckets (zero.ddp_bucket_elements)")
    for key, on in (("ddp_bucket_elements", zero.ddp_bucket_elements is not None),
                    ("grad_reduce_in_fp32", zero.grad_reduce_in_fp32 is not None),
                    ("overlap_param_gather", zero.overlap_param_gather)):
        if on and not (megatron and (zero.stage == 1 or key != "overlap_param_gather")):
            raise fail(f"zero.{key}", f"{getattr(zero, key)} applies to zero.implementation megatron-core"
                       f"{' at stage 1 (the distributed optimizer)' if key == 'overlap_param_gather' else ''} only "
                       f"(this scenario: {zero.implementation}, stage {zero.stage})")
    if zero.implementation != "deepspeed-0.5" or zero.stage != 3:
        for key, default in _coordinator_defaults().items():
            if getattr(zero, key) != default:
                raise fail(f"zero.{key}", f"{getattr(zero, key)} applies to zero.implementation deepspeed-0.5 at "
                           f"stage 3 only (this scenario: {zero.implementation}, stage {zero.stage})")


def _check_zero_r(zero: ZeroSection, fail) -> None:
    """ZeRO-R options that need one another (ZeRO §6.1: Pa partitions activation checkpoints, and
    Pa+cpu offloads those partitions; DeepSpeed's cpu_checkpointing needs partition_activations)."""
    if zero.partition_activations and not zero.activation_checkpointing:
        raise fail("zero.partition_activations", "true needs zero.activation_checkpointing: true "
                   "(Pa partitions the activation checkpoints)")
    if zero.cpu_offload_activations and not zero.partition_activations:
        raise fail("zero.cpu_offload_activations", "true needs zero.partition_activations: true "
                   "(Pa+cpu offloads the partitioned checkpoints)")
    if zero.checkpoint_every > 1 and not zero.activation_checkpointing:
        raise fail("zero.checkpoint_every", f"{zero.checkpoint_every} needs zero.activation_checkpointing: true")


def _check_modern(spec: ScenarioFile, cluster: Cluster, fail) -> None:
    """FlashAttention where it runs (zsim.compute.flash.supported: FA2 Ampere+, FA3 Hopper; 16-bit
    only), selective recompute with checkpointing on, sequence parallelism without Pa (both split the
    layer inputs across the MP group; Megatron-LM's sequence parallelism keeps them sharded)."""
    from zsim.compute.flash import MAX_HEAD_DIM, supported

    model, zero = spec.model, spec.zero
    if model.attention not in ("standard", "auto"):
        version = int(model.attention[-1])
        if spec.precision.dtype == "fp32":
            raise fail("model.attention", f"{model.attention} computes in fp16 or bf16 only (flash-attn README), "
                       "but precision.dtype is fp32")
        cc = cluster.gpu.compute_capability
        if cluster.host is None and (why := supported(version, cc)):
            raise fail("model.attention", f"{model.attention} on {cluster.gpu.name} (compute capability "
                       f"{cc / 10:.1f}): {why}")
        if (width := _qk_width(model)) > MAX_HEAD_DIM:
            raise fail("model.attention", f"{model.attention} runs head dims up to {MAX_HEAD_DIM} (flash-attn flash_api.cpp), "
                       f"but a head's query/key is {width} wide; use model.attention: standard")
    if zero.recompute_granularity == "selective" and not zero.activation_checkpointing:
        raise fail("zero.recompute_granularity", "selective needs zero.activation_checkpointing: true (it chooses "
                   "what the checkpointing recomputes)")
    if zero.recompute_granularity == "selective" and zero.checkpoint_every > 1:
        raise fail("zero.checkpoint_every", f"{zero.checkpoint_every} groups layers for full recompute, but "
                   "zero.recompute_granularity is selective (each layer recomputes its own attention core)")
    if zero.recompute_granularity == "selective" and zero.partition_activations:
        raise fail("zero.partition_activations", "true partitions full-recompute checkpoints, but "
                   "zero.recompute_granularity is selective (no layer checkpoint to partition)")
    check_recompute_modules(spec, fail)
    check_moe(spec, fail)
    if spec.model.mtp_layers and spec.parallel.mp > 1 and not spec.parallel.sequence_parallel:
        # zsim.workload.transformer._mtp_module prices eh_proj's collectives as Megatron-Core runs them under SP
        raise fail("model.mtp_layers", f"{spec.model.mtp_layers} with parallel.mp {spec.parallel.mp} and no "
                   "sequence parallelism: the multi-token prediction modules' MP collectives are modelled under "
                   "parallel.sequence_parallel only (Megatron-Core requires it with MoE and expert parallelism)")
    if spec.model.loss in ("torch", "torch-fp32") and spec.parallel.mp > 1:
        # a DTensor's logits are gathered whole before PyTorch's loss (NeMo AutoModel's MaskedCrossEntropy:
        # `logits.full_tensor()`), a collective and memory zsim does not model
        raise fail("model.loss", f"{spec.model.loss} with parallel.mp {spec.parallel.mp}: PyTorch's cross-entropy runs on whole "
                   "logits, gathered first under tensor parallelism, which zsim does not model; use megatron "
                   "(vocab-parallel) or fused")
    if not spec.precision.master_weights and spec.precision.dtype != "bf16":
        raise fail("precision.master_weights", f"false with dtype {spec.precision.dtype}: training without an "
                   "fp32 master copy is modelled for bf16 only (fp16 needs loss scaling against its master copy; "
                   "fp32 has no 16-bit copy to drop)")
    _check_fp8(spec, cluster, fail)
    _check_fp4(spec, cluster, fail)
    _check_fp8_attention(spec, cluster, fail)
    if spec.precision.adam_moments == "bf16" and not (spec.precision.master_weights and spec.precision.dtype != "fp32"
                                                       and zero.implementation == "megatron-core"):
        raise fail("precision.adam_moments", "bf16 is Megatron-Core's precision-aware optimizer beside an fp32 master "
                   "copy: it needs zero.implementation megatron-core, a 16-bit precision.dtype and master_weights true")
    par = spec.parallel
    if par.tp_comm_overlap and not (par.sequence_parallel and par.mp > 1):
        raise fail("parallel.tp_comm_overlap", "true needs parallel.sequence_parallel and mp > 1 (Megatron-Core "
                   "asserts --sequence-parallel with it; the overlapped collectives are SP's)")
    moe = spec.model.moe
    if par.tp_comm_overlap and moe is not None and (par.expert_mp != 1 or moe.shared_experts or par.ep_overlap):
        why = ("with parallel.ep_overlap (the merged 1F1B passes)" if par.ep_overlap and par.expert_mp == 1
               and not moe.shared_experts else "with MoE blocks whose experts are split across TP or have a shared "
               "expert: zsim overlaps a dense block's collectives and, with parallel.expert_mp 1 and no "
               "model.moe.shared_experts, a MoE block's attention pair (zsim.zero.tp_overlap)")
        raise fail("parallel.tp_comm_overlap", f"true is not modelled {why}")
    if spec.parallel.sequence_parallel and zero.partition_activations and spec.parallel.mp > 1:
        raise fail("zero.partition_activations", "true with parallel.sequence_parallel: sequence parallelism "
                   "already keeps 1/mp of every layer input per MP rank (Korthikanti et al. 2022 §4.2.2)")


def _check_fp8(spec: ScenarioFile, cluster: Cluster, fail) -> None:
    """precision.fp8 where zsim can price it (zsim.compute.fp8): 16-bit training on a GPU profile with an FP8
    peak and FP8 GEMM terms; MXFP8 on Blackwell (compute capability 10.0 and later: Transformer Engine's
    MXFP8 recipe requires it, transformer_engine/pytorch/fp8.py check_mxfp8_support), blockwise on Hopper (the
    recipe zsim models); not with ZeRO-3, whose gathered parameters zsim does not hold in FP8; precision.fp8_params
    only with FP8 and Megatron-Core's distributed optimizer (--fp8-param-gather's)."""
    fp8 = spec.precision.fp8
    if fp8 == "none":
        if spec.precision.fp8_params:
            raise fail("precision.fp8_params", "true needs precision.fp8 (FP8 parameters are Transformer Engine's "
                       "FP8 weights)")
        return
    gpu = cluster.gpu
    if spec.precision.dtype == "fp32":
        raise fail("precision.fp8", f"{fp8} with precision.dtype fp32: Transformer Engine's FP8 training keeps "
                   "16-bit (bf16 or fp16) parameters and activations beside the FP8 GEMMs")
    if cluster.host is not None:
        raise fail("precision.fp8", f"{fp8} on a CPU host ({gpu.name}): FP8 GEMMs run on Hopper and later GPUs")
    if "fp8" not in gpu.peak_flops or gpu.compute is None or "fp8" not in gpu.compute.gemm:
        raise fail("precision.fp8", f"{fp8} on {gpu.name}, whose profile has no FP8 tensor-core peak and FP8 GEMM "
                   "terms (peak_fp8_tflops, compute.gemm.fp8): FP8 tensor cores came with Hopper (compute capability "
                   "9.0); use an H100, H200, GH200 or B200 profile, or precision.fp8: none")
    if fp8 == "blockwise" and gpu.compute_capability >= 100:
        raise fail("precision.fp8", f"blockwise on {gpu.name} (compute capability {gpu.compute_capability / 10:.1f}): "
                   "zsim models block-scaled FP8 as Hopper runs it (DeepSeek-V3's recipe); on Blackwell use mxfp8")
    if fp8 == "mxfp8" and gpu.compute_capability < 100:
        raise fail("precision.fp8", f"mxfp8 on {gpu.name} (compute capability {gpu.compute_capability / 10:.1f}): "
                   "MXFP8 block scaling needs Blackwell (10.0) tensor cores; on Hopper use 'delayed' or 'current'")
    if spec.zero.stage == 3:
        raise fail("precision.fp8", f"{fp8} with zero.stage 3: the gathered parameters' FP8 copies and FP8 "
                   "all-gathers of FSDP-style training are not modelled; use stages 0-2 (Megatron-Core's "
                   "distributed optimizer is stage 1)")
    if spec.precision.fp8_params and not (spec.zero.implementation == "megatron-core" and spec.zero.stage == 1):
        raise fail("precision.fp8_params", "true needs Megatron-Core's distributed optimizer (zero.implementation "
                   "megatron-core, zero.stage 1): --fp8-param-gather gathers the FP8 parameters it casts from "
                   f"its fp32 master shard, but this run is stage {spec.zero.stage} as {spec.zero.implementation}")


def _check_fp4(spec: ScenarioFile, cluster: Cluster, fail) -> None:
    """precision.fp4 where zsim can price it (zsim.compute.fp8, 'nvfp4'): not beside precision.fp8 (Megatron-Bridge
    raises on both: docs/training/mixed-precision.md, "NVFP4 Training"), 16-bit training on a Blackwell GPU profile
    (compute capability 10.0 and later: TE's NVFP4 recipe needs its block-scaled FP4 tensor cores) with an FP4 peak
    and FP4 GEMM terms; not with ZeRO-3, nor with FP8 parameters (NVFP4 parameters are not modelled)."""
    fp4 = spec.precision.fp4
    if fp4 == "none":
        return
    gpu = cluster.gpu
    if spec.precision.fp8 != "none":
        raise fail("precision.fp4", f"{fp4} with precision.fp8 {spec.precision.fp8}: NVFP4 and FP8 linear layers are "
                   "mutually exclusive (Megatron-Core's --fp4-format and --fp8-format); set precision.fp8: none")
    if spec.precision.dtype == "fp32":
        raise fail("precision.fp4", f"{fp4} with precision.dtype fp32: Transformer Engine's NVFP4 training keeps "
                   "16-bit (bf16) parameters and activations beside the FP4 GEMMs")
    if cluster.host is not None:
        raise fail("precision.fp4", f"{fp4} on a CPU host ({gpu.name}): NVFP4 GEMMs run on Blackwell GPUs")
    if gpu.compute_capability < 100 or "fp4" not in gpu.peak_flops or gpu.compute is None \
            or "fp4" not in gpu.compute.gemm:
        raise fail("precision.fp4", f"{fp4} on {gpu.name} (compute capability {gpu.compute_capability / 10:.1f}), "
                   "whose profile has no FP4 tensor-core peak and FP4 GEMM terms (peak_fp4_tflops, "
                   "compute.gemm.fp4): NVFP4 needs Blackwell (10.0); use a B200, GB200, B300 or GB300 profile, "
                   "or precision.fp4: none")
    if spec.zero.stage == 3:
        raise fail("precision.fp4", f"{fp4} with zero.stage 3: the gathered parameters' NVFP4 copies of "
                   "FSDP-style training are not modelled; use stages 0-2 (Megatron-Core's distributed optimizer "
                   "is stage 1)")


def _check_fp8_attention(spec: ScenarioFile, cluster: Cluster, fail) -> None:
    """precision.fp8_attention where zsim can price it: cuDNN's fused attention (model.attention flash3) on a Blackwell
    GPU, the one generation whose FP8/bf16 attention rates were found measured (zsim.compute.flash, [B200 FP8]); 16-bit
    training."""
    if not spec.precision.fp8_attention:
        return
    gpu = cluster.gpu
    if spec.precision.dtype == "fp32":
        raise fail("precision.fp8_attention", "true with precision.dtype fp32: the FP8 attention casts 16-bit Q, K and V")
    if cluster.host is not None or gpu.compute_capability // 10 != 10:
        raise fail("precision.fp8_attention", f"true on {gpu.name}: zsim prices FP8 attention on Blackwell GPUs only "
                   "(compute capability 10.x: NVIDIA's measured B200 FP8/bf16 table); no FP8 attention table of an "
                   "earlier GPU was found")
    if spec.model.attention not in ("flash3", "auto"):  # 'auto' is flash3 on Blackwell
        raise fail("precision.fp8_attention", f"true with model.attention {spec.model.attention}: FP8 attention is "
                   "cuDNN's fused kernel, zsim's flash3 on Blackwell")


def _qk_width(model: ModelSection) -> int:
    """A head's query/key width: head_dim (default hidden / heads), or MLA's d_h + d_h^R."""
    if model.mla is not None:
        return model.mla.qk_nope_head_dim + model.mla.qk_rope_head_dim
    return model.head_dim or model.hidden // model.heads


def _resolve_attention(model: ModelSection, dtype: str, cluster: Cluster) -> ModelSection:
    """`model` with attention 'auto' made 'flash2' where FlashAttention-2 runs (Ampere or newer, fp16/bf16;
    zsim.compute.flash.supported) and 'standard' elsewhere (a CPU host, a V100, fp32, a head wider than 256); on
    Blackwell 'flash3', cuDNN's fused attention, what the frameworks run there (flash-attn 2's kernels run at a
    third of its rate: zsim.compute.flash, [B200])."""
    from zsim.compute.flash import BLACKWELL, MAX_HEAD_DIM, supported

    if model.attention != "auto":
        return model
    cc = 0 if cluster.host is not None else cluster.gpu.compute_capability
    runs = (cluster.host is None and dtype != "fp32" and not supported(2, cc) and _qk_width(model) <= MAX_HEAD_DIM)
    version = "flash3" if cc // 10 == BLACKWELL // 10 else "flash2"
    return replace_struct(model, attention=version if runs else "standard")


def _check_model_states_fit(spec: ScenarioFile, cluster: Cluster, fail) -> None:
    """A model whose model states alone exceed the GPU (ZeRO Table 1) cannot fit at any batch size:
    that is a scenario error, reported before simulating, with the stage that would fit."""
    from zsim.zero.cost import model_states_closed_form
    from zsim.zero.model_states import optimizer_k

    cap = cluster.gpu.memory_bytes
    pp = spec.parallel.pp

    def states_at(stage: int):  # closed form: a huge `layers` is not expanded layer by layer (issue 13)
        nd = spec.parallel.dp * spec.parallel.cp  # ZeRO partitions over Megatron-Core's dp × cp group
        k = optimizer_k(spec.precision.dtype, spec.precision.master_weights, spec.precision.adam_moments)
        whole = model_states_closed_form(spec.model, spec.parallel.mp, nd, stage, spec.precision.dtype, spec.parallel.ep, k,
                                         etp=spec.parallel.expert_mp)
        # with pipeline stages each holds its share: the busiest holds at least the mean, 1/pp of the whole
        return whole if pp == 1 else type(whole)(params=whole.params // pp, grads=whole.grads // pp,
                                                 optimizer=whole.optimizer // pp)

    states = states_at(spec.zero.stage)
    if states.total <= cap:
        return
    # DeepSpeed's MoE with stage 3 is refused (_check_moe), and pipelines with stages 2-3 (pipeline_checks)
    moe_stage3 = spec.model.moe is None or spec.zero.implementation == "paper"
    stages = (1,) if pp > 1 else (1, 2, 3) if moe_stage3 else (1, 2)
    fitting = [st for st in stages if states_at(st).total <= cap]
    advice = f"ZeRO stage {fitting[0]} would need {states_at(fitting[0]).total / 1e9:.1f} GB" \
             if fitting and fitting[0] > spec.zero.stage else \
        "more GPUs (dp), more model parallelism (mp) or more pipeline stages (pp) are needed"
    per_gpu = "per GPU" if pp == 1 else f"per GPU on average over the {pp} pipeline stages"
    err = fail("zero.stage", f"{spec.zero.stage}: the model does not fit: model states alone need "
               f"{states.total / 1e9:.1f} GB {per_gpu} (params {states.params / 1e9:.1f} + grads "
               f"{states.grads / 1e9:.1f} + optimizer {states.optimizer / 1e9:.1f}), but {cluster.gpu.name} has "
               f"{cap / 1e9:.1f} GB; {advice}")
    raise ModelStatesError(err.message, source=err.source, path=err.path)
