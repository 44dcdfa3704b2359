"""The product as a new user gets it: build the wheel, install it into a fresh virtual environment,
and run zsim from a folder outside the repository: the flagship, every `zsim validate` suite (replay as
--dry-run, which records nothing) and a shipped sweep by name (issue 28).

The wheel is built without build isolation (this environment's setuptools, no download). The fresh
environment has no system site-packages and gets the wheel with its declared dependencies from pip
(its cache, else PyPI), with --no-compile: it is exactly what `pip install zsim` gives, without torch
and scipy, so a module that imports either at the top fails here. Without pip, setuptools or the
dependencies (offline, cold cache) the tests skip, saying why.
"""

from __future__ import annotations

import email.parser
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow

SOURCES = ("pyproject.toml", "setup.py", "README.md", "LICENSE", "zsim", "runtime", "hwprofiles", "scenarios")
# pip's words for a package it could not get (offline, cold cache): a skip, not a failure
UNREACHABLE = re.compile(r"No matching distribution|Could not find a version|NewConnectionError|"
                         r"Temporary failure in name resolution|Network is unreachable|ConnectTimeout|ReadTimeout")


def run(cmd: list[str], cwd: Path, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300, **kw)


def clean_env() -> dict[str, str]:
    """This process's environment without what points at the checkout, and with byte-code written (the
    fresh environment was installed uncompiled: its first zsim compiles what it imports, once)."""
    drop = ("PYTHONPATH", "ZSIM_PROFILE_PATH", "PYTHONDONTWRITEBYTECODE", "VIRTUAL_ENV", "PYTHONHOME")
    return {k: v for k, v in os.environ.items() if k not in drop}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built from a copy of the sources (a stale build/ folder cannot leak into it)."""
    if run([sys.executable, "-m", "pip", "--version"], cwd=ROOT).returncode != 0:
        pytest.skip("this environment has no pip to build the wheel with (make test installs it)")
    src = tmp_path_factory.mktemp("src")
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(ROOT / name, src / name)
    dist = tmp_path_factory.mktemp("dist")
    proc = run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dist),
                str(src)], cwd=src)
    if proc.returncode != 0 and "No module named 'setuptools'" in proc.stderr + proc.stdout:
        pytest.skip("no setuptools here to build the wheel offline (make test installs it)")
    assert proc.returncode == 0, proc.stderr
    (path,) = dist.glob("zsim-*.whl")
    return path


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """A fresh venv (no system site-packages) with the wheel and its dependencies, nothing else."""
    env = tmp_path_factory.mktemp("venv")
    base = getattr(sys, "_base_executable", sys.executable)
    assert run([base, "-m", "venv", "--without-pip", str(env)], cwd=env).returncode == 0
    python = env / "bin" / "python"
    proc = run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-compile",
                str(wheel)], cwd=env)
    if proc.returncode != 0 and UNREACHABLE.search(proc.stderr + proc.stdout):
        pytest.skip(f"the wheel's dependencies are neither in pip's cache nor reachable: {proc.stderr[-300:]}")
    assert proc.returncode == 0, proc.stderr
    return env


def test_wheel_ships_profiles_scenarios_and_runtime_inside_zsim(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert {"zsim/hwprofiles/dgx2.yaml", "zsim/hwprofiles/gpus/v100-sxm3-32gb.yaml",
            "zsim/hwprofiles/networks/ib-edr.yaml", "zsim/hwprofiles/links/pcie-gen3-x16.yaml",
            "zsim/scenarios/1T-1024gpu.yaml", "zsim/scenarios/paper/7.5B-64gpu-stage3.yaml",
            "zsim/runtime/worker.py", "zsim/runtime/zero/stage3.py", "zsim/__main__.py"} <= set(names)
    top = {n.split("/")[0] for n in names}
    assert top == {"zsim", wheel.name.split("-py3")[0] + ".dist-info"}, top  # no top-level `runtime`
    shipped = {p.relative_to(ROOT).as_posix() for d in ("hwprofiles", "scenarios") for p in (ROOT / d).rglob("*")
               if p.suffix in (".yaml", ".json")}
    assert {f"zsim/{n}" for n in shipped} <= set(names), "every profile and scenario file is package data"
    assert any(n.endswith("licenses/LICENSE") for n in names)


def test_plain_install_pulls_no_torch(wheel):
    with zipfile.ZipFile(wheel) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    requires = email.parser.Parser().parsestr(meta).get_all("Requires-Dist")
    torch = [r for r in requires if r.lower().startswith("torch")]
    assert torch and all('extra == "runtime"' in r for r in torch), torch
    assert not any(r.lower().startswith(("pytest", "hypothesis")) and "extra ==" not in r for r in requires)


def test_installed_zsim_runs_from_another_folder(venv, tmp_path):
    zsim = str(venv / "bin" / "zsim")
    env = clean_env()
    where = run([str(venv / "bin" / "python"), "-c", "import zsim, importlib.util as u; "
                 "print(zsim.__file__); print(u.find_spec('torch'), u.find_spec('scipy'))"], cwd=tmp_path, env=env)
    assert str(venv) in where.stdout.splitlines()[0] and where.stdout.splitlines()[1] == "None None", where.stdout

    flagship = run([zsim, "run", "1T-1024gpu", "--plot", "wait"], cwd=tmp_path, env=env)
    assert flagship.returncode == 0, flagship.stderr
    assert "FITS" in flagship.stdout
    out = tmp_path / "out" / "1T-1024gpu"
    assert {"result.json", "trace.json", "memory.csv", "memory.png"} <= {p.name for p in out.iterdir()}

    by_path = run([zsim, "run", "scenarios/paper/7.5B-64gpu-stage3.yaml", "--no-plot", "--json", "-"], cwd=tmp_path,
                  env=env)
    assert by_path.returncode == 0 and '"fits": true' in by_path.stdout, by_path.stderr

    coll = run([zsim, "collective", "--profile", "dgx2", "--gpus", "16", "--op", "all_reduce", "-b", "1M", "-e", "8M"],
               cwd=tmp_path, env=env)
    assert coll.returncode == 0 and "busbw" in coll.stdout, coll.stderr

    listing = run([zsim, "profiles"], cwd=tmp_path, env=env)
    assert listing.returncode == 0 and "dgx2" in listing.stdout and "1T-1024gpu" in listing.stdout, listing.stderr

    version = run([str(venv / "bin" / "python"), "-m", "zsim", "--version"], cwd=tmp_path, env=env)
    assert version.returncode == 0 and "torch not installed" in version.stdout, version.stdout

    trace = run([zsim, "trace", "--model", str(out.parent.parent / "m.yaml"), "-o", "t"], cwd=tmp_path, env=env)
    assert trace.returncode == 2 and "pip install 'zsim[runtime]'" in trace.stderr, trace.stderr


def test_every_validate_suite_runs_from_the_wheel(venv, tmp_path):
    """paper and megatron simulate their shipped scenarios (exit 0 all pass, 1 some fail: a verdict, not
    a crash) and replay checks its suite (--dry-run: no torch here), from a folder that is not the checkout."""
    from zsim.validate import megatron

    zsim, env = str(venv / "bin" / "zsim"), clean_env()
    paper = run([zsim, "validate", "paper"], cwd=tmp_path, env=env)
    assert paper.returncode in (0, 1) and "internal error" not in paper.stderr, paper.stderr
    passed, total = map(int, re.search(r"(\d+) of (\d+) pass", paper.stdout).groups())
    assert passed > 0 and total > 100 and "cannot run" not in paper.stdout, paper.stdout[-2000:]

    installed = run([zsim, "validate", "megatron", "--json", "m.json"], cwd=tmp_path, env=env)
    assert installed.returncode in (0, 1), installed.stderr
    # the same numbers as the checkout's suite: the wheel's scenarios are the checkout's
    assert json.loads((tmp_path / "m.json").read_text()) == json.loads(json.dumps(megatron.run().as_dict()))

    replay = run([zsim, "validate", "replay", "--dry-run"], cwd=tmp_path, env=env)
    assert replay.returncode == 0, replay.stderr
    assert "the suite checks out" in replay.stdout and "torch not installed" in replay.stdout
    assert str(venv) in replay.stdout  # the suite's scenarios come from the installed package
    full = run([zsim, "validate", "replay"], cwd=tmp_path, env=env)
    assert full.returncode == 2 and "needs torch: pip install 'zsim[runtime]'" in full.stderr, full.stderr


def test_a_shipped_sweep_by_name_from_the_wheel(venv, tmp_path):
    zsim, env = str(venv / "bin" / "zsim"), clean_env()
    listing = run([zsim, "profiles"], cwd=tmp_path, env=env)
    sweeps = listing.stdout[listing.stdout.index("sweeps (zsim sweep NAME)"):]
    assert "whatif/stage-vs-dp-7.5B" in sweeps, listing.stdout

    sweep = run([zsim, "sweep", "whatif/stage-vs-dp-7.5B", "--workers", "1"], cwd=tmp_path, env=env)
    assert sweep.returncode == 0, sweep.stderr
    out = tmp_path / "out" / "stage-vs-dp-7.5B"
    assert len((out / "sweep.csv").read_text().splitlines()) == 21  # 4 stages × 5 DP degrees, and the header
    assert list(out.glob("*.png")), "the plot"

    as_run = run([zsim, "run", "whatif/stage-vs-dp-7.5B"], cwd=tmp_path, env=env)
    assert as_run.returncode == 2 and "run it with `zsim sweep whatif/stage-vs-dp-7.5B`" in as_run.stderr

    fit = run([zsim, "gemm-fit", "g.csv", "--gpu", "v100-sxm3-32gb"], cwd=tmp_path, env=env)
    assert fit.returncode == 2 and "pip install 'zsim[fit]'" in fit.stderr, fit.stderr
