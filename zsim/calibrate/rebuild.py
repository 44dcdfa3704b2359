"""Rebuilding a measured run as a scenario: the model, layout, ZeRO options, precision, steps and
micro-batches the trace metadata records, on the hardware profile the user names."""

from __future__ import annotations

import math
from typing import Any

from zsim.fabric.cluster import load_cluster
from zsim.config.profiles import Profiles
from zsim.scenario.scenario import Scenario, build_scenario
from zsim.config.model_section import ModelSection
from zsim.config.schema import ZeroSection
from zsim.config.struct import fields
from zsim.errors import ConfigError
from zsim.trace.run_reader import MeasuredRun


def scenario_dict(run: MeasuredRun, profile: str, profiles: Profiles | None = None) -> dict[str, Any]:
    """The scenario mapping of `run` on `profile` (a name found by `profiles`).

    Raises:
        ConfigError: the metadata lacks a key the scenario needs, or the run's ranks do not fill whole
        nodes of the profile.
    """
    meta = run.metadata
    for key in ("model", "zero", "precision", "dp", "mp", "world_size"):
        if key not in meta:
            raise ConfigError(f"metadata has no '{key}': cannot rebuild the run", source=str(run.folder))
    model = {k: v for k, v in meta["model"].items() if k in fields(ModelSection) and v is not None}
    model.pop("global_batch", None)
    model["grad_accum"] = int(meta.get("grad_accum") or model.get("grad_accum") or 1)
    if meta.get("source") == "measured":
        model.update(runtime_model_options(meta))
    zero = {k: v for k, v in meta["zero"].items() if k in fields(ZeroSection)}
    if meta.get("source") == "measured" and _device_facts(meta).get("type") == "cuda" and not pipeline_keys(meta):
        zero["setup_residue"] = "runtime"  # a runtime run on a GPU: its setup's cached blocks (ZeroSection)
    cluster = load_cluster(profile, 1, profiles)
    world = int(meta["world_size"])
    per_node = cluster.gpus_per_node
    if world % per_node and world > per_node:
        raise ConfigError(f"the run had {world} ranks; profile '{profile}' has {per_node} per node: they do not fill "
                          "whole nodes", source=str(run.folder))
    hardware: dict[str, Any] = {"profile": profile, "nodes": max(1, math.ceil(world / per_node))}
    if world < per_node:
        from zsim.config.schema import HardwareSection

        if "gpus_per_node" not in fields(HardwareSection):
            raise ConfigError(f"the run had {world} ranks, profile '{profile}' has {per_node} GPUs per node, and this "
                              "build cannot use part of a node (hardware.gpus_per_node): give a profile with "
                              f"{world} per node", source=str(run.folder))
        hardware["gpus_per_node"] = world  # contract 2: the run used part of one node
    return {"name": f"replay-{run.folder.name}", "model": model, "parallel": {"dp": meta["dp"], "mp": meta["mp"],
                                                                            **pipeline_keys(meta)},
            "zero": zero, "precision": {"dtype": meta["precision"]}, "hardware": hardware,
            "run": {"steps": len(run.steps)}}


def pipeline_keys(meta: dict[str, Any]) -> dict[str, Any]:
    """The `parallel` keys of a pipeline run's metadata (runtime/worker.py writes `pipeline`: pp, schedule,
    virtual_stages and the layers of each stage's chunks): pp, pipeline_schedule, virtual_stages, and
    pp_layers, the layers of each virtual stage in order (chunk c of stage s is virtual stage c·pp + s,
    zsim.parallel.pipeline), so a stated uneven split is rebuilt as it ran. {} without a pipeline."""
    pipe = meta.get("pipeline")
    if not isinstance(pipe, dict) or int(pipe.get("pp", 1)) <= 1:
        return {}
    p, v = int(pipe["pp"]), int(pipe.get("virtual_stages", 1))
    layers = pipe.get("layers")
    keys: dict[str, Any] = {"pp": p, "pipeline_schedule": str(pipe["schedule"]), "virtual_stages": v}
    if isinstance(layers, list) and len(layers) == p and all(isinstance(st, list) and len(st) == v for st in layers):
        keys["pp_layers"] = [int(layers[s][c][1]) - int(layers[s][c][0]) for c in range(v) for s in range(p)]
    return keys


def _device_facts(meta: dict[str, Any]) -> dict[str, Any]:
    """The runtime's record of the device a run used (runtime/device_facts.py), {} where there is none."""
    return meta["device_facts"] if isinstance(meta.get("device_facts"), dict) else {}


def runtime_model_options(meta: dict[str, Any]) -> dict[str, Any]:
    """What zsim's runtime model (runtime/model.py) is, beyond the shape its metadata records: it has
    no dropout, and its attention is `torch.nn.functional.scaled_dot_product_attention`, which on a GPU
    runs a fused kernel that keeps no s×s scores (on the 2026-11-26 H200 run, cuDNN's sm90 flash kernels,
    data/device/20261126-h200: Hopper's FlashAttention-3 class; FlashAttention-2 on Ampere, torch's own
    flash backend). CPU runs keep zsim's standard attention: the host model prices them that way and
    the CPU replay suite is calibrated on it. Its head takes `F.cross_entropy(logits.float())` (model.loss
    torch-fp32) without tensor parallelism; a tensor-parallel run keeps the default (vocab-parallel). On a
    GPU its kernels are PyTorch 2's (model.kernels pytorch-2: biases in the GEMM epilogue, nn.Embedding,
    F.cross_entropy), as its Kineto traces show; CPU runs keep the default lists, on which the host model
    and the CPU replay suites were fitted and validated (a CPU addmm copies the bias into its output
    before the GEMM, which the separate bias kernel stands for)."""
    options: dict[str, Any] = {"dropout": False}
    if int(meta.get("mp", 1) or 1) == 1:
        options["loss"] = "torch-fp32"
    facts = _device_facts(meta)
    capability = str(facts.get("capability", ""))
    if facts.get("type") == "cuda":
        options["kernels"] = "pytorch-2"
    if facts.get("type") == "cuda" and capability[:1].isdigit():
        major = int(capability.split(".")[0])
        if major >= 9:
            options["attention"] = "flash3"
        elif major >= 8:
            options["attention"] = "flash2"
    return options


def rebuild(run: MeasuredRun, profile: str, profiles: Profiles | None = None) -> Scenario:
    """The validated scenario of `run` on `profile`: a name, or a .yaml file (e.g. `zsim calibrate`'s output).

    Raises:
        ConfigError: as scenario_dict, or the scenario does not validate (naming the key).
    """
    profiles, name = (Profiles.from_environment() if profiles is None else profiles).resolve_system(profile)
    return build_scenario(scenario_dict(run, name, profiles), profiles=profiles,
                          source=f"{run.folder} (rebuilt from its metadata)",
                          default_name=f"replay-{run.folder.name}")
