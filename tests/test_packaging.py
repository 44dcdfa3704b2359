"""The product as a new user gets it: build the wheel, install it into a fresh virtual environment,
and run zsim from a folder outside the repository.

Offline: the wheel is built without build isolation (this environment's setuptools) and installed
with --no-deps; the fresh environment sees this environment's libraries through a folder of links
that leaves out torch (and this checkout's editable zsim), so it is also the simulator-only install
that `pip install zsim` gives.
"""

from __future__ import annotations

import email.parser
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow

SOURCES = ("pyproject.toml", "setup.py", "README.md", "LICENSE", "zsim", "runtime", "hwprofiles", "scenarios")


def run(cmd: list[str], cwd: Path, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300, **kw)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built from a copy of the sources (a stale build/ folder cannot leak into it)."""
    src = tmp_path_factory.mktemp("src")
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(ROOT / name, src / name)
    dist = tmp_path_factory.mktemp("dist")
    proc = run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dist),
                str(src)], cwd=src)
    assert proc.returncode == 0, proc.stderr
    (path,) = dist.glob("zsim-*.whl")
    return path


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """A fresh venv with the wheel installed, and this environment's libraries except torch."""
    env = tmp_path_factory.mktemp("venv")
    base = getattr(sys, "_base_executable", sys.executable)
    assert run([base, "-m", "venv", "--without-pip", str(env)], cwd=env).returncode == 0
    python = env / "bin" / "python"
    proc = run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index",
                str(wheel)], cwd=env)
    assert proc.returncode == 0, proc.stderr
    libs = env / "libs"
    libs.mkdir()
    for item in Path(sysconfig.get_paths()["purelib"]).iterdir():
        name = item.name.lower()
        if not name.startswith(("torch", "zsim", "__editable__", "_distutils_hack", "distutils-precedence")):
            (libs / item.name).symlink_to(item)
    purelib = run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=env)
    (Path(purelib.stdout.strip()) / "zsim-test-libs.pth").write_text(f"{libs}\n")
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
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ZSIM_PROFILE_PATH")}
    where = run([str(venv / "bin" / "python"), "-c", "import zsim, importlib.util as u; "
                 "print(zsim.__file__); print(u.find_spec('torch'))"], cwd=tmp_path, env=env)
    assert str(venv) in where.stdout.splitlines()[0] and where.stdout.splitlines()[1] == "None", where.stdout

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
