"""`zsim sweep SWEEP.yaml`: run a what-if study over any scenario keys and answer it (docs/sweep.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from zsim.commands import HELP
from zsim.commands.options import add_json_option, emit_json, text_stream
from zsim.errors import EXIT_OK

MAX_WORKERS = 1024  # processes on one machine or one Dask cluster; a typo of 100000 would fork until it fails


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "sweep", help=HELP["sweep"],
        description="Run a sweep file: every combination of its axes, each point validated before any runs, "
                    "simulated on local processes or a Dask cluster, cached so that a rerun runs only missing "
                    "points. Writes sweep.csv, sweep.jsonl, sweep.json and a plot (PNG, SVG). Exit 0 when it "
                    "ran (OOM points are results, not errors), 2 on bad input.")
    p.add_argument("sweep", help="sweep YAML file, or a shipped sweep's name (`zsim profiles` lists them), "
                   "e.g. whatif/ib-bandwidth-1T")
    p.add_argument("-o", "--output", metavar="DIR", help="output folder (default: out/<sweep name>); its cache/ "
                   "holds finished points")
    p.add_argument("--workers", type=_positive, metavar="N", help="worker processes (default: all cores)")
    p.add_argument("--engine", choices=("local", "dask"), default="local",
                   help="local processes (default), or Dask (pip install 'zsim[dask]'); same results either way")
    p.add_argument("--address", metavar="ADDR", help="with --engine dask: a running scheduler, e.g. tcp://host:8786 "
                   "(default: start a local Dask cluster of --workers processes)")
    p.add_argument("--per-point", action="store_true",
                   help="also write each point's result.json to points/<key>/ (its cache key)")
    p.add_argument("--no-plot", action="store_true", help="skip the plot")
    add_json_option(p, "sweep.json's facts")
    p.set_defaults(func=sweep_command)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    if value > MAX_WORKERS:
        raise argparse.ArgumentTypeError(f"at most {MAX_WORKERS} worker processes, got {value}")
    return value


def sweep_command(args: argparse.Namespace) -> int:
    from zsim.scenario.scenario import safe_name
    from zsim.sweep.files import sweep_lock
    from zsim.sweep.points import load_plan
    from zsim.sweep.runner import run_sweep, summary_facts, write_outputs
    from zsim.sweep.summary import sweep_summary

    from zsim.errors import ZsimError, printable

    if args.address and args.engine != "dask":
        raise ZsimError("--address needs --engine dask")
    if args.address:
        from zsim.sweep.engines import check_address

        check_address(args.address)  # before planning: a malformed address costs nothing
    planning = _PlanBar() if sys.stderr.isatty() else None
    try:
        plan = load_plan(args.sweep, progress=planning.update if planning else None)  # every point, before any runs
    finally:
        if planning:
            planning.close()  # before the workers fork: tqdm's monitor thread ends with its last bar
    name = plan.spec.name or Path(args.sweep).stem
    # as `zsim run` does with a scenario's name: one safe file-name component, so `name: ../../x` or
    # `name: /abs` cannot write outside out/ (issue 13)
    out = Path(args.output) if args.output else Path("out") / safe_name(name)
    if out.exists() and not out.is_dir():
        raise ZsimError(f"-o {out}: is a file; the sweep needs a folder")
    text = text_stream(args)
    with sweep_lock(out):  # the whole sweep: cache, tables and plots (a second sweep here is refused)
        bar = _progress_bar(len(plan.points))
        try:
            sweep = run_sweep(plan, out, engine=args.engine, workers=args.workers, address=args.address,
                              per_point=args.per_point, write=False, lock=False,
                              progress=bar.update if bar else None)
        except KeyboardInterrupt:
            if bar:
                bar.close()
            done = sum(1 for _ in (out / "cache").glob("*.json")) if (out / "cache").is_dir() else 0
            print(f"zsim: interrupted; finished points are cached in {printable(str(out / 'cache'))} ({done} "
                  "files): run the same command again to resume", file=sys.stderr)
            return 130
        if bar:
            bar.close()
        write_outputs(sweep, plot=not args.no_plot)
    print(sweep_summary(sweep), file=text)
    emit_json(args, summary_facts(sweep))
    return EXIT_OK


class _Bar:
    """tqdm on a terminal (stderr), nothing otherwise. Created at the first update, after the worker
    processes have started (tqdm runs a monitor thread, and the local engine forks only without one)."""

    def __init__(self, total: int):
        self._bar = None

    def update(self, done: int, total: int) -> None:
        if self._bar is None:
            from tqdm import tqdm

            self._bar = tqdm(total=total, unit="pt", desc="sweep", file=sys.stderr, leave=False)
        self._bar.total = total
        self._bar.n = done
        self._bar.refresh()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


class _PlanBar:
    """tqdm on stderr while a sweep is planned, shown only when planning takes over a second."""

    def __init__(self):
        from tqdm import tqdm

        self._bar = tqdm(total=0, unit="pt", desc="plan", file=sys.stderr, leave=False, delay=1)

    def update(self, done: int, total: int) -> None:
        self._bar.total = total
        self._bar.update(done - self._bar.n)  # tqdm redraws at most every 0.1 s

    def close(self) -> None:
        self._bar.close()


def _progress_bar(total: int) -> _Bar | None:
    return _Bar(total) if sys.stderr.isatty() else None
