"""docs/api.md's examples run, from the repository root, and print what the page says (doctest)."""

import doctest
import os

from tests.conftest import ROOT


def test_api_page_examples(monkeypatch):
    monkeypatch.chdir(ROOT)
    failures, tried = doctest.testfile(str(ROOT / "docs" / "api.md"), module_relative=False,
                                       optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert tried > 10 and failures == 0


def test_api_module_docstring_names_real_functions():
    from zsim import api

    for name in api.__all__:
        assert hasattr(api, name), name
    assert os.path.isfile(ROOT / "scenarios/whatif/stage-vs-dp-7.5B.yaml")  # the docstring's example file
