"""Fuzz targets for issue 13 (hypothesis strategies + the checks), shared by tests/test_fuzz.py (a quick,
derandomized profile in `make test`) and benchmarks/fuzz_long.py (a long random one that prints what it
covered).

Each target takes one generated input, runs it through the real loader or the real `zsim` entry point
(in-process `zsim.cli.main`), and returns an `Outcome`; `check` asserts the promise of the README:
exit 0, 2 or 3 only; no traceback; at most two lines on stderr, each short and printable; bounded
time. Loaders may only return a value or raise ZsimError (the CLI's exit 2).
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import yaml
from hypothesis import strategies as st

from tests.bad_inputs import BASE, BASE_TEXT, HEADER, TINY_MODEL
from zsim.errors import ZsimError

ROOT = Path(__file__).resolve().parents[1]
MAX_SECONDS = 15.0  # per example on the 2-core shared machine; the simulations are capped by ZSIM_MAX_SECONDS
MAX_LINE = 320


@dataclass
class Outcome:
    code: int  # exit code (0 loaded, 2 ZsimError for loaders)
    err: str  # stderr, or the ZsimError message
    seconds: float


def check(outcome: Outcome) -> None:
    assert outcome.code in (0, 2, 3), (outcome.code, outcome.err[:2000])
    lines = outcome.err.strip().splitlines()
    assert len(lines) <= 2 and "Traceback" not in outcome.err, outcome.err[:2000]
    assert all(len(line) <= MAX_LINE and line.isprintable() for line in lines), repr(outcome.err[:500])
    if outcome.code != 0:
        assert lines, "a failure must say why"
    assert outcome.seconds < MAX_SECONDS, outcome.seconds


# ---- values --------------------------------------------------------------------------------------
NASTY_TEXT = st.sampled_from(["", " ", "\x1b[31m", "\x00", "../../etc/passwd", "/etc/passwd", "..\\x", "é", "\u202e",
                              "x" * 300, "1e400", "nan", "inf", "-0", "0x10", "1_000", "true", "~", "null", "[", "{a: b"])
SCALARS = st.one_of(
    st.integers(min_value=-3, max_value=70),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.sampled_from([0, 1, 2, 3, 4, 8, 16, 64, 128, 1024, 2**31, 2**63, 10**9]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.5, 2.0, 1e-300, 1e300, float("inf"), float("nan"), -1.0]),
    st.booleans(), st.none(), NASTY_TEXT, st.text(max_size=20),
    st.sampled_from(["megatron-core", "deepspeed-0.5", "paper"]),  # zero.implementation values that load
    st.sampled_from(["roce", "ib-ndr", "efa"]),  # hardware.network values that load
)
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                      max_leaves=12)

SCENARIO_KEYS = {
    "model": ["layers", "hidden", "heads", "seq_len", "vocab", "micro_batch", "global_batch", "grad_accum", "loss",
              "moe.experts", "moe.top_k", "moe.dispatcher", "moe.imbalance"],
    "parallel": ["dp", "mp", "ep", "pp", "rank_order"],
    "zero": ["stage", "activation_checkpointing", "checkpoint_every", "reduce_bucket_elements", "prefetch_layers",
             "partition_activations", "cpu_offload_activations", "constant_buffers", "defragment", "implementation",
             "prefetch_bucket_elements", "max_live_elements", "max_reuse_elements", "ddp_bucket_elements",
             "overlap_param_gather", "grad_reduce_in_fp32"],
    "precision": ["dtype", "optimizer", "master_weights", "fp8", "fp8_params", "adam_moments", "fp4", "fp8_attention"],
    "hardware": ["profile", "nodes", "nvls", "gpus_per_node", "nics_per_node", "network"],
    "fabric": ["mode", "algorithm", "degrade", "sm_contention"],
    "run": ["steps", "output"],
}
KEY = st.one_of(st.sampled_from([f"{s}.{k}" for s, ks in SCENARIO_KEYS.items() for k in ks]),
                st.sampled_from(["name", "description", "model", "zero", "extra.key", "model.layerz"]))


def _put(doc: dict, dotted: str, value) -> None:
    keys = dotted.split(".")
    node = doc
    for k in keys[:-1]:
        if not isinstance(node.get(k), dict):
            node[k] = {}
        node = node[k]
    node[keys[-1]] = value


@st.composite
def scenario_documents(draw) -> bytes:
    """The tiny base scenario with 1-4 keys set to generated values (or removed), serialised as YAML,
    sometimes damaged at the byte level."""
    import copy

    doc = copy.deepcopy(BASE)
    for _ in range(draw(st.integers(1, 4))):
        key = draw(KEY)
        if draw(st.integers(0, 5)) == 5:
            section, _, leaf = key.partition(".")
            if leaf and isinstance(doc.get(section), dict):
                doc[section].pop(leaf, None)
            elif not leaf:
                doc.pop(section, None)
        else:
            _put(doc, key, draw(VALUES))
    try:
        text = yaml.safe_dump(doc, allow_unicode=True, sort_keys=False).encode()
    except (yaml.YAMLError, ValueError):
        text = BASE_TEXT.encode()
    return draw(_damaged(text))


@st.composite
def _damaged(draw, data: bytes) -> bytes:
    kind = draw(st.integers(0, 9))  # hypothesis favours 0: the file left whole
    if kind == 9 and data:  # truncated
        return data[: draw(st.integers(0, len(data) - 1))]
    if kind == 1:  # random bytes inserted
        at = draw(st.integers(0, len(data)))
        return data[:at] + draw(st.binary(min_size=1, max_size=8)) + data[at:]
    if kind == 2:  # a line repeated (duplicate keys)
        lines = data.splitlines(keepends=True)
        i = draw(st.integers(0, max(0, len(lines) - 1)))
        return b"".join(lines[: i + 1] + lines[i:]) if lines else data
    if kind == 3:  # nesting
        depth = draw(st.integers(1, 3000))
        return data + b"deep: " + b"[" * depth + b"]" * draw(st.integers(0, depth)) + b"\n"
    return data


# ---- targets -------------------------------------------------------------------------------------
def _main(argv: list[str]) -> Outcome:
    """`zsim.cli.main(argv)` in-process, stdout discarded, stderr captured."""
    from zsim import cli

    err = io.StringIO()
    started = time.perf_counter()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = cli.main(argv)
    return Outcome(code, err.getvalue(), time.perf_counter() - started)


def _loader(fn) -> Outcome:
    started = time.perf_counter()
    try:
        fn()
        return Outcome(0, "", time.perf_counter() - started)
    except ZsimError as exc:
        from zsim.console.parser import error_text

        return Outcome(2, error_text(f"zsim: {exc}"), time.perf_counter() - started)


def scenario_loader(data: bytes, work: Path) -> Outcome:
    from zsim.scenario.scenario import load_scenario

    path = work / "s.yaml"
    path.write_bytes(data)
    return _loader(lambda: load_scenario(path))


def scenario_cli(data: bytes, work: Path) -> Outcome:
    path = work / "s.yaml"
    path.write_bytes(data)
    return _main(["run", str(path), "--no-plot", "-o", str(work / "out")])


PROFILE_FILES = {"system": "dgx2.yaml", "gpu": "gpus/v100-sxm3-32gb.yaml", "network": "networks/ib-edr.yaml",
                 "link": "links/pcie-gen3-x16.yaml"}


@st.composite
def profile_documents(draw) -> tuple[str, bytes]:
    """(which profile file, its new bytes): a real profile with 1-3 keys set to generated values."""
    kind = draw(st.sampled_from(sorted(PROFILE_FILES)))
    doc = yaml.safe_load((ROOT / "hwprofiles" / PROFILE_FILES[kind]).read_text())
    paths = [k for k, v in doc.items() if not isinstance(v, dict)] + [
        f"{k}.{j}" for k, v in doc.items() if isinstance(v, dict) for j in v]
    for _ in range(draw(st.integers(1, 3))):
        _put(doc, draw(st.sampled_from(paths)), draw(VALUES))
    try:
        text = yaml.safe_dump(doc, allow_unicode=True).encode()
    except (yaml.YAMLError, ValueError):
        text = b"name: x\n"
    return kind, draw(_damaged(text))


def profile_loader(item: tuple[str, bytes], work: Path) -> Outcome:
    """The profile written into a copy of hwprofiles/ (ZSIM_PROFILE_PATH), loaded as a cluster."""
    from zsim.fabric.cluster import load_cluster

    root = work / "hwprofiles"
    if not root.exists():
        shutil.copytree(ROOT / "hwprofiles", root)
    kind, data = item
    target = root / PROFILE_FILES[kind]
    original = (ROOT / "hwprofiles" / PROFILE_FILES[kind]).read_bytes()
    target.write_bytes(data)
    old = os.environ.get("ZSIM_PROFILE_PATH")
    os.environ["ZSIM_PROFILE_PATH"] = str(root)
    try:
        return _loader(lambda: load_cluster("dgx2", 2))
    finally:
        target.write_bytes(original)
        if old is None:
            del os.environ["ZSIM_PROFILE_PATH"]
        else:
            os.environ["ZSIM_PROFILE_PATH"] = old


NUMBER_TEXT = st.one_of(st.integers(-10, 10**22).map(str), st.floats(allow_nan=True).map(repr), NASTY_TEXT,
                        st.sampled_from(["8", "1024", "0.00", "N/A", "-", "1e999"]))


@st.composite
def nccl_tables(draw) -> bytes:
    """An nccl-tests table: the real header (sometimes a damaged one) and a size sweep whose rows are
    mostly well formed, with some fields replaced by generated text or numbers."""
    rows = []
    size = draw(st.sampled_from([8, 4, 1, 1 << 20]))
    for _ in range(draw(st.integers(0, 34))):
        t = draw(st.floats(min_value=1.0, max_value=1e6))
        bw = size / t / 1e3
        fields = [str(size), str(size // 4), "float", "sum", "-1", f"{t:.2f}", f"{bw:.2f}", f"{bw * 1.75:.2f}", "0",
                  f"{t:.2f}", f"{bw:.2f}", f"{bw * 1.75:.2f}", "0"]
        for _ in range(draw(st.integers(0, 2))):
            fields[draw(st.integers(0, 12))] = draw(NUMBER_TEXT).replace("\n", " ")
        rows.append("  " + " ".join(fields) + "\n")
        size *= draw(st.sampled_from([2, 2, 2, 1, 4]))
    header = draw(st.sampled_from([HEADER, HEADER, "# size count type\n", "", "#size\n"]))
    return draw(_damaged((header + "".join(rows)).encode("utf-8", "replace")))


def nccl_reader(data: bytes, work: Path) -> Outcome:
    from zsim.trace.nccl_tests import read_nccl_tests

    path = work / "all_reduce.txt"
    path.write_bytes(data)
    return _loader(lambda: read_nccl_tests(path))


def nccl_cli(data: bytes, work: Path) -> Outcome:
    folder = work / "tables"
    folder.mkdir(exist_ok=True)
    (folder / "all_reduce.txt").write_bytes(data)
    return _main(["nccl-fit", str(folder), "--hw", "dgx2", "--gpus", "8"])


@st.composite
def model_files(draw) -> bytes:
    doc = yaml.safe_load(TINY_MODEL)
    for _ in range(draw(st.integers(1, 3))):
        doc[draw(st.sampled_from([*doc, "ffn", "global_batch", "grad_accum"]))] = draw(VALUES)
    try:
        text = yaml.safe_dump(doc, allow_unicode=True).encode()
    except (yaml.YAMLError, ValueError):
        text = TINY_MODEL.encode()
    return draw(_damaged(text))


def model_loader(data: bytes, work: Path) -> Outcome:
    """A model file through `zsim trace`'s real option handling (read, validate, RunConfig), without
    starting ranks (the launcher has its own real-process tests)."""
    from zsim.runtime.cli import add_run_arguments, config_from_args
    from zsim.console.parser import Parser

    path = work / "model.yaml"
    path.write_bytes(data)
    parser = Parser(prog="zsim trace")
    add_run_arguments(parser)
    args = parser.parse_args(["--model", str(path), "--stage", "2", "--ranks", "2", "-o", str(work / "t")])
    return _loader(lambda: config_from_args(args))


FLAG_VALUES = st.one_of(NASTY_TEXT, st.sampled_from(["8", "16", "64", "7.5B", "32GB", "0", "-1", "0.5", "1e400", "1T",
                                                     "8G", "dgx2", "all_reduce", "fp16", "2", "3"]),
                        st.integers(-5, 10**12).map(str), st.floats().map(repr))
COMMAND_FLAGS = {
    "memory": ["--params", "--dp", "--stage", "--mp", "--dtype", "--hidden", "--heads", "--seq", "--batch", "--layers",
               "--ckpt-every", "--bucket", "--pa", "--pa-cpu", "--no-cb", "--no-checkpointing", "--json"],
    "maxsize": ["--dp", "--mp", "--stage", "--gpu-mem", "--dtype", "--json"],  # --batch/--scenario search: slow
    "collective": ["--hw", "--nodes", "--gpus", "--op", "-b", "-e", "-f", "-g", "-d", "--algorithm", "--json"],
    "run": ["--set", "-o", "--json", "--no-plot", "--stats"],
    "trace": ["--model", "--ranks", "--stage", "--steps", "--precision", "--grad-accum", "--lr", "--mp", "--seed",
              "--prefetch", "--bucket-elements", "-o", "--force"],
    "nccl-fit": ["--hw", "--gpus", "--nodes", "-g", "--json"],
}
BASE_ARGS = {"memory": ["--params", "7.5B", "--dp", "64"], "maxsize": ["--dp", "64", "--gpu-mem", "32GB"],
             "collective": ["--hw", "dgx2", "--gpus", "8", "--op", "all_reduce", "-b", "8", "-e", "1M"],
             "run": ["{scenario}", "--no-plot", "-o", "{work}/out"],
             "trace": ["--model", "{model}", "--stage", "1", "-o", "{work}/trace"],
             "nccl-fit": ["{work}", "--hw", "dgx2", "--gpus", "8"]}


@st.composite
def cli_arguments(draw) -> list[str]:
    """A command, mostly valid arguments, and 1-4 generated flag/value pairs appended (argparse takes the
    last of a repeated flag, so they override)."""
    command = draw(st.sampled_from(sorted(COMMAND_FLAGS)))
    argv = [command, *(BASE_ARGS[command] if draw(st.integers(0, 4)) else [])]
    for _ in range(draw(st.integers(1, 4))):
        argv += [draw(st.sampled_from(COMMAND_FLAGS[command]))]
        if draw(st.integers(0, 3)):
            argv.append(draw(FLAG_VALUES))
    return argv


def cli_target(argv: list[str], work: Path) -> Outcome:
    """`zsim ARGV` in-process; `zsim trace` is checked up to the launch (which is replaced by a stub
    that records the validated config: real launches have their own tests)."""
    import zsim.runtime.launch

    (work / "s.yaml").write_text(BASE_TEXT)
    (work / "m.yaml").write_text(TINY_MODEL)
    argv = [a.replace("{scenario}", str(work / "s.yaml")).replace("{model}", str(work / "m.yaml"))
            .replace("{work}", str(work)) for a in argv]
    real = zsim.runtime.launch.launch

    def stub(cfg, **kw):
        zsim.runtime.launch.prepare_out_dir(Path(cfg.out_dir), kw.get("force", False))
        return zsim.runtime.launch.LaunchResult(Path(cfg.out_dir), [], None, {"ranks": [0], "losses": [1.0]})

    zsim.runtime.launch.launch = stub
    cwd = os.getcwd()
    os.chdir(work)  # relative --json / -o values land in the scratch folder
    try:
        return _main(argv)
    finally:
        os.chdir(cwd)
        zsim.runtime.launch.launch = real


TARGETS = {  # name -> (strategy, target)
    "scenario_loader": (scenario_documents(), scenario_loader),
    "scenario_cli": (scenario_documents(), scenario_cli),
    "profile_loader": (profile_documents(), profile_loader),
    "nccl_reader": (nccl_tables(), nccl_reader),
    "nccl_cli": (nccl_tables(), nccl_cli),
    "model_loader": (model_files(), model_loader),
    "cli_arguments": (cli_arguments(), cli_target),
}
