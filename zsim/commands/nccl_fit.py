"""`zsim nccl-fit`: fit a profile's NCCL kernel terms to nccl-tests tables and report the residuals."""

from __future__ import annotations

import argparse
from pathlib import Path

from zsim.commands import HELP
from zsim.commands.options import (add_json_option, add_profile_options, emit_json, held_terms, hold_term,
                                   profile_search, text_stream)
from zsim.console.units import positive
from zsim.commands.collective import MAX_GPUS, MAX_NODES
from zsim.errors import ZsimError
from zsim.fabric.nccl import FUNCTIONS
from zsim.report.table import format_table


def read_tables(folder: Path, failed: list[str] | None = None) -> dict:
    """{collective: rows} from `<folder>/<collective>.txt` files, without the rows nccl-tests' own check
    failed (zsim.trace.nccl_tests.checked), which are named in `failed` when it is given. Raises ZsimError
    if none."""
    from zsim.trace.nccl_tests import checked, read_nccl_tests

    if not folder.exists():
        raise ZsimError(f"{folder}: no such folder (expected a folder of nccl-tests tables, <collective>.txt)")
    if not folder.is_dir():
        raise ZsimError(f"{folder}: not a folder of nccl-tests tables (<collective>.txt)")
    tables = {}
    for fn in FUNCTIONS:
        if (folder / f"{fn}.txt").is_file():
            tables[fn], wrong = checked(read_nccl_tests(folder / f"{fn}.txt"))
            if failed is not None:
                failed += [left_out(f"{fn}.txt", r) for r in wrong]
    if not tables:
        raise ZsimError(f"{folder}: no nccl-tests tables named {', '.join(f + '.txt' for f in FUNCTIONS)}")
    return tables


def left_out(table: str, row) -> str:
    """How the fit's output names a row nccl-tests' own check failed: 'TABLE SIZE B (N wrong)'."""
    return f"{table} {row.size} B ({row.wrong} wrong)"


LEFT_OUT = "# left out, nccl-tests' own check failed (#wrong > 0): "


def profile_yaml(values: dict[str, float], tuner: str) -> str:
    """The `nccl:` section of a system profile, in its units, for the tuner release it was fitted under."""
    def group(prefix: str) -> str:
        items = {k[len(prefix) + 1:]: v for k, v in values.items() if k.startswith(prefix + ".")}
        return "{" + ", ".join(f"{k}: {v:.3f}" for k, v in items.items()) + "}"
    return "\n".join([
        "nccl:",
        f'  tuner: "{tuner}"',
        f"  launch_us: {values['launch_us']:.3f}",
        f"  efficiency: {{LL: {values['efficiency.LL']:.3f}, LL128: {group('efficiency.LL128')}, "
        f"Simple: {values['efficiency.Simple']:.3f}}}",
        f"  latency_us: {group('latency_us')}",
        f"  step_latency_us: {group('step_latency_us')}",
        f"  unaligned_copy_GBps: {values['unaligned_copy_GBps']:.3f}",
        f"  unaligned_reduce_GBps: {values['unaligned_reduce_GBps']:.3f}",
    ])


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "nccl-fit", help=HELP["nccl-fit"],
        description="Read nccl-tests output tables (<collective>.txt in FOLDER), fit the NCCL kernel terms of "
                    "a system profile (launch floor, protocol efficiencies and latencies, unaligned-path "
                    "bandwidths) by least squares on log(time), and print the fitted `nccl:` section and every "
                    "row's busbw residual. `zsim calibrate FOLDER --profile P -o OUT.yaml` fits the same terms from any mix of "
                    "inputs and writes a whole profile with provenance.")
    p.add_argument("folder", type=Path, help="folder of nccl-tests tables")
    add_profile_options(p, required=True, what="the system whose topology ran the tests")
    p.add_argument("--nodes", type=positive("--nodes", MAX_NODES), default=1, help="nodes the tests ran on (default 1)")
    p.add_argument("--gpus", type=positive("--gpus", MAX_GPUS), help="GPUs the tests ran on (single-node tables; "
                   "multi-node tables, <collective>-<N>nodes.txt, say it in their headers)")
    p.add_argument("--max-nodes", type=positive("--max-nodes", MAX_NODES), default=None,
                   help="multi-node tables: fit only those of at most this many nodes and report the rest as "
                        "held out (e.g. --max-nodes 8)")
    p.add_argument("--algo", choices=("auto", "ring", "tree"), default="auto",
                   help="multi-node tables: the NCCL_ALGO they ran with (their provenance says; default auto: "
                        "NCCL's tuner chose). With ring the tree's share is not fitted")
    p.add_argument("--hold", action="append", default=[], type=hold_term, metavar="TERM=VALUE",
                   help="multi-node tables: keep an inter-node term at VALUE instead of fitting it (repeatable; "
                        "terms: efficiency, tree_efficiency, ll128_share, latency_us, latency_growth_us, nvls_tree_share), e.g. "
                        "--hold efficiency=0.96 where the tables stop short of the sizes that set it "
                        "(docs/fabric.md)")
    p.add_argument("-g", "--gpus-per-process", type=positive("-g", 64), default=1, dest="gpus_per_process",
                   help="nccl-tests -g of the recording (GPUs per process)")
    add_json_option(p, "the values and residuals")
    p.set_defaults(func=run_command)


