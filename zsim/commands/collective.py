"""`zsim collective`: an nccl-tests-style table of a simulated collective on a hardware profile."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from zsim.commands.units import parse_size, positive
from zsim.errors import ZsimError
from zsim.fabric.collective import ALGORITHMS
from zsim.fabric.nccl import FUNCTIONS
from zsim.fabric.perf import DTYPE_BYTES, PerfRow, run_collective

MAX_NODES = 2048  # the topology graph holds every node's NICs and switches: 1024 nodes take ~4 s of CPU
MAX_GPUS = 1 << 15  # 32,768 GPUs in one collective group


def sizes(begin: int, end: int, factor: int) -> list[int]:
    """begin, begin·f, ... up to end (nccl-tests -b -e -f)."""
    if factor < 2:
        raise ZsimError(f"-f {factor}: the size factor must be at least 2")
    if end < begin:
        raise ZsimError(f"-e {end} is smaller than -b {begin}")
    out, s = [], begin
    while s <= end:
        out.append(s)
        s *= factor
    return out


def collective_table(profile: str, nodes: int, gpus: int, op: str, sizes_: list[int], gpus_per_process: int = 1,
                     algorithm: str = "auto", dtype: str = "float") -> list[PerfRow]:
    """The rows of the table. Raises ConfigError (profile) or ZsimError (layout)."""
    from zsim.config.hardware import load_cluster

    cluster = load_cluster(profile, nodes)
    return [run_collective(cluster, op, s, gpus, gpus_per_process, algorithm, dtype) for s in sizes_]


def format_table(rows: list[PerfRow], op: str) -> str:
    head = (f"#{'size':>13} {'count':>12} {'type':>7} {'time':>10} {'algbw':>8} {'busbw':>8}  algorithm\n"
            f"#{'(B)':>13} {'(elements)':>12} {'':>7} {'(us)':>10} {'(GB/s)':>8} {'(GB/s)':>8}")
    lines = [f"# zsim collective: {op} (simulated)", head]
    for r in rows:
        lines.append(f" {r.size:>13} {r.count:>12} {r.dtype:>7} {r.time_us:>10.2f} {r.algbw:>8.2f} {r.busbw:>8.2f}  "
                     f"{r.algorithm}")
    if rows:
        lines.append(f"# Avg bus bandwidth    : {sum(r.busbw for r in rows) / len(rows):.4f}")
    return "\n".join(lines)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "collective", help="nccl-tests-style table of a simulated collective",
        description="Simulate one collective at a time on a hardware profile and print the table nccl-tests "
                    "prints (size, count, type, time, algbw, busbw; busbw as in nccl-tests PERFORMANCE.md), "
                    "with the algorithm/protocol NCCL's tuner would pick.")
    p.add_argument("--hw", required=True, help="system profile in hwprofiles/, e.g. dgx2")
    p.add_argument("--nodes", type=positive("--nodes", MAX_NODES), default=1, help="nodes (default 1)")
    p.add_argument("--gpus", type=positive("--gpus", MAX_GPUS), required=True, help="GPUs in the group, spread evenly over the nodes")
    p.add_argument("--op", required=True, choices=FUNCTIONS, help="the collective")
    p.add_argument("-b", "--minbytes", default="8", help="smallest size (default 8)")
    p.add_argument("-e", "--maxbytes", default="8G", help="largest size (default 8G)")
    p.add_argument("-f", "--stepfactor", type=positive("-f", 1 << 20), default=2, help="size multiplier (default 2)")
    p.add_argument("-g", "--gpus-per-process", type=positive("-g", 64), default=1, dest="gpus_per_process",
                   help="GPUs one process drives, as nccl-tests -g: each call costs g kernel launches (default 1)")
    p.add_argument("-d", "--datatype", default="float", choices=sorted(DTYPE_BYTES), help="element type")
    p.add_argument("--algorithm", default="auto", choices=ALGORITHMS, help="auto: as NCCL's tuner picks")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.set_defaults(func=run_command)


def run_command(args: argparse.Namespace) -> int:
    rows = collective_table(args.hw, args.nodes, args.gpus, args.op,
                            sizes(parse_size(args.minbytes), parse_size(args.maxbytes), args.stepfactor),
                            args.gpus_per_process, args.algorithm, args.datatype)
    if args.json:
        json.dump([asdict(r) for r in rows], sys.stdout, indent=1)
        print()
    else:
        print(format_table(rows, args.op))
    return 0
