"""`zsim calibrate INPUT... --profile BASE -o PROFILE.yaml`: fit a hardware profile's terms to
measurements (runtime traces, Kineto traces, nccl-tests tables, GEMM tables) and write it, with
provenance (the fitted terms, every term kept from the base, and the warning of an accepted poor fit),
or refuse (exit 2, every cause named): inputs of another or of several machines, too few samples, or
a poor fit not accepted."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zsim.commands import HELP
from zsim.commands.options import (add_json_option, add_profile_options, emit_json, held_terms, hold_term,
                                   profile_search, text_stream)
from zsim.errors import EXIT_OK, ZsimError
from zsim.report.table import format_table

if TYPE_CHECKING:
    from zsim.config.profiles import Profiles


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "calibrate", help=HELP["calibrate"],
        description="Read measurements, fit the collective model (per collective and group size) and the compute "
                    "model of a base profile, and write a calibrated profile with provenance (inputs, date, "
                    "fitted and kept terms, residuals). Inputs: runtime trace folders (rank<R>.trace.json), "
                    "PyTorch profiler (Kineto) traces, nccl-tests tables (<collective>.txt), GEMM tables (.csv). "
                    "A term the data do not determine is kept from the base and listed. Exit 2, writing nothing, "
                    "for inputs of another machine than the base's (or of several), too few samples for the terms "
                    "they touch, or a poor fit unless --accept-poor-fit, every cause named (docs/calibrate.md).")
    p.add_argument("inputs", nargs="+", type=Path, metavar="INPUT", help="files or folders of measurements")
    add_profile_options(p, required=True, what="the base profile (unfitted terms come from it)")
    p.add_argument("-o", "--output", type=Path, required=True, metavar="PROFILE.yaml", help="the profile to write")
    add_json_option(p, "the fit report")
    p.add_argument("--residuals", action="store_true", help="print every sample's residual")
    p.add_argument("--fit", choices=("all", "collectives", "compute"), default="all",
                   help="which models to fit (default all the inputs inform); samples of the other are reported unused")
    p.add_argument("--accept-poor-fit", action="store_true",
                   help="write a fit with terms at bounds, an in-sample median error above 15%% or terms more than "
                        "3x from the probe or the base (refused otherwise); the profile carries the causes as its "
                        "warning, and `zsim run` prints it")
    p.add_argument("--hold", action="append", default=[], type=hold_term, metavar="TERM=VALUE",
                   help="multi-node nccl-tests tables: keep an inter-node term at VALUE instead of fitting it "
                        "(repeatable; as zsim nccl-fit --hold), e.g. --hold efficiency=0.96 where the tables stop "
                        "short of the sizes that set it (docs/fabric.md)")
    p.add_argument("--allow-missing-ranks", action="store_true",
                   help="accept Kineto traces of some ranks only (their collective times then include waiting)")
    p.set_defaults(func=run_command)


def calibrate(inputs: list[Path], profile: str, output: Path, allow_missing_ranks: bool = False,
              fit: str = "all", profiles: Profiles | None = None, accept_poor_fit: bool = False,
              hold: dict[str, float] | None = None) -> dict[str, Any]:
    """Fit, write `output`, and return the report (what `--json` prints). `profile`: the base profile, a
    name found by `profiles` (default: $ZSIM_PROFILE_PATH, then the built-in ones) or a .yaml file.
    A poor fit (zsim.calibrate.fit_quality) is written only with `accept_poor_fit`, and then carries its
    causes as `provenance.warning` (and the report's `warning`).

    Raises:
        ConfigError: an input or the base profile is invalid.
        CalibrationError: the data cannot determine the model (nothing is written); Refusal (one of
        them): inputs of another or of several machines, or a poor fit not accepted, every cause named.
    """
    from zsim.calibrate.collectives import CalibrationError
    from zsim.calibrate.fit_quality import verdict
    from zsim.calibrate.machines import check_machines
    from zsim.calibrate.profile_terms import host_terms, kept_terms, system_terms, touched
    from zsim.calibrate.profile_writer import base_file, provenance, write_profile
    from zsim.config.yamlfile import read_yaml_mapping
    from zsim.fabric.cluster import load_cluster
    from zsim.config.profiles import Profiles
    from zsim.calibrate.inputs import read_inputs

    profiles, name = (Profiles.from_environment() if profiles is None else profiles).resolve_system(profile)
    multinode = [p for p in inputs if _is_multinode(p)]
    if hold and fit == "compute":
        raise ZsimError(f"--hold {next(iter(hold))}=...: holds an inter-node term, which --fit compute does not fit")
    if hold and not multinode:
        raise ZsimError(f"--hold {next(iter(hold))}=...: holds an inter-node term; no input is a folder of "
                        "multi-node nccl-tests tables (<collective>-<N>nodes.txt)")
    data = read_inputs([p for p in inputs if p not in multinode], allow_missing_ranks)
    cluster = load_cluster(name, 1, profiles)
    check_machines(data.machines, cluster, profile)  # one machine per fit, the base's
    replace: dict[str, Any] = {}
    sections: dict[str, Any] = {}
    report: dict[str, Any] = {"profile": str(output), "base": profile, "inputs": data.sources}
    causes: list[str] = []  # of a poor fit (zsim.calibrate.fit_quality)
    if multinode and fit != "compute":
        _calibrate_network(name, multinode, output, replace, sections, report, profiles, causes, hold or {})
    if getattr(cluster, "host", None) is not None:  # a CPU host profile: gloo collectives and host compute terms
        from zsim.calibrate.host_calibration import calibrate_host

        calibrate_host(cluster, name, data, fit, replace, sections, report, profiles, causes)
    else:
        _calibrate_gpu(cluster, name, data, fit, replace, sections, report, profiles, causes)
    if not replace:
        raise CalibrationError("the inputs hold nothing to fit")
    prov = provenance(profile, data.sources, sections)
    terms = (host_terms if cluster.host is not None else lambda b: system_terms(b, profiles))(
        read_yaml_mapping(base_file(name, profiles)))
    fitted = touched(sections)
    prov["fitted_terms"] = report["fitted_terms"] = [t for t in terms if t in fitted] + sorted(fitted - set(terms))
    prov["kept_from_base"] = report["kept_from_base"] = kept_terms(terms, fitted)  # never touched by the inputs
    warning = verdict(causes, accept_poor_fit)
    if warning:
        prov["warning"] = report["warning"] = warning
    write_profile(name, replace, prov, output, profiles)
    return report


def _is_multinode(path: Path) -> bool:
    """A folder of multi-node nccl-tests tables (`<collective>-<N>nodes.txt`, or zsim collective's .json)."""
    return path.is_dir() and any(p.suffix in (".txt", ".json") for p in path.glob("*-*nodes.*"))


def _calibrate_network(profile: str, folders: list[Path], output: Path, replace: dict, sections: dict,
                       report: dict, profiles=None, causes: list[str] | None = None,
                       hold: dict[str, float] | None = None) -> None:
    """Fit the inter-node terms to multi-node tables (the node's own held: zsim.calibrate.net_fit; `hold`'s
    terms kept at their values) and write them as a network profile beside the output,
    `networks/<output stem>-net.yaml`, which the written system profile names (a profile file's own folder
    is searched first for the networks it names). A poor fit's causes (zsim.calibrate.fit_quality: a term
    on a bound, an in-sample median above the limit on rows >= 1 MiB) are appended to `causes`."""
    import yaml

    from zsim.calibrate.fit_quality import at_bounds, high_error
    from zsim.calibrate.net_fit import TERMS, error_summary, fit_network, on_bounds, read_runs
    from zsim.fabric.cluster import load_cluster
    from zsim.config.profiles import Profiles
    from zsim.config.yamlfile import read_yaml_mapping
    from zsim.report.outputs import write_atomic

    hold = dict(hold or {})
    runs = [run for folder in folders for run in read_runs(folder)]
    result = fit_network(profile, runs, profiles, terms=tuple(t for t in TERMS if t not in hold), held=hold)
    base = load_cluster(profile, 2, profiles)
    search = profiles or Profiles.from_environment()
    net = read_yaml_mapping(search.path("network", base.network_profile))
    net.update({k: round(v, 4) for k, v in result.values.items()})
    net["fit"] = {"cluster": ", ".join(f.name for f in folders), "tables": ", ".join(str(f) for f in folders),
                  "nodes": list(result.nodes), "terms": list(result.fitted)}
    if hold:
        net["fit"]["held"] = {t: "given by zsim calibrate --hold" for t in hold}
    name = f"{output.stem}-net"
    path = output.parent / "networks" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, f"# Fitted by `zsim calibrate` from network '{base.network_profile}' (zsim.calibrate.net_fit).\n"
                 + yaml.safe_dump(net, sort_keys=False, default_flow_style=None, width=110))
    system = read_yaml_mapping(search.path("system", profile))
    replace["inter_node"] = {**system["inter_node"], "network": name}
    median, worst, rows = error_summary(result.residuals)
    if causes is not None:
        causes += at_bounds("inter-node terms", on_bounds(result))
        causes += high_error("inter-node terms (rows >= 1 MiB)", median if rows else None)
    sections["network"] = {"model": "inter-node terms (docs/fabric.md, Between nodes)", "file": str(path),
                           "fitted": {k: result.values[k] for k in result.fitted}, "nodes": list(result.nodes),
                           "kept_from_base": [k for k in result.values if k not in result.fitted and k not in hold],
                           **({"held": dict(hold)} if hold else {}),
                           "residuals": {"rows_over_1MiB": rows, "median_error": median if rows else None,
                                         "max_error": worst if rows else None}}  # none >= 1 MiB: NaN is not JSON
    report["network"] = sections["network"]


def run_command(args: argparse.Namespace) -> int:
    from zsim.calibrate.optimizer import scipy_optimize
    from zsim.errors import ZsimError

    scipy_optimize("zsim calibrate")  # before reading the traces: without scipy, say what to install
    from zsim.report.outputs import check_dir, check_file

    profiles, _ = profile_search(args)  # checks --profiles and that --profile was given
    if args.output.is_dir():  # before any work: a bad output costs nothing
        raise ZsimError(f"-o {args.output}: is a folder, expected a profile file name (.yaml)")
    check_dir(args.output.parent, flag="-o")
    if args.json and args.json != "-":
        check_file(args.json)
    from zsim.calibrate.collectives import Refusal

    try:
        report = calibrate(args.inputs, args.profile, args.output, args.allow_missing_ranks, args.fit,
                           profiles=profiles, accept_poor_fit=args.accept_poor_fit, hold=held_terms(args.hold))
    except Refusal as exc:  # every cause on its own line (the CLI prints two lines of an error)
        from zsim.console.parser import error_text

        print(error_text(f"zsim: {exc.headline}:\n" + "\n".join(f"  - {c}" for c in exc.causes),
                         lines=1 + len(exc.causes)), file=sys.stderr)
        return exc.exit_code
    out = text_stream(args)
    print(f"zsim calibrate · {args.profile} → {args.output}", file=out)
    for source in report["inputs"]:
        skipped = "; ".join([f"{n} skipped: {why}" for why, n in source.get("skipped", {}).items()]
                            + (["GPU kernels " + ", ".join(f"{k} {n}" for k, n in source["gpu_kernels"].items())]
                               if source.get("gpu_kernels") else []))
        print(f"  input     {source['path']} ({source['kind']}: {source['collectives']} collectives, "
              f"{source['compute']} compute samples{'; ' + skipped if skipped else ''})", file=out)
    if report.get("unused"):
        print(f"  unused    {report['unused']}", file=out)
    if report.get("network"):
        n = report["network"]
        r = n["residuals"]
        print(f"  network   {', '.join(f'{k} {v:.4g}' for k, v in n['fitted'].items())} on {n['nodes'][0]}-{n['nodes'][1]} "
              f"nodes → {n['file']}; " + (f"rows >= 1 MiB: median {r['median_error']:.1%}, worst {r['max_error']:.1%}"
                                         if r["rows_over_1MiB"] else "no row >= 1 MiB to judge it by"), file=out)
    coll = report.get("collectives")
    if coll and coll.get("model", "").startswith("gloo"):
        for key, entry in coll["fitted"].items():
            print(f"  fitted    {key}: latency {entry['latency_us']:.1f} us ({entry['latency']}), {entry['GBps']:.4g} GB/s; "
                  f"{entry['fit']['points']} sizes, median error {entry['fit']['median_rel_error']:.1%}", file=out)
        for key, why in coll.get("kept_from_base", {}).items():
            print(f"  kept      {key}: {why}", file=out)
        coll = None
    if report.get("core_sharing"):
        cs = report["core_sharing"]
        print(f"  cores     gloo's share of a rank's cores beside compute: {cs['gloo_core_share']:.3g} ({cs['how']}; "
              f"{cs['collectives']} collectives)", file=out)
    if report.get("compute"):
        c = report["compute"]
        print(f"  compute   {c['values'] if 'values' in c else ''} ({c.get('model', '')})", file=out)
        why = c.get("kept_why") or {}
        for name in c.get("kept_from_base") or ():
            print(f"  kept      compute {name}: {why.get(name, 'not determined by these traces; the base kept')}",
                  file=out)
    if report.get("phases"):
        ph = report["phases"]
        held = ph["heldout"]
        held_text = (f"held out ({held['folds']}): median {held['median_error']:.1%}, worst {held['max_error']:.1%}"
                     if held["median_error"] is not None else "no held-out check (one fold)")
        host_bound = (f"{ph['host_bound_ops_left_out']} host-bound fit the host terms" if ph.get("host")
                      else f"{ph['host_bound_ops_left_out']} host-bound left out")
        print(f"  phases    {ph['fitted']} from {ph['ops']} GPU-bound ops timed by {ph['timing']} "
              f"({host_bound}); median error {ph['median_error']:.1%}, worst {ph['max_error']:.1%}; {held_text}"
              + (f"; kept from the base: {', '.join(ph['kept_from_base'])}" if ph["kept_from_base"] else ""), file=out)
    if coll:
        print(f"  fitted    {', '.join(coll['fitted'])}", file=out)
        if coll["kept_from_base"]:
            print(f"  kept      {', '.join(coll['kept_from_base'])} (the data do not determine them: from the base)",
                  file=out)
        if coll["at_zero"]:
            print(f"  at zero   {', '.join(coll['at_zero'])} (too small to measure in these data)", file=out)
        print("  residuals busbw, simulated vs measured (sizes >= 1 MiB where any): median, worst", file=out)
        rows = [[fn, f"{s['samples']} samples", f"{s['median_error']:.1%}", f"{s['max_error']:.1%}"]
                for fn, s in coll["residuals"].items()]
        for text in format_table(rows, indent="    ", gap="  "):
            print(text, file=out)
        if args.residuals:
            rows = [[r["op"], f"{r['bytes']} B", f"n={r['group']}", f"{r['measured_busbw']:.2f}",
                     f"{r['simulated_busbw']:.2f} GB/s", f"{r['error']:+.1%}", r["algorithm"]] for r in coll["samples"]]
            for text in format_table(rows, align="<><>>><", indent="    "):
                print(text, file=out)
    kept = report.get("kept_from_base") or {}
    print(f"  terms     {len(report.get('fitted_terms') or [])} fitted; {len(kept)} never touched by the inputs, kept "
          f"from the base: {', '.join(kept) or 'none'}", file=out)
    for cause in (report.get("warning") or {}).get("poor_fit", []):
        print(f"  warning   {cause} (accepted: --accept-poor-fit)", file=out)
    emit_json(args, report, indent=1)
    return EXIT_OK


def _calibrate_gpu(cluster, profile: str, data, fit: str, replace: dict, sections: dict, report: dict,
                   profiles=None, causes: list[str] | None = None) -> None:
    """A GPU system profile: the NCCL kernel terms from the collectives; the GEMM terms from GEMM tables;
    the memory-bound compute terms from the phase timings of runtime or simulated traces. The causes of
    a poor fit are appended to `causes` (zsim.calibrate.fit_quality)."""
    causes = [] if causes is None else causes
    if data.collectives and fit != "compute":
        _collectives(cluster, profile, data, replace, sections, report, causes)
    elif data.collectives:
        report["unused"] = f"{len(data.collectives)} collective samples (--fit {fit})"
    if data.compute and fit == "collectives":
        report["unused"] = f"{len(data.compute)} compute samples (--fit collectives)"
    elif data.compute:
        _compute(cluster, profile, data, replace, sections, report, profiles, causes)


def _collectives(cluster, profile: str, data, replace: dict, sections: dict, report: dict, causes: list[str]) -> None:
    """The NCCL kernel terms (zsim.calibrate.collectives), written only where the data moved one."""
    from zsim.calibrate.collectives import calibrate_nccl
    from zsim.calibrate.fit_quality import at_bounds, far_terms, high_error
    from zsim.calibrate.nccl_fit import values_of
    from zsim.calibrate.profile_writer import nccl_section

    fitted = calibrate_nccl(cluster, data.collectives, profile)
    if fitted.fitted:
        replace["nccl"] = nccl_section(fitted.values, cluster.nccl_tuner)
    sections["collectives"] = {"model": "nccl", "fitted": list(fitted.fitted), "kept_from_base": list(fitted.kept),
                               "at_zero": list(fitted.at_zero), "residuals": fitted.summary()}
    report["collectives"] = {**sections["collectives"], "values": fitted.values,
                             "samples": [{"op": r.fn, "bytes": r.size, "group": r.group, "source": r.source,
                                          "measured_busbw": r.measured_busbw, "simulated_busbw": r.simulated_busbw,
                                          "error": r.error, "algorithm": r.algorithm} for r in fitted.residuals]}
    if not fitted.fitted:
        return
    causes += at_bounds("NCCL", (f"{n} = {fitted.values[n]:.4g}" for n in fitted.at_bounds))
    for fn, s in fitted.summary().items():
        causes += high_error(f"NCCL {fn}", s["median_error"])
    rates = {n: fitted.values[n] for n in fitted.fitted if n.startswith(("efficiency", "unaligned"))}
    causes += far_terms("NCCL", rates, values_of(cluster.nccl), "the base")


def _compute(cluster, profile: str, data, replace: dict, sections: dict, report: dict, profiles,
             causes: list[str]) -> None:
    """The GEMM terms from GEMM tables, then the memory-bound terms from phase timings."""
    from zsim.calibrate.fit_quality import MEDIAN_LIMIT, at_bounds, far_terms, high_error
    from zsim.calibrate.gpu_compute import calibrate_gemms, gemm_reference, with_gemm_terms

    gemms = [s for s in data.compute if s.kind == "gemm"]
    phases = [s for s in data.compute if s.kind != "gemm"]
    compute: dict = {}
    if gemms:
        gemm, summary = calibrate_gemms(cluster, gemms)
        for dtype, s in summary.items():
            causes += at_bounds(f"GEMM {dtype}", s.get("at_bounds", ()))
            causes += high_error(f"GEMM {dtype}", s.get("insample_median"))
            rates = {k: v for k, v in gemm[dtype].items() if k != "k_overhead"}  # k_overhead may be 0
            causes += far_terms(f"GEMM {dtype}", rates, gemm_reference(cluster, dtype), "the base")
        compute["gemm"] = gemm
        sections["compute"] = {"model": "GEMM tile-and-wave model (docs/compute.md)", "fitted": summary}
        report["compute"] = {**sections["compute"], "values": gemm}
        cluster = with_gemm_terms(cluster, gemm)  # the phase fit below prices GEMMs with the new terms
    if phases:
        from zsim.calibrate.gpu_phase_fit import calibrate_phases

        pf = calibrate_phases(cluster, data.runs, profile, profiles)
        fitted = {k: round(v, 4) for k, v in pf.values.items() if k not in pf.kept}
        fitted.update({k: round(v, 4) for k, v in pf.host.items()})  # CUDA-event spans: host terms, fitted apart
        compute.update(fitted)
        sections["phases"] = {"model": "memory-bound kernel terms from phase timings (docs/calibrate.md)",
                              "fitted": fitted, **pf.summary()}
        report["phases"] = sections["phases"]
        terms = cluster.gpu.compute
        causes += at_bounds("GPU phases", pf.at_bounds)
        causes += high_error("GPU phases", pf.median_error)
        if pf.spans and (pf.at_bounds or pf.median_error > MEDIAN_LIMIT):  # say where the model misses
            causes.append(f"GPU phases: the ops missed most: {'; '.join(pf.spans['worst_ops'])}; host terms "
                          f"{pf.host['host_module_us']:.4g} us per op + {pf.host['host_op_us']:.4g} us per launch miss "
                          f"the {pf.spans['host_bound']} host-bound spans by a median "
                          f"{pf.spans['host_median_error']:.0%} (docs/calibrate.md, CUDA-event spans)")
        causes += far_terms("GPU phases", fitted, {"kernel_us": terms.kernel_s * 1e6, "hbm_efficiency": terms.hbm_efficiency,
                                                   "reduce_kernel_us": terms.reduce_kernel_s * 1e6,
                                                   "host_op_us": terms.host_op_s * 1e6}, "the base")
    if compute:
        replace["compute"] = compute
