"""`zsim validate`: the report's pass/fail logic, the FLOP convention, and the paper suite end to end."""

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT, small_scenario
from zsim.engine.simulation import simulate
from zsim.validate.paper import _precision, paper_tflops
from zsim.validate.report import Check, Point, Report


def test_points_pass_within_their_tolerance_only():
    assert Point("g", "p", 43.6, 38.0, "TFLOPS", 0.15).passed
    assert not Point("g", "p", 43.8, 38.0, "TFLOPS", 0.15).passed
    assert not Point("g", "p", 38.0, 38.0, "TFLOPS", 0.15, fits=False).passed  # OOM never passes
    assert not Point("g", "p", None, 38.0, "TFLOPS", 0.15).passed
    assert Point("t", "p", 4187.5, 4187, "GB", 1, absolute=True).passed
    assert not Point("t", "p", 122.3, 121.6, "B", 0.1, absolute=True).passed
    r = Report("x", points=[Point("g", "p", 1.0, 1.0, "u", 0.1)], checks=[Check("g", "c", False, "d")])
    assert not r.passed and "FAIL" in r.table() and r.as_dict()["passed"] is False


def test_printed_precision():
    assert _precision(1.88) == pytest.approx(0.01) and _precision(4187) == 1 and _precision(62.5) == pytest.approx(0.1)


def test_paper_convention_counts_recompute():
    """8Ψ per token with checkpointing, 6Ψ without; the model-FLOP value is always 6Ψ."""
    for ckpt, per_token in ((True, 8), (False, 6)):
        r = simulate(small_scenario(zero={"stage": 2, "activation_checkpointing": ckpt}))
        s = r.scenario
        tokens = s.model.micro_batch * s.layout.dp * s.grad_accum * s.model.seq_len
        expect = r.workload.total_params * tokens / (r.total_seconds * s.layout.world) / 1e12
        paper, model = paper_tflops(r)
        assert paper == pytest.approx(per_token * expect) and model == pytest.approx(6 * expect)


def _validate(suite: str):
    """`zsim validate SUITE --json -` in a subprocess: (the process, the JSON report)."""
    proc = subprocess.run([sys.executable, "-m", "zsim.cli", "validate", suite, "--json", "-"], cwd=ROOT,
                          capture_output=True, text=True, timeout=900)
    return proc, json.loads(proc.stdout)


@pytest.fixture(scope="module")
def paper_run():
    return _validate("paper")


def test_validate_paper_exit_code_follows_the_report(paper_run):
    proc, report = paper_run
    assert proc.returncode == (0 if report["passed"] else 1), proc.stderr[-2000:]
    assert "zsim validate paper" in proc.stderr  # the table goes to stderr when JSON goes to stdout
    failed = [p for p in report["points"] if not p["passed"]] + [c for c in report["checks"] if not c["passed"]]
    assert report["passed"] == (not failed)
    groups = {p["group"].split(" — ")[0] for p in report["points"]} | {c["group"].split(" — ")[0] for c in report["checks"]}
    assert {"Figure 2", "Figure 3", "Figure 4 / §10.4", "Figure 6 / Table 3", "Figure 8", "Table 1",
            "Table 2"} <= groups


def test_validate_paper_reproduces_what_the_model_gets_right(paper_run):
    """Tables 1 and 2 to the paper's printed digit; every Figure 2 configuration fits (170B too);
    C1-C5 in the paper's order; the Megatron baseline falls off once MP leaves a node."""
    _, report = paper_run
    tables = [p for p in report["points"] if p["group"].startswith("Table")]
    assert len(tables) == 3 * 6 * 3 + 5 * 4 and all(p["passed"] for p in tables)
    checks = {c["claim"]: c for c in report["checks"]}
    assert checks["every configuration fits in 32 GB (170B included)"]["passed"]
    assert next(c for k, c in checks.items() if k.startswith("largest models in the paper's order"))["passed"]
    assert next(c for k, c in checks.items() if k.startswith("throughput falls off steeply"))["passed"]
    # §10.4: up to 13B without MP fits; PyTorch DDP's largest (1.38B, batch 1) fits under 20 TFLOPS/GPU
    assert checks["ZeRO-100B fits every model up to 13B without MP"]["passed"]
    assert next(c for k, c in checks.items() if k.startswith("PyTorch DDP's largest model"))["passed"]
    # Figure 8: throughput follows the batch each configuration allows; Pa+cpu's copies cost C5 time
    assert next(c for k, c in checks.items() if k.startswith("60B on 128 GPUs: C1 < C2"))["passed"]
    assert next(c for k, c in checks.items() if k.startswith("60B on 128 GPUs: C5 is slower"))["passed"]
    speedup = next(p for p in report["points"] if p["name"] == "largest speedup over the baseline")
    # §10.2 "up to 10x", at the largest model. Since issue 24's measured EDR terms (66% of line rate under
    # NCCL 2.8's own tuner, not the assumed 90%) the Megatron baseline's MP all-reduces across 8 nodes are
    # slower and zsim's speedup at 170B reads ~19.8x (~13.6x with the terms fitted under 2.7's formulas; 17.1x
    # with the efficiency held at 0.96; 15.6x since the tree's pipeline fill, whose refit of the EDR terms made
    # the MP all-reduces faster): outside the point's ±15%. A known miss the report states, held here so a
    # change that moves it either way is seen.
    assert "170B" in speedup["note"] and not speedup["passed"] and 14.5 < speedup["simulated"] < 17.0


