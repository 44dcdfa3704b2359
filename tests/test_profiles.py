"""User profile folders (--profiles, $ZSIM_PROFILE_PATH) before the built-in ones; names, not paths,
in scenario files; `zsim profiles`; shipped scenarios by name."""

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT, small_dict
from zsim.fabric.cluster import load_cluster
from zsim.config.profiles import Profiles, builtin_folder
from zsim.scenario.scenario import build_scenario, find_scenario
from zsim.config.shipped import shipped_scenarios
from zsim.errors import ConfigError

# A user's own cluster: 4 built-in H100s per node on built-in NDR, a built-in PCIe gen5 host link.
MYBOX = """\
name: MyBox
gpu: h100-sxm5-80gb
gpus_per_node: 4
intra_node: {fabric: nvswitch, nvlink_links_per_gpu: 18, nvlink_GBps_per_link: 25, nvswitches: 2}
inter_node: {network: ib-ndr, nics_per_node: 2}
offload_link: pcie-gen5-x16
nccl:
  launch_us: 5.0
  efficiency: {LL: 0.5, LL128: 0.52, Simple: 0.8}
  latency_us: {LL: 3.6, LL128: 8.0, Simple: 4.0}
  step_latency_us: {LL: 0.5, LL128: 0.0, Simple: 5.8}
  unaligned_copy_GBps: 70
  unaligned_reduce_GBps: 40
"""


@pytest.fixture
def user_dir(tmp_path):
    (tmp_path / "mybox.yaml").write_text(MYBOX)
    return tmp_path


def zsim(*args, env=None, cwd=ROOT):
    import os

    environ = {k: v for k, v in os.environ.items() if k != "ZSIM_PROFILE_PATH"} | (env or {})
    return subprocess.run([sys.executable, "-m", "zsim", *args], capture_output=True, text=True, cwd=cwd, env=environ)


def test_a_user_system_names_builtin_components(user_dir):
    cluster = load_cluster("mybox", 2, Profiles.from_environment([user_dir]))
    assert cluster.name == "MyBox" and cluster.gpus_per_node == 4 and cluster.gpu.name == "H100-SXM5-80GB"
    assert cluster.nics_per_node == 2


def test_user_folders_come_first_and_shadow_builtins(user_dir, tmp_path_factory):
    (user_dir / "gpus").mkdir()
    v100 = (builtin_folder() / "gpus" / "v100-sxm3-32gb.yaml").read_text()
    (user_dir / "gpus" / "v100-sxm3-32gb.yaml").write_text(v100.replace("memory_GiB: 32", "memory_GiB: 16"))
    second = tmp_path_factory.mktemp("second")
    (second / "mybox.yaml").write_text(MYBOX.replace("gpus_per_node: 4", "gpus_per_node: 8"))
    profiles = Profiles.from_environment([user_dir], environ={"ZSIM_PROFILE_PATH": str(second)})
    assert profiles.roots == (user_dir, second, builtin_folder())
    assert load_cluster("dgx2", 1, profiles).gpu.memory_bytes == 16 * 2**30  # the user's GPU file wins
    assert load_cluster("mybox", 1, profiles).gpus_per_node == 4  # --profiles before $ZSIM_PROFILE_PATH
    assert profiles.shadowed("gpu", "v100-sxm3-32gb") == [builtin_folder() / "gpus" / "v100-sxm3-32gb.yaml"]
    assert load_cluster("mybox", 1, Profiles.from_environment(environ={"ZSIM_PROFILE_PATH": str(second)})
                        ).gpus_per_node == 8


def test_a_missing_folder_or_profile_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="--profiles .*: no such folder"):
        Profiles.from_environment([tmp_path / "nope"])
    with pytest.raises(ConfigError, match=r"\$ZSIM_PROFILE_PATH .*: no such folder"):
        Profiles.from_environment(environ={"ZSIM_PROFILE_PATH": str(tmp_path / "nope")})
    with pytest.raises(ConfigError, match="no gpu profile 'v100' .*did you mean"):
        Profiles().path("gpu", "v100")


@pytest.mark.parametrize("bad", ["../hwprofiles/dgx2", "/etc/passwd", "dgx2.yaml", "x/y", ""])
def test_scenario_files_name_profiles_never_paths(bad):
    with pytest.raises(ConfigError, match="hardware.profile: .*(not a system profile name|not a path)"):
        build_scenario(small_dict(hardware={"profile": bad, "nodes": 2}))


