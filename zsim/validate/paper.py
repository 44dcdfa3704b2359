"""The ZeRO paper's evaluation (Rajbhandari et al., SC'20) as a suite that can fail: Figure 2 (ZeRO-100B
and the Megatron-LM baseline on 400 V100), Figure 3 (superlinear scaling), Figure 6 / Table 3 (largest
model per ZeRO-R configuration), Tables 1 and 2 (model-state memory, largest model per MP degree).
The scenarios are in scenarios/paper/; docs/validation.md prints the table and discusses it.

FLOP convention. The paper's TFLOPS count the recomputed forward: 2 FLOPs per parameter per token for
each of forward, backward (×2) and recompute, 8Ψ per token with checkpointing. The evidence: the ZeRO
authors' own calculator in DeepSpeedExamples (Megatron-LM-v1.1.5-ZeRO3/megatron/utils.py,
flops_calculator, commit c859f0e4, 2021, O. Ruwase: `params · batch · seq · 2.0 · 4.0`), and Narayanan
et al. 2021 eq. 3 (96Bslh², the factor 4 "with activation recomputation"). No code of 2020 computes
FLOPs (DeepSpeedExamples' Megatron-LM of 2020 prints only step times), but Megatron-LM's own numbers
of the time pin it down: NVIDIA's 1.2B single-V100 baseline runs an iteration (batch 8 × 1024 tokens)
in 1288 ms at 62.4 TFLOPS (nv-adlr.github.io/MegatronLMV1, 2020): 80 TFLOP per iteration = 8Ψ·tokens,
not 6Ψ (60 TFLOP). Each point also notes the model-FLOP value (6Ψ per token) so both can be read.
"""

from __future__ import annotations

import math
from pathlib import Path

from zsim.validate.report import Check, Point, Report
from zsim.validate.scenario_set import ScenarioSet

