"""The `zsim` subcommands, one module each (zsim/commands/<name>.py with `register(subparsers)`).

HELP is each command's one-line help, in the order `zsim --help` lists them. It lives here, not
in the command modules, so that `zsim --help` can list every command without importing any of them
(zsim.cli builds the top-level help from this table alone); each module's `register` uses the same
line for its parser.
"""

HELP: dict[str, str] = {
    "run": "simulate a scenario",
    "sweep": "sweep scenario keys; table, plot, knees, fastest fit",
    "memory": "model-state memory per GPU by ZeRO stage (paper Table 1)",
    "maxsize": "largest model that fits (paper Table 2, Figure 6)",
    "collective": "nccl-tests-style table of a simulated collective",
    "nccl-fit": "fit a profile's NCCL terms to nccl-tests tables",
    "gemm-fit": "fit a GPU profile's GEMM terms to a DeepBench-style table",
    "calibrate": "fit a hardware profile to traces and benchmark tables",
    "replay": "simulate a measured run and print the error table",
    "validate": "compare simulations with published or measured results (exit 1 if any point fails)",
    "trace": "record real traces with the PyTorch runtime",
    "profiles": "list hardware profiles and shipped scenarios",
    "schema": "print the JSON Schema of scenario files (for editors)",
    "completion": "print a shell completion script",
}
