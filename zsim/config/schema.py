"""The scenario schema: one model (a msgspec Struct, zsim.config.struct) per YAML section, each field
documented.

Only per-field and per-section checks live here; checks that need the hardware profile (does the
layout match the cluster?) live in `zsim.scenario.scenario`, which builds the validated `Scenario`.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from zsim.config.bounds import MAX_DEGRADE, MAX_ELEMENTS, MAX_GPUS, MAX_LAYERS, MAX_MP, MAX_STEPS, Name, Text
from zsim.config.model_section import ModelSection, model_json_schema
from zsim.config.struct import Meta, Section, field
from zsim.config.validation import PROFILE_NAME_PATTERN, PROFILE_NAME_RULE

_PROFILE_NAME = re.compile(PROFILE_NAME_PATTERN)


def profile_name(value: str) -> str:
    """A profile *name* (issue 13 containment): letters, digits, '.', '_', '+', '-'; no '/', '\\', '..',
    no absolute path. Profiles are looked up by name in the profile folders, never read from a path
    written in a scenario file. Raises ValueError otherwise."""
    if not _PROFILE_NAME.fullmatch(value):
        raise ValueError(PROFILE_NAME_RULE)
    return value


# A profile name is checked by its pattern (PROFILE_NAME_PATTERN: no '..'); names and free text: zsim.config.bounds.
ProfileName = Annotated[str, Meta(max_length=100, pattern=PROFILE_NAME_PATTERN)]


class ParallelSection(Section, kw_only=True):
    """The parallel layout: world size = dp × mp × pp. MP is Megatron-style tensor parallelism, PP pipeline
    parallelism."""

    dp: Annotated[int, Meta(gt=0, le=MAX_GPUS, description="data-parallel degree Nd (ZeRO partitions across it)")]
    mp: Annotated[int, Meta(gt=0, le=MAX_MP, description=(
        "model (tensor) parallel degree: divides the GPUs of a node, or is a multiple of them (the group "
        "spans whole nodes, its all-reduces on the network)"))] = 1
    ep: Annotated[int, Meta(gt=0, le=MAX_GPUS, description=(
        "expert-parallel degree (mixture-of-experts): each group of ep DP ranks splits the experts among "
        "its members and exchanges tokens by all-to-all; divides dp and model.moe.experts"))] = 1
    # Megatron-Core --expert-tensor-parallel-size (MoE parallel folding: Liu et al. 2025, arXiv 2504.14960).
    expert_mp: Annotated[int, Meta(gt=0, le=MAX_MP, description=(
        "the experts' tensor-parallel degree (Megatron-Core --expert-tensor-parallel-size): mp (the default) "
        "splits each expert across the MP ranks as the dense MLP; 1 keeps each expert whole on one rank and "
        "folds the EP group over a stage's MP and DP ranks (ep then divides dp x mp)"))] | None = None
    # Megatron-Core --context-parallel-size (megatron/core/parallel_state.py order 'tp-cp-ep-dp-pp'; docs/parallel-layouts.md).
    cp: Annotated[int, Meta(gt=0, le=MAX_MP, description=(
        "context-parallel degree (Megatron-Core --context-parallel-size): each sequence is split over cp ranks, "
        "each computing s/cp tokens (zig-zag balanced for causal attention) and exchanging keys and values in a "
        "ring; world = mp × cp × dp × pp; gradients and the distributed optimizer span dp × cp; FlashAttention "
        "only"))] = 1
    # Megatron-Core --overlap-moe-expert-parallel-comm (with --delay-wgrad-compute: the ModelZoo's A2A_OVERLAP=1);
    # pipeline_parallel/combined_1f1b.py, docs/moe.md "EP all-to-alls overlapped in 1F1B".
    ep_overlap: Annotated[bool, Meta(description=(
        "mixture-of-experts: each forward runs merged with a backward, layer by layer, the EP all-to-alls of each "
        "on a communication stream beside the other's compute (Megatron-Core --overlap-moe-expert-parallel-comm): "
        "with pp > 1 (interleaved schedule) each steady-state forward with the backward after it, one more "
        "warm-up forward per stage; with pp 1 each micro-batch's forward with the previous one's backward "
        "(ZeRO stages 0-1)"))] = False
    # Korthikanti et al. 2022 §4.2.2; Megatron-LM --sequence-parallel.
    sequence_parallel: Annotated[bool, Meta(description=(
        "Megatron sequence parallelism: the layer norms, dropouts and residuals run on s/mp tokens per MP "
        "rank, each MP all-reduce becomes a reduce-scatter and an all-gather, and the activations they keep "
        "are divided by mp (no effect at mp 1, as Megatron-LM turns it off there)"))] = False
    # Megatron-Core --tp-comm-overlap, Transformer Engine's userbuffers (zsim.zero.tp_overlap cites TE v1.8).
    tp_comm_overlap: Annotated[bool, Meta(description=(
        "with sequence_parallel and mp > 1: each dense block's all-gathers and reduce-scatters (a MoE block's "
        "attention pair, with expert_mp 1) overlap the GEMMs next to them, chunked as Transformer Engine's "
        "userbuffers run them (Megatron-Core --tp-comm-overlap; zsim.zero.tp_overlap); false: in line on the "
        "compute stream"))] = False
    # Pipeline parallelism (Narayanan et al. 2021, PTD-P; zsim.parallel.pipeline, docs/parallel.md).
    pp: Annotated[int, Meta(gt=0, le=MAX_MP, description=(
        "pipeline-parallel degree p: the layers split into p stages; world = mp × dp × pp, ranks in "
        "Megatron's order (tensor fastest, then data, then pipeline)"))] = 1
    # Megatron-Core --use-tp-pp-dp-mapping (megatron/training/initialize.py: order 'tp-cp-ep-pp-dp'); NeMo's
    # TP_PP_DP_MAPPING, which MLPerf's GB200 NVL72 configs set (zsim.parallel.layout, docs/parallel-layouts.md).
    rank_order: Annotated[Literal["tp-cp-dp-pp", "tp-cp-pp-dp"], Meta(description=(
        "how ranks map to the parallel dimensions, fastest first (Megatron-Core's order without ep): tp-cp-dp-pp "
        "(the default: a pipeline stage is dp × cp × mp consecutive ranks) or tp-cp-pp-dp (--use-tp-pp-dp-mapping: "
        "a model replica's mp × cp × pp ranks are consecutive, so its pipeline stays inside a node that holds it, "
        "as on a GB200 NVL72 rack, and only data parallelism crosses nodes); the same with pp 1"))] = "tp-cp-dp-pp"
    pipeline_schedule: Annotated[Literal["1f1b", "gpipe", "interleaved"], Meta(description=(
        "the pipeline schedule: 1f1b (PipeDream-Flush), gpipe (all forwards, then all backwards) or "
        "interleaved (1F1B over virtual_stages model chunks per stage; micro-batches a multiple of pp)"))] = "1f1b"
    virtual_stages: Annotated[int, Meta(gt=0, le=MAX_LAYERS, description=(
        "model chunks v per pipeline stage (interleaved schedule only; 1 otherwise)"))] = 1
    pp_layers: Annotated[list[Annotated[int, Meta(ge=0, le=MAX_LAYERS)]] | None, Meta(description=(
        "an uneven split: layer counts per virtual stage, in virtual-stage order (pp × virtual_stages of "
        "them, adding up to model.layers); the first and the last may be 0, a stage holding only the "
        "embedding or only the head and loss (Megatron-Core --account-for-embedding-in-pipeline-split, "
        "--account-for-loss-in-pipeline-split); default: an even split"))] = None


class ZeroSection(Section, kw_only=True):
    """ZeRO-DP stage and ZeRO-R options (paper §5 and §6)."""

    stage: Annotated[int, Meta(ge=0, le=3, description="0: plain DP, 1: Pos, 2: Pos+g, 3: Pos+g+p")]
    activation_checkpointing: Annotated[bool, Meta(description=(
        "keep one input per layer, recompute in backward"))] = True
    checkpoint_every: Annotated[int, Meta(gt=0, le=MAX_LAYERS, description=(
        "with checkpointing: keep one checkpoint every k layers and recompute k layers at a time in backward "
        "(Megatron-LM checkpoint_num_layers; Chen et al. 2016)"))] = 1
    # Korthikanti et al. 2022 §5 (selective activation recomputation); Megatron-LM --recompute-granularity.
    recompute_granularity: Annotated[Literal["full", "selective"], Meta(description=(
        "with checkpointing: full keeps each layer's input and recomputes the layer (Megatron 'full'); "
        "selective keeps every activation but the attention core's s×s ones (softmax, its dropout mask and "
        "output) and recomputes only QKᵀ, softmax, dropout and attention·V in backward (Megatron "
        "'selective')"))] = "full"
    # Megatron-Core --recompute-modules (transformer_config.py recompute_modules, default ["core_attn"]).
    recompute_modules: Annotated[list[str] | None, Meta(description=(
        "with recompute_granularity selective: which parts each layer recomputes (Megatron-Core "
        "--recompute-modules): core_attn (the attention core, the default), layernorm (a MoE block's pre-MLP "
        "norm output), moe_act (the routed experts' activation output), mlp (a dense block's whole MLP), moe "
        "(a MoE block's whole MoE layer, its all-to-alls included), mla_up_proj (MLA's up projections: Q, K and "
        "V); any subset, [] for none"))] = None
    reduce_bucket_elements: Annotated[int, Meta(gt=0, le=MAX_ELEMENTS, description=(
        "gradient elements per reduction bucket (DeepSpeed reduce_bucket_size); the constant buffer size when"
        " constant_buffers is true"))] = 500000000
    allgather_bucket_elements: Annotated[int, Meta(gt=0, le=MAX_ELEMENTS, description=(
        "stage 2: parameter elements per all-gather after the step (DeepSpeed allgather_bucket_size; PyTorch "
        "stages it through a buffer of this many elements)"))] = 500000000
    sub_group_elements: Annotated[int, Meta(gt=0, le=MAX_ELEMENTS, description=(
        "stage 3: the optimizer steps its partition in sub-groups of this many elements, each upcast to fp32 "
        "on its own (DeepSpeed sub_group_size; 1e12, i.e. the whole partition, is the default of stage 3 as "
        "it shipped in v0.3.13)"))] = 1000000000000
    prefetch_layers: Annotated[int, Meta(ge=0, le=MAX_LAYERS, description=(
        "stage 3: layers gathered ahead of the one computing"))] = 1
    # deepspeed-0.5's parameter coordinator (zsim.zero.implementation.coordinator); the defaults are DeepSpeed's
    # (runtime/zero/constants.py @ v0.3.13 L86-94: stage3_max_live_parameters 1e9, stage3_max_reuse_distance 1e9,
    # stage3_prefetch_bucket_size 5e7).
    prefetch_bucket_elements: Annotated[int, Meta(gt=0, le=MAX_ELEMENTS, description=(
        "deepspeed-0.5, stage 3: parameter elements prefetched after each sub-module's fetch (DeepSpeed "
        "stage3_prefetch_bucket_size)"))] = 50000000
    max_live_elements: Annotated[int, Meta(gt=0, le=MAX_ELEMENTS, description=(
        "deepspeed-0.5, stage 3: no prefetch while this many gathered parameter elements are live (DeepSpeed "
        "stage3_max_live_parameters)"))] = 1000000000
    max_reuse_elements: Annotated[int, Meta(gt=0, le=MAX_ELEMENTS, description=(
        "deepspeed-0.5, stage 3: a gathered tensor is kept, not released, when it is used again within this "
        "many parameter elements of fetches (DeepSpeed stage3_max_reuse_distance); released tensors are "
        "gathered again"))] = 1000000000
    # zsim.zero.implementation cites each version's code (DeepSpeed tags v0.3.13, v0.5.10, v0.14.0).
    implementation: Annotated[Literal["paper", "deepspeed-0.2", "deepspeed-0.5", "deepspeed-0.14", "megatron-core"],
                              Meta(description=(
        "ZeRO as implemented: 'paper' (default) the paper's schedules (stage 2: one reduce-scatter per "
        "bucket; stage 3: one all-gather per module overlapping compute); 'deepspeed-0.2' (stages 0-2) "
        "stage 2 reduces each bucket to its owners, one reduce per rank (with MD; without it, all-reduces "
        "each flattened bucket); 'deepspeed-0.5' DeepSpeed "
        "v0.3.13-v0.5.10 stage 3: one all-gather per parameter tensor with a device synchronise before each "
        "(no overlap), list copies of Nd pieces per gather and per reduce-scatter; 'deepspeed-0.14' stage 3: "
        "coalesced gathers per module, each parameter rebuilt by a cat of its Nd pieces. Stages 0-1 (and 2 "
        "but under deepspeed-0.2) follow DeepSpeed v0.2.0 for every value; 'megatron-core' (stages 0-1) "
        "Megatron-Core's DDP buffers and, at stage 1, its distributed optimizer (core_r0.8.0): fp32 gradients for "
        "bf16, buckets of ddp_bucket_elements reduced as the last micro-batch's backward fills them under "
        "overlap_comm (--overlap-grad-reduce), the parameters all-gathered per bucket (zsim.zero.megatron_ddp)"))] = "paper"
    # zsim.zero.megatron_ddp cites Megatron-LM @ core_r0.8.0 for both keys; None is its default bucket size,
    # max(4e7, 1e6 x dp) (distributed_data_parallel.py L47-54).
    ddp_bucket_elements: Annotated[int, Meta(gt=0, le=MAX_ELEMENTS, description=(
        "megatron-core: gradient elements per DDP bucket (Megatron-Core --ddp-bucket-size); unset: its default "
        "max(40,000,000, 1,000,000 x dp)"))] | None = None
    grad_reduce_in_fp32: Annotated[bool, Meta(description=(
        "megatron-core: the gradient buffer and its reductions in fp32 (true) or in the 16-bit dtype (false: "
        "Megatron-Bridge's ddp.grad_reduce_in_fp32 False); unset: Megatron-Core's default, fp32 for bf16 "
        "(zsim.zero.megatron_ddp.grad_bytes)"))] | None = None
    overlap_param_gather: Annotated[bool, Meta(description=(
        "megatron-core, stage 1: the updated parameters are all-gathered bucket by bucket under the next step's "
        "forward, each module waiting for its buckets (Megatron-Core --overlap-param-gather); false: all of "
        "them right after the step, in line"))] = False
    # What a framework's setup leaves cached in the caching allocator before the first step. zsim's runtime
    # copies each module's fp32 initial values to the device (runtime/zero/engine.py: layout.flatten(module)
    # .to(device)) and, at stages 1-2, lays them out in one fp32 flat buffer (runtime/zero/stage1.py
    # flat_params), then frees both once the optimizer holds its master copy: 4 B a parameter per module, and
    # 4 B a (padded) parameter more at stages 1-2, cached in blocks of those sizes (the 2026-11-26 H200 runs:
    # reserved − allocated after setup 1.66 GB = 8.1 B a parameter at stage 1, 8.17 GB = 8.0 at stage 2,
    # 2.07 GB = 4.1 at stage 3; data/device/20261126-h200, cuda_setup).
    setup_residue: Annotated[Literal["none", "runtime"], Meta(description=(
        "what the framework's setup leaves cached in the caching allocator before the first step: 'none' "
        "(the model states alone) or 'runtime' (zsim's runtime: its fp32 initial values, a block of 4 B a "
        "parameter per module, and at stages 1-2 its fp32 flat copy, freed before the first step and kept "
        "cached; on a GPU also the runtime's own requests in the step, zsim/zero/runtime_requests.py: its "
        "gradient buffer from setup, its step checks' temporaries, its gathers and buckets, torch 2.x's cuBLAS "
        "workspaces in the allocator, and its step's kernels: checks once per optimizer segment, fused Adam, "
        "zsim.compute.optimizer_kernels.runtime_step_kernels; `zsim replay` sets it for runtime runs on a GPU). "
        "Peaks are counted from "
        "the first step, as the runtime resets torch's after setup"))] = "none"
    # DeepSpeed overlap_comm. DeepSpeed's own default for stages 1-2 was false from v0.2.0 (2020-06) to
    # v0.3.13 (2021-03) and beyond (deepspeed/pt/deepspeed_zero_config.py @ 96c4daabc,
    # runtime/zero/constants.py @ v0.3.13: ZERO_OPTIMIZATION_OVERLAP_COMM_DEFAULT = False; stage 3: True),
    # and then reduce_ipg_grads/average_tensor ran on torch.cuda.current_stream(). zsim defaults to true
    # (what a tuned run sets today); scenarios/paper/ set false as the paper's configs left it.
    overlap_comm: Annotated[bool, Meta(description=(
        "DP gradient reductions run on their own stream, overlapping backward (DeepSpeed overlap_comm); "
        "false: on the compute stream, which waits for each (DeepSpeed's default for stages 1-2 in 2020-21)"))] = True
    # ZeRO-R options (paper §6; docs/memory.md).
    partition_activations: Annotated[bool, Meta(description=(
        "Pa: checkpoints partitioned across the MP group, all-gathered before recompute (§6.1)"))] = False
    cpu_offload_activations: Annotated[bool, Meta(description=(
        "Pa+cpu: partitioned checkpoints kept in host memory, copied over the host link (§6.1); needs "
        "partition_activations"))] = False
    # DeepSpeed copies Pa+cpu's partitions synchronously, in line with compute, and brings each back only
    # when its segment recomputes: `partition.cpu()` in the forward and `get_full_inputs(...,
    # device=cuda_device)` in the backward (v0.2.0 deepspeed_checkpointing.py, unchanged through 2025's
    # runtime/activation_checkpointing/checkpointing.py). An implementation can do better.
    cpu_offload_overlap: Annotated[bool, Meta(description=(
        "with Pa+cpu: false (default, as DeepSpeed) copies each partition to and from the host in line "
        "with compute, the way back when its segment recomputes; true copies on a stream of their own and "
        "brings each back one segment ahead, overlapping compute"))] = False
    # CB defaults to true because DeepSpeed always reduces in constant-size buckets (reduce_bucket_size);
    # false models the fused whole-model buffers of §3.2 (the baseline the paper measures against).
    constant_buffers: Annotated[bool, Meta(description=(
        "CB: gradient reductions and stage 3's fp32 gradients use buffers of reduce_bucket_elements; false: "
        "one fused fp32 buffer of 4Ψ (§3.2, §6.2)"))] = True
    defragment: Annotated[bool, Meta(description=(
        "MD: contiguous buffers for gradients (stages 2-3, outside the caching allocator) and for the "
        "checkpoints, as md_checkpoints says (§6.3)"))] = False
    # How MD holds checkpoints (docs/memory.md, "MD"). DeepSpeed (v0.2.0 deepspeed_checkpointing.py, and
    # every release since) has a contiguous checkpoint buffer only with Pa, on the GPU only without
    # Pa+cpu, allocates its slots through the caching allocator at the first forward of each micro-batch
    # and drops them as backward uses them; the paper's §6.3 describes chunks "pre-allocated" for the run.
    md_checkpoints: Annotated[Literal["deepspeed", "reserved"], Meta(description=(
        "with defragment: 'deepspeed' (with Pa on the GPU, every checkpoint's slot is allocated at the first "
        "forward of a micro-batch and freed as backward uses it; no buffer without Pa), or 'reserved' (the "
        "paper's reading: one buffer for all checkpoints, with or without Pa, reserved for the whole run "
        "outside the allocator)"))] = "deepspeed"


class PrecisionSection(Section, kw_only=True):
    """fp16/bf16 mixed precision (fp32 master weights and Adam, K = 12), plain fp32 training (K = 8), or pure
    bf16 training (master_weights false: Adam's states in bf16, K = 4)."""

    dtype: Annotated[Literal["fp16", "bf16", "fp32"], Meta(description=(
        "parameter, gradient and activation dtype; fp32 means no 16-bit copy and no master copy"))] = "fp16"
    # PyTorch's torch.optim.Adam keeps exp_avg and exp_avg_sq in the parameters' dtype (torch.zeros_like(p)),
    # so a model built in bf16 and trained without a master copy holds 2 + 2 bytes of Adam states per
    # parameter (NeMo AutoModel's custom MoE models: initialize_weights() casts the model to bf16, FSDP2 shards
    # the bf16 parameters). zsim.zero.model_states.PURE_BF16_K.
    master_weights: Annotated[bool, Meta(description=(
        "false: pure bf16 training, no fp32 master copy: the parameters, gradients and Adam's momentum and "
        "variance all in bf16 (K = 4; torch.optim.Adam on a model cast to bf16); bf16 only"))] = True
    # Transformer Engine's FP8 training (Megatron-Core --fp8-format hybrid --fp8-recipe ...; zsim.compute.fp8,
    # docs/models.md "FP8"): the transformer blocks' linear layers quantize their inputs, weights and output
    # gradients and run their three GEMMs in FP8; attention's core, the router, the embedding and the head stay 16-bit.
    fp8: Annotated[Literal["none", "delayed", "current", "blockwise", "mxfp8"], Meta(description=(
        "FP8 GEMMs in the blocks' linear layers as Transformer Engine runs them: 'delayed' (per-tensor scales from "
        "an amax history), 'current' (per-tensor scales from each tensor's own amax: one more read), 'blockwise' "
        "(DeepSeek-V3's 1x128 and 128x128 block scales, Hopper), 'mxfp8' (32-element block scales, Blackwell); "
        "'none': every GEMM in precision.dtype"))] = "none"
    # Transformer Engine's NVFP4 training (Megatron-Core --fp4-format e2m1 --fp4-recipe nvfp4; Megatron-Bridge's
    # bf16_with_nvfp4_mixed; zsim.compute.fp8, docs/models.md "NVFP4"): the blocks' linear layers as under fp8, their
    # three GEMMs on E2M1 operands with an E4M3 scale per 16 elements; NVFP4 and FP8 are mutually exclusive
    # (Megatron-Bridge docs/training/mixed-precision.md, "NVFP4 Training")
    fp4: Annotated[Literal["none", "nvfp4"], Meta(description=(
        "NVFP4 GEMMs in the blocks' linear layers as Transformer Engine runs them (Blackwell: 16-element E4M3 block "
        "scales and a per-tensor fp32 scale from each tensor's amax); instead of precision.fp8, not beside it"))] = "none"
    # cuDNN's FP8 fused attention (Megatron-Core --fp8-dot-product-attention; NeMo FP8_DPA with
    # NVTE_DPA_FP8_RECIPE Float8CurrentScaling): zsim.compute.flash [B200 FP8], docs/models.md "FP8 attention"
    fp8_attention: Annotated[bool, Meta(description=(
        "the attention core in FP8 (cuDNN's fused attention on Blackwell: Q, K, V and the output gradient cast to FP8 "
        "with current scaling, its matmuls at the rate NVIDIA measured for FP8 over bf16); needs model.attention "
        "flash3 on a Blackwell GPU"))] = False
    fp8_params: Annotated[bool, Meta(description=(
        "with fp8: the linear weights kept as FP8 parameters, 1 byte, no 16-bit copy (Megatron-Core --fp8-param-gather: "
        "the distributed optimizer's parameter all-gathers carry them; needs zero.implementation megatron-core)"))] = False
    adam_moments: Annotated[Literal["fp32", "bf16"], Meta(description=(
        "Adam's momentum and variance beside the fp32 master: fp32 (K = 12) or bf16 (K = 8: Megatron-Core's "
        "precision-aware optimizer, --exp-avg-dtype/--exp-avg-sq-dtype bf16; needs zero.implementation megatron-core)"))] = "fp32"
    optimizer: Annotated[Literal["adam"], Meta(description="Adam: fp32 master, momentum, variance")] = "adam"

    @property
    def linear_recipe(self) -> str:
        """The blocks' linear layers' low-precision recipe (zsim.compute.fp8.RECIPES): precision.fp4's when set,
        else precision.fp8's; 'none' for 16-bit GEMMs."""
        return self.fp4 if self.fp4 != "none" else self.fp8


class HardwareSection(Section, kw_only=True):
    """The cluster: a system profile from hwprofiles/ and how many of its nodes. The optional keys
    replace the profile's value for this scenario only (a what-if without a new profile file:
    `--set hardware.nic_Gbps=200`); zsim.fabric.cluster.load_cluster applies them."""

    profile: Annotated[ProfileName, Meta(description=(
        "name of a system profile (hwprofiles/<profile>.yaml), e.g. dgx2; a name, not a path"))]
    nodes: Annotated[int, Meta(gt=0, le=MAX_GPUS, description="number of nodes")]
    gpu: Annotated[ProfileName, Meta(description=(
        "a GPU profile name (hwprofiles/gpus/) instead of the system's"))] | None = None
    gpus_per_node: Annotated[int, Meta(gt=0, le=4096, description=(
        "GPUs per node instead of the system's"))] | None = None
    nics_per_node: Annotated[int, Meta(gt=0, le=4096, description="inter-node NIC ports per node")] | None = None
    nic_Gbps: Annotated[float, Meta(gt=0, le=1e6, description=(
        "one NIC port's line rate, Gbit/s per direction"))] | None = None
    nic_latency_us: Annotated[float, Meta(ge=0, le=1e6, description=(
        "network latency per hop, microseconds"))] | None = None
    gpu_memory_GiB: Annotated[float, Meta(gt=0, le=1e6, description=(
        "GPU memory, GiB (2^30 bytes)"))] | None = None
    oversubscription: Annotated[float, Meta(ge=1, le=1e6, description=(
        "fat-tree oversubscription (node injection bandwidth / bandwidth up to the spines), >= 1"))] | None = None
    gpudirect_rdma: Annotated[bool, Meta(description=(
        "false: no GPUDirect RDMA (NCCL stages inter-node bytes through host memory: a NIC carries "
        "min(2/3 of its rate, half its PCIe switch's uplink), zsim.fabric.gpudirect); true: as the profile"))] | None = None
    nvls: Annotated[bool, Meta(description=(
        "false: NCCL does not use NVLink SHARP (NCCL_NVLS_ENABLE=0: no NVLS or NVLSTree, zsim.fabric.nvls); "
        "true: as a profile whose NVSwitches do it (refused on a node whose switches do not)"))] | None = None
    network: Annotated[ProfileName, Meta(description=(
        "a network profile name (hwprofiles/networks/, e.g. roce) whose fitted terms replace the system's network's "
        "on the same NICs: the port rate stays the system's unless nic_Gbps is set too"))] | None = None

    def overrides(self) -> dict[str, float | int | str]:
        """The override keys that are set, by name (the keyword arguments of load_cluster)."""
        return {k: getattr(self, k) for k in self.__struct_fields__
                if k not in ("profile", "nodes") and getattr(self, k) is not None}


class DegradeItem(Section, kw_only=True):
    """One slow or failed link, for a what-if (per-rank mode)."""

    link: Annotated[Literal["nvlink", "nic"], Meta(description="'nvlink' (of a GPU) or 'nic' (of a node)")]
    gpu: Annotated[int, Meta(ge=0, lt=MAX_GPUS, description="nvlink: the GPU's global rank")] | None = None
    node: Annotated[int, Meta(ge=0, lt=MAX_GPUS, description="nic: the node")] | None = None
    index: Annotated[int, Meta(ge=0, le=1024, description="which of the GPU's NVLinks / the node's NICs")] = 0
    factor: Annotated[float, Meta(ge=0, le=1, description="bandwidth multiplier: 0.5 = half speed, 0 = failed")]

    def __post_init__(self) -> None:  # target given
        super().__post_init__()
        if self.link == "nvlink" and self.gpu is None:
            raise ValueError("an nvlink degradation needs gpu: <global rank>")
        if self.link == "nic" and self.node is None:
            raise ValueError("a nic degradation needs node: <node index>")


class FabricSection(Section, kw_only=True):
    """How the network is simulated (zsim.fabric)."""

    mode: Annotated[Literal["auto", "class", "per_rank"], Meta(description=(
        "class: one rank per class (fast); per_rank: every rank and flow; auto: per_rank when links are "
        "degraded, else class"))] = "auto"
    algorithm: Annotated[Literal["auto", "ring", "tree", "hierarchical"], Meta(description=(
        "collective algorithm; auto picks as NCCL's tuner does"))] = "auto"
    degrade: Annotated[list[DegradeItem], Meta(max_length=MAX_DEGRADE, description=(
        "slow or failed links (per_rank)"))] = field(default_factory=list)
    sm_contention: Annotated[bool, Meta(description=(
        "collectives beside compute hold SMs (NCCL: a CTA per channel; DeepEP: 20; Transformer Engine's "
        "userbuffers: 16, or 1 for ring exchange) and the compute stream runs on the SMs left "
        "(zsim.engine.sm_share); class mode on GPUs"))] = False


class RunSection(Section, kw_only=True):
    """How to run the simulation."""

    _STRIP = ("output",)

    steps: Annotated[int, Meta(gt=0, le=MAX_STEPS, description="optimizer steps to simulate")] = 1
    output: Annotated[Text, Meta(description="output folder, relative and inside the working folder (no '..'); "
                                 "default out/<scenario name>; -o writes anywhere")] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        # As `name`, which becomes out/<safe name> (issue 13): a scenario file, perhaps from elsewhere,
        # must not write outside the folder zsim runs in; the person at the command line can (-o).
        if self.output is not None:
            parts = self.output.replace("\\", "/").split("/")
            if not self.output.strip() or self.output.startswith(("/", "~")) or ".." in parts:
                raise ValueError(f"output {self.output[:80]!r}: a folder inside the working folder, without '..' "
                                 "(write elsewhere with -o DIR)")


class ScenarioFile(Section, kw_only=True):
    """A whole scenario file."""

    _STRIP = ("name", "description")

    name: Annotated[Name, Meta(description=(
        "scenario name; default the file's stem (control characters removed)"))] | None = None
    description: Annotated[Text, Meta(description="free text shown in the summary")] | None = None
    model: ModelSection
    parallel: ParallelSection
    zero: ZeroSection
    precision: PrecisionSection = field(default_factory=PrecisionSection)
    hardware: HardwareSection
    fabric: FabricSection = field(default_factory=FabricSection)
    run: RunSection = field(default_factory=RunSection)


# Declared draft: what msgspec writes for these models (type, enum, anyOf, required, numeric
# exclusiveMinimum, additionalProperties, and $ref to "#/$defs/..." JSON pointers) is valid draft-07,
# which the VS Code YAML extension (yaml-language-server) supports fully; it warns that 2020-12 is
# "not yet fully supported" (redhat-developer/vscode-yaml#726). tests/test_schema_command.py validates
# the shipped scenarios with both draft-07 and 2020-12 validators.
JSON_SCHEMA_DRAFT = "http://json-schema.org/draft-07/schema#"


def scenario_json_schema() -> dict:
    """The JSON Schema of a scenario file, generated from ScenarioFile (for editors: docs/models.md):
    msgspec's schema with the root model inline, as editors expect, and the model section's shape
    keys required unless from_hf supplies them."""
    import msgspec

    schema = msgspec.json.schema(ScenarioFile)
    defs = schema.get("$defs", {})
    for section in defs.values():  # an optional key's description, from inside its anyOf, to the key
        for prop in section.get("properties", {}).values():
            described = [m for m in prop.get("anyOf", ()) if "description" in m]
            if described and "description" not in prop:
                prop["description"] = described[0].pop("description")
    root = defs.pop("ScenarioFile")
    model_json_schema(defs["ModelSection"])
    # model.moe's experts and top_k may come from from_hf (a Mixtral config.json): the loader checks them
    defs["MoeSection"].pop("required", None)
    return {"$schema": JSON_SCHEMA_DRAFT, "title": "zsim scenario",
            **{k: v for k, v in root.items() if k != "title"}, "$defs": defs}