def test_command_line_profile_takes_a_name_or_a_file(user_dir):
    profiles, name = Profiles().resolve_system(str(user_dir / "mybox.yaml"))
    assert name == "mybox" and load_cluster(name, 1, profiles).name == "MyBox"
    assert Profiles().resolve_system("dgx2") == (Profiles(), "dgx2")
    with pytest.raises(ConfigError, match="no such file"):
        Profiles().resolve_system(str(user_dir / "other.yaml"))


def test_cli_finds_user_profiles_by_flag_env_and_file(user_dir):
    args = ("collective", "--gpus", "8", "--nodes", "2", "--op", "all_gather", "-b", "1M", "-e", "1M", "--json", "-")
    by_flag = zsim(*args, "--profile", "mybox", "--profiles", str(user_dir))
    by_env = zsim(*args, "--profile", "mybox", env={"ZSIM_PROFILE_PATH": str(user_dir)})
    by_file = zsim(*args, "--profile", str(user_dir / "mybox.yaml"))
    assert by_flag.returncode == by_env.returncode == by_file.returncode == 0, by_flag.stderr + by_file.stderr
    assert json.loads(by_flag.stdout) == json.loads(by_env.stdout) == json.loads(by_file.stdout)
    missing = zsim(*args, "--profile", "mybox")
    assert missing.returncode == 2 and "no system profile 'mybox'" in missing.stderr


def test_run_with_another_profile_on_the_command_line(user_dir, tmp_path):
    proc = zsim("run", "paper/7.5B-64gpu-stage3", "--no-plot", "-o", str(tmp_path / "o"), "--json", "-",
                "--profile", "dgx-a100", "--set", "hardware.nodes=8")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["layout"]["gpu"] == "A100-SXM4-80GB"


def test_zsim_profiles_lists_every_kind_and_the_scenarios(user_dir):
    proc = zsim("profiles", "--profiles", str(user_dir))
    assert proc.returncode == 0, proc.stderr
    for heading in ("systems", "GPUs", "networks", "host links", "scenarios"):
        assert f"\n{heading}" in proc.stdout
    line = next(x for x in proc.stdout.splitlines() if x.strip().startswith("mybox"))
    assert "MyBox" in line and str(user_dir) in line
    assert any(x.strip().startswith("dgx2 ") and "16 × v100-sxm3-32gb" in x for x in proc.stdout.splitlines())
    table = json.loads(zsim("profiles", "--json", "-").stdout)
    assert {r["name"] for r in table["gpu"]} >= {"v100-sxm3-32gb", "a100-sxm4-80gb", "h100-sxm5-80gb"}
    assert {r["name"] for r in table["scenarios"]} >= {"1T-1024gpu", "paper/7.5B-64gpu-stage3"}


@pytest.mark.parametrize("args", [
    ["run", "scenarios/paper/C1-100B-400gpu.yaml", "--no-plot", "-o", "/tmp/zsim-never"],
    ["maxsize", "--scenario", "scenarios/paper/C1-100B-400gpu.yaml"],
    ["maxsize", "--batch", "16", "--dp", "8", "--gpu-mem", "32GB"],
])
def test_a_missing_profile_is_blamed_on_the_profile_flag(args, capsys, monkeypatch):
    """`--profile dgx22` was reported as `--set 'hardware.profile=dgx22'` (run) or as the file's (maxsize)."""
    from zsim.cli import main

    monkeypatch.chdir(ROOT)
    assert main([*args, "--profile", "dgx22"]) == 2
    assert capsys.readouterr().err.startswith("zsim: --profile 'dgx22': hardware.profile: no system profile 'dgx22' "
                                              "(did you mean 'dgx2'")


def test_every_shipped_scenario_says_what_it_is(capsys):
    """`zsim profiles` lists the shipped scenarios with their description; an empty one is a blank row."""
    from zsim.cli import main

    assert main(["profiles", "--json", "-"]) == 0
    rows = json.loads(capsys.readouterr().out)["scenarios"]
    assert len(rows) == len(shipped_scenarios()) and rows
    assert [r["name"] for r in rows if not r["description"].strip()] == []


def test_shipped_scenarios_by_name_from_any_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert set(shipped_scenarios()) >= {"1T-1024gpu", "paper/C1-100B-400gpu", "whatif/7.5B-64gpu-slow-nic"}
    flagship = builtin_folder("zsim.scenarios") / "1T-1024gpu.yaml"
    assert find_scenario("1T-1024gpu") == find_scenario("scenarios/1T-1024gpu.yaml") == flagship
    assert find_scenario("C1-100B-400gpu").name == "C1-100B-400gpu.yaml"
    with pytest.raises(ConfigError, match="not a shipped scenario .*did you mean '1T-1024gpu'"):
        find_scenario("1T-1024")
