"""Golden key numbers of the flagship scenarios (regenerate deliberately: python -m tests.golden.regenerate)."""

import json
from pathlib import Path

import pytest

from tests.golden.regenerate import GOLDEN, compute


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_key_numbers_unchanged(name):
    golden = json.loads((Path(__file__).parent / "golden" / f"{name}.json").read_text())
    got = compute(name)
    assert got.keys() == golden.keys()
    for key, want in golden.items():
        if isinstance(want, float) or (isinstance(want, list) and want and isinstance(want[0], float)):
            assert got[key] == pytest.approx(want, rel=1e-9), key
        else:
            assert got[key] == want, key  # integers (bytes, parameters) are exact