GB = 1e9
# Figure 2's model sizes, ZeRO-100B and the Megatron-LM baseline alike: the paper's artifact appendix
# (SC'20 version, "Appendix: Artifact Description", Table 1) lists 20B too, which the issue's list omits.
FIG2_SIZES = ("1.5B", "8B", "20B", "40B", "60B", "80B", "100B", "120B", "140B", "170B")
FIG2_AVERAGE = ("8B", "20B", "40B", "60B", "80B", "100B")  # "8B to 100B": the paper's 15 PFLOPS average
MEGATRON_SIZES = FIG2_SIZES
FIG3_GPUS = (64, 128, 256, 400)
# §10.4 / Figure 4 (arXiv numbering): ZeRO-100B without MP on 128 GPUs, and PyTorch DDP's largest models
# (the artifact appendix's Table 6 gives their shapes and batches; scenarios/paper/fig4-*.yaml).
FIG4_ZERO = ("1.5B", "2.5B", "4B", "6B", "8B", "10B", "11B", "12B", "13B")
FIG4_DDP = ("1.16B", "1.38B")
FIG8 = ("C1", "C2", "C3", "C4", "C5")  # Figure 8 (arXiv): 60B on 128 GPUs per configuration
# Figure 6 at a fixed batch: largest model per configuration, billions (the artifact appendix, Table 3,
# gives each as a run: 40B = 50 layers, 60B = 132, 50B = 62, 140B = 175, 150B = 187).
FIG6 = {"C1": 40.0, "C2": 60.0, "C3": 50.0, "C4": 140.0, "C5": 150.0}
# Table 1: model-state memory per GPU, GB (Ψ = 7.5B, 128B, 1T; K = 12; Nd = 1 .. 1024).
TABLE1 = {
    7.5e9: {1: (120, 120, 120), 4: (52.5, 41.3, 30), 16: (35.6, 21.6, 7.5), 64: (31.4, 16.6, 1.88),
            256: (30.4, 15.4, 0.47), 1024: (30.1, 15.1, 0.12)},
    128e9: {1: (2048, 2048, 2048), 4: (896, 704, 512), 16: (608, 368, 128), 64: (536, 284, 32),
            256: (518, 263, 8), 1024: (513, 257, 2)},
    1e12: {1: (16000, 16000, 16000), 4: (7000, 5500, 4000), 16: (4750, 2875, 1000), 64: (4187, 2218, 250),
           256: (4046, 2054, 62.5), 1024: (4011, 2013, 15.6)},
}
# Table 2: largest model (billions) whose model states fit a 32 GB V100 with Nd = 64, per MP degree:
# baseline, Pos, Pos+g, Pos+g+p.
# Per run, the authors' own chart of the same runs: DeepSpeed's ZeRO-2 figure (github.com/microsoft/DeepSpeed
# @ v0.2.0, docs/assets/images/zero-full.png, "Figure 2" of docs/_tutorials/megatron.md, May 2020: "ZeRO-2
# runs 100-billion-parameter models on a 400 NVIDIA V100 GPU cluster with over 38 teraflops per GPU and
# aggregated performance over 15 petaflops", the paper's §10.2 words). ZeRO-2 there is the paper's ZeRO-100B
# (Pos+g with ZeRO-R); its panels are the paper's Figure 2 (40B to 170B), Figure 3 and §10.4's Figure 4.
# The values are read from the image: each marker's or bar top's pixel centre against the axis gridlines
# (bottom-left panel 3.74 px per TFLOPS, bottom-right 3.88, top-right 5.4), so within about ±0.3 TFLOPS.
# Scenario name -> TFLOPS/GPU. No issue names them and nothing in zsim was fitted to them.
CHART = {
    "fig2-zero-40B": 35.9, "fig2-zero-60B": 36.4, "fig2-zero-80B": 37.4, "fig2-zero-100B": 38.6,
    "fig2-zero-120B": 28.0, "fig2-zero-140B": 26.8, "fig2-zero-170B": 20.8,
    "fig3-60B-64gpu": 25.7, "fig3-60B-128gpu": 37.6, "fig3-60B-256gpu": 39.1, "fig3-60B-400gpu": 36.7,
    "fig4-zero-dp-1.5B": 40.2, "fig4-zero-dp-2.5B": 41.7, "fig4-zero-dp-4B": 43.4, "fig4-zero-dp-6B": 46.8,
    "fig4-zero-dp-8B": 46.8, "fig4-zero-dp-10B": 40.9, "fig4-zero-dp-11B": 35.4, "fig4-zero-dp-12B": 32.6,
    "fig4-zero-dp-13B": 21.0, "fig4-ddp-1.16B": 39.4, "fig4-ddp-1.38B": 18.0,
}
# The same chart's red triangles, "Baseline w. internode MP": Megatron-LM with tensor parallelism across nodes,
# per Figure 2 run (40B-170B), read from zero-full.png by the same method as CHART (bounding-box centre of
# each marker against the gridlines; the method gives CHART's ZeRO-2 values back within 0.1 TFLOPS).
CHART_MEGATRON = {
    "fig2-megatron-40B": 4.7, "fig2-megatron-60B": 6.1, "fig2-megatron-80B": 5.1, "fig2-megatron-100B": 3.6,
    "fig2-megatron-120B": 3.6, "fig2-megatron-140B": 3.7, "fig2-megatron-170B": 2.0,
}
# Values of 2-6 TFLOPS read to about ±0.3 carry ±5-15% of reading error alone; issue 25 judges these
# chart baselines at ±30% (its "How it will be judged"), so the suite holds them to that.
CHART_MEGATRON_TOLERANCE = 0.30
CHART_LABELS = {"fig2-zero-": "Fig. 2 ", "fig3-60B-": "Fig. 3 60B, ", "fig4-zero-dp-": "§10.4 ", "fig4-ddp-": "§10.4 DDP "}
TABLE2 = {1: (2, 7.6, 14.4, 128), 2: (4, 15.2, 28.8, 256), 4: (8, 30.4, 57.6, 512), 8: (16, 60.8, 115.2, 1024),
          16: (32, 121.6, 230.4, 2048)}


