"""The launcher owns its ranks (issue 13), tested with real processes: SIGTERM or SIGKILL to the
launcher leaves no process of the run alive a second later (ranks, forkserver, resource tracker), and
when one rank is killed that rank is the one named."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.runtime.conftest import TINY

pytestmark = [pytest.mark.slow, pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")]


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of `pid`, or None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return fields[0], int(fields[1])


def descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := _stat(int(entry))) is not None:
            children.setdefault(st[1], []).append(int(entry))
    found, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def alive(pid: int) -> bool:
    st = _stat(pid)
    return st is not None and st[0] not in ("Z", "X")  # a zombie has exited; only its parent has not reaped it


def rank_of(pid: int) -> int | None:
    """The rank a process runs, from where its stdout goes (the launcher points it at rank<R>.log)."""
    try:
        name = os.path.basename(os.readlink(f"/proc/{pid}/fd/1"))
    except OSError:
        return None
    return int(name[4:-4]) if name.startswith("rank") and name.endswith(".log") else None


def start_run(tmp_path: Path, ranks: int = 2) -> tuple[subprocess.Popen, Path]:
    model = tmp_path / "model.yaml"
    model.write_text("\n".join(f"{k}: {v}" for k, v in TINY.items()))
    out = tmp_path / "trace"
    proc = subprocess.Popen([sys.executable, "-m", "runtime", "--model", str(model), "--stage", "1", "--ranks",
                             str(ranks), "--steps", "100000", "--device", "cpu", "-o", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 120
    while not all((out / f"rank{r}.trace.json").exists() for r in range(ranks)):  # every rank trains
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the ranks never started"
        time.sleep(0.1)
    return proc, out


def survivors(pids: set[int], within_s: float = 1.0) -> set[int]:
    deadline = time.monotonic() + within_s
    while (left := {p for p in pids if alive(p)}) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_no_process_of_the_run_survives_the_launcher(tmp_path, sig):
    proc, _ = start_run(tmp_path)
    family = descendants(proc.pid)
    ranks = {p for p in family if rank_of(p) is not None}
    assert len(ranks) == 2 and len(family) >= 3  # the ranks, the forkserver (and the resource tracker)
    os.kill(proc.pid, sig)
    proc.wait(timeout=30)
    assert survivors(family | {proc.pid}) == set()
    if sig == signal.SIGTERM:
        err = proc.stderr.read()
        assert "stopped by SIGTERM" in err and "Traceback" not in err
    proc.stdout.close()
    proc.stderr.close()


def test_the_killed_rank_is_the_one_named(tmp_path):
    proc, out = start_run(tmp_path, ranks=3)
    family = descendants(proc.pid)
    victim = next(p for p in family if rank_of(p) == 1)
    os.kill(victim, signal.SIGKILL)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert "rank 1 failed: killed by signal SIGKILL" in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) <= 2
    assert survivors(family) == set()


def test_an_earlier_run_is_not_replaced_without_force(tmp_path):
    from zsim.runtime.launch import prepare_out_dir
    from zsim.errors import ConfigError

    out = tmp_path / "run"
    out.mkdir()
    (out / "rank0.trace.json").write_text("{}")
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="--force"):
        prepare_out_dir(out, force=False)
    assert (out / "rank0.trace.json").exists()
    prepare_out_dir(out, force=True)
    assert not (out / "rank0.trace.json").exists() and (out / "notes.txt").read_text() == "mine"
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="is a file"):
        prepare_out_dir(tmp_path / "file", force=True)
