"""`zsim validate scale` (zsim.validate.scale): the declared published runs, judged on their held-out half,
and a suite that can fail."""

import pytest
import yaml

from zsim.cli import main
from zsim.validate.scale import Residual, _trend, default_suite, load_suite, run


def test_the_declared_suite_covers_what_issue_25_asks():
    """At least 16 points from at least 4 clusters, V100 and A100/H100, ZeRO-2/3 and tensor parallelism
    across nodes, both halves, and a held-out series at a fixed global batch over rising GPU counts."""
    points, series = load_suite(default_suite())
    data = yaml.safe_load(default_suite().read_text())
    assert len(points) >= 16 and len({p.cluster for p in points}) >= 4
    gpus = {data["clusters"][p.cluster]["gpu"].split("-")[0] for p in points}
    assert {"V100", "A100", "H100"} <= gpus
    frameworks = " ".join(p.framework for p in points)
    assert "ZeRO-3" in frameworks and "ZeRO-2" in frameworks and "across nodes" in frameworks
    assert {p.half for p in points} == {"calibration", "held_out"}
    assert all(p.quote for p in points) and all("source" in raw for raw in data["points"])
    fixed = [s for s in series if "fixed global batch" in s["name"]]
    by_id = {p.id: p for p in points}
    assert any(all(by_id[i].half == "held_out" for i in s["points"]) for s in fixed)


def _suite_with(tmp_path, tokens_per_s: float):
    """A one-point suite: the MosaicML H100 13B run on 16 GPUs (0.2 s to simulate), with its published
    throughput replaced."""
    data = yaml.safe_load(default_suite().read_text())
    point = next(p for p in data["points"] if p["id"] == "h100-13b-16")
    point["published"]["tokens_per_s"] = tokens_per_s
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump({"points": [point]}))
    return path


def test_a_point_zsim_misses_fails_the_suite_and_exits_1(tmp_path):
    # ten times the published throughput: zsim's step is several times the implied one
    path = _suite_with(tmp_path, 762800.0)
    report = run(suite_file=path)
    (point,) = report.points
    assert point.judged and point.error > 0.35 and not point.passed and not report.passed
    assert main(["validate", "scale", "--suite-file", str(path)]) == 1


def test_each_point_runs_the_framework_its_source_ran():
    """Narayanan et al.'s ZeRO-3 rows (Selene) ran DeepSpeed's stage 3 of March-April 2021 and BigScience's
    Jean Zay rows DeepSpeed 0.3.17 (their log): they declare `deepspeed-0.5`; the FSDP runs keep the paper
    plan (FSDP is not DeepSpeed)."""
    points, _ = load_suite(default_suite())
    for p in points:
        implementation = ((p.scenario or {}).get("zero") or {}).get("implementation", "paper")
        if p.cluster in ("selene-a100", "jean-zay-v100"):  # DeepSpeed of 2021: v0.3.12-14 and v0.3.17
            assert implementation == "deepspeed-0.5", p.id
        elif "FSDP" in p.framework:
            assert implementation == "paper", p.id


def test_a_calibration_point_is_printed_not_judged(tmp_path):
    path = _suite_with(tmp_path, 762800.0)
    data = yaml.safe_load(path.read_text())
    data["points"][0]["half"] = "calibration"
    data["points"].append({**data["points"][0], "id": "copy", "half": "held_out"})
    data["points"][1]["published"] = {"tokens_per_s": 1.0, "tokens_per_step": 1.0}
    path.write_text(yaml.safe_dump(data))
    report = run(suite_file=path)
    held, calibration = sorted(report.points, key=lambda p: p.name == "h100-13b-16")
    assert not calibration.judged and not calibration.passed
    assert held.judged and "miss" in report.table() and "not judged" in report.table()


