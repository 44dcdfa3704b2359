"""The validated description of one traced run (`RunConfig`) and how it is read from a YAML file.

`--model` names either a scenario YAML (its `model:` section is used, and its `zero:` and
`precision:` sections give defaults) or a YAML file holding only the model keys. The model shape is
the simulator's own `ModelSection`, validated by the same code, so both halves read one schema.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import msgspec

from zsim.config.hf import resolve_from_hf
from zsim.config.model_section import ModelSection
from zsim.config.schema import ParallelSection, PrecisionSection, ScenarioFile, ZeroSection
from zsim.config.struct import dump
from zsim.config.validation import validate
from zsim.config.yamlfile import read_yaml_mapping
from zsim.errors import ConfigError, short
from zsim.parallel.pipeline import SCHEDULES, split_layers
from zsim.workload.transformer import mp_problems

MAX_RANKS = 1024  # processes on one machine (one per GPU, or CPU processes)
MAX_STEPS = 1_000_000

PRECISIONS = ("fp32", "fp16", "bf16")
_ZERO_DEFAULTS = {f.name: f.default for f in msgspec.structs.fields(ZeroSection)}
DEFAULT_BUCKET_ELEMENTS = _ZERO_DEFAULTS["reduce_bucket_elements"]
DEFAULT_ALLGATHER_ELEMENTS = _ZERO_DEFAULTS["allgather_bucket_elements"]


class _ScenarioView(msgspec.Struct, frozen=True, kw_only=True):
    """The parts of a scenario file the runtime reads; its other sections (unknown keys here, ignored)
    are the simulator's."""

    model: ModelSection
    zero: ZeroSection | None = None
    precision: PrecisionSection | None = None
    parallel: ParallelSection | None = None


@dataclass(frozen=True, kw_only=True)
class ModelDefaults:
    """A model file read from disk: the shape, and the run options a scenario file suggests."""

    model: ModelSection
    stage: int | None = None  # scenario zero.stage
    precision: str | None = None  # scenario precision.dtype
    checkpointing: bool | None = None  # scenario zero.activation_checkpointing
    bucket_elements: int | None = None  # scenario zero.reduce_bucket_elements
    allgather_bucket_elements: int | None = None  # scenario zero.allgather_bucket_elements
    prefetch_layers: int | None = None  # scenario zero.prefetch_layers


