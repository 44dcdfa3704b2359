"""Host profiles (hwprofiles/hosts/, zsim/config/host.py): a CPU machine as a cluster the simulator
runs, with gloo's latency-bandwidth terms per collective and the host's achieved compute rates."""

from __future__ import annotations

import shutil

import pytest
import yaml

from tests.conftest import ROOT
from zsim.fabric.cluster import load_cluster
from zsim.config.host import HostFile, host_model
from zsim.scenario.scenario import build_scenario
from zsim.engine.simulation import simulate
from zsim.errors import ConfigError
from zsim.config.validation import validate

SCENARIO = {"model": {"layers": 2, "hidden": 64, "heads": 4, "seq_len": 32, "vocab": 256, "micro_batch": 2},
            "parallel": {"dp": 2, "mp": 1}, "zero": {"stage": 3, "activation_checkpointing": False},
            "precision": {"dtype": "fp32"}, "hardware": {"profile": "dev-2core", "nodes": 1}}


def test_shipped_host_profile_loads_as_a_one_node_cluster():
    cluster = load_cluster("dev-2core", 1)
    assert cluster.host is not None and cluster.gpus_per_node == cluster.host.ranks == 2
    spec = yaml.safe_load((ROOT / "hwprofiles/hosts/dev-2core.yaml").read_text())
    assert cluster.gpu.peak_flops["fp32"] == pytest.approx(spec["compute"]["matmul_GFLOPS"]["fp32"] * 1e9)
    assert cluster.host.op_overhead_s == pytest.approx(spec["compute"]["op_overhead_us"] * 1e-6)


def test_collectives_follow_the_latency_bandwidth_terms():
    """A collective on the host takes latency + S / bandwidth, the profile's fit, on the comm stream,
    while no compute shares the rank's cores (tests/test_host_cores.py has the sharing)."""
    r = simulate(build_scenario(SCENARIO))
    spec = yaml.safe_load((ROOT / "hwprofiles/hosts/dev-2core.yaml").read_text())
    comm = [e for e in r.events if e.get("cat") == "comm"]
    busy = [(e["ts"], e["ts"] + e["dur"]) for e in r.events if e.get("cat") == "compute" and e.get("ph") == "X"]
    alone = [e for e in comm if not any(lo < e["ts"] + e["dur"] and e["ts"] < hi for lo, hi in busy)]
    assert alone and {e["args"]["algorithm"] for e in comm} == {"gloo"}
    for e in alone:
        terms = spec["collectives"][e["args"]["op"]][2]
        want = terms["latency_us"] + e["args"]["bytes"] / (terms["GBps"] * 1e9) * 1e6
        assert e["dur"] == pytest.approx(want, rel=1e-9)


def test_more_than_one_host_and_missing_group_sizes_are_refused():
    with pytest.raises(ConfigError, match="hardware.nodes must be 1"):
        load_cluster("dev-2core", 2)
    model = host_model(validate(HostFile, yaml.safe_load((ROOT / "hwprofiles/hosts/dev-2core.yaml").read_text()), "dev-2core"))
    assert model.collective_seconds("all_reduce", 1e6, 1) == 0.0  # a group of one moves nothing
    with pytest.raises(ConfigError, match="no all_reduce terms for a group of 4"):
        model.collective_seconds("all_reduce", 1e6, 4)


def test_bad_host_profile_names_the_file_and_key(tmp_path, monkeypatch):
    shutil.copytree(ROOT / "hwprofiles", tmp_path / "hwprofiles")
    path = tmp_path / "hwprofiles/hosts/bad.yaml"
    spec = yaml.safe_load((ROOT / "hwprofiles/hosts/dev-2core.yaml").read_text())
    spec["collectives"]["all_reduce"][2]["GBps"] = 0
    path.write_text(yaml.safe_dump(spec))
    monkeypatch.setenv("ZSIM_PROFILE_PATH", str(tmp_path / "hwprofiles"))
    with pytest.raises(ConfigError, match="bad.yaml") as err:
        load_cluster("bad", 1)
    assert "GBps" in str(err.value)
    spec["collectives"]["all_reduce"][2]["GBps"] = 1.0
    spec["collectives"]["allreduce"] = spec["collectives"].pop("all_reduce")
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(ConfigError, match="unknown collective"):
        load_cluster("bad", 1)


def test_host_scenario_runs_from_the_command_line(tmp_path):
    from zsim.cli import main

    assert main(["run", str(ROOT / "scenarios/host/tiny-2rank-stage3.yaml"), "--no-plot", "-o", str(tmp_path)]) == 0
    assert (tmp_path / "trace.json").is_file()


@pytest.mark.parametrize("key,value,words", [
    ("nic_Gbps", 100.0, "gloo on loopback"), ("nics_per_node", 4, "gloo on loopback"),
    ("nic_latency_us", 2.0, "gloo on loopback"), ("oversubscription", 2.0, "no fat tree"),
    ("gpudirect_rdma", False, "no NIC"), ("gpu", "a100-sxm4-40gb", "measured rates"),
    ("network", "roce", "gloo on loopback"),
    ("gpu_memory_GiB", 8.0, "memory_GiB")])
def test_hardware_overrides_a_host_cannot_honour_are_refused_by_key(key, value, words):
    """A host used to run as if the override were unset: a what-if that silently answered another question."""
    spec = {**SCENARIO, "hardware": {**SCENARIO["hardware"], key: value}}
    with pytest.raises(ConfigError, match=words) as exc:
        build_scenario(spec)
    assert exc.value.path == f"hardware.{key}"


def test_a_host_runs_fewer_ranks_than_it_measured_and_refuses_more():
    one = load_cluster("dev-2core", 1, gpus_per_node=1)
    two = load_cluster("dev-2core", 1)
    assert (one.gpus_per_node, one.host.ranks, one.world) == (1, 1, 1)
    assert one.gpu.memory_bytes == 2 * two.gpu.memory_bytes  # one rank has the host's memory to itself
    assert one.host.ranks_share_cores is False  # 1 rank × 1 thread on 2 cores
    r = simulate(build_scenario({**SCENARIO, "parallel": {"dp": 1, "mp": 1},
                                 "hardware": {"profile": "dev-2core", "nodes": 1, "gpus_per_node": 1}}))
    comm = [e for e in r.events if e.get("cat") == "comm"]
    assert r.step_seconds[0] > 0 and comm and all(e["dur"] == 0 for e in comm)  # a group of one moves nothing
    with pytest.raises(ConfigError, match="measured with 2 ranks") as exc:
        load_cluster("dev-2core", 1, gpus_per_node=3)
    assert exc.value.path == "hardware.gpus_per_node"