def _check_recording(args: argparse.Namespace) -> None:
    """--gpus and -g against what each table's header says it ran on (`zsim calibrate` reads them from
    there): a fit for another GPU count would be silently wrong. Raises ZsimError."""
    from zsim.trace.nccl_tests import recording_of

    if args.gpus < 2:
        raise ZsimError(f"--gpus {args.gpus}: a collective needs at least 2 GPUs")
    for fn in FUNCTIONS:
        path = args.folder / f"{fn}.txt"
        found = recording_of(path) if path.is_file() else None
        if found is not None and found != (args.gpus, args.gpus_per_process):
            gpus, per_process = found
            raise ZsimError(f"{path}: its header lists {gpus} GPUs, {per_process} per process (nccl-tests -g); "
                            f"give --gpus {gpus} -g {per_process}, not --gpus {args.gpus} -g {args.gpus_per_process}")


def network_yaml(values: dict[str, float], fitted_on: str, nodes: tuple[int, int],
                 fitted: tuple[str, ...] | None = None, held: tuple[str, ...] = ()) -> str:
    """The fitted terms of a network profile (hwprofiles/networks/), in its units, with their `fit:` block
    (`fitted`: the terms the fit set, default all in `values`; `held`: those --hold gave)."""
    from zsim.calibrate.net_fit import TERMS

    fitted = tuple(t for t in TERMS if t in values) if fitted is None else fitted
    lines = [f"{t}: {values[t]:.4g}" for t in TERMS if t in values]
    lines += ["fit:", f"  cluster: {fitted_on}", f"  tables: {fitted_on}", f"  nodes: [{nodes[0]}, {nodes[1]}]",
              f"  terms: [{', '.join(t for t in TERMS if t in fitted)}]"]
    if held:
        lines.append("  held: {" + ", ".join(f"{t}: given by --hold" for t in held) + "}")
    return "\n".join(lines)


def run_network(args: argparse.Namespace, profiles, profile: str) -> int:
    """Multi-node tables: fit the network's inter-node terms, the node's own held (zsim.calibrate.net_fit)."""
    from zsim.calibrate.net_fit import error_summary, fit_network, read_runs, residuals_of

    from zsim.calibrate.net_fit import TERMS

    runs = read_runs(args.folder, max_nodes=args.max_nodes, algorithm=args.algo)
    hold = held_terms(args.hold)
    result = fit_network(profile, runs, profiles, terms=tuple(t for t in TERMS if t not in hold), held=hold)
    held = [r for r in read_runs(args.folder, algorithm=args.algo) if r.header.nodes > (args.max_nodes or 1 << 30)]
    held_res = residuals_of(profile, held, result.values, profiles) if held else []
    out = text_stream(args)
    print(f"# inter-node terms of profile '{profile}''s network fitted to {args.folder.name} "
          f"({result.nodes[0]}-{result.nodes[1]} nodes)", file=out)
    print(network_yaml(result.values, args.folder.name, result.nodes, result.fitted, tuple(hold)), file=out)
    failed = [left_out(run.path.name, r) for run in [*runs, *held] for r in run.failed]
    if failed:
        print(LEFT_OUT + "; ".join(failed), file=out)
    cells = [[tag, r.source.split("/")[-1], str(r.size), f"{r.measured_busbw:.2f}", f"{r.simulated_busbw:.2f}",
              f"{r.error:+.1%}", r.algorithm] for tag, rows in (("fit", result.residuals), ("held", held_res)) for r in rows]
    print("", *_commented(cells, ["", "table", "size", "measured", "simulated", "error", "algorithm"]), sep="\n", file=out)
    summary = {tag: error_summary(rows) for tag, rows in (("fit", result.residuals), ("held", held_res))}
    summary = {tag: s for tag, s in summary.items() if s[2]}  # no row >= 1 MiB: no median (NaN is not JSON)
    print("\n# sizes >= 1 MiB: median |busbw error|, worst |busbw error|, rows", file=out)
    for tag, (med, worst, n) in summary.items():
        print(f"# {tag:>5}  {med:6.1%}  {worst:6.1%}  {n}", file=out)
    emit_json(args, {"values": result.values, "nodes": list(result.nodes),
                     "summary": {k: {"median": v[0], "worst": v[1], "rows": v[2]} for k, v in summary.items()},
                     "residuals": [{"table": r.source, "op": r.fn, "size": r.size, "measured_busbw": r.measured_busbw,
                                    "simulated_busbw": r.simulated_busbw, "algorithm": r.algorithm,
                                    "held_out": i >= len(result.residuals)}
                                   for i, r in enumerate(result.residuals + held_res)]}, indent=1)
    return 0