def read_model_file(path: str | Path) -> ModelDefaults:
    """Read a scenario YAML or a model-only YAML (its `from_hf` read relative to the file).

    Raises:
        ConfigError: missing file, bad YAML, unknown or invalid model keys (naming the dotted key), a
            from_hf config that cannot be imported.
    """
    path = Path(path)
    data = read_yaml_mapping(path)
    if "model" not in data:  # a file of model keys only
        data = resolve_from_hf({"model": data}, source=str(path), base_dir=path.parent)["model"]
        return ModelDefaults(model=validate(ModelSection, data, str(path)))  # type: ignore[arg-type]
    data = resolve_from_hf(data, source=str(path), base_dir=path.parent)
    # the whole scenario as `zsim run` reads it (an unknown section or key is an error here too), then the
    # parts the runtime uses
    validate(ScenarioFile, data, str(path))
    view: _ScenarioView = validate(_ScenarioView, data, str(path))  # type: ignore[assignment]
    zero = view.zero
    if view.precision is not None and not view.precision.master_weights:
        # the runtime's mixed precision always keeps the fp32 master and Adam (runtime/zero/): a trace of it
        # would calibrate another optimizer than the one asked for
        raise ConfigError("false (pure bf16 training) is not what the runtime trains: it keeps an fp32 master "
                          "copy and fp32 Adam states; `zsim run` simulates it, but it cannot be traced yet",
                          source=str(path), path="precision.master_weights")
    if zero is not None and zero.activation_checkpointing and zero.recompute_granularity != "full":
        # the runtime checkpoints whole blocks (runtime/model.py): a trace of full recompute would calibrate
        # another schedule than the selective one asked for (zero.recompute_modules included)
        raise ConfigError("selective: the runtime recomputes whole blocks (full granularity) and does not "
                          "build selective recompute; `zsim run` simulates it, but it cannot be traced yet",
                          source=str(path), path="zero.recompute_granularity")
    if view.parallel is not None and view.parallel.cp > 1:
        # the runtime's ranks each run whole sequences: a trace without the keys' and values' ring would calibrate
        # another schedule than the one asked for
        raise ConfigError(f"{view.parallel.cp}: the runtime does not build context parallelism; `zsim run` simulates "
                          "it, but it cannot be traced yet", source=str(path), path="parallel.cp")
    if view.parallel is not None and view.parallel.pp > 1 and view.parallel.rank_order != "tp-cp-dp-pp":
        # the runtime numbers its pipeline's ranks in Megatron's default order (zsim.parallel.pipeline.pipeline_rank):
        # a trace of it would calibrate other groups than the ones asked for
        raise ConfigError(f"{view.parallel.rank_order}: the runtime lays its pipeline out in the default order "
                          "(tp-cp-dp-pp); `zsim run` simulates the other, but it cannot be traced yet", source=str(path),
                          path="parallel.rank_order")
    return ModelDefaults(
        model=view.model,
        stage=zero.stage if zero else None,
        # A scenario always trains in mixed precision (PrecisionSection defaults to fp16).
        precision=(view.precision or PrecisionSection()).dtype,
        checkpointing=zero.activation_checkpointing if zero else None,
        bucket_elements=zero.reduce_bucket_elements if zero else None,
        allgather_bucket_elements=zero.allgather_bucket_elements if zero else None,
        prefetch_layers=zero.prefetch_layers if zero else None,
    )


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """One traced training run, validated at construction (`ConfigError` names the option)."""

    model: ModelSection  # the model shape and batch (micro_batch, global_batch, grad_accum)
    stage: int  # ZeRO-DP stage: 0 plain DP, 1 Pos, 2 Pos+g, 3 Pos+g+p
    precision: str  # "fp32", "fp16" (dynamic loss scaling) or "bf16"; fp32 master + Adam when mixed
    world_size: int  # ranks (processes); dp = world_size / (mp x pp)
    out_dir: str  # where rank<R>.trace.json and friends are written
    mp: int = 1  # Megatron-style tensor-parallel degree (consecutive ranks form an MP group)
    # Pipeline parallelism (docs/runtime.md "Pipeline parallelism"): pp stages, Megatron's rank order
    # (tp fastest, then dp, then pp: zsim.parallel.pipeline.pipeline_rank); the micro-batches of a step
    # are grad_accum's
    pp: int = 1
    pipeline_schedule: str = "1f1b"  # one of zsim.parallel.pipeline.SCHEDULES
    virtual_stages: int = 1  # model chunks per stage (interleaved only)
    pp_layers: tuple[int, ...] = ()  # a stated uneven split: layers per virtual stage; () = even
    steps: int = 5  # optimizer steps
    grad_accum: int | None = None  # micro-batches per step; None: from the model section, else 1
    seed: int = 0  # model initialisation and data
    checkpointing: bool = False  # activation checkpointing per transformer block
    bucket_elements: int = DEFAULT_BUCKET_ELEMENTS  # gradient elements per reduction bucket (stages 0-3; stage 1: interval)
    allgather_bucket_elements: int = DEFAULT_ALLGATHER_ELEMENTS  # stage 2: elements per all-gather after the step
    prefetch_layers: int = 1  # stage 3: layers gathered ahead of the one computing (0 or 1)
    lr: float = 1e-3  # Adam learning rate
    device: str = "auto"  # "auto" (cuda + nccl if GPUs exist, else cpu + gloo), "cpu" or "cuda"
    profile: bool = False  # also write a PyTorch profiler (Kineto) trace per rank
    save_params: bool = False  # testing aid: write rank<R>.params.pt, this rank's parameters after the run
    fail_rank: int | None = None  # testing aid: this rank raises at step fail_at_step
    fail_at_step: int | None = None
    # CUDA: torch.cuda.set_per_process_memory_fraction, a cap on what the caching allocator may reserve
    # (the device check pushes a run to the allocator's limit with it, to price a cache flush)
    cuda_memory_fraction: float | None = None
    # CUDA: record the caching allocator's history block by block (runtime/memory_history.py) into
    # rank<R>.memory_history.json.gz; ignored on CPU (no caching allocator), which the summary says
    cuda_memory_history: bool = False

    def __post_init__(self) -> None:
        def fail(key: str, message: str) -> None:
            raise ConfigError(message, path=key)

        for name, kind in (("stage", int), ("world_size", int), ("mp", int), ("steps", int), ("seed", int),
                           ("bucket_elements", int), ("allgather_bucket_elements", int), ("prefetch_layers", int), ("checkpointing", bool),
                           ("profile", bool), ("save_params", bool), ("cuda_memory_history", bool), ("lr", float), ("precision", str), ("device", str), ("out_dir", str)):
            value = getattr(self, name)
            # bool is an int in Python: `stage: true` must not become stage 1; an int lr is fine.
            if isinstance(value, bool) != (kind is bool) or not isinstance(value, (int, float) if kind is float else kind):
                fail(name, f"expected {kind.__name__} (got {short(value)})")
        if isinstance(self.pp_layers, list):  # from config.json
            object.__setattr__(self, "pp_layers", tuple(self.pp_layers))
        for name, kind in (("pp", int), ("virtual_stages", int), ("pipeline_schedule", str), ("pp_layers", tuple)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, kind) or (
                    kind is tuple and not all(isinstance(n, int) and not isinstance(n, bool) for n in value)):
                fail(name, f"expected {'a list of integers' if kind is tuple else kind.__name__} (got {short(value)})")
        for name in ("grad_accum", "fail_rank", "fail_at_step"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                fail(name, f"expected an integer (got {short(value)})")
        if not self.out_dir.strip():
            fail("output", "expected a folder name (got '')")
        if self.stage not in (0, 1, 2, 3):
            fail("stage", f"must be 0, 1, 2 or 3 (got {self.stage!r})")
        if self.precision not in PRECISIONS:
            fail("precision", f"must be one of {', '.join(PRECISIONS)} (got {self.precision!r})")
        if not 1 <= self.world_size <= MAX_RANKS:
            fail("ranks", f"must be 1 to {MAX_RANKS} (got {self.world_size})")
        if self.mp < 1 or self.world_size % self.mp:
            fail("mp", f"{self.mp} must be >= 1 and divide the {self.world_size} ranks")
        self._check_pipeline(fail)
        self._check_model_options(fail)
        for key, message in mp_problems(self.model, self.mp):  # the simulator's rule (Megatron's)
            fail(key, message)
        if not 1 <= self.steps <= MAX_STEPS:
            fail("steps", f"must be 1 to {MAX_STEPS:,} (got {self.steps})")
        if self.grad_accum is not None and not 1 <= self.grad_accum <= 1_000_000:
            fail("grad_accum", f"must be 1 to 1,000,000 (got {self.grad_accum})")
        if self.seed < 0:
            fail("seed", f"must be >= 0 (got {self.seed})")
        if self.fail_at_step is not None and not 0 <= self.fail_at_step < self.steps:
            fail("fail_at_step", f"must be a step of the run, 0 to {self.steps - 1} (got {self.fail_at_step}): "
                 "it would never fire")
        if self.bucket_elements < 1:
            fail("bucket_elements", f"must be >= 1 (got {self.bucket_elements})")
        if self.allgather_bucket_elements < 1:
            fail("allgather_bucket_elements", f"must be >= 1 (got {self.allgather_bucket_elements})")
        if self.prefetch_layers not in (0, 1):
            fail("prefetch_layers", f"the runtime prefetches 0 or 1 layer ahead (got {self.prefetch_layers})")
        if not (math.isfinite(self.lr) and 0 < self.lr <= 1e3):
            fail("lr", f"must be a finite number > 0 (got {short(self.lr)})")
        if self.device not in ("auto", "cpu", "cuda"):
            fail("device", f"must be auto, cpu or cuda (got {self.device!r})")
        if self.cuda_memory_fraction is not None and (
                isinstance(self.cuda_memory_fraction, bool) or not isinstance(self.cuda_memory_fraction, (int, float))
                or not (math.isfinite(self.cuda_memory_fraction) and 0 < self.cuda_memory_fraction <= 1)):
            fail("cuda_memory_fraction", f"must be a number in (0, 1] (got {short(self.cuda_memory_fraction)})")
        if (self.fail_rank is None) != (self.fail_at_step is None):
            fail("fail_rank", "--fail-rank and --fail-at-step go together")
        if self.fail_rank is not None and not 0 <= self.fail_rank < self.world_size:
            fail("fail_rank", f"{self.fail_rank} is not a rank of {self.world_size}")
        _ = self.accum  # raises ConfigError when the batch arithmetic does not work

    def _check_model_options(self, fail) -> None:
        """Refuse the model options the simulator prices but this runtime's GPT does not build (runtime/model.py),
        naming the key: a trace of another model than the one asked for would calibrate the wrong thing."""
        m = self.model
        unbuilt = [
            ("model.moe", m.moe is not None, "mixture-of-experts MLPs"),
            ("model.mla", m.mla is not None, "multi-head latent attention"),
            ("model.mtp_layers", getattr(m, "mtp_layers", 0) > 0, "multi-token prediction layers"),
            ("model.head_dim", m.head_dim is not None and m.head_dim * m.heads != m.hidden,
             "a head width other than hidden / heads"),
            ("model.position", m.position == "alibi", "ALiBi positions"),
            ("model.norm", m.norm not in ("layernorm", "rmsnorm"), f"{m.norm} norms"),
            ("model.layer_norms", m.layer_norms != 2, f"{m.layer_norms} norms per block"),
            ("model.qk_norm", m.qk_norm != "none", "query/key norms"),
            ("model.sliding_window", m.sliding_window is not None, "sliding-window attention"),
            ("model.embedding_norm", bool(getattr(m, "embedding_norm", False)), "a norm after the embedding"),
            ("model.loss", getattr(m, "loss", "megatron") != "megatron",
             f"the {getattr(m, 'loss', 'megatron')} cross-entropy (it runs Megatron's fp32 one)"),
        ]
        for key, used, what in unbuilt:
            if used:
                fail(key, f"the runtime does not build {what} (runtime/model.py builds GPT, LLaMA, Mistral and "
                          "Qwen2 shapes); `zsim run` simulates this model, but it cannot be traced yet")

    def _check_pipeline(self, fail) -> None:
        """The pipeline keys as a whole (after mp): world = mp x dp x pp, ZeRO stage 0 or 1, a known
        schedule, chunks only interleaved, the layers split over the virtual stages (evenly, or as
        pp_layers states). The interleaved schedule's m % p rule is checked with the batch (`accum`)."""
        if not 1 <= self.pp <= MAX_RANKS or self.world_size % (self.mp * self.pp):
            fail("pp", f"{self.pp}: ranks {self.world_size} must be mp {self.mp} x dp x pp {self.pp} "
                       f"(mp x pp = {self.mp * self.pp} does not divide {self.world_size})")
        if self.pipeline_schedule not in SCHEDULES:
            fail("pipeline_schedule", f"must be one of {', '.join(SCHEDULES)} (got {self.pipeline_schedule!r})")
        if self.virtual_stages < 1 or (self.virtual_stages > 1 and self.pipeline_schedule != "interleaved"):
            fail("virtual_stages", f"{self.virtual_stages}: more than 1 model chunk per stage needs "
                                   "--pipeline-schedule interleaved")
        if self.pp > 1 and self.stage >= 2:
            # DeepSpeed's PipelineEngine refuses ZeRO-2/3: deepspeed/runtime/pipe/engine.py
            # PipelineEngine.__init__ asserts `self.zero_optimization_stage() < 2` ("ZeRO-2 and ZeRO-3 are
            # incompatible with pipeline parallelism"; later releases spell it `< ZeroStageEnum.gradients`).
            # Megatron's distributed optimizer with PP is ZeRO-1 too.
            fail("stage", f"ZeRO stage {self.stage} with pp {self.pp}: pipeline parallelism runs with ZeRO "
                          "stage 0 or 1 only (DeepSpeed's pipeline engine refuses stages 2 and 3)")
        if self.pp_layers and self.pp == 1:
            fail("pp_layers", "an uneven layer split needs pp > 1")
        try:
            split_layers(self.model.layers, self.pp, self.virtual_stages, self.pp_layers)
        except ValueError as exc:
            fail("pp_layers" if self.pp_layers else "pp", f"{exc} (model.layers {self.model.layers}, pp {self.pp}, "
                 f"virtual_stages {self.virtual_stages})")

    @property
    def dp(self) -> int:
        """Data-parallel degree Nd: the ranks ZeRO partitions across (those of one stage and MP rank)."""
        return self.world_size // (self.mp * self.pp)

    @property
    def accum(self) -> int:
        """Micro-batches per optimizer step: --grad-accum, else model.grad_accum, else from
        model.global_batch = micro_batch x dp x grad_accum, else 1.

        Raises:
            ConfigError: global_batch does not split into micro-batches on this many ranks.
        """
        m = self.model
        accum = self.grad_accum or m.grad_accum
        per_accum = m.micro_batch * self.dp
        if m.global_batch is not None:
            if accum is None:
                if m.global_batch % per_accum:
                    raise ConfigError(f"{m.global_batch} is not a multiple of micro_batch {m.micro_batch} x dp "
                                      f"{self.dp} = {per_accum}", path="model.global_batch")
                accum = m.global_batch // per_accum
            elif m.global_batch != per_accum * accum:
                raise ConfigError(f"{m.global_batch} != micro_batch {m.micro_batch} x dp {self.dp} x grad_accum "
                                  f"{accum} = {per_accum * accum}", path="model.global_batch")
        accum = accum or 1
        if self.pp > 1 and self.pipeline_schedule == "interleaved" and accum % self.pp:
            # Megatron-LM's interleaved schedule needs m a multiple of p (zsim.parallel.pipeline)
            raise ConfigError(f"the interleaved schedule needs the micro-batches per step ({accum}) to be a multiple "
                              f"of pp {self.pp}", path="grad_accum")
        return accum

    @property
    def global_batch(self) -> int:
        """Sequences per optimizer step."""
        return self.model.micro_batch * self.dp * self.accum

    def to_json(self) -> str:
        data = asdict(self)
        data["model"] = dump(self.model)
        return json.dumps(data, indent=1)

    @classmethod
    def from_json(cls, text: str, source: str = "config.json") -> RunConfig:
        """The RunConfig written by `to_json` (a run folder's config.json).

        Raises:
            ConfigError: not JSON, not an object, unknown or missing keys, or invalid values.
        """
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as exc:
            raise ConfigError(f"not valid JSON: {str(exc)[:100]}", source=source) from None
        if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
            raise ConfigError("expected a run configuration object with a `model` object", source=source)
        known = {f.name for f in fields(cls)}
        unknown = sorted(str(k)[:40] for k in data if k not in known)
        missing = sorted(f.name for f in fields(cls) if f.name not in data and f.name in ("stage", "precision",
                                                                                           "world_size", "out_dir"))
        if unknown or missing:
            raise ConfigError(f"unknown keys {', '.join(unknown)}" if unknown else f"missing keys {', '.join(missing)}",
                              source=source)
        data["model"] = validate(ModelSection, data["model"], f"{source}: model")
        try:
            return cls(**data)
        except ConfigError as exc:
            raise ConfigError(str(exc), source=source) from None