def scenarios_dir() -> Path:
    """The shipped scenarios/paper/ (package data zsim.scenarios: a checkout's scenarios/, or the
    installed wheel's zsim/scenarios/)."""
    from zsim.config.profiles import builtin_folder

    return builtin_folder("zsim.scenarios") / "paper"


def paper_tflops(result) -> tuple[float, float]:
    """(TFLOPS per GPU in the paper's convention, in the model-FLOP convention) of a Result: 8Ψ (6Ψ
    without checkpointing) and 6Ψ FLOPs per token, over the mean step time (module docstring)."""
    s = result.scenario
    tokens = s.model.micro_batch * s.parallel.dp * s.grad_accum * s.model.seq_len
    step = result.total_seconds / len(result.step_seconds)
    per_token = 8 if s.zero.activation_checkpointing else 6
    scale = result.workload.total_params * tokens / (step * s.layout.world) / 1e12
    return per_token * scale, 6 * scale


def _runs(sc: ScenarioSet, prefix: str, sizes, bar, rows: list[str]):
    """(size, Result) of scenarios/paper/<prefix><size>.yaml for each size that runs; one that cannot
    adds a row to `rows` saying why. Advances `bar` once a size."""
    for size in sizes:
        result, error = sc.simulate(f"{prefix}{size}")
        bar.update(1)
        if result is None:
            rows.append(f"{size}: cannot run ({error})")
            continue
        yield size, result


def _progress(total: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, disable=not enabled, desc="zsim validate paper", unit="run", leave=False)


def run(progress: bool = False, overrides: tuple[str, ...] = ()) -> Report:
    """Run every point of the suite, each scenario with `overrides` (`zsim validate --set`); see the
    module docstring.

    Raises:
        ConfigError: an override that does not apply to the scenarios (checked before anything runs).
    """
    sc = ScenarioSet.checked(scenarios_dir(), overrides, "fig2-zero-100B")
    report = Report("paper", overrides=sc.overrides)
    bar = _progress(len(FIG2_SIZES) + len(MEGATRON_SIZES) + len(FIG3_GPUS) + len(FIG4_ZERO) + len(FIG4_DDP)
                    + len(FIG6) + len(FIG8) + 3, progress)
    runs: dict[str, tuple[float, bool, float, float]] = {}  # name -> (TFLOPS/GPU, fits, reserved peak, capacity GB)
    try:
        zero = _figure2(sc, report, bar, runs)
        _megatron(sc, report, bar, zero, runs)
        _megatron_single_gpu(sc, report, bar)
        _figure3(sc, report, bar, runs)
        _figure4(sc, report, bar, runs)
        _chart(report, runs)
        _figure6(sc, report, bar)
        _figure8(sc, report, bar)
        _tables(report)
        bar.update(1)
    finally:
        bar.close()
    report.notes.append("TFLOPS are the paper's convention: 8Ψ FLOPs per token with checkpointing (recompute "
                        "counted), as Megatron-LM's and the ZeRO authors' own figures count them; the model-FLOP "
                        "value (6Ψ) is printed beside each Figure 2 run (docs/validation.md).")
    return report


def _record(runs: dict, name: str, result, tflops: float) -> None:
    runs[name] = (tflops, result.fits, result.ledger.peak_reserved / GB, result.ledger.capacity / GB)