def _commented(rows: list[list[str]], header: list[str]) -> list[str]:
    """A residual table as nccl-tests prints its own (zsim.report.table): the header line a '#' comment,
    columns right-aligned but the last."""
    lines = format_table(rows, header=[header], align=">" * (len(header) - 1) + "<", indent=" ")
    return ["#" + lines[0][1:], *lines[1:]]


def run_command(args: argparse.Namespace) -> int:
    from zsim.calibrate.nccl_fit import fit
    from zsim.calibrate.optimizer import scipy_optimize

    scipy_optimize("zsim nccl-fit")  # before reading the tables: without scipy, say what to install
    from zsim.fabric.cluster import load_cluster

    from zsim.calibrate.nccl_fit import _PARAMS

    profiles, profile = profile_search(args)
    held_terms(args.hold)  # a term twice, or every term: refused before any table is read
    if not args.folder.is_dir():  # named before asking for --gpus, which a missing folder would not need
        what = "not a folder" if args.folder.exists() else "no such folder"
        raise ZsimError(f"{args.folder}: {what} (expected a folder of nccl-tests tables: <collective>.txt for one "
                        "node, <collective>-<N>nodes.txt across nodes)")
    if any(p.suffix in (".txt", ".json") for p in args.folder.glob("*-*nodes.*")):
        return run_network(args, profiles, profile)
    if args.hold:
        raise ZsimError(f"--hold {args.hold[0][0]}=...: holds an inter-node term; {args.folder} holds no multi-node "
                        "tables (<collective>-<N>nodes.txt)")
    if args.gpus is None:
        raise ZsimError(f"{args.folder}: single-node tables need --gpus (the GPUs the tests ran on)")
    failed: list[str] = []
    tables = read_tables(args.folder, failed)
    rows = len({(fn, r.size) for fn, t in tables.items() for r in t})
    if rows < 2 * len(_PARAMS):  # fewer sizes than twice the terms: the fit would be underdetermined noise
        raise ZsimError(f"{args.folder}: {rows} distinct sizes in the nccl-tests tables; fitting {len(_PARAMS)} terms "
                        f"needs at least {2 * len(_PARAMS)} (a sweep such as -b 8 -e 8G -f 2 gives 31 per table)")
    _check_recording(args)
    cluster = load_cluster(profile, args.nodes, profiles)
    result = fit(cluster, tables, args.gpus, args.gpus_per_process)
    out = text_stream(args)
    print(profile_yaml(result.values, cluster.nccl_tuner), file=out)
    if failed:
        print(LEFT_OUT + "; ".join(failed), file=out)
    cells = [[r.fn, str(r.size), f"{r.measured_busbw:.2f}", f"{r.simulated_busbw:.2f}", f"{r.error:+.1%}", r.algorithm]
             for r in result.residuals]
    print("\n# residuals: simulated vs measured busbw (GB/s)", *_commented(
        cells, ["op", "size", "measured", "simulated", "error", "algorithm"]), sep="\n", file=out)
    print("\n# per collective, sizes >= 1 MiB: median |error|, max |error|", file=out)
    for fn, (med, worst) in result.summary().items():
        print(f"#{fn:>15}  {med:6.1%}  {worst:6.1%}", file=out)
    emit_json(args, {"values": result.values, "summary": result.summary(),
                     "residuals": [{"op": r.fn, "size": r.size, "measured_busbw": r.measured_busbw,
                                    "simulated_busbw": r.simulated_busbw, "algorithm": r.algorithm}
                                   for r in result.residuals]}, indent=1)
    return 0
