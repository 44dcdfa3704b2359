"""pytest-xdist's workers must collect the same test ids, or `make test` stops with "Different tests
were collected between gw0 and gw1" (it did, now and then: an id held a gzip header, which carries the
time). Ids must not depend on the clock or on Python's per-process string hashing."""

import os
import subprocess
import sys
import time

from tests.conftest import ROOT


def _ids(hash_seed: str) -> list[str]:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-o", "addopts=",
                           "-p", "no:warnings", "-p", "no:cacheprovider", "tests"],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return [line for line in proc.stdout.splitlines() if "::" in line]


def test_test_ids_are_the_same_in_every_worker():
    first = _ids("1")
    time.sleep(1.1)  # a second later: an id holding a timestamp would differ
    second = _ids("2")
    assert len(first) > 1000
    assert first == second, sorted(set(first) ^ set(second))[:10]
