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


# The keys a Hugging Face config.json can supply (zsim/config/hf.py); without from_hf they are required.
HF_SHAPE_KEYS = ("layers", "hidden", "heads", "seq_len", "vocab")


def _model_json_schema(schema: dict, _cls: type) -> None:
    """JSON Schema of the model section: the shape keys are required unless from_hf supplies them."""
    schema["required"] = [k for k in schema.get("required", []) if k not in HF_SHAPE_KEYS]
    schema["anyOf"] = [{"required": ["from_hf"]}, {"required": list(HF_SHAPE_KEYS)}]


class ModelSection(Section):
    """A decoder-only transformer. The defaults are GPT's (Megatron-LM, the ZeRO paper); the shape
    options describe LLaMA, Mistral, Qwen2 and GPT-NeoX too, and `from_hf` reads them from a Hugging
    Face config.json (docs/models.md has the formulas and the mapping)."""

    model_config = ConfigDict(json_schema_extra=_model_json_schema)

    layers: int = Field(gt=0, le=MAX_LAYERS, description="number of transformer blocks L")
    hidden: int = Field(gt=0, le=MAX_HIDDEN, description="hidden size h")
    heads: int = Field(gt=0, le=MAX_HIDDEN, description="attention (query) heads a; must divide hidden")
    seq_len: int = Field(gt=0, le=MAX_SEQ, description="sequence length s, tokens")
    vocab: int = Field(gt=0, le=MAX_VOCAB, description="vocabulary size V (padded to a multiple of vocab_padding × mp)")
    micro_batch: int = Field(gt=0, le=MAX_BATCH, description="sequences per GPU per forward/backward pass")
    global_batch: int | None = Field(default=None, gt=0, le=MAX_BATCH, description="sequences per optimizer step")
    grad_accum: int | None = Field(default=None, gt=0, le=MAX_ACCUM, description="micro-batches per optimizer step")
    # Shape options (docs/models.md); each default is the GPT shape.
    ffn_hidden: int | None = Field(default=None, gt=0, le=MAX_HIDDEN, description="MLP inner width f (HF intermediate_size); "
                                   "default 4 × hidden")
    gated_mlp: bool = Field(default=False, description="gated MLP (SwiGLU, LLaMA): gate and up projections "
                            "h×f, down f×h; false: two matmuls h×f and f×h with GeLU between (GPT)")
    kv_heads: int | None = Field(default=None, gt=0, le=MAX_HIDDEN, description="key/value heads (grouped-query attention; "
                                 "1 = multi-query); must divide heads; default heads")
    tied_head: bool = Field(default=True, description="the LM head reuses the word embedding (GPT-2, Megatron-LM); "
                            "false: its own vocab × hidden matrix (LLaMA, Mistral, GPT-NeoX)")
    linear_bias: bool = Field(default=True, description="biases on the attention output projection and the "
                              "MLP's linears (false for LLaMA, Mistral, Qwen2)")
    qkv_bias: bool | None = Field(default=None, description="biases on the Q, K and V projections; default "
                                  "linear_bias (Qwen2: true while linear_bias is false)")
    norm: Literal["layernorm", "rmsnorm"] = Field(default="layernorm", description="layernorm: weight and bias "
                                                  "(2h per norm); rmsnorm: weight only (h)")
    position: Literal["learned", "rotary"] = Field(default="learned", description="learned: a table of "
                                                   "max_positions × hidden parameters; rotary: RoPE, no parameters")
    max_positions: int | None = Field(default=None, gt=0, le=MAX_SEQ, description="rows of the learned position table "
                                      "(HF n_positions); default seq_len")
    vocab_padding: int | None = Field(default=None, gt=0, le=MAX_VOCAB, description="pad vocab to a multiple of vocab_padding × mp "
                                      "(Megatron-LM make_vocab_size_divisible_by); default 128, or 1 with from_hf "
                                      "(the checkpoint's vocabulary, padded only as far as MP needs)")
    dropout: bool = Field(default=True, description="dropout on the attention probabilities and the residual "
                          "branches, whose masks backward keeps (Korthikanti et al. 2022); false for models "
                          "trained without (LLaMA, Mistral, Qwen2, GPT-NeoX-20B)")
    from_hf: Text | None = Field(default=None, description="a Hugging Face config.json (or the folder holding "
                                "one) giving the shape; keys written here override it; a relative path is "
                                "relative to the scenario file")

    @model_validator(mode="after")
    def _shape_is_consistent(self) -> ModelSection:
        if self.hidden % self.heads:
            raise ValueError(f"hidden {self.hidden} is not divisible by heads {self.heads}")
        if self.kv_heads is not None and (self.kv_heads > self.heads or self.heads % self.kv_heads):
            raise ValueError(f"kv_heads {self.kv_heads} must divide heads {self.heads} (each KV head serves "
                             "heads / kv_heads query heads)")
        if self.position == "rotary" and (self.hidden // self.heads) % 2:
            raise ValueError(f"rotary positions rotate pairs of a head's dimensions, but hidden {self.hidden} / "
                             f"heads {self.heads} = {self.hidden // self.heads} is odd")
        if self.position == "rotary" and self.max_positions is not None:
            raise ValueError(f"max_positions {self.max_positions} sizes a learned position table, but position "
                             "is rotary (no table)")
        if self.max_positions is not None and self.max_positions < self.seq_len:
            raise ValueError(f"seq_len {self.seq_len} is longer than the {self.max_positions} rows of the learned "
                             "position table (max_positions)")
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


# Declared draft: what pydantic writes for these models (type, enum, anyOf, required, numeric
# exclusiveMinimum, additionalProperties, and $ref to "#/$defs/..." JSON pointers) is valid draft-07,
# which the VS Code YAML extension (yaml-language-server) supports fully; it warns that 2020-12 is
# "not yet fully supported" (redhat-developer/vscode-yaml#726). tests/test_schema_command.py validates
# the shipped scenarios with both draft-07 and 2020-12 validators.
JSON_SCHEMA_DRAFT = "http://json-schema.org/draft-07/schema#"


def scenario_json_schema() -> dict:
    """The JSON Schema of a scenario file, generated from ScenarioFile (for editors: docs/models.md)."""
    schema = ScenarioFile.model_json_schema()
    return {"$schema": JSON_SCHEMA_DRAFT, "title": "zsim scenario", **{k: v for k, v in schema.items() if k != "title"}}
