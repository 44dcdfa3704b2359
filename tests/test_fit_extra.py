"""scipy is the `fit` extra (issue 28): the simulator runs without it, and the fitting commands say what
to install (exit 2, no traceback) instead of failing on an ImportError."""

from __future__ import annotations

import sys

import pytest

from zsim.cli import main

FIT_COMMANDS = {
    "gemm-fit": lambda d: ["gemm-fit", str(d / "g.csv"), "--gpu", "v100-sxm3-32gb", "--dtype", "fp32"],
    "nccl-fit": lambda d: ["nccl-fit", str(d), "--profile", "dgx2", "--gpus", "8"],
    "calibrate": lambda d: ["calibrate", str(d / "g.csv"), "--profile", "dgx2", "-o", str(d / "c.yaml")],
}


@pytest.fixture
def no_scipy(monkeypatch):
    """An interpreter where `import scipy` fails, as in a simulator-only install."""
    for name in [n for n in sys.modules if n == "scipy" or n.startswith("scipy.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "scipy", None)  # None in sys.modules: the import raises ImportError
    monkeypatch.setitem(sys.modules, "scipy.optimize", None)


@pytest.mark.parametrize("command", sorted(FIT_COMMANDS))
def test_fit_commands_without_scipy_name_the_extra(command, no_scipy, tmp_path, capsys):
    (tmp_path / "g.csv").write_text("source,M,N,K,transA,transB,time_ms,tflops\n")
    assert main(FIT_COMMANDS[command](tmp_path)) == 2
    err = capsys.readouterr().err
    assert f"zsim {command} needs scipy, which is not installed: pip install 'zsim[fit]'" in err, err
    assert "Traceback" not in err
    assert not (tmp_path / "c.yaml").exists()


def test_the_fit_functions_without_scipy_raise_a_zsim_error(no_scipy):
    import numpy as np

    from zsim.calibrate.host_fit import relative_line
    from zsim.errors import ZsimError

    with pytest.raises(ZsimError, match=r"the host fit \(zsim calibrate\) needs scipy.*zsim\[fit\]"):
        relative_line(np.array([1.0, 2.0, 3.0]), np.array([1.0, 2.0, 3.0]))


def test_the_simulator_runs_without_scipy(no_scipy, tmp_path, capsys):
    assert main(["run", "paper/7.5B-64gpu-stage3", "--no-plot", "-o", str(tmp_path / "out")]) == 0
    assert "FITS" in capsys.readouterr().out
    assert "scipy" not in sys.modules or sys.modules["scipy"] is None
