"""`zsim memory`: model-state memory per GPU for each ZeRO stage (the ZeRO paper's Table 1), and with a
shape (--hidden, --seq, --batch) the residual states too: activation checkpoints and working memory
(with checkpointing every k layers, Pa, Pa+cpu) and the gradient buffers (CB or the fused 4Ψ buffer)."""

from __future__ import annotations

import argparse
from typing import Any

from zsim.commands import HELP
from zsim.commands.options import add_json_option, emit_json, text_stream
from zsim.console.units import count_arg, positive
from zsim.errors import ZsimError
from zsim.report.table import format_table
from zsim.zero.model_states import STAGE_NAMES, adam_k, model_states, stage_partition
from zsim.zero.residual import (
    bucket_buffer_bytes,
    checkpoint_bytes_per_rank,
    checkpoint_segments,
    fused_gradient_buffer_bytes,
    step_gradient_bytes,
)

GB = 1e9


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "memory", help=HELP["memory"],
        description="Per-GPU model-state bytes (fp16/bf16 params and grads, fp32 Adam states, K = 12) for Ψ "
                    "parameters on Nd data-parallel GPUs, per ZeRO stage (Rajbhandari et al., Table 1). "
                    "GB = 10^9 bytes, as in the paper.")
    p.add_argument("--params", type=count_arg, metavar="Ψ", help="parameters, e.g. 7.5e9, 7.5B, 1T")
    p.add_argument("--dp", type=positive("--dp"), metavar="Nd", help="data-parallel degree")
    p.add_argument("--scenario", metavar="FILE",
                   help="a scenario instead of --params/--dp: per pipeline stage, its model states and activations "
                        "at the schedule's peak in-flight micro-batches (docs/parallel.md)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scenario key (with --scenario)")
    p.add_argument("--stage", type=int, choices=(0, 1, 2, 3), help="one ZeRO stage (default: all four)")
    p.add_argument("--mp", type=positive("--mp"), default=1, help="model-parallel degree: each DP group holds Ψ/mp")
    p.add_argument("--dtype", choices=("fp16", "bf16", "fp32"), default="fp16",
                   help="parameter and gradient dtype (fp32: plain fp32 training, K = 8)")
    r = p.add_argument_group("residual states (give --hidden, --seq and --batch)")
    r.add_argument("--hidden", type=positive("--hidden"), help="hidden size h")
    r.add_argument("--heads", type=positive("--heads"), help="attention heads (default h/128)")
    r.add_argument("--seq", type=positive("--seq"), help="sequence length s")
    r.add_argument("--batch", type=positive("--batch"), help="micro-batch b per GPU")
    r.add_argument("--layers", type=positive("--layers"), help="layers (default Ψ / 12h², rounded)")
    r.add_argument("--no-checkpointing", dest="checkpointing", action="store_false", help="keep every activation")
    r.add_argument("--ckpt-every", type=positive("--ckpt-every"), default=1, help="one checkpoint every k layers")
    r.add_argument("--pa", action="store_true", help="Pa: checkpoints partitioned across MP")
    r.add_argument("--pa-cpu", action="store_true", help="Pa+cpu: partitioned checkpoints in host memory")
    r.add_argument("--no-cb", dest="cb", action="store_false", help="fused whole-model fp32 gradient buffer (no CB)")
    r.add_argument("--bucket", type=count_arg, default=500_000_000, help="CB bucket, elements (default 5e8)")
    r.add_argument("--vocab", type=positive("--vocab"), default=50257,
                   help="vocabulary, padded as Megatron-LM pads it (default 50257, GPT-2's)")
    add_json_option(p)
    p.set_defaults(func=memory_command)


