"""`zsim maxsize`: the largest model that fits on a GPU (the ZeRO paper's Table 2 and Figure 6).

Two questions, two pure functions:
  max_params_model_states: model states only, the paper's Table 2 "theoretical" columns: the Ψ whose
      per-GPU model states (Table 1, Ψ split over MP first) fill the GPU memory;
  max_layers: the full memory of a given shape and micro-batch (Figure 6): the most transformer
      layers of that shape whose simulated steps do not run out of memory until the caching
      allocator settles into a state that repeats every step (binary search over `zsim run`'s own
      simulation, allocator included). Near the limit the allocator can make fitting non-monotone in
      the layer count; the search reports the boundary it finds between a size that fits and one that
      does not.
"""

from __future__ import annotations

import argparse
import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from zsim.commands import HELP
from zsim.commands.options import add_json_option, add_profile_options, emit_json, profile_search, text_stream
from zsim.console.units import positive, size_arg
from zsim.errors import ConfigError, ModelStatesError, ZsimError
from zsim.zero.model_states import PARAM_BYTES, STAGE_NAMES, adam_k

if TYPE_CHECKING:
    from zsim.config.profiles import Profiles

def bytes_per_param(stage: int, dp: int, dtype: str = "fp16") -> float:
    """Model-state bytes per parameter of one MP rank on one GPU, ZeRO Table 1 without padding:
    (2e + K), 2e + K/Nd, e + (e + K)/Nd, (2e + K)/Nd with e parameter bytes and K optimizer bytes."""
    e, k = PARAM_BYTES[dtype], adam_k(dtype)
    return {0: 2 * e + k, 1: 2 * e + k / dp, 2: e + (e + k) / dp, 3: (2 * e + k) / dp}[stage]


def max_params_model_states(gpu_bytes: int, dp: int, mp: int, stage: int, dtype: str = "fp16") -> float:
    """The largest Ψ (whole model) whose model states fit in `gpu_bytes` per GPU: each MP rank holds
    Ψ/mp, so Ψ = mp · memory / bytes_per_param (ZeRO Table 2, theoretical columns)."""
    return mp * gpu_bytes / bytes_per_param(stage, dp, dtype)


class Trial(NamedTuple):
    """One simulated size: whether it fits, its Ψ, the reserved peak (bytes), the steps simulated and
    whether the allocator settled by then (its state at a step's end repeated)."""

    fits: bool
    params: int
    reserved_peak_bytes: int
    steps: int = 0
    settled: bool = True


@dataclass(frozen=True, slots=True)
class MaxModel:
    """The largest fitting model of a shape: `layers`, its Ψ, the reserved peak of that run, and the
    steps its trial simulated until the allocator settled (`settled` false: it had not by MAX_STEPS)."""

    layers: int
    params: int
    reserved_peak_bytes: int
    steps: int = 0
    settled: bool = True

    @classmethod
    def of(cls, layers: int, trial: Trial) -> MaxModel:
        return cls(layers, trial.params, trial.reserved_peak_bytes, trial.steps, trial.settled)


# Steps to simulate: start with two (step 2 begins with step 1's allocator cache, as every later step of
# a real run does; step 1 alone misses that: C1 at 54 layers once reserved 34.2 GB in step 1, 39.4 in
# step 2), and double while the allocator has not settled, up to MAX_STEPS. Settled: its state at the
# end of the last step equals the step before's (CachingAllocator.state), so every later step repeats.
# Some runs settle only after several steps and fail on the way: C1 (scenarios/paper/C1-100B-400gpu.yaml)
# at 77 layers with md_checkpoints: deepspeed fits three steps and runs out of memory in the fourth.
FIRST_STEPS, MAX_STEPS = 2, 32


def fits(data: dict[str, Any], layers: int, gpu_bytes: int | None, profiles: Profiles | None = None,
         source: str = "<maxsize>") -> Trial:
    """The Trial of scenario `data` with `layers` layers, no accumulation, simulated
    until the allocator settles (FIRST_STEPS, doubled up to MAX_STEPS; a run that has not settled by
    then and never ran out of memory counts as fitting)."""
    from zsim.scenario.scenario import build_scenario
    from zsim.engine.simulation import simulate
    from zsim.zero.cost import check_cost

    trial = copy.deepcopy(data)
    trial["model"]["layers"] = layers
    trial["model"]["grad_accum"] = pipeline_micro_batches(trial)
    trial["model"].pop("global_batch", None)
    trial.get("parallel", {}).pop("pp_layers", None)  # a stated split is for its own layer count: split evenly
    steps = FIRST_STEPS
    while True:
        trial.setdefault("run", {})["steps"] = steps
        try:
            scenario = build_scenario(trial, source=source, default_name="maxsize", gpu_memory_bytes=gpu_bytes,
                                      profiles=profiles)
        except ModelStatesError:  # model states alone exceed the GPU; any other error is the user's to read
            return Trial(False, 0, 0)
        check_cost(scenario, trace=False)  # a trial costs what `zsim run` would: refused the same way (issue 28)
        result = simulate(scenario, trace=False)
        states = result.step_memory_states
        settled = len(states) >= 2 and states[-1] == states[-2]
        if not result.fits or settled or steps >= MAX_STEPS:
            return Trial(result.fits, result.workload.total_params, result.ledger.peak_reserved, steps, settled)
        steps *= 2