def _figure2(sc: ScenarioSet, report: Report, bar, runs: dict) -> dict[str, float]:
    """ZeRO-100B on 400 V100: every configuration fits; 100B at 38 TFLOPS/GPU; 8B-100B average 15 PFLOPS."""
    group = "Figure 2 — ZeRO-100B on 400 V100"
    tflops: dict[str, float] = {}
    rows = []
    for size in FIG2_SIZES:
        result, error = sc.simulate(f"fig2-zero-{size}")
        bar.update(1)
        if result is None:
            rows.append(f"{size}: cannot run ({error})")
            report.checks.append(Check(group, f"{size} runs", False, error))
            continue
        paper, model = paper_tflops(result)
        tflops[size] = paper
        _record(runs, f"fig2-zero-{size}", result, paper)
        rows.append(f"{size}: {'fits' if result.fits else 'OOM'}, {paper:.1f} TFLOPS/GPU ({model:.1f} model-FLOP), "
                    f"reserved peak {result.ledger.peak_reserved / GB:.1f} GB")
        if size == "100B":
            report.points.append(Point(group, "100B TFLOPS/GPU", paper, 38.0, "TFLOPS", 0.15, fits=result.fits,
                                       note=f"model-FLOP convention: {model:.1f}; paper §10.2 'over 38'"))
        if not result.fits:
            tflops.pop(size)
    fits = [s for s in FIG2_SIZES if s in tflops]
    report.checks.append(Check(group, "every configuration fits in 32 GB (170B included)", len(fits) == len(FIG2_SIZES),
                               "; ".join(rows)))
    avg = [tflops[s] for s in FIG2_AVERAGE if s in tflops]
    if len(avg) == len(FIG2_AVERAGE):
        pflops = sum(avg) / len(avg) * 400 / 1000
        report.points.append(Point(group, "8B–100B average PFLOPS (400 GPUs)", pflops, 15.0, "PFLOPS", 0.15, fits=True,
                                   note="mean of 8B, 40B, 60B, 80B, 100B; paper §10.2 '15 PetaFlops'"))
    else:
        report.points.append(Point(group, "8B–100B average PFLOPS (400 GPUs)", None, 15.0, "PFLOPS", 0.15))
    return tflops


def _megatron(sc: ScenarioSet, report: Report, bar, zero: dict[str, float], runs: dict) -> None:
    """The Megatron-LM baseline falls off steeply once MP leaves a node; ZeRO-100B is several times
    faster from 40B up (paper §10.2: up to 10x)."""
    group = "Figure 2 — Megatron-LM baseline"
    base: dict[str, tuple[float, int, bool]] = {}
    rows: list[str] = []
    for size, result in _runs(sc, "fig2-megatron-", MEGATRON_SIZES, bar, rows):
        paper, _ = paper_tflops(result)
        _record(runs, f"fig2-megatron-{size}", result, paper)
        base[size] = (paper, result.scenario.layout.mp, result.fits)
        rows.append(f"{size}: MP {result.scenario.layout.mp}, {'fits' if result.fits else 'OOM'}, {paper:.1f} TFLOPS/GPU")
    detail = "; ".join(rows)
    inside = [v for v, mp, ok in base.values() if mp <= 16 and ok]
    across = [v for v, mp, ok in base.values() if mp > 16 and ok]
    steep = bool(inside and across) and max(across) < 0.5 * max(inside)
    report.checks.append(Check(group, "throughput falls off steeply once MP spans nodes (< half the best "
                                      "single-node run)", steep, detail))
    large = [s for s in FIG2_SIZES[FIG2_SIZES.index("40B"):] if s in zero and s in base]
    ratios = {s: zero[s] / base[s][0] for s in large if base[s][2]}
    oom = [s for s in large if not base[s][2]]  # the baseline does not fit at all: ZeRO wins outright
    several = bool(ratios) and min(ratios.values()) >= 3.0
    detail = ", ".join(f"{s} {r:.1f}x" for s, r in ratios.items()) or "no baseline run fits"
    if oom:
        detail += "; the baseline runs out of memory at " + ", ".join(oom)
    report.checks.append(Check(group, "ZeRO-100B is several (>= 3x) times faster from 40B up", several, detail))
    both = {s: zero[s] / base[s][0] for s in FIG2_SIZES if s in zero and s in base and base[s][2]}
    best = max(both, key=both.get) if both else None
    report.points.append(Point("Figure 2 — ZeRO-100B against the Megatron-LM baseline", "largest speedup over the "
                               "baseline", both[best] if best else None, 10.0, "x", 0.15, fits=True if best else None,
                               note=f"at {best}; paper §10.2 'up to 10x speedup over baseline'" if best else ""))