def memory_table(params: int, dp: int, mp: int = 1, stages: tuple[int, ...] = (0, 1, 2, 3),
                 dtype: str = "fp16") -> dict[str, Any]:
    """The calculator's figures: bytes per GPU by category for each stage, Ψ split over mp first."""
    psi = -(-params // mp)  # each MP rank holds ceil(Ψ / mp) parameters
    return {
        "params": params, "dp": dp, "mp": mp, "dtype": dtype, "k": adam_k(dtype), "params_per_mp_rank": psi,
        "stages": {str(s): model_states(psi, dp, s, dtype).as_dict() for s in stages},
    }


def residual_table(params: int, dp: int, mp: int, stage: int, *, hidden: int, seq: int, batch: int,
                   heads: int | None = None, layers: int | None = None, dtype: str = "fp16",
                   checkpointing: bool = True, every: int = 1, pa: bool = False, pa_cpu: bool = False,
                   cb: bool = True, bucket: int = 500_000_000, vocab: int = 50257) -> dict[str, int]:
    """Residual-state bytes per GPU at the two activation peaks, the start of backward and the loss
    (closed form; `zsim run` simulates the same terms over time):
      checkpoints: ceil(L/k) layer inputs e·sbh, /mp with Pa, on the host with Pa+cpu (K22 §5; ZeRO §6.1);
      working: k layers of recomputed activations (K22 eq. 2), or all L without checkpointing;
      gradient_buffer: one CB bucket e·min(bucket, Ψ/mp), or the fused fp32 4Ψ/mp (ZeRO §3.2),
          none at stage 3 (in place);
      optimizer_fp32_grads: the gradient copy the Adam step reads (fp32, or stage 0's fp16 flat copy),
          held through the update (zsim.zero.residual.step_gradient_bytes; stage 3: the whole partition,
          DeepSpeed v0.3.13's default sub-group);
      loss: what the loss holds at the end of forward over T = s·b tokens and the padded vocabulary's
          V/mp columns, as Megatron-LM of the paper's time: the e-byte logits, their fp32 copy, the
          cross-entropy's clone of it and its fp32 softmax, (e + 12)·T·V/mp bytes (fp32: 12) (docs/memory.md).
    `host` is Pa+cpu's host memory. Bytes; raises ZsimError for an impossible shape."""
    from zsim.workload.activations import block_saved_bytes, loss_work_tensors
    from zsim.workload.transformer import padded_vocab

    heads = heads or max(1, hidden // 128)
    if hidden % heads or heads % mp:
        raise ZsimError(f"--heads {heads} must divide --hidden {hidden} and be divisible by --mp {mp}")
    e = 4 if dtype == "fp32" else 2
    layers = layers or max(1, round(params / (12 * hidden * hidden)))
    psi = -(-params // mp)
    ckpt = checkpoint_bytes_per_rank(e * seq * batch * hidden, mp, pa or pa_cpu)
    saved = block_saved_bytes(seq, batch, hidden, heads, mp, e)
    kept = checkpoint_segments(layers, every) * ckpt if checkpointing else 0
    grad_buffer = 0 if stage == 3 else (bucket_buffer_bytes(bucket, psi, e) if cb else fused_gradient_buffer_bytes(psi))
    part = stage_partition(psi, dp, stage)
    return {
        "layers": layers,
        "checkpoints": 0 if pa_cpu else kept,
        "working": min(every, layers) * saved if checkpointing else layers * saved,
        "gradient_buffer": grad_buffer,
        "optimizer_fp32_grads": step_gradient_bytes(stage, part, dtype, part).held,
        # the saved fp32 softmax and the copies the loss holds beside it
        "loss": 4 * seq * batch * padded_vocab(vocab, mp) // mp + sum(loss_work_tensors(seq * batch, padded_vocab(vocab, mp), mp, e)),
        "host": kept if pa_cpu else 0,
    }


def memory_command(args: argparse.Namespace) -> int:
    if args.json is not None and args.json != "-":
        from zsim.report.outputs import check_file

        check_file(args.json)  # before any work: a bad --json costs nothing
    if args.scenario is not None:
        given = [flag for flag, value in (("--params", args.params), ("--dp", args.dp), ("--stage", args.stage),
                                          ("--hidden", args.hidden), ("--seq", args.seq), ("--batch", args.batch))
                 if value is not None]
        if given:
            raise ZsimError(f"{given[0]} belongs to the --params mode; with --scenario change the scenario's keys "
                            "with --set")
        return stage_memory_command(args)
    if args.params is None or args.dp is None:
        raise ZsimError("give --params and --dp, or --scenario FILE")
    if args.overrides:
        raise ZsimError(f"--set {args.overrides[0]} overrides a scenario key: it needs --scenario FILE")
    stages = (args.stage,) if args.stage is not None else (0, 1, 2, 3)
    table = memory_table(args.params, args.dp, args.mp, stages, args.dtype)
    shape = (args.hidden, args.seq, args.batch)
    if any(shape) and not all(shape):
        raise ZsimError("residual states need all of --hidden, --seq and --batch")
    residual_only = [flag for flag, given in (("--heads", args.heads is not None), ("--layers", args.layers is not None),
                                              ("--no-checkpointing", not args.checkpointing),
                                              ("--ckpt-every", args.ckpt_every != 1), ("--pa", args.pa),
                                              ("--pa-cpu", args.pa_cpu), ("--no-cb", not args.cb)) if given]
    if residual_only and not all(shape):
        raise ZsimError(f"{', '.join(residual_only)} {'shape' if len(residual_only) > 1 else 'shapes'} the residual "
                        "states: give --hidden, --seq and --batch too")
    if not args.checkpointing and (args.ckpt_every != 1 or args.pa or args.pa_cpu):
        raise ZsimError("--ckpt-every, --pa and --pa-cpu place checkpoints: they need checkpointing "
                        "(drop --no-checkpointing)")
    if all(shape):
        table["residual"] = {str(s): residual_table(
            args.params, args.dp, args.mp, s, hidden=args.hidden, seq=args.seq, batch=args.batch, heads=args.heads,
            layers=args.layers, dtype=args.dtype, checkpointing=args.checkpointing, every=args.ckpt_every,
            pa=args.pa, pa_cpu=args.pa_cpu, cb=args.cb, bucket=args.bucket, vocab=args.vocab) for s in stages}
    emit_json(args, table)
    out = text_stream(args)
    print(f"Model states per GPU: Ψ = {args.params:,} parameters, Nd = {args.dp}, MP = {args.mp}, "
          f"{args.dtype} params/grads, Adam K = {adam_k(args.dtype)}; GB = 10^9 bytes", file=out)
    rows = [[f"{s} ({STAGE_NAMES[s]})", *(f"{table['stages'][str(s)][k] / GB:.2f}"
                                          for k in ("params", "grads", "optimizer", "total"))] for s in stages]
    for text in format_table(rows, header=[["stage", "params", "grads", "optimizer", "total"]], gap="  "):
        print(text, file=out)
    if "residual" in table:
        print(f"Residual states per GPU ({table['residual'][str(stages[0])]['layers']} layers), totals with the model "
              "states at the start of backward and while the loss runs:", file=out)
        rows = []
        for s in stages:
            res, states = table["residual"][str(s)], table["stages"][str(s)]
            # The fp32 gradients exist only during the optimizer step.
            bwd = states["total"] + res["checkpoints"] + res["working"] + res["gradient_buffer"]
            loss = states["total"] + res["checkpoints"] + res["loss"]
            rows.append([f"{s} ({STAGE_NAMES[s]})", *(f"{v / GB:.2f}" for v in (
                res["checkpoints"], res["working"], res["gradient_buffer"], res["loss"], res["optimizer_fp32_grads"],
                bwd, loss, res["host"]))])
        header = ["stage", "ckpts", "working", "grad buf", "loss", "fp32 grads", "bwd total", "loss total", "host"]
        for text in format_table(rows, header=[header], gap="  "):
            print(text, file=out)
    return 0


def stage_table(scenario) -> dict[str, Any]:
    """Per pipeline stage, bytes per rank: model states, activations at the schedule's peak and the
    micro-batch chunks then in flight (zsim.zero.stage_memory), and the binding (fullest) stage."""
    from zsim.zero.stage_memory import binding_stage, stage_memory

    stages = stage_memory(scenario)
    par = scenario.parallel
    return {"scenario": scenario.name, "pp": par.pp, "schedule": par.pipeline_schedule,
            "micro_batches": scenario.grad_accum, "binding_stage": binding_stage(stages).stage,
            "capacity_bytes": scenario.cluster.gpu.memory_bytes,
            "stages": [{"stage": st.stage, "layers": st.layers, "in_flight": st.in_flight,
                        **{k: v for k, v in st.states.as_dict().items()}, "activations": st.activations,
                        **({"fp8_weights": st.fp8_weights} if st.fp8_weights else {}),  # precision.fp8's copies
                        "total": st.total} for st in stages]}


def stage_memory_command(args: argparse.Namespace) -> int:
    """`zsim memory --scenario FILE`: the per-stage table; raises ConfigError for a bad scenario."""
    from zsim.scenario.scenario import load_scenario

    scenario = load_scenario(args.scenario, args.overrides)
    table = stage_table(scenario)
    emit_json(args, table)
    out = text_stream(args)
    print(f"Memory per rank of each pipeline stage: {scenario.name}, pp {table['pp']}, {table['schedule']}, "
          f"{table['micro_batches']} micro-batches; GB = 10^9 bytes; * = the binding stage", file=out)
    columns = ("params", "grads", "optimizer", "activations") + (
        ("fp8_weights",) if any("fp8_weights" in st for st in table["stages"]) else ()) + ("total",)
    rows = [[f"{st['stage']}{'*' if st['stage'] == table['binding_stage'] else ''}", str(st["layers"]),
             str(st["in_flight"]), *(f"{st[k] / GB:.2f}" for k in columns)] for st in table["stages"]]
    header = ["stage", "layers", "in flight", *(k.replace("_", " ") for k in columns)]
    for text in format_table(rows, header=[header], gap="  "):
        print(text, file=out)
    worst = table["stages"][table["binding_stage"]]["total"]
    print(f"Binding stage {table['binding_stage']}: {worst / GB:.2f} GB of {table['capacity_bytes'] / GB:.2f} GB per GPU "
          f"({'fits' if worst <= table['capacity_bytes'] else 'does not fit'}, before the allocator's fragmentation "
          "and working buffers: zsim run simulates those)", file=out)
    return 0
