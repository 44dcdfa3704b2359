"""The scenario schema: one pydantic model per YAML section, each field documented.

Only per-field and per-section checks live here; checks that need the hardware profile (does the
layout match the cluster?) live in `zsim.config.scenario`, which builds the validated `Scenario`.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

# Upper bounds (issue 13): far above any real training run, low enough that the closed-form checks
# and the per-layer workload stay cheap and no product overflows a float. Ψ of the largest bound
# model is ~12·L·h² = 12 · 1e5 · (1e6)² ≈ 1e18 parameters: still finite and still "does not fit".
MAX_LAYERS = 100_000
MAX_HIDDEN = 1_000_000
MAX_SEQ = 100_000_000  # 1e8 tokens: beyond any published context length
MAX_VOCAB = 100_000_000
MAX_BATCH = 100_000_000  # sequences (micro_batch, global_batch)
MAX_ACCUM = 1_000_000
MAX_GPUS = 1 << 24  # dp, nodes (16.7M GPUs)
MAX_MP = 1024
MAX_ELEMENTS = 1 << 50  # reduce_bucket_elements
MAX_STEPS = 1000  # simulated optimizer steps: each step is simulated in full
MAX_DEGRADE = 10_000  # degraded links listed

_PROFILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,99}")


def profile_name(value: str) -> str:
    """A profile *name* (issue 13 containment): letters, digits, '.', '_', '+', '-'; no '/', '\\', '..',
    no absolute path. Profiles are looked up by name in the profile folders, never read from a path
    written in a scenario file."""
    if not _PROFILE_NAME.fullmatch(value) or ".." in value:
        raise ValueError("a profile name (letters, digits, '.', '_', '+', '-'), not a path")
    return value


def strip_control(value: str) -> str:
    """Control characters removed (ANSI escapes, NUL), line breaks and tabs made spaces: the text is echoed."""
    return "".join(c if c.isprintable() else " " for c in value if c.isprintable() or c in "\t\n\r")


ProfileName = Annotated[str, Field(max_length=100), AfterValidator(profile_name)]
Name = Annotated[str, Field(min_length=1, max_length=200), AfterValidator(strip_control)]
Text = Annotated[str, Field(max_length=4000), AfterValidator(strip_control)]


class Section(BaseModel):
    """A YAML section: unknown keys are errors, values are not coerced (a "12" is not 12, `true` is not 1,
    2.0 is not 2), floats are finite (no .inf, .nan)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)


class ModelSection(Section):
    """A GPT-style decoder-only transformer (the shape Megatron-LM and the ZeRO paper use)."""

    layers: int = Field(gt=0, le=MAX_LAYERS, description="number of transformer blocks")
    hidden: int = Field(gt=0, le=MAX_HIDDEN, description="hidden size h")
    heads: int = Field(gt=0, le=MAX_HIDDEN, description="attention heads a; must divide hidden")
    seq_len: int = Field(gt=0, le=MAX_SEQ, description="sequence length s, tokens")
    vocab: int = Field(gt=0, le=MAX_VOCAB, description="vocabulary size V (padded for MP, as Megatron-LM does)")
    micro_batch: int = Field(gt=0, le=MAX_BATCH, description="sequences per GPU per forward/backward pass")
    global_batch: int | None = Field(default=None, gt=0, le=MAX_BATCH, description="sequences per optimizer step")
    grad_accum: int | None = Field(default=None, gt=0, le=MAX_ACCUM, description="micro-batches per optimizer step")

    @model_validator(mode="after")
    def _heads_divide_hidden(self) -> ModelSection:
        if self.hidden % self.heads:
            raise ValueError(f"hidden {self.hidden} is not divisible by heads {self.heads}")
        return self


class ParallelSection(Section):
    """The parallel layout: world size = dp × mp. MP is Megatron-style tensor parallelism in a node."""

    dp: int = Field(gt=0, le=MAX_GPUS, description="data-parallel degree Nd (ZeRO partitions across it)")
    mp: int = Field(default=1, gt=0, le=MAX_MP, description="model (tensor) parallel degree, inside one node")


class ZeroSection(Section):
    """ZeRO-DP stage and ZeRO-R options (paper §5 and §6)."""

    stage: int = Field(ge=0, le=3, description="0: plain DP, 1: Pos, 2: Pos+g, 3: Pos+g+p")
    activation_checkpointing: bool = Field(default=True, description="keep one input per layer, recompute in backward")
    checkpoint_every: int = Field(
        default=1, gt=0, le=MAX_LAYERS, description="with checkpointing: keep one checkpoint every k layers and recompute k "
        "layers at a time in backward (Megatron-LM checkpoint_num_layers; Chen et al. 2016)")
    reduce_bucket_elements: int = Field(
        default=500_000_000, gt=0, le=MAX_ELEMENTS, description="gradient elements per reduction bucket (DeepSpeed reduce_bucket_size); "
        "the constant buffer size when constant_buffers is true"
    )
    prefetch_layers: int = Field(default=1, ge=0, le=MAX_LAYERS, description="stage 3: layers gathered ahead of the one computing")
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

    profile: ProfileName = Field(description="name of a system profile (hwprofiles/<profile>.yaml), e.g. dgx2; a name, not a path")
    nodes: int = Field(gt=0, le=MAX_GPUS, description="number of nodes")


class DegradeItem(Section):
    """One slow or failed link, for a what-if (per-rank mode)."""

    link: Literal["nvlink", "nic"] = Field(description="'nvlink' (of a GPU) or 'nic' (of a node)")
    gpu: int | None = Field(default=None, ge=0, lt=MAX_GPUS, description="nvlink: the GPU's global rank")
    node: int | None = Field(default=None, ge=0, lt=MAX_GPUS, description="nic: the node")
    index: int = Field(default=0, ge=0, le=1024, description="which of the GPU's NVLinks / the node's NICs")
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
    degrade: list[DegradeItem] = Field(default_factory=list, max_length=MAX_DEGRADE, description="slow or failed links (per_rank)")


class RunSection(Section):
    """How to run the simulation."""

    steps: int = Field(default=1, gt=0, le=MAX_STEPS, description="optimizer steps to simulate")
    output: Text | None = Field(default=None, description="output folder; default out/<scenario name>")


class ScenarioFile(Section):
    """A whole scenario file."""

    name: Name | None = Field(default=None, description="scenario name; default the file's stem (control characters removed)")
    description: Text | None = Field(default=None, description="free text shown in the summary")
    model: ModelSection
    parallel: ParallelSection
    zero: ZeroSection
    precision: PrecisionSection = PrecisionSection()
    hardware: HardwareSection
    fabric: FabricSection = FabricSection()
    run: RunSection = RunSection()
