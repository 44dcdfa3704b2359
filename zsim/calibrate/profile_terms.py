"""The terms of a hardware profile, by dotted name, and which of them a calibration touched.

A calibrated profile must say which of its numbers the inputs determined and which it carries over
from the base unmeasured (issue 26: a profile whose `kept_from_base` was empty while the inter-node
terms that price 90% of the flagship's step were never touched). A *term* is a number the simulator
prices time with:

* GPU system: every `nccl.*` number; the GPU's compute model (`compute.gemm.<dtype>.*`,
  `compute.hbm_efficiency`, `kernel_us`, `reduce_kernel_us`, `host_op_us`; the system's `compute:`
  keys over the GPU file's); the GPU's datasheet rates (`gpu.peak_<dtype>_tflops`, `gpu.hbm_GBps`);
  the links: `intra_node.nvlink_GBps_per_link`, the inter-node ones (`inter_node.nics_per_node`,
  `inter_node.oversubscription`, and the network profile's `inter_node.network.port_Gbps`,
  `.efficiency`, `.latency_us`) and the offload link's (`offload_link.GBps_per_direction`, `.efficiency`).
  Counts that describe the node's shape (SMs, tiles, NVSwitches, GPUs per PCIe switch) are facts of
  the machine, not terms.
* host (CPU) profile: every number of `compute:` and `collectives.<op>.<group>.{latency_us,GBps}`.
"""

from __future__ import annotations

from typing import Any

from zsim.config.profiles import Profiles
from zsim.config.yamlfile import read_yaml_mapping

_SHAPE = {"sms", "tiles"}  # compute-section counts that describe the GPU, not terms


def _numbers(prefix: str, value: Any, out: dict[str, float], skip: set[str] = frozenset()) -> None:
    """Every numeric leaf of `value` under `prefix`, dotted ('nccl.efficiency.LL128.all_reduce')."""
    if isinstance(value, dict):
        for k, v in value.items():
            if str(k) not in skip:
                _numbers(f"{prefix}.{k}" if prefix else str(k), v, out)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        out[prefix] = float(value)


def _component(profiles: Profiles, kind: str, name: str) -> dict[str, Any]:
    """A component profile's YAML mapping ({} when it cannot be found: the base loaded, so it can)."""
    try:
        return read_yaml_mapping(profiles.path(kind, name))
    except Exception:  # noqa: BLE001 - a name the loader resolved otherwise; nothing to enumerate
        return {}


def system_terms(base: dict[str, Any], profiles: Profiles) -> dict[str, float]:
    """{dotted term: value in profile units} of a GPU system profile's YAML mapping (module docstring)."""
    out: dict[str, float] = {}
    _numbers("nccl", base.get("nccl") or {}, out)
    gpu = _component(profiles, "gpu", str(base.get("gpu", "")))
    compute = dict(gpu.get("compute") or {})
    override = base.get("compute") or {}
    for key, value in override.items():
        if key == "gemm":
            gemm = {d: dict(t) for d, t in (compute.get("gemm") or {}).items()}
            for dtype, terms in (value or {}).items():
                gemm.setdefault(dtype, {}).update(terms or {})
            compute["gemm"] = gemm
        else:
            compute[key] = value
    _numbers("compute", compute, out, _SHAPE)
    for key in ("peak_fp16_tflops", "peak_bf16_tflops", "peak_fp32_tflops", "hbm_GBps"):
        _numbers(f"gpu.{key}", gpu.get(key), out)
    _numbers("intra_node.nvlink_GBps_per_link", (base.get("intra_node") or {}).get("nvlink_GBps_per_link"), out)
    inter = base.get("inter_node") or {}
    for key in ("nics_per_node", "oversubscription"):
        _numbers(f"inter_node.{key}", inter.get(key), out)
    net = _component(profiles, "network", str(inter.get("network", "")))
    for key in ("port_Gbps", "efficiency", "tree_efficiency", "ll128_share", "latency_us", "latency_growth_us",
                "nvls_tree_share"):  # zsim.calibrate.net_fit.TERMS and the line rate
        _numbers(f"inter_node.network.{key}", net.get(key), out)
    link = _component(profiles, "link", str(base.get("offload_link", "")))
    for key in ("GBps_per_direction", "efficiency"):
        _numbers(f"offload_link.{key}", link.get(key), out)
    return out


def host_terms(base: dict[str, Any]) -> dict[str, float]:
    """{dotted term: value} of a host profile's YAML mapping: its compute numbers and gloo lines."""
    out: dict[str, float] = {}
    _numbers("compute", base.get("compute") or {}, out)
    for op, by_group in (base.get("collectives") or {}).items():
        for group, entry in (by_group or {}).items():
            for key in ("latency_us", "GBps"):
                _numbers(f"collectives.{op}.{group}.{key}", (entry or {}).get(key), out)
    return out


def touched(sections: dict[str, Any]) -> set[str]:
    """The dotted terms a calibration's provenance `sections` say were fitted (not kept)."""
    out: set[str] = set()
    coll = sections.get("collectives") or {}
    if coll.get("model") == "nccl":
        out |= {f"nccl.{n}" for n in coll.get("fitted", ())}
    else:  # gloo lines: "op/group" -> entry
        for key, entry in (coll.get("fitted") or {}).items():
            op, _, group = key.partition("/")
            out.add(f"collectives.{op}.{group}.GBps")
            if entry.get("latency") == "fitted":
                out.add(f"collectives.{op}.{group}.latency_us")
    comp = sections.get("compute") or {}
    if str(comp.get("model", "")).startswith("GEMM"):
        for dtype in comp.get("fitted") or {}:
            out |= {f"compute.gemm.{dtype}.{k}" for k in ("efficiency", "tile_TBps", "k_overhead", "fixed_us",
                                                          "hbm_efficiency")}
    elif comp:  # host compute
        kept = comp.get("kept_from_base", ())
        for term in ("op_overhead_us", "matmul_GFLOPS", "memory_GBps", "module_overhead_us"):
            if term not in kept:
                out.add(f"compute.{term}.{comp.get('dtype', 'fp32')}" if term == "matmul_GFLOPS" else f"compute.{term}")
        if comp.get("optimizer_median_error") is not None:
            out |= {"compute.optimizer_op_overhead_us", "compute.optimizer_memory_GBps"}
        if (comp.get("slowest_rank_factor") or {}).get("how", "").startswith("median"):
            out.add("compute.slowest_rank_factor")
    if str((sections.get("core_sharing") or {}).get("how", "")).startswith("median"):
        out.add("gloo_core_share")
    out |= {f"compute.{k}" for k in ((sections.get("phases") or {}).get("fitted") or {})}
    out |= {f"inter_node.network.{k}" for k in ((sections.get("network") or {}).get("fitted") or {})}
    return out


def kept_terms(terms: dict[str, float], fitted: set[str]) -> dict[str, float]:
    """The terms the inputs never touched, with the base's values, in the order of `terms`."""
    return {name: value for name, value in terms.items() if name not in fitted}