def pipeline_micro_batches(data: dict[str, Any]) -> int:
    """Micro-batches per step a trial of scenario `data` runs: 1 without pipeline stages (memory does not
    depend on them); with them, as many as the stages' memory peaks need. 1F1B holds min(p − s, m)
    micro-batches on stage s (zsim.parallel.pipeline.peak_in_flight), and its peak is a forward that
    brings it back to p − s after a backward has made the stage's gradients, which needs m > p − s: so
    min(m, p + 1) gives every stage m's peaks (tests/test_maxsize_pipeline.py checks them equal). GPipe
    holds all m and the interleaved schedule's warm-up grows with m, so they keep m (the scenario's
    grad_accum, or global_batch / (micro_batch · dp))."""
    par, model = data.get("parallel", {}), data["model"]
    p = int(par.get("pp", 1))
    if p == 1:
        return 1
    m = model.get("grad_accum")
    if m is None and model.get("global_batch") is not None:
        m = int(model["global_batch"]) // (int(model.get("micro_batch", 1)) * int(par.get("dp", 1)))
    m = max(1, int(m or 1))
    return min(m, p + 1) if par.get("pipeline_schedule", "1f1b") == "1f1b" else m


def _counts_as_validated(data: dict[str, Any], spec) -> dict[str, Any]:
    """`data` with the counts the search reads from the raw mapping (layer_unit, pipeline_micro_batches)
    replaced by their validated values: `pp: 1e3` is the whole number 1000 to the schema but a string in
    the YAML (issue 28: int('1e3') was an internal error)."""
    out = {**data, "model": dict(data["model"]), "parallel": dict(data.get("parallel") or {})}
    for section, keys in (("model", ("micro_batch", "grad_accum", "global_batch")), ("parallel", ("pp", "dp", "virtual_stages"))):
        for key in keys:
            if key in out[section]:
                out[section][key] = getattr(getattr(spec, section), key)
    return out


def layer_unit(data: dict[str, Any]) -> int:
    """The layer counts a search of `data` tries are multiples of this: pp × virtual_stages, so that
    the layers split evenly over the (virtual) pipeline stages (Megatron-LM get_num_layers_to_build)."""
    par = data.get("parallel", {})
    return int(par.get("pp", 1)) * int(par.get("virtual_stages", 1))


def max_layers(data: dict[str, Any], gpu_bytes: int | None = None, limit: int = 4096,
               profiles: Profiles | None = None, progress: bool = False, source: str = "<maxsize>") -> MaxModel:
    """The most layers (1..limit) of scenario `data`'s shape that fit, by binary search (memory grows
    with the layer count); `progress` shows a tqdm counter of the simulated trials on stderr.
    Raises ZsimError when not even one layer fits."""
    from tqdm import tqdm

    bar = tqdm(desc="maxsize: simulated trials", unit=" trial", disable=not progress, leave=False)

    def trial(data: dict[str, Any], layers: int, gpu_bytes: int | None) -> Trial:
        bar.set_postfix_str(f"{layers} layers")
        out = fits(data, layers, gpu_bytes, profiles, source)
        bar.update()
        return out

    try:
        return _search(trial, data, gpu_bytes, limit)
    finally:
        bar.close()


