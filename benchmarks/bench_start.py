"""Whole-process start-up and run time of the `zsim` command (issue 12: `make run` under 0.5 s).

Run: make bench   (or .venv/bin/python benchmarks/bench_start.py [--repeat N])

Each case runs N times as a fresh process, as a user runs it (the `zsim` console script of this
environment, from the repository root); the table shows the median, min and max wall time. `zsim run`
draws memory.png in a background process after the summary: the table gives both the time until
the command returns (what `make run` waits for) and the time until memory.png is complete; the
next repetition starts only after the plot is drawn, so runs do not compete for the CPU. The first
row, an empty Python start, is the floor of any command on this machine: compare ratios, since a
loaded machine (other jobs on the cores) slows every row alike. The CPU columns count only the
command's own process (not the background plot): they are what the command costs with the
machine to itself, and move much less than wall time when other jobs share the cores (make's row
counts make and the zsim it waits for). The row
"... less the simulation" is the --no-plot run less the seconds its simulation took (the `--stats`
line): what start-up, loading and writing cost (zsim.config, the CLI, the outputs), the simulation
excluded.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ZSIM = str(Path(sys.executable).with_name("zsim"))


def timed(cmd: list[str], wait_for: Path | None = None) -> tuple[float, float, float | None]:
    """(seconds until the process exits, its CPU seconds (user + system), seconds until `wait_for`
    exists, or, for a command with --stats, the seconds its simulation took, or None)."""
    if wait_for is not None:
        wait_for.unlink(missing_ok=True)
        wait_for.with_name("timeline.png").unlink(missing_ok=True)
    start = time.perf_counter()
    stats = "--stats" in cmd
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE if stats else subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    text = proc.stdout.read().decode() if stats else ""  # type: ignore[union-attr]
    _, status, usage = os.wait4(proc.pid, 0)
    exited = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} exited with {proc.returncode}")
    cpu = usage.ru_utime + usage.ru_stime
    if stats:
        found = re.search(r"in ([0-9.]+) s of simulation", text)
        if not found:
            raise RuntimeError(f"{' '.join(cmd)}: no --stats line in its output")
        return exited, cpu, float(found.group(1))
    if wait_for is None:
        return exited, cpu, None
    while not wait_for.exists():
        if time.perf_counter() - start > 120:
            raise RuntimeError(f"{wait_for} did not appear in 120 s")
        time.sleep(0.005)
    drawn = time.perf_counter() - start
    # The same background process draws timeline.png next: wait for it too, so that the next repetition
    # does not share the cores with it (it did, and every later `returns` row measured that contention).
    timeline = wait_for.with_name("timeline.png")
    while not timeline.exists() and time.perf_counter() - start < 120:
        time.sleep(0.005)
    return exited, cpu, drawn


def row(label: str, times: list[float], cpu: list[float] | None = None) -> str:
    cpu_text = f"{statistics.median(cpu):>10.3f}{min(cpu):>8.3f}" if cpu else ""
    return f"{label:<50}{statistics.median(times):>8.3f}{min(times):>8.3f}{max(times):>8.3f}{cpu_text}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=9, help="runs per case (default 9)")
    args = parser.parse_args()
    # Byte-code first, as `make` does before run and bench: where PYTHONDONTWRITEBYTECODE is set (this
    # machine), a module edited since the last compile is compiled again by every run, which put
    # ~0.1 s on each zsim row when this script was run by hand after an edit.
    subprocess.run([sys.executable, "-m", "compileall", "-q", "zsim", "runtime"], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL)
    out = Path(tempfile.mkdtemp(prefix="zsim-bench-"))
    png = out / "memory.png"
    cases = [
        ("python -c pass (interpreter start, the floor)", [sys.executable, "-c", "pass"], None),
        ("zsim --help", [ZSIM, "--help"], None),
        ("zsim run 1T-1024gpu --no-plot", [ZSIM, "run", "1T-1024gpu", "-o", str(out), "--no-plot", "--stats"], None),
        ("zsim run 1T-1024gpu (make run): returns", [ZSIM, "run", "1T-1024gpu", "-o", str(out)], png),
        ("make run (the target itself: make, then zsim run)",
         ["make", "-s", "run", f"SCENARIO=scenarios/1T-1024gpu.yaml -o {out}"], png),
        ("zsim run 1T-1024gpu --plot wait", [ZSIM, "run", "1T-1024gpu", "-o", str(out), "--plot", "wait"], None),
    ]
    print(f"whole-process wall time and the process's own CPU time (user + system), {args.repeat} runs each (s)")
    print(f"{'case':<50}{'median':>8}{'min':>8}{'max':>8}{'CPU med':>10}{'min':>8}")
    try:
        for label, cmd, wait_for in cases:
            timed(cmd, wait_for)  # warm the file cache and byte-code
            results = [timed(cmd, wait_for) for _ in range(args.repeat)]
            print(row(label, [r[0] for r in results], [r[1] for r in results]), flush=True)
            if "--stats" in cmd:
                print(row("  ... less the simulation (its --stats seconds)", [r[0] - r[2] for r in results],
                          [r[1] - r[2] for r in results]), flush=True)
            if wait_for is not None:
                print(row("  ... until memory.png is drawn (background)", [r[2] for r in results]), flush=True)
    finally:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