def _megatron_single_gpu(sc: ScenarioSet, report: Report, bar) -> None:
    """Megatron-LM's 1.2B on one V100 at 39 TFLOPS (Shoeybi et al. 2019, §5.1): the compute model alone,
    no communication, in the same convention (scenarios/paper/megatron-1.2B-1gpu.yaml says why)."""
    result, error = sc.simulate("megatron-1.2B-1gpu")
    bar.update(1)
    paper, model = paper_tflops(result) if result is not None else (None, None)
    report.points.append(Point("Megatron-LM 2019 — 1.2B on one V100 (not ZeRO)", "1.2B TFLOPS/GPU", paper, 39.0,
                               "TFLOPS", 0.15, fits=None if result is None else result.fits,
                               note=error or f"model-FLOP convention: {model:.1f}; Shoeybi et al. 2019 §5.1"))


def _figure3(sc: ScenarioSet, report: Report, bar, runs: dict) -> None:
    """60B on 64/128/256/400 GPUs: per-GPU throughput rises with the GPU count (superlinear scaling)."""
    group = "Figure 3 — 60B, superlinear scaling"
    values = []
    for gpus in FIG3_GPUS:
        result, error = sc.simulate(f"fig3-60B-{gpus}gpu")
        bar.update(1)
        values.append(None if result is None or not result.fits else paper_tflops(result)[0])
        if result is not None:
            _record(runs, f"fig3-60B-{gpus}gpu", result, paper_tflops(result)[0])
    ok = all(v is not None for v in values) and all(b > a for a, b in zip(values, values[1:]))
    detail = ", ".join(f"{g} GPUs: {'—' if v is None else f'{v:.1f}'}" for g, v in zip(FIG3_GPUS, values))
    chart = [CHART[f"fig3-60B-{g}gpu"] for g in FIG3_GPUS]
    falls = [f"{a} to {b}" for a, b, x, y in zip(FIG3_GPUS, FIG3_GPUS[1:], chart, chart[1:]) if y <= x]
    report.checks.append(Check(group, "TFLOPS per GPU rise with every step in GPU count", ok,
                               f"{detail} TFLOPS/GPU; the authors' chart (DeepSpeed's ZeRO-2 figure): "
                               + ", ".join(f"{v:.1f}" for v in chart)
                               + (f", which itself does not rise from {' or '.join(falls)} GPUs" if falls else "")))