def _search(fits, data: dict[str, Any], gpu_bytes: int | None, limit: int) -> MaxModel:
    """Binary search over layer counts that are multiples of layer_unit(data) (1 without pipelines)."""
    unit = layer_unit(data)
    if unit > limit:  # the smallest model the search could try is already past its limit (issue 28)
        raise ZsimError(f"parallel.pp × parallel.virtual_stages = {unit:,} layers (one per pipeline stage and chunk) "
                        f"is more than the {limit:,} layers maxsize searches: lower pp or virtual_stages")
    t = fits(data, unit, gpu_bytes)
    if not t.fits:
        what = "one layer" if unit == 1 else f"{unit} layers (one per pipeline stage and chunk)"
        raise ZsimError(f"not even {what} of this shape fits: lower the micro-batch or raise mp / dp")
    lo, best, hi = 1, MaxModel.of(unit, t), 2  # in units of `unit` layers
    while hi * unit <= limit:
        t = fits(data, hi * unit, gpu_bytes)
        if not t.fits:
            break
        lo, best, hi = hi, MaxModel.of(hi * unit, t), hi * 2
    hi = min(hi, limit // unit + 1)  # lo fits, hi does not (or is past the limit)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        t = fits(data, mid * unit, gpu_bytes)
        if t.fits:
            lo, best = mid, MaxModel.of(mid * unit, t)
        else:
            hi = mid
    return best


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "maxsize", help=HELP["maxsize"],
        description="Without --batch or --scenario: the largest model whose model states fit per GPU, per ZeRO "
                    "stage (Table 2). With --scenario FILE (or --batch and a shape): the most layers of that "
                    "shape that fits until the simulated allocator settles into a state that repeats every step, "
                    "activations, buffers and allocator included (Figure 6).")
    p.add_argument("--dp", type=positive("--dp"), help="data-parallel degree Nd")
    p.add_argument("--mp", type=positive("--mp"), help="model-parallel degree (default 1)")
    p.add_argument("--stage", type=int, choices=(0, 1, 2, 3), help="one ZeRO stage (default: all four)")
    p.add_argument("--gpu-mem", type=size_arg, metavar="SIZE",
                   help="GPU memory, e.g. 32GB (10^9 bytes, as the paper), 32GiB or 32G (2^30 bytes); "
                        "default: the profile's")
    p.add_argument("--dtype", choices=("fp16", "bf16", "fp32"),
                   help="parameter and gradient dtype (fp32: plain fp32 training, K = 8; default fp16)")
    p.add_argument("--scenario", metavar="FILE", help="search the layers of this scenario's shape and options")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a key of --scenario (repeatable)")
    shape = p.add_argument_group("shape for the full-memory search (with --batch)")
    shape.add_argument("--batch", type=positive("--batch"), help="micro-batch per GPU (sequences)")
    shape.add_argument("--hidden", type=positive("--hidden"), help="hidden size h (default 8192)")
    shape.add_argument("--heads", type=positive("--heads"), help="attention heads (default 64)")
    shape.add_argument("--seq", type=positive("--seq"), help="sequence length (default 1024)")
    shape.add_argument("--vocab", type=positive("--vocab"), help="vocabulary size (default 51200)")
    for flag, key in (("--pa", "partition_activations"), ("--pa-cpu", "cpu_offload_activations"),
                      ("--md", "defragment")):
        shape.add_argument(flag, dest=key, action="store_true", default=None, help=f"zero.{key}: true")
    shape.add_argument("--no-cb", dest="constant_buffers", action="store_false", default=None,
                       help="zero.constant_buffers: false")
    add_profile_options(p, what="with --batch: the hardware (default dgx2); with --scenario: replaces its hardware.profile")
    add_json_option(p)
    p.set_defaults(func=maxsize_command)


