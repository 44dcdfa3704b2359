"""`zsim profiles`: every hardware profile zsim can find (systems, GPUs, networks, host links, host
CPUs), one line each, then the shipped scenarios (`zsim run NAME`) and, apart, the shipped sweeps
(`zsim sweep NAME`). User folders (--profiles, $ZSIM_PROFILE_PATH) come
first; a user file that hides a built-in one of the same name says so."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from zsim.commands import HELP
from zsim.commands.options import add_json_option, add_profile_options, emit_json, printable_text, profile_search

TITLES = {"system": "systems", "gpu": "GPUs", "network": "networks", "link": "host links", "host": "host CPUs"}


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "profiles", help=HELP["profiles"],
        description="List the hardware profiles zsim finds (your folders from --profiles and $ZSIM_PROFILE_PATH "
                    "first, then the built-in ones), one line each, then the scenarios (zsim run NAME) and the sweeps "
                    "(zsim sweep NAME) shipped with zsim. docs/profiles.md says how to write your own.")
    add_profile_options(p, profile=False)
    add_json_option(p, "the list")
    p.set_defaults(func=profiles_command)


def _get(data: dict, *keys: str) -> Any:
    for key in keys:
        data = data.get(key) if isinstance(data, dict) else None
    return data


def _system(d: dict) -> str:
    fabric = _get(d, "intra_node", "fabric")
    links, gbps = _get(d, "intra_node", "nvlink_links_per_gpu"), _get(d, "intra_node", "nvlink_GBps_per_link")
    nvlink = f"{fabric}, {links} NVLinks × {gbps} GB/s per GPU" if fabric else None
    nics = _get(d, "inter_node", "nics_per_node")
    net = f"{nics} × {_get(d, 'inter_node', 'network')}" if nics else None
    gpus = f"{d.get('gpus_per_node')} × {d.get('gpu')}" if d.get("gpu") else None
    return "; ".join(x for x in (gpus, nvlink, net, d.get("offload_link") and f"host link {d['offload_link']}") if x)


def _gpu(d: dict) -> str:
    parts = [f"{d['memory_GiB']} GiB" if "memory_GiB" in d else None,
             f"HBM {d['hbm_GBps']} GB/s" if "hbm_GBps" in d else None,
             f"fp16 {d['peak_fp16_tflops']} TFLOPS" if "peak_fp16_tflops" in d else None,
             f"bf16 {d['peak_bf16_tflops']}" if "peak_bf16_tflops" in d else None,
             f"fp32 {d['peak_fp32_tflops']}" if "peak_fp32_tflops" in d else None,
             f"fp8 {d['peak_fp8_tflops']}" if "peak_fp8_tflops" in d else None,
             f"fp4 {d['peak_fp4_tflops']}" if "peak_fp4_tflops" in d else None]
    return ", ".join(p for p in parts if p)


def _network(d: dict) -> str:
    parts = [f"{d['port_Gbps']} Gb/s per port" if "port_Gbps" in d else None,
             f"latency {d['latency_us']} us" if "latency_us" in d else None]
    return ", ".join(p for p in parts if p)


def _link(d: dict) -> str:
    return f"{d['GBps_per_direction']} GB/s per direction" if "GBps_per_direction" in d else ""


def _generic(d: dict) -> str:
    """A kind this command has no summary for (yet): its numeric top-level keys."""
    return ", ".join(f"{k} {v}" for k, v in d.items() if isinstance(v, (int, float)) and not isinstance(v, bool))


SUMMARIES: dict[str, Callable[[dict], str]] = {"system": _system, "gpu": _gpu, "network": _network, "link": _link}


def describe(kind: str, path: Path) -> dict[str, Any]:
    """One profile file's line: its `name:` and a summary, or why it cannot be read."""
    from zsim.config.yamlfile import read_yaml_mapping
    from zsim.errors import ConfigError

    try:
        data = read_yaml_mapping(path)
    except ConfigError as exc:
        return {"title": "", "summary": f"unreadable: {exc}"}
    return {"title": str(data.get("name", "")), "summary": SUMMARIES.get(kind, _generic)(data)}


def catalog(args: argparse.Namespace) -> dict[str, Any]:
    """{kind: [{name, title, summary, file, builtin, shadows}], 'scenarios': [...], 'sweeps': [...]} (the
    JSON); a scenario or sweep row is {name, description, file}."""
    from zsim.config.profiles import KINDS, builtin_folder
    from zsim.config.shipped import shipped_scenarios, shipped_sweeps
    from zsim.config.yamlfile import read_yaml_mapping

    profiles, _ = profile_search(args)
    builtin = builtin_folder()
    out: dict[str, Any] = {"search_path": [str(r) for r in profiles.roots]}
    for kind in KINDS:
        rows = []
        for name, path in sorted(profiles.names(kind).items()):
            rows.append({"name": name, **describe(kind, path), "file": str(path),
                         "builtin": path.is_relative_to(builtin),
                         "shadows": [str(p) for p in profiles.shadowed(kind, name)]})
        out[kind] = rows
    for key, files in (("scenarios", shipped_scenarios()), ("sweeps", shipped_sweeps())):
        rows = []
        for name, path in files.items():
            data = read_yaml_mapping(path)
            rows.append({"name": name, "description": str(data.get("description") or ""), "file": str(path)})
        out[key] = rows
    return out


def format_catalog(table: dict[str, Any]) -> str:
    from zsim.config.profiles import KINDS

    lines = [f"Profiles ({' → '.join(table['search_path'])}; the first match wins):"]
    for kind in KINDS:
        rows = table[kind]
        if not rows:
            continue
        width = max(len(r["name"]) for r in rows)
        lines.append(f"{TITLES.get(kind, kind)}")
        for r in rows:
            where = "" if r["builtin"] else f"  [{r['file']}{', hides a built-in' if r['shadows'] else ''}]"
            title = f"{r['title']}: " if r["title"] else ""
            lines.append(f"  {r['name']:<{width}}  {title}{r['summary']}{where}")
    for key, heading in (("scenarios", "scenarios (zsim run NAME)"), ("sweeps", "sweeps (zsim sweep NAME)")):
        rows = table[key]
        if rows:
            width = max(len(r["name"]) for r in rows)
            lines.append(heading)
            lines += [f"  {r['name']:<{width}}  {r['description']}" for r in rows]
    return "\n".join(lines)


def profiles_command(args: argparse.Namespace) -> int:
    table = catalog(args)
    print(format_catalog(table), file=printable_text(args))  # names, fields and file names are echoed: no escape codes
    emit_json(args, table)
    return 0