def _figure4(sc: ScenarioSet, report: Report, bar, runs: dict) -> None:
    """§10.4: without MP on 128 GPUs, ZeRO-100B trains up to 13B "achieving throughput over 40 TFlops per
    GPU on average"; "without ZeRO, the largest trainable model with DP alone has 1.4B parameters with
    throughput less than 20 TFlops per GPU" (PyTorch DDP)."""
    group = "Figure 4 / §10.4 — data parallelism alone on 128 V100"
    zero: dict[str, tuple[float, bool]] = {}
    rows: list[str] = []
    for size, result in _runs(sc, "fig4-zero-dp-", FIG4_ZERO, bar, rows):
        zero[size] = (paper_tflops(result)[0], result.fits)
        _record(runs, f"fig4-zero-dp-{size}", result, zero[size][0])
        rows.append(f"{size}: {'fits' if result.fits else 'OOM'}, {zero[size][0]:.1f} TFLOPS/GPU, reserved peak "
                    f"{result.ledger.peak_reserved / GB:.1f} GB")
    fit = [s for s, (_, ok) in zero.items() if ok]
    report.checks.append(Check(group, "ZeRO-100B fits every model up to 13B without MP", len(fit) == len(FIG4_ZERO),
                               "; ".join(rows)))
    mean = sum(v for v, _ in zero.values()) / len(zero) if len(fit) == len(FIG4_ZERO) else None
    report.points.append(Point(group, "ZeRO 1.5B–13B average TFLOPS/GPU", mean, 40.0, "TFLOPS", 0.15,
                               fits=None if mean is None else True,
                               note="mean of the nine runs; §10.4 'over 40 TFlops per GPU on average'"))
    rows, largest = [], None
    for size, result in _runs(sc, "fig4-ddp-", FIG4_DDP, bar, rows):
        tflops = paper_tflops(result)[0]
        _record(runs, f"fig4-ddp-{size}", result, tflops)
        rows.append(f"{size}: {'fits' if result.fits else 'OOM'}, batch {result.scenario.model.micro_batch}, "
                    f"{tflops:.1f} TFLOPS/GPU")
        if size == FIG4_DDP[-1]:
            largest = (result.fits, tflops)
    report.checks.append(Check(group, "PyTorch DDP's largest model, 1.4B, fits and runs under 20 TFLOPS/GPU",
                               largest is not None and largest[0] and largest[1] < 20.0, "; ".join(rows)))


def _chart(report: Report, runs: dict) -> None:
    """Every run of the authors' chart (CHART) against its value there, ±15% as the paper's throughput
    points; the note gives the run's simulated reserved peak (docs/validation.md relates the two)."""
    group = "Per run — the authors' chart (DeepSpeed v0.2 docs, zero-full.png)"
    for name, published in CHART.items():
        prefix = next(p for p in CHART_LABELS if name.startswith(p))
        label = CHART_LABELS[prefix] + name.removeprefix(prefix).replace("gpu", " GPUs")
        tflops, fits, reserved, capacity = runs.get(name, (None, None, None, None))
        report.points.append(Point(group, f"{label} TFLOPS/GPU", tflops, published, "TFLOPS", 0.15, fits=fits,
                                   note="cannot run" if tflops is None else f"reserved peak {reserved:.1f} GB of "
                                   f"{capacity:.1f}; read from the chart, ±0.3 TFLOPS"))
    group = "Per run — the chart's Megatron-LM baselines, tensor parallelism across nodes (zero-full.png)"
    for name, published in CHART_MEGATRON.items():
        tflops, fits, reserved, capacity = runs.get(name, (None, None, None, None))
        report.points.append(Point(group, f"Fig. 2 Megatron-LM {name.removeprefix('fig2-megatron-')} TFLOPS/GPU",
                                   tflops, published, "TFLOPS", CHART_MEGATRON_TOLERANCE, fits=fits,
                                   note="cannot run" if tflops is None else "red triangle 'Baseline w. internode MP', "
                                   "read from the chart, ±0.3 TFLOPS"))


def _figure6(sc: ScenarioSet, report: Report, bar) -> None:
    """C1-C5 at a fixed batch: largest model within 20% of the paper's, in the paper's order."""
    from zsim.commands.maxsize import max_layers
    from zsim.errors import ZsimError

    group = "Figure 6 / Table 3 — largest model, C1–C5"
    sizes: dict[str, float] = {}
    for c, published in FIG6.items():
        try:
            best = max_layers(sc.mapping(f"{c}-*"), limit=1024)
            sizes[c] = best.params / 1e9
            value = sizes[c]
        except ZsimError:
            value = None
        bar.update(1)
        report.points.append(Point(group, f"{c} largest model", value, published, "B params", 0.20, fits=True,
                                   note="zsim maxsize --scenario (allocator included)"))
    paper_order = sorted(FIG6, key=FIG6.get)
    ours = sorted(sizes, key=sizes.get)
    # strictly: a tie is not the paper's order (sorting would keep the tied pair in the paper's order)
    ordered = len(sizes) == len(FIG6) and all(sizes[a] < sizes[b] for a, b in zip(paper_order, paper_order[1:]))
    report.checks.append(Check(group, "largest models in the paper's order " + " < ".join(paper_order), ordered,
                               "zsim: " + ", ".join(f"{c} {sizes[c]:.1f}B" for c in ours)))