def _shape_scenario(args: argparse.Namespace, profiles: Profiles, profile: str) -> dict[str, Any]:
    from zsim.fabric.cluster import load_cluster

    cluster = load_cluster(profile, 1, profiles)
    mp = args.mp or 1
    gpus = args.dp * mp
    if gpus % cluster.gpus_per_node:
        raise ZsimError(f"--dp {args.dp} × --mp {mp} = {gpus} GPUs is not a whole number of "
                        f"{cluster.name} nodes ({cluster.gpus_per_node} GPUs each)")
    return {
        "model": {"layers": 1, "hidden": args.hidden or 8192, "heads": args.heads or 64, "seq_len": args.seq or 1024,
                  "vocab": args.vocab or 51200, "micro_batch": args.batch},
        "parallel": {"dp": args.dp, "mp": mp},
        "zero": {"stage": 1 if args.stage is None else args.stage,
                 "partition_activations": bool(args.partition_activations or args.cpu_offload_activations),
                 "cpu_offload_activations": bool(args.cpu_offload_activations),
                 "constant_buffers": args.constant_buffers is not False, "defragment": bool(args.defragment)},
        "precision": {"dtype": args.dtype or "fp16"},
        "hardware": {"profile": profile, "nodes": gpus // cluster.gpus_per_node},
    }


# The options each mode reads; the others are refused rather than silently ignored.
SHAPE_OPTIONS = {"dp": "--dp", "mp": "--mp", "stage": "--stage", "dtype": "--dtype", "batch": "--batch",
                 "hidden": "--hidden", "heads": "--heads", "seq": "--seq", "vocab": "--vocab",
                 "partition_activations": "--pa", "cpu_offload_activations": "--pa-cpu", "defragment": "--md",
                 "constant_buffers": "--no-cb"}
MODEL_STATES_OPTIONS = ("dp", "mp", "stage", "dtype")


def _refuse_unread(args: argparse.Namespace) -> None:
    """Raise ZsimError for an option the chosen mode does not read (it would be silently ignored)."""
    if args.scenario:
        unread = [flag for key, flag in SHAPE_OPTIONS.items() if getattr(args, key) is not None]
        if unread:
            raise ZsimError(f"{', '.join(unread)} {'describe' if len(unread) > 1 else 'describes'} a shape of its "
                            "own; with --scenario change the scenario's keys "
                            "with --set (e.g. --set zero.stage=2 --set model.micro_batch=8)")
        return
    if args.overrides:
        raise ZsimError("--set changes a key of --scenario; without it use the shape options (--batch, --hidden, ...)")
    if not args.batch:
        unread = [flag for key, flag in SHAPE_OPTIONS.items() if key not in MODEL_STATES_OPTIONS
                  and getattr(args, key) is not None]
        if unread:
            raise ZsimError(f"{', '.join(unread)} {'describe' if len(unread) > 1 else 'describes'} the shape of a "
                            "full-memory search: give --batch too "
                            "(without it maxsize counts model states alone)")


def maxsize_command(args: argparse.Namespace) -> int:
    _refuse_unread(args)
    if args.json is not None and args.json != "-":
        from zsim.report.outputs import check_file

        check_file(args.json)  # before any work: a bad --json costs nothing
    if args.scenario or args.batch:
        import sys

        from zsim.scenario.scenario import blame_override, set_by

        profiles, profile = profile_search(args)
        if args.scenario:
            from zsim.config.hf import resolve_from_hf
            from zsim.config.overrides import apply_overrides
            from zsim.scenario.scenario import find_scenario
            from zsim.config.schema import ScenarioFile
            from zsim.config.validation import validate
            from zsim.config.yamlfile import read_yaml_mapping

            overrides = [*args.overrides, *([f"hardware.profile={profile}"] if profile else [])]
            path = find_scenario(args.scenario)
            setters = set_by(args.overrides, path, profile)
            try:
                # from_hf is relative to the scenario file; resolved here, the trials can grow its layers.
                data = resolve_from_hf(apply_overrides(read_yaml_mapping(path), overrides), source=str(path),
                                       base_dir=path.parent)
                # The file and its --set as given, before the search replaces layers and steps: a bad value
                # there is an error naming the --set (or the file) and key, never "not even one layer fits".
                spec = validate(ScenarioFile, data, str(path))
            except ConfigError as exc:
                raise blame_override(exc, setters) from None
            data = _counts_as_validated(data, spec)
            source = str(path)
        else:
            if args.dp is None:
                raise ZsimError("--batch needs --dp (and --mp)")
            source = "<maxsize>"
            setters = set_by([], profile=profile)
            try:
                data = _shape_scenario(args, profiles, profile or "dgx2")
            except ConfigError as exc:
                raise blame_override(exc, setters) from None
        try:
            best = max_layers(data, args.gpu_mem, profiles=profiles, progress=sys.stderr.isatty(), source=source)
        except ConfigError as exc:  # e.g. a --profile no folder has: the flag's, not the file's
            raise blame_override(exc, setters) from None
        table: dict[str, Any] = {"mode": "full memory", "layers": best.layers, "params": best.params,
                                 "reserved_peak_bytes": best.reserved_peak_bytes, "steps": best.steps,
                                 "settled": best.settled}
        settled = (f"the allocator settled by step {best.steps}" if best.settled else
                   f"the allocator had not settled after {best.steps} steps: it fits that many")
        text = (f"largest fitting model: {best.layers} layers = {best.params / 1e9:.1f}B parameters "
                f"(reserved peak {best.reserved_peak_bytes / 1e9:.1f} GB per GPU; {settled})")
    else:
        if args.dp is None or args.gpu_mem is None:
            raise ZsimError("model-states mode needs --dp and --gpu-mem (or give --scenario / --batch)")
        stages = (args.stage,) if args.stage is not None else (0, 1, 2, 3)
        mp, dtype = args.mp or 1, args.dtype or "fp16"
        table = {"mode": "model states", "dp": args.dp, "mp": mp, "gpu_bytes": args.gpu_mem,
                 "params": {str(s): max_params_model_states(args.gpu_mem, args.dp, mp, s, dtype)
                            for s in stages}}
        text = f"largest model by model states alone, Nd = {args.dp}, MP = {mp}, {args.gpu_mem / 1e9:g} GB/GPU:\n" + \
            "\n".join(f"  {f'{s} ({STAGE_NAMES[s]})':<14}{table['params'][str(s)] / 1e9:>10.1f}B" for s in stages)
    print(text, file=text_stream(args))
    emit_json(args, table)
    return 0