def test_every_run_of_the_authors_chart_is_a_point(paper_run):
    """DeepSpeed's ZeRO-2 figure (the same runs, per run): one point per run, against its value there,
    with the run's reserved peak in the note (docs/validation.md relates the two)."""
    from zsim.validate.paper import CHART, CHART_MEGATRON, CHART_MEGATRON_TOLERANCE, scenarios_dir

    _, report = paper_run
    chart = [p for p in report["points"] if p["group"].startswith("Per run — the authors' chart")]
    assert [p["published"] for p in chart] == list(CHART.values())
    assert all((scenarios_dir() / f"{name}.yaml").is_file() for name in CHART)
    assert all(p["simulated"] is not None and "reserved peak" in p["note"] for p in chart)
    # the same chart's Megatron-LM baselines (TP across nodes), per run, at the issue's ±30%
    baselines = [p for p in report["points"] if p["group"].startswith("Per run — the chart's Megatron-LM")]
    assert [p["published"] for p in baselines] == list(CHART_MEGATRON.values())
    assert all((scenarios_dir() / f"{name}.yaml").is_file() for name in CHART_MEGATRON)
    assert all(p["simulated"] is not None and p["tolerance"] == CHART_MEGATRON_TOLERANCE for p in baselines)
    fig3 = next(c for c in report["checks"] if c["claim"].startswith("TFLOPS per GPU rise"))
    assert "25.7, 37.6, 39.1, 36.7" in fig3["detail"]  # the chart's own bars, printed beside zsim's


# The paper's artifact appendix (SC'20, "Appendix: Artifact Description"), Table 1: Figure 2's runs,
# (GPUs, MP, layers, hidden, heads, batch per GPU, total batch); Table 3: the C1-C5 shapes.
FIG2_TABLE = {
    "zero-1.5B": (400, 1, 48, 1600, 16, 24, 9600), "megatron-1.5B": (400, 2, 48, 1600, 16, 16, 3200),
    "zero-8B": (400, 4, 72, 3072, 24, 64, 6400), "megatron-8B": (400, 8, 72, 3072, 24, 8, 400),
    "zero-20B": (400, 4, 98, 4096, 32, 32, 3200), "megatron-20B": (400, 16, 98, 4096, 32, 4, 100),
    "zero-40B": (400, 4, 88, 6144, 32, 12, 1200), "megatron-40B": (384, 32, 88, 6144, 64, 4, 48),
    "zero-60B": (400, 16, 132, 6144, 32, 64, 1600), "megatron-60B": (384, 64, 132, 6144, 64, 4, 24),
    "zero-80B": (400, 16, 100, 8192, 64, 32, 800), "megatron-80B": (384, 128, 100, 8192, 128, 4, 12),
    "zero-100B": (400, 16, 125, 8192, 64, 32, 800), "megatron-100B": (384, 128, 125, 8192, 128, 2, 6),
    "zero-120B": (400, 16, 150, 8192, 64, 24, 600), "megatron-120B": (384, 128, 150, 8192, 128, 2, 6),
    "zero-140B": (400, 16, 175, 8192, 64, 16, 400), "megatron-140B": (384, 128, 175, 8192, 128, 2, 6),
    "zero-170B": (400, 16, 212, 8192, 64, 12, 300), "megatron-170B": (256, 256, 212, 8192, 256, 2, 2),
}


@pytest.mark.parametrize("run", sorted(FIG2_TABLE))
def test_figure_2_scenarios_are_the_papers_configurations(run):
    from zsim.scenario.scenario import load_scenario

    s = load_scenario(ROOT / f"scenarios/paper/fig2-{run}.yaml")
    m = s.model
    got = (s.layout.world, s.layout.mp, m.layers, m.hidden, m.heads, m.micro_batch,
           m.micro_batch * s.layout.dp * s.grad_accum)
    assert got == FIG2_TABLE[run]


@pytest.fixture(scope="module")
def megatron_run():
    return _validate("megatron")


def test_validate_megatron_compares_every_published_point(megatron_run):
    """Megatron-LM 2019's scaling study (out of sample): the 1.2B baseline, four weak-scaling runs (Figure
    5, Table 7, the abstract's 512 GPUs) against efficiency × 39 TFLOPS, and Table 8's three speedups."""
    proc, report = megatron_run
    assert proc.returncode == (0 if report["passed"] else 1), proc.stderr[-2000:]
    published = {p["name"]: p["published"] for p in report["points"]}
    assert published == {
        "1.2B, 1 GPU TFLOPS/GPU": 39.0, "8.3B, 8 GPUs TFLOPS/GPU": 30.03, "8.3B, 24 heads, 8 GPUs TFLOPS/GPU": 31.2,
        "8.3B, 16 heads, 8 GPUs TFLOPS/GPU": 31.98, "8.3B, 512 GPUs TFLOPS/GPU": 29.49,
        "speedup, 2 GPUs (MP 2)": 1.64, "speedup, 4 GPUs (MP 4)": 2.34, "speedup, 8 GPUs (MP 8)": 2.98}
    assert all(p["simulated"] is not None and p["fits"] for p in report["points"])