def _figure8(sc: ScenarioSet, report: Report, bar) -> None:
    """§10.5 and Figure 8: "performance improvement corresponds to decrease in memory consumption between
    the optimizations" (C1 < C2 < C3 < C4 at the batch each allows), "the performance drop between C4 and
    C5 for 60B" (Pa+cpu's copies at the same batch), and "Pa+cpu is needed for 170B model to execute
    without running out of memory"."""
    group = "Figure 8 — throughput per configuration"
    tflops: dict[str, float] = {}
    rows: list[str] = []
    for c, result in _runs(sc, "fig8-60B-128gpu-", FIG8, bar, rows):
        if result.fits:
            tflops[c] = paper_tflops(result)[0]
        rows.append(f"{c}: batch {result.scenario.model.micro_batch}, {'fits' if result.fits else 'OOM'}, "
                    f"{paper_tflops(result)[0]:.1f} TFLOPS/GPU")
    ran = len(tflops) == len(FIG8)
    rising = ran and tflops["C1"] < tflops["C2"] < tflops["C3"] < tflops["C4"]
    report.checks.append(Check(group, "60B on 128 GPUs: C1 < C2 < C3 < C4 per GPU, each at the batch it allows",
                               rising, "; ".join(rows)))
    report.checks.append(Check(group, "60B on 128 GPUs: C5 is slower than C4 at the same batch (Pa+cpu's copies)",
                               ran and tflops["C5"] < tflops["C4"],
                               "; ".join(r for r in rows if r.startswith(("C4", "C5")))))
    result, error = sc.simulate("fig8-170B-400gpu-C4")
    bar.update(1)
    detail = error or (f"zsim: {'fits' if result.fits else 'runs out of memory'} without Pa+cpu, reserved peak "
                       f"{result.ledger.peak_reserved / GB:.1f} GB")
    report.checks.append(Check(group, "170B at batch 12 runs out of memory without Pa+cpu",
                               result is not None and not result.fits, detail))


def _tables(report: Report) -> None:
    """Tables 1 and 2 to the paper's printed precision (it truncates whole numbers: 4187.5 → 4187)."""
    from zsim.commands.maxsize import max_params_model_states
    from zsim.zero.model_states import model_states

    names = ("Pos", "Pos+g", "Pos+g+p")
    for psi, rows in TABLE1.items():
        label = f"{psi / 1e9:g}B" if psi < 1e12 else "1T"
        for nd, published in rows.items():
            for stage, pub in zip((1, 2, 3), published):
                value = model_states(int(psi), nd, stage).total / GB
                report.points.append(Point(f"Table 1 — model states per GPU, Ψ = {label}", f"Nd {nd} {names[stage - 1]}",
                                           value, pub, "GB", _precision(pub), absolute=True))
    for mp, published in TABLE2.items():
        for stage, pub in zip(range(4), published):
            # The paper's rows are its MP 1 value, printed to 0.1B, times MP (121.6 = 16 × 7.6).
            one = max_params_model_states(32 * 10**9, 64, 1, stage) / 1e9
            value = mp * math.floor(one * 10 + 1e-9) / 10
            column = ("baseline", *names)[stage]
            report.points.append(Point("Table 2 — largest model, 32 GB V100, Nd = 64", f"MP {mp} {column}",
                                       value, pub, "B params", _precision(pub), absolute=True))


def _precision(published: float) -> float:
    """One unit of the last digit the paper printed (its whole numbers are truncated, its decimals
    rounded: a difference below one unit is the printing, not the model)."""
    text = f"{published:g}"
    decimals = len(text.split(".")[1]) if "." in text else 0
    return 10.0 ** -decimals
