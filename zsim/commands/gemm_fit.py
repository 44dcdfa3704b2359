"""`zsim gemm-fit`: fit a GPU profile's GEMM terms to measured GEMM times and report the held-out error."""

from __future__ import annotations

import argparse
from pathlib import Path

from zsim.commands import HELP
from zsim.commands.options import add_json_option, add_profile_options, emit_json, text_stream


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "gemm-fit", help=HELP["gemm-fit"],
        description="Read a GEMM table (DeepBench-style CSV with M, N, K, time_ms and optional batch, or XLA's "
                    "b, m, n, k, dtype, flops_per_s layout, of which the --dtype rows), fit the "
                    "five GEMM terms of the compute model (docs/compute.md) by robust least squares on "
                    "log(time), and print the `gemm.<dtype>` entry for a profile's `compute:` section with "
                    "the error on rows each fit never saw (even/odd 2-fold).")
    p.add_argument("csv", type=Path, help="GEMM table, e.g. ../shared/data/deepbench-v100/gemm_fp16_tensorcore.csv")
    p.add_argument("--gpu", required=True, help="GPU profile (hwprofiles/gpus/) the table was measured on")
    p.add_argument("--dtype", choices=("fp16", "bf16", "fp32", "tf32", "fp8", "fp4"), default="fp16",
                   help="operand type of the table (default fp16); tf32: fp32 operands on tensor cores, priced "
                        "against the GPU's peak_tf32_tflops (XLA's f32 rows); fp8: E4M3 operands (XLA's "
                        "f8e4m3fn x f8e4m3fn rows), 1 byte each, against peak_fp8_tflops; fp4: NVFP4 or MXFP4 "
                        "operands (E2M1), half a byte each, against peak_fp4_tflops (a DeepBench-style table: XLA's "
                        "have no FP4 rows)")
    add_json_option(p, "the values and held-out errors")
    add_profile_options(p, profile=False)
    p.set_defaults(func=run_command)


def fit_table(csv: Path, gpu: str, dtype: str, folders: list[str] | None = None):
    """Fit `csv` on GPU profile `gpu` in `dtype` (found in the user `folders`, $ZSIM_PROFILE_PATH, then
    the built-in profiles); returns a GemmFit. Raises ZsimError/ConfigError."""
    from zsim.calibrate.gemm_fit import fit, read_gemm_csv
    from zsim.config.profile_files import GpuFile, load_profile
    from zsim.config.profiles import Profiles

    spec: GpuFile = load_profile(Profiles.from_environment(folders or []), "gpu", gpu, GpuFile)  # type: ignore[assignment]
    hw = table_hardware(spec, gpu, dtype)
    return fit(read_gemm_csv(csv, dtype), hw)


def table_hardware(spec, gpu: str, dtype: str):
    """GemmHardware of GPU profile `spec` (named `gpu`) for `dtype`. Raises ZsimError when it has no
    peak for `dtype`."""
    from zsim.calibrate.gemm_fit import GemmHardware
    from zsim.fabric.cluster import compute_terms
    from zsim.errors import ZsimError

    peak = {"fp16": spec.peak_fp16_tflops, "bf16": spec.peak_bf16_tflops, "fp32": spec.peak_fp32_tflops,
            "tf32": spec.peak_tf32_tflops, "fp8": spec.peak_fp8_tflops, "fp4": spec.peak_fp4_tflops}[dtype]
    if peak is None:
        raise ZsimError(f"GPU profile '{gpu}' has no {dtype} peak (peak_{dtype}_tflops)")
    terms = compute_terms(spec.compute)
    return GemmHardware(sms=terms.sms, tiles=terms.tiles, peak_flops=peak * 1e12, hbm_bytes_per_s=spec.hbm_GBps * 1e9,
                        elem_bytes={"fp32": 4, "tf32": 4, "fp8": 1, "fp4": 0.5}.get(dtype, 2))


def run_command(args: argparse.Namespace) -> int:
    from zsim.calibrate.gemm_fit import profile_yaml
    from zsim.calibrate.optimizer import scipy_optimize

    scipy_optimize("zsim gemm-fit")  # before reading the table: without scipy, say what to install

    result = fit_table(args.csv, args.gpu, args.dtype, args.profiles)
    summary = result.summary()
    out = text_stream(args)
    print("compute:\n  gemm:", file=out)
    print(profile_yaml(args.dtype, result.values), file=out)
    print(f"# {summary['rows']} rows; error on rows each fit did not see (even/odd 2-fold): median "
          f"{summary['heldout_median']:.1%}, p90 {summary['heldout_p90']:.1%}, max {summary['heldout_max']:.1%}; "
          f"in sample median {summary['insample_median']:.1%}", file=out)
    emit_json(args, {"dtype": args.dtype, "values": result.values, "summary": summary}, indent=1)
    return 0
