"""The scenario schema: one pydantic model per YAML section, each field documented.

Only per-field and per-section checks live here; checks that need the hardware profile (does the
layout match the cluster?) live in `zsim.config.scenario`, which builds the validated `Scenario`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Section(BaseModel):
    """A YAML section: unknown keys are errors, values are not coerced (a "12" is not 12)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class ModelSection(Section):
    """A GPT-style decoder-only transformer (the shape Megatron-LM and the ZeRO paper use)."""

    layers: int = Field(gt=0, description="number of transformer blocks")
    hidden: int = Field(gt=0, description="hidden size h")
    heads: int = Field(gt=0, description="attention heads a; must divide hidden")
    seq_len: int = Field(gt=0, description="sequence length s, tokens")
    vocab: int = Field(gt=0, description="vocabulary size V (padded for MP, as Megatron-LM does)")
    micro_batch: int = Field(gt=0, description="sequences per GPU per forward/backward pass")
    global_batch: int | None = Field(default=None, gt=0, description="sequences per optimizer step")
    grad_accum: int | None = Field(default=None, gt=0, description="micro-batches per optimizer step")
    tied_head: bool = Field(default=True, description="the LM head computes its logits with the word embedding's "
                            "weight (Megatron-LM, GPT-2); false: the head has its own V x h weight")

    @model_validator(mode="after")
    def _heads_divide_hidden(self) -> ModelSection:
        if self.hidden % self.heads:
            raise ValueError(f"hidden {self.hidden} is not divisible by heads {self.heads}")
        return self


class ParallelSection(Section):
    """The parallel layout: world size = dp × mp. MP is Megatron-style tensor parallelism in a node."""

    dp: int = Field(gt=0, description="data-parallel degree Nd (ZeRO partitions across it)")
    mp: int = Field(default=1, gt=0, description="model (tensor) parallel degree, inside one node")


class ZeroSection(Section):
    """ZeRO-DP stage and ZeRO-R options (paper §5 and §6)."""

    stage: Literal[0, 1, 2, 3] = Field(description="0: plain DP, 1: Pos, 2: Pos+g, 3: Pos+g+p")
    activation_checkpointing: bool = Field(default=True, description="keep one input per layer, recompute in backward")
    checkpoint_every: int = Field(
        default=1, gt=0, description="with checkpointing: keep one checkpoint every k layers and recompute k "
        "layers at a time in backward (Megatron-LM checkpoint_num_layers; Chen et al. 2016)")
    reduce_bucket_elements: int = Field(
        default=500_000_000, gt=0, description="gradient elements per reduction bucket (DeepSpeed reduce_bucket_size); "
        "the constant buffer size when constant_buffers is true"
    )
    prefetch_layers: int = Field(default=1, ge=0, description="stage 3: layers gathered ahead of the one computing")
    # ZeRO-R options (paper §6; docs/memory.md).
    partition_activations: bool = Field(default=False, description="Pa: checkpoints partitioned across the MP group, "
                                        "all-gathered before recompute (§6.1)")
    cpu_offload_activations: bool = Field(default=False, description="Pa+cpu: partitioned checkpoints kept in host "
                                          "memory, copied over the host link (§6.1); needs partition_activations")
    # CB defaults to true because DeepSpeed always reduces in constant-size buckets (reduce_bucket_size);
    # false models the fused whole-model buffers of §3.2 (the baseline the paper measures against).
    constant_buffers: bool = Field(default=True, description="CB: gradient reductions and stage 3's fp32 gradients "
                                   "use buffers of reduce_bucket_elements; false: one fused fp32 buffer of 4Ψ (§3.2, §6.2)")
    defragment: bool = Field(default=False, description="MD: checkpoints and gradients live in pre-allocated "
                             "contiguous buffers, outside the caching allocator (§6.3)")


class PrecisionSection(Section):
    """fp16/bf16 mixed precision (fp32 master weights and Adam, K = 12) or plain fp32 training (K = 8)."""

    dtype: Literal["fp16", "bf16", "fp32"] = Field(default="fp16", description="parameter, gradient and "
                                                   "activation dtype; fp32 means no 16-bit copy and no master copy")
    optimizer: Literal["adam"] = Field(default="adam", description="Adam: fp32 master, momentum, variance")


class HardwareSection(Section):
    """The cluster: a system profile from hwprofiles/ and how many of its nodes."""

    profile: str = Field(description="name of a file hwprofiles/<profile>.yaml, e.g. dgx2")
    nodes: int = Field(gt=0, description="number of nodes")


class DegradeItem(Section):
    """One slow or failed link, for a what-if (per-rank mode)."""

    link: Literal["nvlink", "nic"] = Field(description="'nvlink' (of a GPU) or 'nic' (of a node)")
    gpu: int | None = Field(default=None, ge=0, description="nvlink: the GPU's global rank")
    node: int | None = Field(default=None, ge=0, description="nic: the node")
    index: int = Field(default=0, ge=0, description="which of the GPU's NVLinks / the node's NICs")
    factor: float = Field(ge=0, le=1, description="bandwidth multiplier: 0.5 = half speed, 0 = failed")

    @model_validator(mode="after")
    def _target_given(self) -> DegradeItem:
        if self.link == "nvlink" and self.gpu is None:
            raise ValueError("an nvlink degradation needs gpu: <global rank>")
        if self.link == "nic" and self.node is None:
            raise ValueError("a nic degradation needs node: <node index>")
        return self


class FabricSection(Section):
    """How the network is simulated (zsim.fabric)."""

    mode: Literal["auto", "class", "per_rank"] = Field(
        default="auto", description="class: one rank per class (fast); per_rank: every rank and flow; "
        "auto: per_rank when links are degraded, else class")
    algorithm: Literal["auto", "ring", "tree", "hierarchical"] = Field(
        default="auto", description="collective algorithm; auto picks as NCCL's tuner does")
    degrade: list[DegradeItem] = Field(default_factory=list, description="slow or failed links (per_rank)")


class RunSection(Section):
    """How to run the simulation."""

    steps: int = Field(default=1, gt=0, description="optimizer steps to simulate")
    output: str | None = Field(default=None, description="output folder; default out/<scenario name>")


class ScenarioFile(Section):
    """A whole scenario file."""

    name: str | None = Field(default=None, description="scenario name; default the file's stem")
    description: str | None = Field(default=None, description="free text shown in the summary")
    model: ModelSection
    parallel: ParallelSection
    zero: ZeroSection
    precision: PrecisionSection = PrecisionSection()
    hardware: HardwareSection
    fabric: FabricSection = FabricSection()
    run: RunSection = RunSection()