def test_validate_megatron_speedups_are_step_time_ratios(megatron_run):
    """A speedup is the one-GPU step over the N-GPU step of the same scenario family, and more GPUs are
    never slower for this model (the MP all-reduces are small next to the split GEMMs)."""
    from zsim.scenario.scenario import load_scenario
    from zsim.validate.megatron import scenarios_dir

    _, report = megatron_run
    speedups = [p["simulated"] for p in report["points"] if p["name"].startswith("speedup")]
    assert speedups == sorted(speedups) and speedups[0] > 1
    steps = {g: simulate(load_scenario(scenarios_dir() / f"1.2B-{g}.yaml")).total_seconds for g in ("1gpu", "mp8")}
    assert speedups[-1] == pytest.approx(steps["1gpu"] / steps["mp8"])


@pytest.mark.parametrize(("config", "shape"), [("C1", (8192, 32)), ("C2", (6144, 64)), ("C3", (8192, 32)),
                                               ("C4", (8192, 64)), ("C5", (8192, 64))])
def test_c1_to_c5_scenarios_have_the_papers_shapes(config, shape):
    """Artifact appendix, Table 3: 400 GPUs, MP 16, batch 16; C1 40B = 50 x 8192 with 32 heads, C2 60B =
    132 x 6144 with 64, C3 50B = 62 x 8192 with 32, C4 and C5 x 8192 with 64 (maxsize varies the layers)."""
    from zsim.scenario.scenario import load_scenario

    s = load_scenario(ROOT / f"scenarios/paper/{config}-100B-400gpu.yaml")
    assert (s.model.hidden, s.model.heads) == shape
    assert (s.layout.world, s.layout.mp, s.model.micro_batch, s.grad_accum) == (400, 16, 16, 1)


def test_validate_draws_its_points_as_a_chart(tmp_path, capsys):
    """--png draws every point's error against its tolerance (a real PNG), and a bad path is refused
    before the suite runs (exit 2, the flag named)."""
    from zsim.cli import main

    png = tmp_path / "megatron.png"
    code = main(["validate", "megatron", "--png", str(png)])
    assert code in (0, 1) and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert f"chart: {png}" in capsys.readouterr().err
    assert main(["validate", "megatron", "--png", str(tmp_path / "no" / "x.png")]) == 2
    assert "--png" in capsys.readouterr().err


def test_validate_set_overrides_every_run_and_says_so(megatron_run, capsys):
    """--set applies a scenario key to every run of the suite (Megatron-LM's 512-GPU point overlaps its
    DP all-reduce with backward under zero.overlap_comm=true, and gets faster), the report names it in
    its title and JSON, a key no scenario knows is refused before anything runs (exit 2, the key named),
    and replay, which records its own runs, refuses --set."""
    from zsim.cli import main

    assert main(["validate", "megatron", "--set", "zero.overlap_comm=true", "--json", "-"]) in (0, 1)
    out = capsys.readouterr()
    report = json.loads(out.out)
    assert report["overrides"] == ["zero.overlap_comm=true"]
    assert "zsim validate megatron --set zero.overlap_comm=true" in out.err
    point = "8.3B, 512 GPUs TFLOPS/GPU"
    before = next(p["simulated"] for p in megatron_run[1]["points"] if p["name"] == point)
    after = next(p["simulated"] for p in report["points"] if p["name"] == point)
    assert after > before
    assert main(["validate", "paper", "--set", "zero.bogus=1"]) == 2
    assert "zero.bogus" in capsys.readouterr().err
    assert main(["validate", "replay", "--set", "zero.stage=2"]) == 2
    assert "--set" in capsys.readouterr().err


def test_a_replay_suite_is_checked_whole_before_anything_is_recorded(tmp_path):
    """A suite naming a profile or a scenario that does not exist, or more ranks than the runtime starts,
    is an error naming the key at once, not after minutes of recording."""
    from zsim.errors import ConfigError
    from zsim.validate.replay import DEFAULT_SUITE, load_suite

    text = DEFAULT_SUITE.read_text()
    cases = {"base_profile: nope": r"base_profile: no system profile 'nope'",
             "ranks: 100000": r"ranks: must be an integer <= 1024",
             "gpt-tiny-b.yaml": r"scenario 'calibrate/gpt-tiny-c.yaml' is neither beside the suite"}
    for change, message in cases.items():
        key = change.split(":")[0]
        bad = tmp_path / "suite.yaml"
        if key == "gpt-tiny-b.yaml":
            bad.write_text(text.replace("gpt-tiny-b.yaml", "gpt-tiny-c.yaml"))
        else:
            bad.write_text("\n".join(change if line.startswith(f"{key}:") else line for line in text.splitlines()))
        with pytest.raises(ConfigError, match=message):
            load_suite(bad)
