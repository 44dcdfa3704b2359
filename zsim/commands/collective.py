"""`zsim collective`: an nccl-tests-style table of a simulated collective on a hardware profile."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from typing import TYPE_CHECKING

from zsim.commands import HELP
from zsim.commands.options import add_json_option, add_profile_options, emit_json, profile_search, text_stream
from zsim.console.units import nccl_size_arg, positive
from zsim.errors import ZsimError
from zsim.fabric.nccl import FUNCTIONS

if TYPE_CHECKING:
    from zsim.config.profiles import Profiles
    from zsim.fabric.perf import PerfRow

# zsim.fabric.collective.ALGORITHMS and zsim.fabric.perf.DTYPE_BYTES, spelled out here because those
# modules import msgspec, simpy and networkx (tests/test_cli_conventions.py checks they agree).
ALGORITHMS = ("auto", "ring", "tree", "hierarchical")
DTYPES = ("bfloat16", "double", "float", "half", "int32", "int8")

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
                     algorithm: str = "auto", dtype: str = "float", profiles: Profiles | None = None,
                     gpudirect_rdma: bool | None = None, network: str | None = None) -> list[PerfRow]:
    """The rows of the table; `gpudirect_rdma` False stages the NICs' traffic through host memory
    (zsim.fabric.gpudirect), None keeps the profile's; `network` prices the profile's NICs with another network
    profile's fitted terms (a scenario's hardware.network). Raises ConfigError (profile, network) or ZsimError
    (layout)."""
    from zsim.fabric.cluster import load_cluster
    from zsim.fabric.perf import run_collective

    cluster = load_cluster(profile, nodes, profiles, gpudirect_rdma=gpudirect_rdma, network=network)
    return [run_collective(cluster, op, s, gpus, gpus_per_process, algorithm, dtype) for s in sizes_]


def format_table(rows: list[PerfRow], op: str, nodes: int | None = None, gpus: int | None = None,
                 gpus_per_process: int = 1) -> str:
    """nccl-tests' table; with `nodes` and `gpus`, also its `nGpus` and `# Rank r ... on HOST` header
    lines (one simulated host per node; beyond 64 GPUs only each node's first rank and the last), so that
    the table reads back as the run it simulates
    (zsim.trace.nccl_tests.header_of; `zsim nccl-fit` takes it)."""
    ranks: list[str] = []
    if nodes and gpus:
        per_node = gpus // nodes
        ranks = [f"# nThread 1 nGpus {gpus_per_process} (simulated by zsim)", "#", "# Using devices"]
        listed = range(gpus) if gpus <= 64 else sorted({*range(0, gpus, per_node), gpus - 1})  # every host, once
        ranks += [f"#  Rank {r:4d} Pid {r // gpus_per_process:5d} on {'zsim-node' + str(r // per_node):>12} "
                  f"device {r % per_node:2d} [0x00] simulated" for r in listed]
    head = (f"#{'size':>13} {'count':>12} {'type':>7} {'time':>10} {'algbw':>8} {'busbw':>8}  algorithm\n"
            f"#{'(B)':>13} {'(elements)':>12} {'':>7} {'(us)':>10} {'(GB/s)':>8} {'(GB/s)':>8}")
    lines = [f"# zsim collective: {op} (simulated)", *ranks, head]
    for r in rows:
        lines.append(f" {r.size:>13} {r.count:>12} {r.dtype:>7} {r.time_us:>10.2f} {r.algbw:>8.2f} {r.busbw:>8.2f}  "
                     f"{r.algorithm}")
    if rows:
        lines.append(f"# Avg bus bandwidth    : {sum(r.busbw for r in rows) / len(rows):.4f}")
    return "\n".join(lines)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "collective", help=HELP["collective"],
        description="Simulate one collective at a time on a hardware profile and print the table nccl-tests "
                    "prints (size, count, type, time, algbw, busbw; busbw as in nccl-tests PERFORMANCE.md), "
                    "with the algorithm/protocol NCCL's tuner would pick.")
    add_profile_options(p, required=True)
    p.add_argument("--nodes", type=positive("--nodes", MAX_NODES), default=1, help="nodes (default 1)")
    p.add_argument("--gpus", type=positive("--gpus", MAX_GPUS), required=True, help="GPUs in the group, spread evenly over the nodes")
    p.add_argument("--op", required=True, choices=FUNCTIONS, help="the collective")
    p.add_argument("-b", "--minbytes", type=nccl_size_arg, default="8", metavar="SIZE",
                   help="smallest size in bytes (default 8); as nccl-tests, 8M = 8·2²⁰ (8MB = 8·10⁶)")
    p.add_argument("-e", "--maxbytes", type=nccl_size_arg, default="8G", metavar="SIZE",
                   help="largest size (default 8G = 8·2³⁰)")
    p.add_argument("-f", "--stepfactor", type=positive("-f", 1 << 20), default=2, help="size multiplier (default 2)")
    p.add_argument("-g", "--gpus-per-process", type=positive("-g", 64), default=1, dest="gpus_per_process",
                   help="GPUs one process drives, as nccl-tests -g: each call costs g kernel launches (default 1)")
    p.add_argument("-d", "--datatype", default="float", choices=DTYPES, help="element type")
    p.add_argument("--algorithm", default="auto", choices=ALGORITHMS, help="auto: as NCCL's tuner picks")
    p.add_argument("--no-gpudirect-rdma", action="store_false", dest="gpudirect_rdma", default=None,
                   help="NCCL stages inter-node bytes through host memory (no GPUDirect RDMA): a NIC carries "
                        "min(2/3 of its rate, half its PCIe switch's uplink); default: as the profile says")
    p.add_argument("--network", metavar="NAME", default=None,
                   help="price the profile's NICs with another network profile's fitted terms (hwprofiles/networks/, "
                        "e.g. roce), as a scenario's hardware.network; the port rate stays the profile's")
    add_json_option(p, "the rows")
    p.set_defaults(func=run_command)


def run_command(args: argparse.Namespace) -> int:
    if (args.gpus // args.nodes) % args.gpus_per_process:
        raise ZsimError(f"-g {args.gpus_per_process}: each process drives GPUs of one node, so -g must divide "
                        f"the {args.gpus // args.nodes} GPUs a node has here (--gpus {args.gpus} over --nodes "
                        f"{args.nodes})")
    profiles, profile = profile_search(args)
    rows = collective_table(profile, args.nodes, args.gpus, args.op, sizes(args.minbytes, args.maxbytes, args.stepfactor),
                            args.gpus_per_process, args.algorithm, args.datatype, profiles, args.gpudirect_rdma,
                            args.network)
    stream = text_stream(args)
    print(format_table(rows, args.op, args.nodes, args.gpus, args.gpus_per_process), file=stream)
    if args.algorithm != "auto" and any(not r.algorithm.startswith(args.algorithm) for r in rows):
        # zsim.fabric.collective: what NCCL does when the algorithm has no implementation for the call
        where = ("all_reduce across nodes" if args.algorithm == "tree"
                 else "all_reduce, reduce_scatter and all_gather across nodes, several GPUs a node")
        print(f"# --algorithm {args.algorithm} applies to {where}; {args.op} on {args.gpus} GPUs over "
              f"{args.nodes} node{'s' if args.nodes > 1 else ''} runs as NCCL runs it there, the rows say which",
              file=stream)
    run = {"op": args.op, "nodes": args.nodes, "gpus": args.gpus, "gpus_per_process": args.gpus_per_process}
    # reads back as a table (read_nccl_tests); a simulated row has no #wrong count to report
    emit_json(args, [{**{k: v for k, v in asdict(r).items() if k != "wrong"}, **run} for r in rows], indent=1)
    return 0
