"""Multi-node nccl-tests folders whose rows all lie below 1 MiB (issue 28, second pass): the fit is valid but
has no median to report; `--json` of nccl-fit and calibrate was an internal error (NaN is not JSON) and
calibrate's text summary one more (None formatted as a percentage). Both must write valid JSON and exit 0."""

from __future__ import annotations

import json

import pytest

from tests.bad_inputs import _table
from zsim import cli

pytest.importorskip("scipy")  # the fit extra

SMALL = tuple(8 << i for i in range(15))  # 8 B to 128 KiB


@pytest.fixture
def small_tables(tmp_path):
    folder = tmp_path / "small"
    folder.mkdir()
    for nodes in (2, 4):
        (folder / f"all_reduce-{nodes}nodes.txt").write_text(_table(nodes, sizes=SMALL))
    return folder


def test_nccl_fit_json_without_rows_over_1mib(small_tables, tmp_path, capsys):
    out = tmp_path / "fit.json"
    assert cli.main(["nccl-fit", str(small_tables), "--profile", "abci-v100", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["summary"] == {} and len(report["residuals"]) == 2 * len(SMALL)


def test_calibrate_json_without_rows_over_1mib(small_tables, tmp_path, capsys):
    out = tmp_path / "fit.json"
    code = cli.main(["calibrate", str(small_tables), "--profile", "abci-v100", "-o", str(tmp_path / "p.yaml"),
                     "--accept-poor-fit", "--json", str(out)])
    assert code == 0, capsys.readouterr().err
    residuals = json.loads(out.read_text())["network"]["residuals"]
    assert residuals == {"rows_over_1MiB": 0, "median_error": None, "max_error": None}
    assert "no row >= 1 MiB" in capsys.readouterr().out


@pytest.mark.parametrize("make, words", [(lambda p: p / "missing", "no such folder"),
                                         (lambda p: (p / "a.txt").write_text("x") and p / "a.txt", "not a folder")])
def test_a_missing_folder_is_named_before_gpus_is_asked_for(tmp_path, capsys, make, words):
    """Without --gpus a missing folder was answered "single-node tables need --gpus", as if it held tables."""
    assert cli.main(["nccl-fit", str(make(tmp_path)), "--profile", "dgx2"]) == 2
    err = capsys.readouterr().err
    assert words in err and "--gpus" not in err