def test_a_series_trend_is_judged_on_sign_and_ratio():
    def r(i, sim, pub):
        return Residual(i, "held_out", None, sim, pub, True, "")

    # published step falls to 0.82x; zsim's to 0.27x: right sign, ratio 67% off
    assert not _trend("s", [r("a", 52.0, 81.6), r("b", 14.0, 66.7)], True).passed
    assert _trend("s", [r("a", 50.0, 80.0), r("b", 42.0, 66.0)], True).passed
    assert not _trend("s", [r("a", 50.0, 80.0), r("b", 55.0, 66.0)], True).passed  # wrong sign
    unjudged = _trend("s", [r("a", 52.0, 81.6), r("b", 14.0, 66.7)], False)
    assert not unjudged.passed and not unjudged.judged


@pytest.mark.parametrize("edit, where", [
    (lambda p: p.pop("half"), "points[0]"),
    (lambda p: p.update(half="maybe"), "points[0].half"),
    (lambda p: p.update(published={"tflops_per_gpu": 1}), "points[0].published"),
])
def test_a_malformed_suite_is_refused_naming_file_and_key(tmp_path, capsys, edit, where):
    path = _suite_with(tmp_path, 76280.0)
    data = yaml.safe_load(path.read_text())
    edit(data["points"][0])
    path.write_text(yaml.safe_dump(data))
    assert main(["validate", "scale", "--suite-file", str(path)]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and where in err


def test_set_overrides_every_point_and_names_itself(tmp_path, capsys):
    """`zsim validate scale --set K=V`: each point's scenario run with the override (here SM contention, which
    lengthens this FSDP run's step), the report's command naming it; a key no scenario knows is refused on the
    first point before anything runs (exit 2, the --set named)."""
    path = _suite_with(tmp_path, 76280.0)
    plain = run(suite_file=path)
    contended = run(suite_file=path, overrides=("fabric.sm_contention=true",))
    assert contended.points[0].simulated > plain.points[0].simulated
    assert contended.title == "zsim validate scale --set fabric.sm_contention=true"
    assert contended.as_dict()["overrides"] == ["fabric.sm_contention=true"]
    assert main(["validate", "scale", "--suite-file", str(path), "--set", "fabric.sm_contentio=true"]) == 2
    err = capsys.readouterr().err
    assert "--set 'fabric.sm_contentio=true'" in err and "unknown key" in err
    assert main(["validate", "modern", "-o", str(tmp_path)]) == 2


def test_an_override_a_point_refuses_is_that_points_miss_not_the_suites_end(tmp_path):
    """A `--set` the schema accepts but a point's own checks refuse (TP overlap on a run without TP) leaves that
    point without a simulated step, its reason in the note, and the suite judged (exit 1), not stopped (exit 2)."""
    path = _suite_with(tmp_path, 76280.0)
    report = run(suite_file=path, overrides=("parallel.tp_comm_overlap=true",))
    (point,) = report.points
    assert point.simulated is None and "parallel.tp_comm_overlap" in point.note and not report.passed
    assert main(["validate", "scale", "--suite-file", str(path), "--set", "parallel.tp_comm_overlap=true"]) == 1


def test_a_point_whose_scenario_zsim_refuses_is_a_miss_with_the_reason(tmp_path):
    """An inline scenario the loader refuses (DP × MP not the cluster's GPUs) leaves the point without a step, the
    refusal naming the suite file, point and key in its note: the suite is judged, it does not crash."""
    data = yaml.safe_load(default_suite().read_text())
    point = next(p for p in data["points"] if p["id"] == "h100-13b-16")
    point["scenario"]["parallel"] = {"dp": 7, "mp": 1}
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump({"points": [point]}))
    (result,) = run(suite_file=path).points
    assert result.simulated is None and "parallel.dp" in result.note and "h100-13b-16" in result.note


def test_an_inline_from_hf_is_found_under_the_shipped_scenarios_from_any_folder(tmp_path, monkeypatch):
    """`model.from_hf: hf/NAME.json` in a suite point is a shipped config, whatever the working folder."""
    from zsim.validate.modern import default_suite as modern_suite
    from zsim.validate.scale import _scenario

    monkeypatch.chdir(tmp_path)
    points, _ = load_suite(modern_suite())
    point = next(p for p in points if p.scenario and "from_hf" in p.scenario.get("model", {}))
    assert _scenario(point, modern_suite()).model.layers > 0
