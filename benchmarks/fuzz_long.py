"""The long fuzz run of issue 13: every target of tests/fuzz_targets.py (scenario documents, profiles,
nccl-tests tables, model files, CLI argument lists) for many random examples, plus the corpus of
tests/bad_inputs.py as real subprocesses; prints what it covered (examples, exit codes, distinct
errors, slowest example, peak memory) and every failure hypothesis found (shrunk).

    .venv/bin/python benchmarks/fuzz_long.py [--examples 500] [--targets scenario_cli,cli_arguments] [--seed N]

Exit status 1 if any target failed. Runs are capped with ZSIM_MAX_SECONDS=5 (the cost guard).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hypothesis import HealthCheck, given, seed, settings  # noqa: E402

from tests.bad_inputs import CASES  # noqa: E402
from tests.fuzz_targets import TARGETS, check  # noqa: E402


def kind(err: str) -> str:
    """The error without file names and numbers: what kind of message it was."""
    text = err.strip().splitlines()[0] if err.strip() else ""
    text = re.sub(r"/\S+", "<path>", text)
    text = re.sub(r"\d[\d.,e+-]*", "N", text)
    return text[:90]


def fuzz(name: str, examples: int, rng_seed: int) -> tuple[bool, str]:
    strategy, target = TARGETS[name]
    codes: collections.Counter = collections.Counter()
    kinds: collections.Counter = collections.Counter()
    slowest = [0.0]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)

        @seed(rng_seed)
        @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        @given(strategy)
        def run(item):
            outcome = target(item, work)
            codes[outcome.code] += 1
            kinds[kind(outcome.err)] += 1
            slowest[0] = max(slowest[0], outcome.seconds)
            check(outcome)

        try:
            run()
            ok, failure = True, ""
        except Exception as exc:  # noqa: BLE001 - a finding, reported below
            ok, failure = False, f"{type(exc).__name__}: {str(exc)[:1500]}"
    total = sum(codes.values())
    print(f"\n== {name}: {total} examples in {time.perf_counter() - started:.1f} s, slowest {slowest[0]:.2f} s; "
          f"exit codes {dict(sorted(codes.items()))}; {len(kinds)} distinct messages")
    for text, n in kinds.most_common(12):
        print(f"   {n:5d}  {text or '(ok)'}")
    if not ok:
        print(f"   FAILED: {failure}")
    return ok, failure


def corpus_subprocesses() -> bool:
    """Every corpus case as a real `zsim` process (4 GiB address-space limit): exit 2/3, <= 2 lines."""
    bad = 0
    started = time.perf_counter()
    slowest = (0.0, "")
    for name in sorted(CASES):
        with tempfile.TemporaryDirectory() as tmp:
            argv = CASES[name](Path(tmp))
            env = {**os.environ, "ZSIM_HWPROFILES": str(Path(tmp) / "hwprofiles")} if name.startswith("profile/") \
                else None
            t = time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "zsim.cli", *argv], capture_output=True, text=True,
                                  cwd=tmp, env=env, timeout=120,
                                  preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30)))
            took = time.perf_counter() - t
            slowest = max(slowest, (took, name))
            lines = proc.stderr.strip().splitlines()
            if proc.returncode not in (2, 3) or not 1 <= len(lines) <= 2 or "Traceback" in proc.stderr:
                bad += 1
                print(f"   FAILED {name}: exit {proc.returncode}: {proc.stderr[:300]!r}")
    print(f"\n== corpus as real processes: {len(CASES)} cases in {time.perf_counter() - started:.1f} s, "
          f"slowest {slowest[0]:.1f} s ({slowest[1]}), {bad} failed")
    return bad == 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=300, help="examples per target (default 300)")
    parser.add_argument("--targets", default=",".join(TARGETS), help="comma-separated targets")
    parser.add_argument("--seed", type=int, default=int(time.time()), help="random seed (printed)")
    parser.add_argument("--no-corpus", action="store_true", help="skip the corpus as real processes")
    args = parser.parse_args()
    os.environ["ZSIM_MAX_SECONDS"] = "5"
    print(f"fuzz_long: seed {args.seed}, {args.examples} examples per target")
    results = [fuzz(name, args.examples, args.seed)[0] for name in args.targets.split(",")]
    if not args.no_corpus:
        results.append(corpus_subprocesses())
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"\npeak memory of this process: {peak:.2f} GiB; {'all passed' if all(results) else 'FAILURES above'}")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
