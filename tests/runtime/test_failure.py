"""Guaranteed teardown (issue 5): when a rank fails, the others are stopped, the launcher names the
rank and its error and exits non-zero, no process is left behind, and the healthy ranks' traces
of the steps they finished are kept."""

from __future__ import annotations

import json
import os

from zsim.runtime.launch import LaunchResult, RankFailure
from tests.runtime.conftest import TINY, run_config
from zsim import cli


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_failing_rank_is_named_and_the_rest_torn_down(tmp_path):
    from zsim.runtime.launch import launch

    result = launch(run_config(tmp_path, stage=1, world_size=3, steps=5, fail_rank=1, fail_at_step=2))
    assert not result.ok
    assert result.failure.rank == 1
    assert "InjectedFailure: injected failure at step 2" in result.failure.error
    assert len(result.pids) == 3 and not any(alive(pid) for pid in result.pids)
    for rank in (0, 2):  # healthy ranks: their trace holds the two steps they finished
        doc = json.loads((tmp_path / f"rank{rank}.trace.json").read_text())
        steps = {e["args"]["step"] for e in doc["traceEvents"] if e.get("name") == "optimizer/step"}
        assert steps == {0, 1}
    assert (tmp_path / "rank1.trace.json").exists()  # the failing rank wrote what it had, too


def test_cli_reports_the_failed_rank_and_exits_non_zero(tmp_path, monkeypatch, capsys):
    import zsim.runtime.launch

    model = tmp_path / "model.yaml"
    model.write_text("\n".join(f"{k}: {v}" for k, v in TINY.items()))
    failure = RankFailure(3, "RuntimeError: boom", tmp_path / "rank3.log")
    monkeypatch.setattr(zsim.runtime.launch, "launch", lambda cfg, **kw: LaunchResult(tmp_path, [1], failure))
    code = cli.main(["trace", "--model", str(model), "--ranks", "4", "--stage", "0", "-o", str(tmp_path)])
    assert code == 1
    assert "rank 3 failed: RuntimeError: boom" in capsys.readouterr().err
