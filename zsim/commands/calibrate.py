"""`zsim calibrate INPUT... --profile BASE -o PROFILE.yaml`: fit a hardware profile's terms to
measurements (runtime traces, Kineto traces, nccl-tests tables, GEMM tables) and write it, with
provenance, or refuse (exit 2) when the data cannot determine what would be written."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zsim.commands import HELP
from zsim.commands.options import add_json_option, add_profile_options, emit_json, profile_search, text_stream
from zsim.errors import EXIT_OK

if TYPE_CHECKING:
    from zsim.config.profiles import Profiles


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "calibrate", help=HELP["calibrate"],
        description="Read measurements, fit the collective model (per collective and group size) and the compute "
                    "model of a base profile, and write a calibrated profile with provenance (inputs, date, "
                    "fitted and kept terms, residuals). Inputs: runtime trace folders (rank<R>.trace.json), "
                    "PyTorch profiler (Kineto) traces, nccl-tests tables (<collective>.txt), GEMM tables (.csv). "
                    "Exit 2, writing nothing, when the data cannot determine a term (docs/calibrate.md).")
    p.add_argument("inputs", nargs="+", type=Path, metavar="INPUT", help="files or folders of measurements")
    add_profile_options(p, required=True, what="the base profile (unfitted terms come from it)")
    p.add_argument("-o", "--output", type=Path, required=True, metavar="PROFILE.yaml", help="the profile to write")
    add_json_option(p, "the fit report")
    p.add_argument("--residuals", action="store_true", help="print every sample's residual")
    p.add_argument("--fit", choices=("all", "collectives", "compute"), default="all",
                   help="which models to fit (default all the inputs inform); samples of the other are reported unused")
    p.add_argument("--allow-missing-ranks", action="store_true",
                   help="accept Kineto traces of some ranks only (their collective times then include waiting)")
    p.set_defaults(func=run_command)


def calibrate(inputs: list[Path], profile: str, output: Path, allow_missing_ranks: bool = False,
              fit: str = "all", profiles: Profiles | None = None) -> dict[str, Any]:
    """Fit, write `output`, and return the report (what `--json` prints). `profile`: the base profile, a
    name found by `profiles` (default: $ZSIM_PROFILE_PATH, then the built-in ones) or a .yaml file.

    Raises:
        ConfigError: an input or the base profile is invalid.
        CalibrationError: the data cannot determine the model (nothing is written).
    """
    from zsim.calibrate.collectives import CalibrationError
    from zsim.calibrate.profile_writer import provenance, write_profile
    from zsim.config.hardware import load_cluster
    from zsim.config.profiles import Profiles
    from zsim.trace.inputs import read_inputs

    profiles, name = (Profiles.from_environment() if profiles is None else profiles).resolve_system(profile)
    data = read_inputs(inputs, allow_missing_ranks)
    cluster = load_cluster(name, 1, profiles)
    replace: dict[str, Any] = {}
    sections: dict[str, Any] = {}
    report: dict[str, Any] = {"profile": str(output), "base": profile, "inputs": data.sources}
    if getattr(cluster, "host", None) is not None:  # a CPU host profile: gloo collectives and host compute terms
        from zsim.calibrate.host_calibration import calibrate_host

        calibrate_host(cluster, name, data, fit, replace, sections, report, profiles)
    else:
        _calibrate_gpu(cluster, name, data, fit, replace, sections, report, profiles)
    if not replace:
        raise CalibrationError("the inputs hold nothing to fit")
    write_profile(name, replace, provenance(profile, data.sources, sections), output, profiles)
    return report


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
    report = calibrate(args.inputs, args.profile, args.output, args.allow_missing_ranks, args.fit,
                       profiles=profiles)
    out = text_stream(args)
    print(f"zsim calibrate · {args.profile} → {args.output}", file=out)
    for source in report["inputs"]:
        skipped = "; ".join(f"{n} skipped: {why}" for why, n in source.get("skipped", {}).items())
        print(f"  input     {source['path']} ({source['kind']}: {source['collectives']} collectives, "
              f"{source['compute']} compute samples{'; ' + skipped if skipped else ''})", file=out)
    if report.get("unused"):
        print(f"  unused    {report['unused']}", file=out)
    coll = report.get("collectives")
    if coll and coll.get("model", "").startswith("gloo"):
        for key, entry in coll["fitted"].items():
            print(f"  fitted    {key}: latency {entry['latency_us']:.1f} us ({entry['latency']}), {entry['GBps']:.4g} GB/s; "
                  f"{entry['fit']['points']} sizes, median error {entry['fit']['median_rel_error']:.1%}", file=out)
        coll = None
    if report.get("compute"):
        c = report["compute"]
        print(f"  compute   {c['values'] if 'values' in c else ''} ({c.get('model', '')})", file=out)
    if report.get("phases"):
        ph = report["phases"]
        held = ph["heldout"]
        held_text = (f"held out ({held['folds']}): median {held['median_error']:.1%}, worst {held['max_error']:.1%}"
                     if held["median_error"] is not None else "no held-out check (one fold)")
        print(f"  phases    {ph['fitted']} from {ph['ops']} GPU-bound ops ({ph['host_bound_ops_left_out']} host-bound "
              f"left out); median error {ph['median_error']:.1%}, worst {ph['max_error']:.1%}; {held_text}"
              + (f"; kept from the base: {', '.join(ph['kept_from_base'])}" if ph["kept_from_base"] else ""), file=out)
    if coll:
        print(f"  fitted    {', '.join(coll['fitted'])}", file=out)
        if coll["kept_from_base"]:
            print(f"  kept      {', '.join(coll['kept_from_base'])} (the data do not determine them: from the base)",
                  file=out)
        if coll["at_zero"]:
            print(f"  at zero   {', '.join(coll['at_zero'])} (too small to measure in these data)", file=out)
        print("  residuals busbw, simulated vs measured (sizes >= 1 MiB where any): median, worst", file=out)
        for fn, s in coll["residuals"].items():
            print(f"    {fn:<15} {s['samples']:>4} samples  {s['median_error']:6.1%}  {s['max_error']:6.1%}", file=out)
        if args.residuals:
            for r in coll["samples"]:
                print(f"    {r['op']:<15} {r['bytes']:>12} B  n={r['group']:<3} {r['measured_busbw']:8.2f} "
                      f"{r['simulated_busbw']:8.2f} GB/s {r['error']:+7.1%}  {r['algorithm']}", file=out)
    emit_json(args, report, indent=1)
    return EXIT_OK


def _calibrate_gpu(cluster, profile: str, data, fit: str, replace: dict, sections: dict, report: dict,
                   profiles=None) -> None:
    """A GPU system profile: the NCCL kernel terms from the collectives; the GEMM terms from GEMM tables;
    the memory-bound compute terms from the phase timings of runtime or simulated traces."""
    from zsim.calibrate.collectives import calibrate_nccl
    from zsim.calibrate.profile_writer import nccl_section

    if data.collectives and fit != "compute":
        fitted = calibrate_nccl(cluster, data.collectives, profile)
        replace["nccl"] = nccl_section(fitted.values, cluster.nccl_tuner)
        sections["collectives"] = {"model": "nccl", "fitted": list(fitted.fitted), "kept_from_base": list(fitted.kept),
                                   "at_zero": list(fitted.at_zero), "residuals": fitted.summary()}
        report["collectives"] = {**sections["collectives"], "values": fitted.values,
                                 "samples": [{"op": r.fn, "bytes": r.size, "group": r.group, "source": r.source,
                                              "measured_busbw": r.measured_busbw, "simulated_busbw": r.simulated_busbw,
                                              "error": r.error, "algorithm": r.algorithm} for r in fitted.residuals]}
    elif data.collectives:
        report["unused"] = f"{len(data.collectives)} collective samples (--fit {fit})"
    if data.compute and fit == "collectives":
        report["unused"] = f"{len(data.compute)} compute samples (--fit collectives)"
    elif data.compute:
        from zsim.calibrate.gpu_compute import calibrate_gemms, with_gemm_terms

        gemms = [s for s in data.compute if s.kind == "gemm"]
        phases = [s for s in data.compute if s.kind != "gemm"]
        compute: dict = {}
        if gemms:
            gemm, summary = calibrate_gemms(cluster, gemms)
            compute["gemm"] = gemm
            sections["compute"] = {"model": "GEMM tile-and-wave model (docs/compute.md)", "fitted": summary}
            report["compute"] = {**sections["compute"], "values": gemm}
            cluster = with_gemm_terms(cluster, gemm)  # the phase fit below prices GEMMs with the new terms
        if phases:
            from zsim.calibrate.gpu_phase_fit import calibrate_phases

            pf = calibrate_phases(cluster, data.runs, profile, profiles)
            fitted = {k: round(v, 4) for k, v in pf.values.items() if k not in pf.kept}
            compute.update(fitted)
            sections["phases"] = {"model": "memory-bound kernel terms from phase timings (docs/calibrate.md)",
                                  "fitted": fitted, **pf.summary()}
            report["phases"] = sections["phases"]
        replace["compute"] = compute
