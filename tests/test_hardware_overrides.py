"""`hardware.*` overrides: each replaces exactly its profile value, bad values are ConfigErrors that
name the key, and the topology follows a different node size (or is refused with a reason)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT, small_dict
from zsim.config.profile_files import GiB
from zsim.fabric.cluster import load_cluster
from zsim.scenario.scenario import build_scenario, load_scenario
from zsim.errors import ConfigError
from zsim.fabric.topology import aggregate_capacities, build_topology

BASE = dataclasses.asdict(load_cluster("dgx2", 2))
EFF = BASE["network_efficiency"]  # the EDR profile's fitted share of the line rate (hwprofiles/networks/ib-edr.yaml)


def changed_fields(**overrides) -> dict:
    """The Cluster fields (flattened one level) whose value differs from the plain dgx2 profile."""
    new = dataclasses.asdict(load_cluster("dgx2", 2, **overrides))
    diff = {}
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(BASE[key], dict):
            diff.update({f"{key}.{k}": v for k, v in value.items() if BASE[key].get(k) != v})
        elif value != BASE[key]:
            diff[key] = value
    return diff


@pytest.mark.parametrize("overrides, expected", [
    # a NIC rate or latency of the user's own is no longer the fitted network's: its fit is dropped
    ({"nic_Gbps": 200.0}, {"nic_bytes_per_s": 200 / 8 * 1e9 * EFF, "nic_pool.bytes_per_s": 8 * 200 / 8 * 1e9 * EFF,
                           "network_fit": None, "nic_line_bytes_per_s": 200 / 8 * 1e9}),
    ({"nic_latency_us": 2.0}, {"nic_pool.latency_s": 2e-6, "network_fit": None}),
    ({"nics_per_node": 4}, {"nics_per_node": 4, "nic_pool.bytes_per_s": 4 * 100 / 8 * 1e9 * EFF}),
    ({"oversubscription": 2.0}, {"oversubscription": 2.0}),
    ({"gpu_memory_GiB": 16.0}, {"gpu.memory_bytes": 16 * GiB}),
    ({"gpus_per_node": 8}, {"gpus_per_node": 8}),
    # staged through host memory: 2/3 of the NIC's rate, at most half the PCIe switch's uplink (gen3 x16,
    # 12.285 GB/s achieved): 6.14 GB/s a NIC (zsim.fabric.gpudirect); the fitted terms still apply
    ({"gpudirect_rdma": False}, {"gpudirect_rdma": False, "nic_bytes_per_s": 15.75e9 * 0.78 / 2,
                                 "nic_pool.bytes_per_s": 8 * 15.75e9 * 0.78 / 2}),
    ({"gpudirect_rdma": True}, {}),
])
def test_each_override_changes_its_value_and_nothing_else(overrides, expected):
    diff = changed_fields(**overrides)
    assert set(diff) == set(expected)
    for key, value in expected.items():
        assert diff[key] is None if value is None else diff[key] == pytest.approx(value)


def test_gpu_override_swaps_the_gpus_own_figures_only():
    diff = changed_fields(gpu="a100-sxm4-80gb")
    assert diff["gpu.name"].startswith("A100")
    assert diff["gpu.memory_bytes"] == 80 * GiB
    assert all(k.startswith("gpu.") for k in diff), diff  # the node (NVLinks, NICs) is the DGX-2's


def test_set_on_the_command_line_reaches_the_cluster():
    path = ROOT / "scenarios/paper/7.5B-64gpu-stage2.yaml"
    plain = load_scenario(path)
    fast = load_scenario(path, ["hardware.nic_Gbps=200", "hardware.gpu_memory_GiB=40"])
    assert fast.cluster.nic_bytes_per_s == pytest.approx(2 * plain.cluster.nic_bytes_per_s)
    assert fast.cluster.gpu.memory_bytes == 40 * GiB
    assert fast.cluster.nvlink == plain.cluster.nvlink


def error_of(hardware: dict, parallel: dict | None = None) -> str:
    data = small_dict(hardware={"profile": "dgx2", "nodes": 2, **hardware}, parallel=parallel or {"dp": 8, "mp": 4})
    with pytest.raises(ConfigError) as info:
        build_scenario(data, source="s.yaml")
    return str(info.value)


@pytest.mark.parametrize("key, value, words", [
    ("nic_Gbps", 0, "must be a number > 0.0 (got 0)"),
    ("nic_Gbps", "fast", "must be a number (got 'fast')"),
    ("nic_latency_us", -1.0, "must be a number >= 0.0 (got -1.0)"),
    ("gpus_per_node", 0, "must be an integer >= 1 (got 0)"),
    ("gpus_per_node", 7.5, "must be an integer (got 7.5)"),
    ("nics_per_node", -2, "must be an integer >= 1 (got -2)"),
    ("gpu_memory_GiB", 0, "must be a number > 0.0 (got 0)"),
    ("oversubscription", 0.5, "must be a number >= 1.0 (got 0.5)"),
    ("gpu", "v100-sxm3-32", "did you mean 'v100-sxm3-32gb'"),
    ("gpus_per_node", 15, "multiple of 2"),
])
def test_bad_override_is_a_config_error_naming_the_key(key, value, words):
    msg = error_of({key: value})
    assert msg.startswith(f"s.yaml: hardware.{key}: "), msg
    assert words in msg, msg


def test_unknown_hardware_key_suggests_the_close_one():
    assert "hardware.nic_gbps: unknown key; did you mean 'nic_Gbps'?" in error_of({"nic_gbps": 200})


def test_gpus_per_node_changes_the_world_the_layout_must_cover():
    msg = error_of({"gpus_per_node": 8})
    assert "parallel.dp: 8 × mp 4 = 32 GPUs, but the cluster has 16 (2 nodes × 8 GPUs)" in msg
    s = build_scenario(small_dict(hardware={"profile": "dgx2", "nodes": 2, "gpus_per_node": 8},
                                  parallel={"dp": 4, "mp": 4}))
    assert s.layout.gpus_per_node == 8 and s.cluster.world == 16


def test_cube_mesh_keeps_the_sub_mesh_of_a_smaller_node():
    """A DGX-1 job on GPUs 0..3 keeps the links among them: 0-1 x1, 0-2 x1, 0-3 x2, 1-2 x2, 1-3 x1,
    2-3 x2 (whitepaper Fig. 5): GPUs 0 and 1 keep 4 of their 6 NVLinks, GPUs 2 and 3 keep 5."""
    c = load_cluster("dgx1", 1, gpus_per_node=4)
    g = build_topology(c)
    assert sorted(n for n in g if "gpu" in n) == [f"n0.gpu{i}" for i in range(4)]
    caps = aggregate_capacities(g, c)
    assert [caps[("nvlink", r)] / c.nvlink_link_bytes_per_s for r in range(4)] == [4, 4, 5, 5]
    assert c.nvlink_links == 4 and c.nvlink.bytes_per_s == 4 * c.nvlink_link_bytes_per_s
    # every GPU still reaches a PCIe switch and the NICs hang off existing switches
    assert all(any(d["kind"] == "pcie" for _, _, d in g.out_edges(f"n0.gpu{i}", data=True)) for i in range(4))


def test_cube_mesh_of_odd_size_has_every_gpu_on_a_pcie_switch():
    c = load_cluster("dgx1", 2, gpus_per_node=3)
    g = build_topology(c)
    assert all(any(d["kind"] == "pcie" for _, _, d in g.out_edges(f"n1.gpu{i}", data=True)) for i in range(3))
    assert c.nvlink_links == 2  # GPU 0 keeps 0-1 and 0-2


def test_cube_mesh_refuses_more_than_eight_gpus():
    with pytest.raises(ConfigError) as info:
        load_cluster("dgx1", 1, gpus_per_node=16)
    assert info.value.path == "hardware.gpus_per_node" and "at most 8" in str(info.value)


def test_cli_set_of_a_bad_hardware_value_exits_2_naming_it():
    out = subprocess.run([sys.executable, "-m", "zsim.cli", "run", "scenarios/paper/7.5B-64gpu-stage2.yaml",
                          "--set", "hardware.nic_Gbps=-5", "--no-plot", "-o", "/tmp/zsim-never"],
                         cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 2
    assert "hardware.nic_Gbps" in out.stderr and "Traceback" not in out.stderr


def test_profile_files_are_parsed_once_and_reread_when_edited(tmp_path, monkeypatch):
    import shutil

    from zsim.config import profile_files

    root = tmp_path / "hw"
    shutil.copytree(ROOT / "hwprofiles", root)
    monkeypatch.setenv("ZSIM_PROFILE_PATH", str(root))
    first = load_cluster("dgx2", 1)
    hits = profile_files.parsed_file.cache_info().hits
    load_cluster("dgx2", 1)
    assert profile_files.parsed_file.cache_info().hits >= hits + 4  # system, GPU, network, link: from the cache
    net = root / "networks" / "ib-edr.yaml"
    net.write_text(net.read_text().replace("port_Gbps: 100", "port_Gbps: 200.0"))  # new size, new mtime
    assert load_cluster("dgx2", 1).nic_bytes_per_s == pytest.approx(2 * first.nic_bytes_per_s)


def test_network_override_swaps_the_fabric_terms_on_the_same_nics():
    """hardware.network: another network profile's fitted terms (RoCE here) on the node's own NICs: a DGX H100's
    400 Gb/s ports stay 400 Gb/s (roce.yaml's default port is 100 Gb/s), the node is untouched."""
    ib = dataclasses.asdict(load_cluster("dgx-h100", 8))
    roce = load_cluster("dgx-h100", 8, network="roce")
    ethernet = dataclasses.asdict(roce)
    changed = {k for k in ib if ib[k] != ethernet[k]}
    assert changed == {"nic_pool", "nic_bytes_per_s", "network_fit", "network_profile", "network_efficiency",
                       "tree_efficiency", "ll128_share", "nvls_tree_share"}, changed
    assert roce.network_profile == "roce" and roce.network_fit.tables.endswith("oci-a100-sxm4-40gb-roce")
    assert roce.nic_line_bytes_per_s == pytest.approx(400 / 8 * 1e9)
    assert roce.nic_bytes_per_s == pytest.approx(400 / 8 * 1e9 * roce.network_efficiency)
    assert roce.nic_pool.latency_s != ib["nic_pool"]["latency_s"]
    # with a rate of its own the fit no longer describes it
    assert load_cluster("dgx-h100", 8, network="roce", nic_Gbps=200).network_fit is None


def test_unknown_network_override_names_the_key():
    msg = error_of({"network": "ethernet"})
    assert msg.startswith("s.yaml: hardware.network: "), msg
    assert "roce" in msg or "network profile" in msg, msg


def test_collective_network_flag_prices_the_same_nics_with_another_fabric():
    """`zsim collective --network roce`: the DGX H100's 400 Gb/s NICs with RoCE's fitted terms, a different busbw
    than its own InfiniBand's on two nodes; an unknown network exits 2 naming the key, without a traceback."""
    def busbw(*flag):
        out = subprocess.run([sys.executable, "-m", "zsim.cli", "collective", "--profile", "dgx-h100", "--nodes", "2",
                              "--gpus", "16", "--op", "all_reduce", "-b", "64M", "-e", "64M", "--json", "-", *flag],
                             cwd=ROOT, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout[out.stdout.index("["):])[0]["busbw"]

    own, roce = busbw(), busbw("--network", "roce")
    assert roce != pytest.approx(own, rel=0.01)
    bad = subprocess.run([sys.executable, "-m", "zsim.cli", "collective", "--profile", "dgx-h100", "--nodes", "2",
                          "--gpus", "16", "--op", "all_reduce", "--network", "ethernet"],
                         cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and "hardware.network: no network profile 'ethernet'" in bad.stderr
    assert "Traceback" not in bad.stderr
