"""A corpus of hand-written bad inputs of every kind issue 13 lists (decoding, parsing, numbers,
unbounded work, outputs, containment), as (name, argv builder) cases for `zsim` commands. Each builder
gets a scratch folder, writes the files it needs there and returns the argument list. Shared by
tests/test_bad_inputs.py (in-process and as real subprocesses) and benchmarks/fuzz_long.py.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
BASE = {
    "name": "tiny",
    "model": {"layers": 2, "hidden": 256, "heads": 8, "seq_len": 128, "vocab": 1000, "micro_batch": 1},
    "parallel": {"dp": 16, "mp": 1},
    "zero": {"stage": 2},
    "hardware": {"profile": "dgx2", "nodes": 1},
}
BASE_TEXT = yaml.safe_dump(BASE, sort_keys=False)
TINY_MODEL = "layers: 2\nhidden: 32\nheads: 2\nseq_len: 8\nvocab: 64\nmicro_batch: 1\n"


def _file(name: str, content: str | bytes) -> Callable[[Path], Path]:
    def make(d: Path) -> Path:
        path = d / name
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
        return path
    return make


def _replace(section: str, key: str, raw: str) -> str:
    """BASE_TEXT with `section.key` set to the YAML text `raw`."""
    lines, out, inside = BASE_TEXT.splitlines(), [], None
    for line in lines:
        if not line.startswith(" "):
            inside = line.rstrip(":")
        if inside == section and line.strip().startswith(f"{key}:"):
            line = f"  {key}: {raw}"
        out.append(line)
    if not any(line.strip().startswith(f"{key}: {raw}") for line in out):
        out = [*out[: out.index(f"{section}:") + 1], f"  {key}: {raw}", *out[out.index(f"{section}:") + 1:]]
    return "\n".join(out) + "\n"


BOMB = ('a: &a ["x","x","x","x","x","x","x","x","x"]\n' + "".join(
    f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi")) + "model: *i\n")

# pp 2 × 50,000 interleaved chunks of a 100,000-layer model (each chunk one layer)
DEEP_INTERLEAVED = (
    "name: deep\nmodel: {layers: 100000, hidden: 64, heads: 2, seq_len: 128, vocab: 1000, micro_batch: 1, grad_accum: 2}\n"
    "parallel: {dp: 8, mp: 1, pp: 2, pipeline_schedule: interleaved, virtual_stages: 50000}\n"
    "zero: {stage: 1}\nprecision: {dtype: bf16}\nhardware: {profile: dgx-h100, nodes: 2}\n")

SCENARIO_TEXTS: dict[str, str | bytes] = {
    "latin1": BASE_TEXT.encode() + b"# caf\xe9\n",
    "utf16": BASE_TEXT.encode("utf-16"),
    "nul": BASE_TEXT.encode() + b"\x00\x00",
    "ansi_raw": BASE_TEXT + "description: \x1b[2J\x1b[31mred\n",
    "empty": "",
    "comments_only": "# nothing here\n",
    "top_list": "- model\n- zero\n",
    "top_scalar": "42\n",
    "brackets": "model: " + "[" * 20000 + "]" * 20000 + "\n",
    "braces": "model: " + "{a: " * 3000 + "1" + "}" * 3000 + "\n",
    "indent_deep": "".join(" " * i + f"k{i}:\n" for i in range(400)) + " " * 400 + "v: 1\n",
    "alias_bomb": BOMB,
    "dup_section": BASE_TEXT + "zero:\n  stage: 3\n",
    "dup_key": _replace("model", "layers", "2\n  layers: 3"),
    "tab_indent": BASE_TEXT.replace("  layers", "\tlayers"),
    "unclosed": "model: {layers: 2\n",
    "list_key": "? [a, b]\n: 1\n" + BASE_TEXT,
    "huge_file": BASE_TEXT + "# " + "x" * (2 << 20) + "\n",
    "stage_true": _replace("zero", "stage", "true"),
    "stage_float": _replace("zero", "stage", "2.0"),
    "stage_string": _replace("zero", "stage", '"3"'),
    "stage_5": _replace("zero", "stage", "5"),
    "layers_float": _replace("model", "layers", "1e9"),
    "layers_huge": _replace("model", "layers", "1" + "0" * 30),
    "layers_big": _replace("model", "layers", "100000"),
    "layers_max_stage0": _replace("model", "layers", "100000").replace("stage: 2", "stage: 0"),
    "hidden_inf": _replace("model", "hidden", ".inf"),
    "hidden_nan": _replace("model", "hidden", ".nan"),
    "hidden_neg": _replace("model", "hidden", "-256"),
    "vocab_zero": _replace("model", "vocab", "0"),
    "batch_bool": _replace("model", "micro_batch", "yes"),
    "seq_huge": _replace("model", "seq_len", "100000000"),
    "dp_zero": _replace("parallel", "dp", "0"),
    "nodes_huge": _replace("hardware", "nodes", str(10**12)),
    "nodes_max": _replace("hardware", "nodes", str(1 << 24)).replace("dp: 16", f"dp: {16 << 24}"),
    "steps_float": BASE_TEXT + "run:\n  steps: 1e9\n",
    "steps_big": BASE_TEXT + "run:\n  steps: 1000000000\n",
    "steps_1000_layers_big": _replace("model", "layers", "5000") + "run:\n  steps: 1000\n",
    "accum_big": _replace("model", "grad_accum", "1000000") + "run:\n  steps: 1000\n",
    "per_rank_huge": BASE_TEXT.replace("nodes: 1", "nodes: 4096").replace("dp: 16", "dp: 65536")
    + "fabric:\n  mode: per_rank\nrun:\n  steps: 100\n",
    "bucket_huge": _replace("zero", "reduce_bucket_elements", "1" + "0" * 40),
    "profile_abs": _replace("hardware", "profile", "/etc/passwd"),
    "profile_dotdot": _replace("hardware", "profile", "../hwprofiles/dgx2"),
    "profile_backslash": _replace("hardware", "profile", '"..\\\\dgx2"'),
    "profile_empty": _replace("hardware", "profile", '""'),
    "profile_nul": _replace("hardware", "profile", '"dgx2\\0"'),
    "profile_unknown": _replace("hardware", "profile", "dgx9000"),
    "profile_long": _replace("hardware", "profile", "x" * 5000),
    "degrade_nan": BASE_TEXT + "fabric:\n  degrade: [{link: nic, node: 0, factor: .nan}]\n",
    "degrade_node_huge": BASE_TEXT + "fabric:\n  degrade: [{link: nic, node: 99999999, factor: 0.5}]\n",
    "degrade_not_list": BASE_TEXT + "fabric:\n  degrade: 3\n",
    "unknown_section": BASE_TEXT + "zeroo:\n  stage: 1\n",
    "section_scalar": BASE_TEXT.replace("zero:\n  stage: 2", "zero: 2"),
    "long_value": _replace("precision", "dtype", "x" * 100000) if False else BASE_TEXT + "precision:\n  dtype: "
    + "x" * 100000 + "\n",
    "date_value": _replace("model", "layers", "2024-01-01"),
    "binary_tag": BASE_TEXT + "name: !!binary aGVsbG8=\n",
    "python_tag": BASE_TEXT + "description: !!python/object/apply:os.system ['true']\n",
    "merge_weird": BASE_TEXT + "extra: {<<: 3}\n",
    "global_batch_odd": _replace("model", "global_batch", "17"),
    "recompute_modules_string": _replace("zero", "recompute_modules", "moe_act"),
    "recompute_modules_unmodelled": _replace("zero", "recompute_modules", "[shared_experts]")
    .replace("zero:\n", "zero:\n  recompute_granularity: selective\n"),
    "recompute_modules_full": _replace("zero", "recompute_modules", "[core_attn]"),
    "recompute_modules_moe_on_dense": _replace("zero", "recompute_modules", "[moe]")
    .replace("zero:\n", "zero:\n  recompute_granularity: selective\n"),
    "cp_world": _replace("parallel", "cp", "2"),
    "cp_unfused": _replace("parallel", "cp", "2").replace("dp: 16", "dp: 8"),
    "cp_zero": _replace("parallel", "cp", "0"),
    "ep_overlap_dense": _replace("parallel", "ep_overlap", "true"),
    "ep_overlap_string": _replace("parallel", "ep_overlap", "yes please"),
    "model_states_dont_fit": _replace("model", "layers", "2000").replace("hidden: 256", "hidden: 8192")
    .replace("heads: 8", "heads: 64").replace("stage: 2", "stage: 0"),
}


def _scenario_case(name: str, content: str | bytes, *extra: str) -> Callable[[Path], list[str]]:
    def build(d: Path) -> list[str]:
        return ["run", str(_file(f"{name}.yaml", content)(d)), "--no-plot", "-o", str(d / "out"), *extra]
    return build


def _set_case(*sets: str) -> Callable[[Path], list[str]]:
    def build(d: Path) -> list[str]:
        path = _file("base.yaml", BASE_TEXT)(d)
        return ["run", str(path), "--no-plot", "-o", str(d / "out"), *[x for s in sets for x in ("--set", s)]]
    return build


def _output_case(kind: str) -> Callable[[Path], list[str]]:
    def build(d: Path) -> list[str]:
        path = _file("base.yaml", BASE_TEXT)(d)
        (d / "afile").write_text("x")
        (d / "folder").mkdir(exist_ok=True)
        return {
            "o_file": ["run", str(path), "-o", str(d / "afile")],
            "o_under_file": ["run", str(path), "-o", str(d / "afile" / "sub")],
            "json_folder": ["run", str(path), "--no-plot", "-o", str(d / "o"), "--json", str(d / "folder")],
            "json_missing": ["run", str(path), "--no-plot", "-o", str(d / "o"), "--json", str(d / "no" / "x.json")],
            "json_under_file": ["run", str(path), "--no-plot", "-o", str(d / "o"), "--json", str(d / "afile" / "x")],
            "memory_json_folder": ["memory", "--params", "7.5B", "--dp", "64", "--json", str(d / "folder")],
            "maxsize_json_missing": ["maxsize", "--dp", "64", "--gpu-mem", "32GB", "--json", str(d / "no" / "x")],
            "name_escape": ["run", str(_file("esc.yaml", BASE_TEXT.replace("name: tiny", "name: ../../esc"))(d)),
                            "--no-plot", "--json", str(d / "folder")],
        }[kind]
    return build


def _profile_case(kind: str, mutate: Callable[[dict], object] | str | bytes) -> Callable[[Path], list[str]]:
    """A copy of hwprofiles/ with one file broken; the run is pointed at it with ZSIM_PROFILE_PATH
    (the builder returns the argv; tests set the environment from `profile_env`)."""
    def build(d: Path) -> list[str]:
        root = d / "hwprofiles"
        if root.exists():
            shutil.rmtree(root)
        shutil.copytree(ROOT / "hwprofiles", root)
        path = {"system": root / "dgx2.yaml", "gpu": root / "gpus" / "v100-sxm3-32gb.yaml",
                "network": root / "networks" / "ib-edr.yaml", "link": root / "links" / "pcie-gen3-x16.yaml"}[kind]
        if isinstance(mutate, (str, bytes)):
            (path.write_bytes if isinstance(mutate, bytes) else path.write_text)(mutate)
        else:
            doc = yaml.safe_load(path.read_text())
            mutate(doc)
            path.write_text(yaml.safe_dump(doc))
        scenario = _file("base.yaml", BASE_TEXT)(d)
        return ["run", str(scenario), "--no-plot", "-o", str(d / "out")]
    return build


def _set(path: str, value):
    def mutate(doc: dict) -> None:
        node = doc
        keys = path.split(".")
        for k in keys[:-1]:
            node = node[k]
        node[keys[-1]] = value
    return mutate


def _nccl_case(content: str | bytes) -> Callable[[Path], list[str]]:
    def build(d: Path) -> list[str]:
        folder = d / "tables"
        folder.mkdir(exist_ok=True)
        _file("all_reduce.txt", content)(folder)
        return ["nccl-fit", str(folder), "--hw", "dgx2", "--gpus", "8"]
    return build


HEADER = ("#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   "
          "busbw #wrong\n#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            "
          "(us)  (GB/s)  (GB/s)\n")


def _row(size, time="10.0", algbw="1.0", busbw="1.0") -> str:
    return f"  {size} {size // 4 if isinstance(size, int) else size} float sum -1 {time} {algbw} {busbw} 0 " \
           f"{time} {algbw} {busbw} 0\n"


def _table(nodes: int, sizes=tuple(8 << i for i in range(24)), per_node: int = 4, host: str = "node") -> str:
    """A multi-node nccl-tests all_reduce table (ABCI's layout: 4 GPUs a node, an `error` column), times
    from an α-β line (20 µs + S / 10 GB/s)."""
    ranks = "".join(f"#   Rank {r:2d} Pid {100 + r} on {host}{r // per_node:04d} device {r % per_node} [0x3d] GPU\n"
                    for r in range(nodes * per_node))
    head = ("# nThread 1 nGpus 1 minBytes 8 maxBytes 64M step: 2(factor)\n#\n# Using devices\n" + ranks + "#\n"
            "#       size         count    type   redop     time   algbw   busbw  error     time   algbw   busbw  error\n")
    rows = ""
    for size in sizes:
        t = 20.0 + size / 1e4
        algbw = size / t / 1e3
        rows += f"  {size} {size // 4} float sum {t:.2f} {algbw:.2f} {algbw * 1.75:.2f} 0 {t:.2f} {algbw:.2f} {algbw * 1.75:.2f} 0\n"
    return head + rows


def _netfit_case(files: dict[str, str], *extra: str, command: str = "nccl-fit") -> Callable[[Path], list[str]]:
    """`zsim nccl-fit` (or calibrate) of a folder of multi-node tables `files` on abci-v100."""
    def build(d: Path) -> list[str]:
        folder = d / "net"
        folder.mkdir(exist_ok=True)
        for name, text in files.items():
            _file(name, text)(folder)
        if command == "calibrate":
            # --accept-poor-fit: the synthetic tables fit poorly, which must not be why a case exits 2
            return ["calibrate", str(folder), "--profile", "abci-v100", "-o", str(d / "fit.yaml"), "--accept-poor-fit",
                    *extra]
        return ["nccl-fit", str(folder), "--profile", "abci-v100", *extra]
    return build


NET_GOOD = {"all_reduce-2nodes.txt": _table(2), "all_reduce-4nodes.txt": _table(4)}
HOLD_ALL = [x for t, v in (("efficiency", 0.9), ("tree_efficiency", 0.5), ("ll128_share", 0.8), ("latency_us", 10),
                           ("latency_growth_us", 1), ("nvls_tree_share", 0.8)) for x in ("--hold", f"{t}={v}")]


def _many_tables(d: Path) -> list[str]:
    folder = d / "many"
    folder.mkdir(exist_ok=True)
    text = _table(2)
    for i in range(3000):
        (folder / f"all_reduce-{i}nodes.txt").write_text(text)
    return ["nccl-fit", str(folder), "--profile", "abci-v100"]


# issue 28, second pass: multi-node nccl-tests folders and --hold (each was an internal error, a run past
# 60 s, or a fit of contradictory input)
NETFIT_CASES: dict[str, Callable[[Path], list[str]]] = {
    # {"gpus": 1e400} in zsim collective --json rows: int(inf) was an OverflowError
    "json_gpus_overflow": _netfit_case({"all_reduce-2nodes.json": '[{"gpus": 1e400, "nodes": 2, "size": 8}]'}),
    "json_size_overflow": _netfit_case({"all_reduce-2nodes.json": '[{"gpus": 8, "nodes": 2, "size": 1e400, "count": 1,'
                                        ' "dtype": "float", "time_us": 1, "algbw": 1, "busbw": 1}]'}),
    # a reduce_scatter named table holding an all_reduce's tiny rows: 8 B over 8 ranks is no element each,
    # a 0-byte collective, and busbw 0 divided by (ZeroDivisionError)
    "rows_below_one_element": _netfit_case({**NET_GOOD, "reduce_scatter-2nodes.txt": _table(2, sizes=(8, 16))}),
    # the name says 2 nodes, the header lists 4 hosts: silently fitted as 4
    "name_contradicts_header": _netfit_case({"all_reduce-2nodes.txt": _table(4), "all_reduce-4nodes.txt": _table(4)}),
    "name_zero_nodes": _netfit_case({"all_reduce-0nodes.txt": _table(2), "all_reduce-4nodes.txt": _table(4)}),
    # 3,000 tables: each read and its cluster built, past 70 s
    "thousands_of_tables": _many_tables,
    # a term held twice: the last silently won
    "hold_twice": _netfit_case(NET_GOOD, "--hold", "efficiency=0.9", "--hold", "efficiency=0.5"),
    "hold_twice_calibrate": _netfit_case(NET_GOOD, "--hold", "latency_us=5", "--hold", "latency_us=9",
                                         command="calibrate"),
    # every term held: a "fit" of nothing, written as a fitted profile
    "hold_every_term": _netfit_case(NET_GOOD, *HOLD_ALL),
    "hold_every_term_calibrate": _netfit_case(NET_GOOD, *HOLD_ALL, command="calibrate"),
}


def _trace_case(model: str | bytes, *extra: str) -> Callable[[Path], list[str]]:
    def build(d: Path) -> list[str]:
        path = _file("model.yaml", model)(d)
        return ["trace", "--model", str(path), "--stage", "1", "--ranks", "2", "--steps", "1", "--device", "cpu",
                "-o", str(d / "trace"), *extra]
    return build


def _args(*argv: str) -> Callable[[Path], list[str]]:
    return lambda d: list(argv)


SUITE_POINT = {"id": "a", "cluster": "c", "half": "held_out", "published": {"step_s": 1.0}, "scenario": BASE}


def _suite_case(suite: str, **changes) -> Callable[[Path], list[str]]:
    """`zsim validate SUITE --suite-file` of a one-point suite with `changes` (point keys; `published`
    replaced whole; `series` at the top level)."""
    def build(d: Path) -> list[str]:
        series = changes.pop("series", None)
        point = {**SUITE_POINT, **changes}
        doc = {"points": [point, {**point, "id": "b"}], **({"series": series} if series is not None else {})}
        return ["validate", suite, "--suite-file", str(_file("suite.yaml", yaml.safe_dump(doc))(d))]
    return build


# issue 28: each was an internal error (ValueError, ZeroDivisionError, TypeError, KeyError) or a judged
# run of a nonsense figure, after the points before it had been simulated
SUITE_CASES = {
    "step_string": dict(published={"step_s": "abc"}),
    "step_zero": dict(published={"step_s": 0}),
    "step_negative": dict(published={"step_s": -1}),
    "step_list": dict(published={"step_s": [1]}),
    "tokens_per_s_zero": dict(published={"tokens_per_s": 0, "tokens_per_step": 5}),
    "tflops_string": dict(published={"tflops_per_gpu": "x", "flops": "narayanan-eq3"}),
    "flops_list": dict(published={"tflops_per_gpu": 1, "flops": ["a"]}),
    "scenario_list": dict(scenario=[1, 2]),
    "scenario_run_list": dict(scenario={**BASE, "run": [1]}),
    "id_list": dict(id=[1]),
    "series_not_list": dict(series=5),
    "series_without_name": dict(series=[{"points": ["a", "b"]}]),
    "series_points_int": dict(series=[{"name": "x", "points": 5}]),
}

CASES: dict[str, Callable[[Path], list[str]]] = {
    **{f"scenario/{k}": _scenario_case(k, v) for k, v in SCENARIO_TEXTS.items()},
    "scenario/missing": lambda d: ["run", str(d / "nope.yaml")],
    "scenario/folder": lambda d: ["run", str(d)],
    "set/stage_true": _set_case("zero.stage=true"),
    "set/no_equals": _set_case("zero.stage"),
    "set/empty_key": _set_case("=3"),
    "set/through_value": _set_case("model.layers.x=1"),
    "set/section_list": _set_case("model=[1, 2]"),
    "set/unknown": _set_case("model.layerz=3"),
    "set/inf": _set_case("model.hidden=.inf"),
    "set/bomb": _set_case("model=" + "[" * 5000),
    "set/profile_path": _set_case("hardware.profile=/etc/passwd"),
    "set/steps_huge": _set_case("run.steps=99999999999"),
    **{f"output/{k}": _output_case(k) for k in ("o_file", "o_under_file", "json_folder", "json_missing",
                                                 "json_under_file", "memory_json_folder", "maxsize_json_missing",
                                                 "name_escape")},
    "profile/gpu_eff_zero": _profile_case("gpu", _set("matmul_efficiency", 0)),
    "profile/gpu_mem_inf": _profile_case("gpu", _set("memory_GiB", float("inf"))),
    "profile/gpu_mem_string": _profile_case("gpu", _set("memory_GiB", "32GB")),
    "profile/gpu_tflops_huge": _profile_case("gpu", _set("peak_fp16_tflops", 1e300)),
    "profile/net_latency_neg": _profile_case("network", _set("latency_us", -1.0)),
    "profile/net_eff_bool": _profile_case("network", _set("efficiency", True)),
    "profile/link_zero": _profile_case("link", _set("GBps_per_direction", 0)),
    "profile/nccl_empty": _profile_case("system", _set("nccl.efficiency", {})),
    "profile/nccl_unaligned_empty": _profile_case("system", _set("nccl.unaligned_reduce_GBps", {})),
    "profile/nccl_latency_nan": _profile_case("system", _set("nccl.latency_us", {"LL": float("nan"), "LL128": 1,
                                                                                 "Simple": 1})),
    "profile/gpus_per_node_zero": _profile_case("system", _set("gpus_per_node", 0)),
    "profile/gpu_path": _profile_case("system", _set("gpu", "../../etc/passwd")),
    "profile/network_abs": _profile_case("system", _set("inter_node.network", "/etc/hosts")),
    "profile/latin1": _profile_case("gpu", b"name: caf\xe9\n"),
    "profile/dup": _profile_case("network", "name: x\nname: y\n"),
    "profile/bomb": _profile_case("link", BOMB),
    "profile/list": _profile_case("system", "- 1\n"),
    "profile/nested": _profile_case("system", "a: " + "[" * 10000),
    "nccl/latin1": _nccl_case(HEADER.encode() + b"  8 2 float sum -1 \xff\xfe\n"),
    "nccl/empty": _nccl_case(""),
    "nccl/header_only": _nccl_case(HEADER),
    "nccl/inf_rows": _nccl_case(HEADER + "".join(_row(8 << i, "inf", "nan", "inf") for i in range(20))),
    "nccl/zero_time": _nccl_case(HEADER + "".join(_row(8 << i, "0", "0", "0") for i in range(20))),
    "nccl/one_row": _nccl_case(HEADER + _row(1 << 20)),
    "nccl/huge_sizes": _nccl_case(HEADER + "".join(_row(10 ** (20 + i)) for i in range(20))),
    "nccl/same_rows": _nccl_case(HEADER + _row(1 << 20) * 50),
    "nccl/garbage_cols": _nccl_case("# size count type\n" + "1 2 3\n" * 10),
    "nccl/binary": _nccl_case(bytes(range(256)) * 100),
    **{f"netfit/{k}": v for k, v in NETFIT_CASES.items()},
    "nccl/not_folder": lambda d: ["nccl-fit", str(_file("x.txt", "x")(d)), "--hw", "dgx2", "--gpus", "8"],
    "trace/latin1": _trace_case(TINY_MODEL.encode() + b"# \xe9\n"),
    "trace/dup": _trace_case(TINY_MODEL + "layers: 3\n"),
    "trace/bomb": _trace_case(BOMB),
    "trace/brackets": _trace_case("layers: " + "[" * 20000),
    "trace/layers_bool": _trace_case(TINY_MODEL.replace("layers: 2", "layers: true")),
    "trace/too_big": _trace_case(TINY_MODEL.replace("layers: 2", "layers: 100000").replace("hidden: 32", "hidden: 65536")),
    "trace/lr_nan": _trace_case(TINY_MODEL, "--lr", "nan"),
    "trace/lr_inf": _trace_case(TINY_MODEL, "--lr", "1e400"),
    "trace/accum_zero": _trace_case(TINY_MODEL, "--grad-accum", "0"),
    "trace/steps_float": _trace_case(TINY_MODEL, "--steps", "2.5"),
    "trace/ranks_huge": _trace_case(TINY_MODEL, "--ranks", "100000"),
    "trace/seed_neg": _trace_case(TINY_MODEL, "--seed", "-3"),
    "trace/o_file": lambda d: _trace_case(TINY_MODEL)(d)[:-2] + ["-o", str(_file("f", "x")(d))],
    "memory/params_tiny": _args("memory", "--params", "0.4", "--dp", "8"),
    "memory/params_overflow": _args("memory", "--params", "1e400", "--dp", "8"),
    "memory/params_inf": _args("memory", "--params", "inf", "--dp", "8"),
    "memory/params_nan": _args("memory", "--params", "nan", "--dp", "8"),
    "memory/params_huge": _args("memory", "--params", "1e30", "--dp", "8"),
    "memory/params_neg": _args("memory", "--params", "-5", "--dp", "8"),
    "memory/dp_float": _args("memory", "--params", "7.5B", "--dp", "8.0"),
    "memory/dp_huge": _args("memory", "--params", "7.5B", "--dp", "99999999999999999999"),
    "memory/bucket_zero": _args("memory", "--params", "7.5B", "--dp", "8", "--hidden", "256", "--seq", "8",
                                "--batch", "1", "--bucket", "0.2"),
    "memory/heads_bad": _args("memory", "--params", "7.5B", "--dp", "8", "--hidden", "256", "--seq", "8",
                              "--batch", "1", "--heads", "7"),
    "memory/ansi": _args("memory", "--params", "\x1b[31m7B", "--dp", "8"),
    "maxsize/gpu_mem_inf": _args("maxsize", "--dp", "64", "--gpu-mem", "1e400GB"),
    "maxsize/gpu_mem_tiny": _args("maxsize", "--dp", "64", "--gpu-mem", "0.5"),
    "maxsize/no_dp": _args("maxsize", "--gpu-mem", "32GB"),
    "maxsize/batch_huge": _args("maxsize", "--dp", "16", "--batch", "1000000000", "--gpu-mem", "32GB"),
    "maxsize/scenario_latin1": lambda d: ["maxsize", "--scenario", str(_file("s.yaml", b"\xff")(d))],
    "maxsize/profile_path": _args("maxsize", "--dp", "16", "--batch", "1", "--profile", "../../etc/passwd"),
    "collective/b_half": _args("collective", "--hw", "dgx2", "--gpus", "8", "--op", "all_reduce", "-b", "0.5",
                               "-e", "8"),
    "collective/e_huge": _args("collective", "--hw", "dgx2", "--gpus", "8", "--op", "all_reduce", "-e", "1e300"),
    "collective/e_inf": _args("collective", "--hw", "dgx2", "--gpus", "8", "--op", "all_reduce", "-e", "inf"),
    "collective/f_one": _args("collective", "--hw", "dgx2", "--gpus", "8", "--op", "all_reduce", "-f", "1"),
    "collective/nodes_huge": _args("collective", "--hw", "dgx2", "--nodes", "1000000000", "--gpus", "1000000000",
                                   "--op", "all_reduce", "-b", "8", "-e", "8"),
    "collective/gpus_odd": _args("collective", "--hw", "dgx2", "--nodes", "2", "--gpus", "3", "--op", "all_reduce"),
    "collective/hw_path": _args("collective", "--hw", "/etc/passwd", "--gpus", "8", "--op", "all_reduce"),
    "collective/op_bad": _args("collective", "--hw", "dgx2", "--gpus", "8", "--op", "all_reduc"),
    "output/o_empty": lambda d: ["run", str(_file("base.yaml", BASE_TEXT)(d)), "-o", ""],
    "output/json_empty": lambda d: ["run", str(_file("base.yaml", BASE_TEXT)(d)), "--json", ""],
    "trace/o_empty": lambda d: _trace_case(TINY_MODEL)(d)[:-2] + ["-o", ""],
    "scenario/dev_null": _args("run", "/dev/null"),
    "scenario/fifo": lambda d: (os.mkfifo(d / "fifo"), ["run", str(d / "fifo")])[1],
    "cli/unknown_command": _args("runn"),
    "cli/no_command": _args(),
    "cli/bad_flag": _args("run", "--frobnicate"),
    **{f"validate/{suite}_{k}": _suite_case(suite, **v) for k, v in SUITE_CASES.items() for suite in ("scale", "modern")},
    # a --set that makes each run of a suite cost what `zsim run` refuses: checked on the suite's probe first
    # (issue 28: 10⁶ micro-batches per point ran on for minutes)
    "validate/megatron_set_accum": _args("validate", "megatron", "--set", "model.grad_accum=1000000"),
    "validate/paper_set_global_batch": _args("validate", "paper", "--set", "model.global_batch=100000000"),
    **{f"pipeline/{k}": v for k, v in {
        # issue 28: global_batch implying more micro-batches than model.grad_accum may hold (a pp 4 memory
        # table walked 6.25M of them for minutes)
        "global_batch_accum": _args("memory", "--scenario", "mixtral-8x7b-pp4-ep8-dgx-h100", "--set",
                                    "model.global_batch=100000000"),
        # within grad_accum's bound, 8M schedule items were 27 s; pp 1024 would be hours
        "memory_schedule_items": _args("memory", "--scenario", "mixtral-8x7b-pp4-ep8-dgx-h100", "--set",
                                       "model.global_batch=16000000"),
        # a whole number in scientific notation is valid to the schema but was int('1e3') to maxsize's search
        "maxsize_pp_scientific": _args("maxsize", "--scenario", "mixtral-8x7b-pp4-ep8-dgx-h100", "--set",
                                       "parallel.pp=1e3"),
        # maxsize searched a gpipe pipeline of 10⁶ micro-batches per trial with no cost guard
        "maxsize_gpipe_cost": _args("maxsize", "--scenario", "mixtral-8x7b-pp4-ep8-dgx-h100", "--set",
                                    "model.global_batch=16000000", "--set", "parallel.pipeline_schedule=gpipe"),
        # 100,000 virtual stages: split_layers was quadratic in them, and maxsize's smallest trial is past its limit
        "maxsize_unit_past_limit": lambda d: ["maxsize", "--scenario", str(_file("deep.yaml", DEEP_INTERLEAVED)(d))],
    }.items()},
}
