"""Without GPUDirect RDMA (zsim.fabric.gpudirect): NCCL stages inter-node bytes through host memory, so a
NIC carries min(2/3 of its rate, half its PCIe switch's uplink); the key reaches the cluster from a system
profile, a scenario (`hardware.gpudirect_rdma`) and `zsim collective --no-gpudirect-rdma`, the run says so,
and nothing changes where it is not set."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT, small_scenario
from zsim.calibrate.net_fit import with_network
from zsim.config.profiles import Profiles, builtin_folder
from zsim.engine.simulation import simulate
from zsim.fabric.cluster import load_cluster
from zsim.fabric.gpudirect import STAGED_SHARE, nic_bytes_per_s
from zsim.fabric.perf import run_collective

GEN3_X16 = 15.75e9 * 0.78  # hwprofiles/links/pcie-gen3-x16.yaml: the DGX-2's uplink, achieved, per direction


def test_the_staged_rate_is_the_lower_of_its_two_bounds():
    assert nic_bytes_per_s(12e9, True, GEN3_X16) == 12e9  # GPUDirect RDMA: the network's rate
    # DGX-2: an EDR NIC and two GPUs behind one gen3 switch: half the uplink (6.14) is below 2/3 of 12 (8.0)
    assert nic_bytes_per_s(12e9, False, GEN3_X16) == pytest.approx(GEN3_X16 / 2)
    # a wide uplink (gen4 x16, 25.2 GB/s) under a 10.2 GB/s EFA NIC: the staged share binds instead
    assert nic_bytes_per_s(10.2e9, False, 25.2e9) == pytest.approx(10.2e9 * STAGED_SHARE)
    assert STAGED_SHARE == pytest.approx(16 / 24)  # github.com/NVIDIA/nccl/issues/412: 16 of 24 GB/s on HDR


def test_profile_default_is_gpudirect_and_the_override_changes_only_the_nics():
    plain, staged = load_cluster("dgx2", 2), load_cluster("dgx2", 2, gpudirect_rdma=False)
    assert plain.gpudirect_rdma and plain == load_cluster("dgx2", 2, gpudirect_rdma=True)
    assert staged.nic_bytes_per_s == pytest.approx(GEN3_X16 / 2)
    assert staged.nic_line_bytes_per_s == plain.nic_line_bytes_per_s == 12.5e9
    assert staged.nvlink == plain.nvlink and staged.offload == plain.offload and staged.nccl == plain.nccl


def test_a_system_profile_can_say_it_has_no_gpudirect(tmp_path):
    text = (builtin_folder() / "dgx2.yaml").read_text()
    (tmp_path / "nogdr.yaml").write_text(text.replace("  oversubscription: 1.0", "  oversubscription: 1.0\n"
                                                      "  gpudirect_rdma: false"))
    cluster = load_cluster("nogdr", 2, Profiles.from_environment([tmp_path]))
    assert not cluster.gpudirect_rdma and cluster.nic_bytes_per_s == pytest.approx(GEN3_X16 / 2)
    # the scenario's override wins over the profile, both ways
    assert load_cluster("nogdr", 2, Profiles.from_environment([tmp_path]), gpudirect_rdma=True).gpudirect_rdma


def test_a_nic_bound_all_reduce_runs_at_the_staged_rate():
    """1 GiB across 2 DGX-2 nodes is a ring/Simple bound by the node's 8 NICs: busbw follows their rate."""
    direct = run_collective(load_cluster("dgx2", 2), "all_reduce", 1 << 30, 32)
    staged = run_collective(load_cluster("dgx2", 2, gpudirect_rdma=False), "all_reduce", 1 << 30, 32)
    assert direct.algorithm == staged.algorithm == "ring/Simple"
    assert staged.busbw / direct.busbw == pytest.approx((GEN3_X16 / 2) / 12e9, rel=0.03)


def test_inside_one_node_nothing_changes():
    plain = run_collective(load_cluster("dgx2", 1), "all_reduce", 1 << 30, 16)
    staged = run_collective(load_cluster("dgx2", 1, gpudirect_rdma=False), "all_reduce", 1 << 30, 16)
    assert staged.time_us == plain.time_us


def test_a_network_refit_keeps_the_staging():
    """zsim nccl-fit on a cluster without GPUDirect RDMA: a new efficiency is staged like the old one."""
    staged = load_cluster("p4d", 2, gpudirect_rdma=False)
    refit = with_network(staged, {"efficiency": 0.5})
    assert refit.nic_bytes_per_s == pytest.approx(nic_bytes_per_s(12.5e9 * 0.5, False, staged.offload.bytes_per_s))
    direct = with_network(load_cluster("p4d", 2), {"efficiency": 0.5})
    assert direct.nic_bytes_per_s == pytest.approx(12.5e9 * 0.5)


def test_class_and_per_rank_modes_agree_without_gpudirect():
    s = small_scenario(hardware={"profile": "dgx1", "nodes": 2, "gpudirect_rdma": False},
                       parallel={"dp": 16, "mp": 1}, zero={"stage": 2}, run={"steps": 2})
    a, b = simulate(s, "class"), simulate(s, "per_rank")
    assert b.step_seconds == pytest.approx(a.step_seconds, rel=0.01)
    plain = simulate(dataclasses.replace(s, cluster=load_cluster("dgx1", 2)), "class")
    assert a.step_seconds[-1] > plain.step_seconds[-1]  # its DP collectives cross the slower NICs


def _zsim(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zsim", *args], capture_output=True, text=True, cwd=ROOT)


def test_run_says_the_nics_are_staged_and_result_json_carries_it(tmp_path):
    scenario = str(ROOT / "scenarios/paper/7.5B-64gpu-stage2.yaml")
    out = _zsim("run", scenario, "--set", "hardware.gpudirect_rdma=false", "--no-plot", "-o", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "no GPUDirect RDMA: NIC traffic staged through host memory, 6.1 GB/s a NIC (with it 12.0)" in out.stdout
    facts = json.loads((tmp_path / "result.json").read_text())["inter_node"]
    assert facts["gpudirect_rdma"] is False and facts["nic_bytes_per_s"] == pytest.approx(GEN3_X16 / 2)
    bad = _zsim("run", scenario, "--set", "hardware.gpudirect_rdma=sometimes", "--no-plot", "-o", str(tmp_path))
    assert bad.returncode == 2 and "hardware.gpudirect_rdma: must be true or false" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_collective_flag_halves_a_dgx2_ring():
    rows = {}
    for flag in ((), ("--no-gpudirect-rdma",)):
        out = _zsim("collective", "--profile", "dgx2", "--nodes", "2", "--gpus", "32", "--op", "all_reduce",
                    "-b", "1G", "-e", "1G", "--json", "-", *flag)
        assert out.returncode == 0, out.stderr
        rows[flag] = json.loads(out.stdout[out.stdout.index("["):])[0]["busbw"]
    assert rows[("--no-gpudirect-rdma",)] / rows[()] == pytest.approx((GEN3_X16 / 2) / 12e9, rel=0.03)


def test_the_plan_is_shared_with_and_without_gpudirect():
    """Staging changes only speeds: a sweep over the key reuses one plan (zsim.engine.simulation.plan_key)."""
    from zsim.engine.simulation import plan_key

    s = small_scenario(hardware={"profile": "dgx1", "nodes": 2}, parallel={"dp": 16, "mp": 1})
    staged = dataclasses.replace(s, cluster=load_cluster("dgx1", 2, gpudirect_rdma=False))
    assert plan_key(staged) == plan_key(s)
