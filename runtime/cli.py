"""The options of a traced run, shared by `zsim trace` and `python -m zsim.runtime` (no torch and no
config-model import here: `zsim --help` builds this parser and must stay fast)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from zsim.console.units import positive, positive_float
from zsim.errors import ConfigError

if TYPE_CHECKING:
    from .config import RunConfig

PRECISIONS = ("fp32", "fp16", "bf16")  # runtime.config.PRECISIONS (a test checks they agree)
PIPELINE_SCHEDULES = ("1f1b", "gpipe", "interleaved")  # zsim.parallel.pipeline.SCHEDULES (a test checks)
MAX_RANKS = 1024  # runtime.config.MAX_RANKS
MAX_STEPS = 1_000_000  # runtime.config.MAX_STEPS


def _natural(flag: str):
    """argparse type: a whole number from 0 to 2**62 (seeds, rank and step indices)."""
    def parse(text: str) -> int:
        try:
            value = int(text[:30]) if len(text) <= 30 else -1
        except ValueError:
            value = -1
        if not 0 <= value <= 2**62:
            raise argparse.ArgumentTypeError(f"{flag} {text[:30]!r}: expected a whole number >= 0")
        return value
    return parse


def _layer_counts(text: str) -> tuple[int, ...]:
    """argparse type of --pp-layers: comma-separated whole numbers >= 1 (`3,1`)."""
    try:
        counts = tuple(int(part) for part in text[:2000].split(","))
    except ValueError:
        counts = ()
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"--pp-layers {text[:40]!r}: expected layer counts >= 1 separated by commas")
    return counts


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, metavar="YAML",
                        help="a scenario YAML (its model: section; its zero: and precision: give defaults) "
                             "or a YAML holding only model keys")
    parser.add_argument("--ranks", type=positive("--ranks", MAX_RANKS), default=None, help="processes to spawn (default 2); "
                        "under torchrun, WORLD_SIZE")
    parser.add_argument("--stage", type=int, choices=(0, 1, 2, 3), default=None,
                        help="ZeRO-DP stage (default: the scenario's zero.stage; required for a model-only YAML)")
    parser.add_argument("--steps", type=positive("--steps", MAX_STEPS), default=5, help="optimizer steps (default 5)")
    parser.add_argument("--precision", choices=PRECISIONS, default=None,
                        help="default: the scenario's precision.dtype, fp32 for a model-only YAML")
    parser.add_argument("--checkpointing", action=argparse.BooleanOptionalAction, default=None,
                        help="activation checkpointing per block (default: the scenario's, else off)")
    parser.add_argument("--grad-accum", type=positive("--grad-accum", 1_000_000), default=None,
                        help="micro-batches per step (overrides the model's)")
    parser.add_argument("--bucket-elements", type=positive("--bucket-elements", 1 << 50), default=None,
                        help="gradient elements per bucket (default: the scenario's zero.reduce_bucket_elements, "
                             "else that key's default)")
    parser.add_argument("--allgather-bucket-elements", type=positive("--allgather-bucket-elements", 1 << 50),
                        default=None, help="stage 2: parameter elements per all-gather after the step (default: the "
                        "scenario's zero.allgather_bucket_elements, else that key's default)")
    parser.add_argument("--prefetch", type=int, choices=(0, 1), default=None,
                        help="stage 3: layers gathered ahead (default: the scenario's, else 1)")
    parser.add_argument("--lr", type=positive_float("--lr", 1e3), default=1e-3, help="Adam learning rate (default 1e-3)")
    parser.add_argument("--mp", type=positive("--mp", MAX_RANKS), default=1, help="Megatron-style tensor-parallel degree: consecutive ranks form an MP group (default 1)")
    parser.add_argument("--pp", type=positive("--pp", MAX_RANKS), default=1,
                        help="pipeline-parallel stages (default 1); ranks = mp x dp x pp, Megatron's order (tp fastest, "
                             "then dp, then pp); ZeRO stage 0 or 1")
    parser.add_argument("--pipeline-schedule", choices=PIPELINE_SCHEDULES, default="1f1b",
                        help="with --pp > 1: 1f1b (default), gpipe, or interleaved 1F1B (micro-batches a multiple of pp)")
    parser.add_argument("--virtual-stages", type=positive("--virtual-stages", 1024), default=1,
                        help="interleaved: model chunks per pipeline stage (default 1)")
    parser.add_argument("--pp-layers", type=_layer_counts, default=(), metavar="N,N,...",
                        help="an uneven split: transformer layers per virtual stage, in order (default: even)")
    parser.add_argument("--seed", type=_natural("--seed"), default=0, help="model initialisation and synthetic data seed")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="auto: one rank per GPU with NCCL when GPUs exist, else CPU with gloo")
    parser.add_argument("--torch-profiler", action="store_true",
                        help="also write a PyTorch profiler (Kineto) trace per rank")
    parser.add_argument("--cuda-memory-fraction", type=positive_float("--cuda-memory-fraction", 1.0), default=None,
                        help="CUDA: cap the caching allocator at this share of the GPU's memory "
                             "(torch.cuda.set_per_process_memory_fraction), to run at the allocator's limit")
    parser.add_argument("--cuda-memory-history", action="store_true",
                        help="CUDA: record the caching allocator's history, block by block with its call sites, "
                             "into rank<R>.memory_history.json.gz (torch.cuda.memory._record_memory_history)")
    parser.add_argument("--fail-rank", type=_natural("--fail-rank"), default=None, help="testing aid: this rank raises ...")
    parser.add_argument("--fail-at-step", type=_natural("--fail-at-step"), default=None, help="... at this step (0-based)")
    parser.add_argument("-o", "--output", required=True, metavar="DIR", help="folder for the trace files")
    parser.add_argument("--force", action="store_true",
                        help="replace the traced run already in -o DIR (without it, such a folder is an error)")


def config_from_args(args: argparse.Namespace, *, world_size: int | None = None) -> RunConfig:
    """The validated run. `world_size` (torchrun's WORLD_SIZE) wins over --ranks.

    Raises:
        ConfigError: unreadable model file, invalid model keys, or an invalid option.
    """
    from .config import DEFAULT_ALLGATHER_ELEMENTS, DEFAULT_BUCKET_ELEMENTS, RunConfig, read_model_file

    found = read_model_file(args.model)
    stage = args.stage if args.stage is not None else found.stage
    if stage is None:
        raise ConfigError(f"{args.model} is a model-only YAML: give --stage", path="stage")
    ranks = world_size if world_size is not None else (args.ranks if args.ranks is not None else 2)
    if world_size is not None and args.ranks not in (None, world_size):
        raise ConfigError(f"--ranks {args.ranks} disagrees with WORLD_SIZE {world_size}", path="ranks")

    def pick(given, from_file, default):
        return given if given is not None else (from_file if from_file is not None else default)

    return RunConfig(
        model=found.model, stage=stage, world_size=ranks, out_dir=args.output, mp=args.mp, steps=args.steps,
        pp=args.pp, pipeline_schedule=args.pipeline_schedule, virtual_stages=args.virtual_stages,
        pp_layers=args.pp_layers,
        precision=pick(args.precision, found.precision, "fp32"),
        checkpointing=pick(args.checkpointing, found.checkpointing, False),
        grad_accum=args.grad_accum,
        bucket_elements=pick(args.bucket_elements, found.bucket_elements, DEFAULT_BUCKET_ELEMENTS),
        allgather_bucket_elements=pick(args.allgather_bucket_elements, found.allgather_bucket_elements,
                                       DEFAULT_ALLGATHER_ELEMENTS),
        prefetch_layers=pick(args.prefetch, found.prefetch_layers, 1),
        lr=args.lr, seed=args.seed, device=args.device, profile=args.torch_profiler,
        fail_rank=args.fail_rank, fail_at_step=args.fail_at_step, cuda_memory_fraction=args.cuda_memory_fraction,
        cuda_memory_history=args.cuda_memory_history)
