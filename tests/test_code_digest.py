"""A sweep point's cache key carries a digest of zsim's source (zsim.sweep.code_digest): a row cached by other
code, even of the same version string, is not reused."""

import shutil

from zsim.sweep.code_digest import PACKAGE, code_digest


def test_the_digest_follows_every_source_file(tmp_path):
    copy = tmp_path / "zsim"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert code_digest(copy) == code_digest(PACKAGE)  # the same bytes at another place
    (copy / "fabric" / "nccl.py").write_text((copy / "fabric" / "nccl.py").read_text() + "\n# a comment\n")
    edited = code_digest.__wrapped__(copy)
    assert edited != code_digest(PACKAGE) and len(edited) == 64
    (copy / "fabric" / "nccl.py").rename(copy / "fabric" / "nccl2.py")  # a renamed file is other code too
    assert code_digest.__wrapped__(copy) not in (edited, code_digest(PACKAGE))


def test_the_point_key_changes_with_the_code(monkeypatch):
    from tests.conftest import small_dict
    from zsim.config.schema import ScenarioFile
    from zsim.config.validation import validate
    from zsim.scenario.scenario import build_scenario
    from zsim.sweep import points

    data = small_dict()
    scenario, spec = build_scenario(data, source="<t>"), validate(ScenarioFile, data, "<t>")
    key = points.point_key(scenario, spec, 32 << 30)
    assert key == points.point_key(scenario, spec, 32 << 30)
    monkeypatch.setattr(points, "code_digest", lambda: "0" * 64)  # the same scenario under other code
    assert points.point_key(scenario, spec, 32 << 30) != key
