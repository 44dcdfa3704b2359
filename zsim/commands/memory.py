"""`zsim memory`: model-state memory per GPU for each ZeRO stage (the ZeRO paper's Table 1)."""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any

from zsim.errors import ZsimError
from zsim.zero.model_states import ADAM_K, model_states

GB = 1e9
STAGE_NAMES = {0: "baseline", 1: "Pos", 2: "Pos+g", 3: "Pos+g+p"}
_SUFFIX = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


def parse_count(text: str) -> int:
    """'7.5e9', '7.5B', '1T', '1_000' -> an integer count. Raises ZsimError."""
    m = re.fullmatch(r"\s*([0-9_.]+(?:e[+-]?\d+)?)\s*([kmbgtKMBGT]?)\s*", text)
    try:
        value = float(m.group(1).replace("_", "")) * _SUFFIX.get(m.group(2).lower(), 1) if m else None
    except ValueError:
        value = None
    if value is None or value <= 0:
        raise ZsimError(f"{text!r}: expected a positive count like 7.5e9, 7.5B or 1T")
    return round(value)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "memory", help="model-state memory per GPU by ZeRO stage (paper Table 1)",
        description="Per-GPU model-state bytes (fp16/bf16 params and grads, fp32 Adam states, K = 12) for Ψ "
                    "parameters on Nd data-parallel GPUs, per ZeRO stage (Rajbhandari et al., Table 1). "
                    "GB = 10^9 bytes, as in the paper.")
    p.add_argument("--params", required=True, type=_count_arg, metavar="Ψ", help="parameters, e.g. 7.5e9, 7.5B, 1T")
    p.add_argument("--dp", required=True, type=_positive("--dp"), metavar="Nd", help="data-parallel degree")
    p.add_argument("--stage", type=int, choices=(0, 1, 2, 3), help="one ZeRO stage (default: all four)")
    p.add_argument("--mp", type=_positive("--mp"), default=1, help="model-parallel degree: each DP group holds Ψ/mp")
    p.add_argument("--dtype", choices=("fp16", "bf16"), default="fp16", help="parameter and gradient dtype")
    p.add_argument("--json", metavar="PATH", help="write the figures as JSON to PATH ('-' for stdout)")
    p.set_defaults(func=memory_command)


def _count_arg(text: str) -> int:
    try:
        return parse_count(text)
    except ZsimError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive(flag: str):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{flag} {text!r}: expected a positive integer")
        return value
    return parse


def memory_table(params: int, dp: int, mp: int = 1, stages: tuple[int, ...] = (0, 1, 2, 3),
                 dtype: str = "fp16") -> dict[str, Any]:
    """The calculator's figures: bytes per GPU by category for each stage, Ψ split over mp first."""
    psi = -(-params // mp)  # each MP rank holds ceil(Ψ / mp) parameters
    return {
        "params": params, "dp": dp, "mp": mp, "dtype": dtype, "k": ADAM_K, "params_per_mp_rank": psi,
        "stages": {str(s): model_states(psi, dp, s, dtype).as_dict() for s in stages},
    }


def memory_command(args: argparse.Namespace) -> int:
    stages = (args.stage,) if args.stage is not None else (0, 1, 2, 3)
    table = memory_table(args.params, args.dp, args.mp, stages, args.dtype)
    if args.json == "-":
        json.dump(table, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(table, fh, indent=2)
    print(f"Model states per GPU: Ψ = {args.params:,} parameters, Nd = {args.dp}, MP = {args.mp}, "
          f"{args.dtype} params/grads + fp32 Adam (K = {ADAM_K}); GB = 10^9 bytes")
    print(f"  {'stage':<14}{'params':>10}{'grads':>10}{'optimizer':>12}{'total':>10}")
    for s in stages:
        row = table["stages"][str(s)]
        print(f"  {f'{s} ({STAGE_NAMES[s]})':<14}{row['params'] / GB:>10.2f}{row['grads'] / GB:>10.2f}"
              f"{row['optimizer'] / GB:>12.2f}{row['total'] / GB:>10.2f}")
    return 0
