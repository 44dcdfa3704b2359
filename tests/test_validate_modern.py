"""`zsim validate modern` (zsim.validate.modern): published PP / SP / selective-recompute runs, declared with
their sources and halves, run and judged as the scale suite's are."""

from __future__ import annotations

import pytest
import yaml

from zsim.cli import main
from zsim.validate import modern
from zsim.validate.scale import load_suite, published_step


def test_suite_declares_sourced_points_in_two_halves():
    points, series = load_suite(modern.default_suite())
    assert len(points) == 163
    halves = {p.half for p in points}
    assert halves == {"calibration", "held_out"}
    assert sum(p.half == "held_out" for p in points) == 89
    for p in points:
        assert p.quote and p.framework, p.id
        assert (p.scenario is not None) != (p.scenario_file is not None), p.id  # one or the other
    # every held-out series is held out whole
    by_id = {p.id: p for p in points}
    for s in series:
        assert len({by_id[i].half for i in s["points"]}) == 1, s["name"]


def test_layouts_cover_their_clusters():
    """TP × PP × DP = the GPUs of the declared nodes, and the layers divide across p·v virtual stages, or a
    stated split adds up to them (BLOOM's 5 + 6 × 10 + 5: its embeddings count as a block)."""
    from zsim.validate.scale import _scenario

    points, _ = load_suite(modern.default_suite())
    for p in points:
        if p.scenario is None:  # a shipped scenario (NeMo AutoModel's Qwen3-30B-A3B): the loader checked it
            lay = _scenario(p, modern.default_suite()).layout
            assert lay.dp * lay.mp * lay.pp == lay.world == lay.nodes * lay.gpus_per_node, p.id
            continue
        par, model = p.scenario["parallel"], p.scenario["model"]
        pp, v = par.get("pp", 1), par.get("virtual_stages", 1)
        gpn = p.scenario["hardware"].get("gpus_per_node", 72 if p.scenario["hardware"]["profile"].endswith("-nvl72") else 8)
        assert par["dp"] * par.get("cp", 1) * par["mp"] * pp == p.scenario["hardware"]["nodes"] * gpn, p.id
        if "pp_layers" in par:  # a stated split (with from_hf, the config's layer count)
            layers = _scenario(p, modern.default_suite()).model.layers if "from_hf" in model else model["layers"]
            assert sum(par["pp_layers"]) == layers and len(par["pp_layers"]) == pp * v, p.id
        elif "from_hf" in model:  # the layer count is the config's: the loader checks it
            assert _scenario(p, modern.default_suite()).model.layers % (pp * v) == 0, p.id
        else:
            assert model["layers"] % (pp * v) == 0, p.id


def test_an_iteration_time_is_the_published_step(tmp_path):
    """step_s (Korthikanti et al. Table 5 prints iteration times) is taken as the step, with no FLOP count."""
    points, _ = load_suite(modern.default_suite())
    kor = next(p for p in points if p.id == "kor-22B-sel")
    assert published_step(kor, None) == 1.10


def test_megatron_core_flops_give_the_modelzoo_tables_own_tflops():
    """flops megatron-core (Megatron-Core's num_floating_point_operations): the ModelZoo's four 4k rows print both a
    step time and TFLOPS/GPU; the count over step × GPUs gives each row's TFLOPS within 1%. The figures are rounded
    (a step to 0.1 s, TFLOPS to 1: up to 0.6% together); three rows come within 0.25%, the EP 32 row, run on another
    branch of Megatron-Core (moe_dev f3e6c5, the others main 1e057005), 0.5% high."""
    from zsim.validate.scale import FLOP_COUNTS, _scenario

    points, _ = load_suite(modern.default_suite())
    tflops = {"modelzoo-qwen3-235b-ep32-pp8": 245, "modelzoo-qwen3-235b-ep8-fsdp": 276,
              "modelzoo-qwen3-235b-tp4-ep8-pp8": 167, "modelzoo-qwen3-235b-a2a-pp32": 200}
    for p in points:
        if p.id in tflops:
            sc = _scenario(p, modern.default_suite())
            got = FLOP_COUNTS["megatron-core"](sc) / (p.published["step_s"] * sc.layout.world) / 1e12
            assert abs(got / tflops[p.id] - 1) < 0.01, (p.id, got)


def test_cli_judges_a_suite_file_and_exits_1_on_a_miss(tmp_path):
    """A one-point suite the model cannot meet (a published step 10x faster than any simulation) fails."""
    suite = {"points": [{
        "id": "tiny", "cluster": "c", "half": "held_out", "framework": "Megatron-LM", "quote": "made up",
        "published": {"step_s": 1e-6},
        "scenario": {"model": {"layers": 2, "hidden": 256, "heads": 4, "seq_len": 128, "vocab": 1024,
                               "micro_batch": 1, "global_batch": 8},
                     "parallel": {"dp": 8, "mp": 1}, "zero": {"stage": 0}, "precision": {"dtype": "fp16"},
                     "hardware": {"profile": "dgx-a100", "nodes": 1}}}]}
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(suite))
    assert main(["validate", "modern", "--suite-file", str(path)]) == 1


def test_automodels_llama_row_is_one_step_of_its_tokens():
    """NeMo AutoModel's Llama-3.1-70B row: 128 sequences of 8192 tokens in 18.90 s on 64 GPUs is its printed
    866.77 tokens/s/GPU (to the row's rounding), and the point's scenario runs those sequences: 4 micro-batches of
    one on 32 DP ranks, each sequence split over CP 2."""
    from zsim.validate.scale import _scenario

    points, _ = load_suite(modern.default_suite())
    p = next(p for p in points if p.id == "automodel-llama31-70b-64")
    assert abs(128 * 8192 / p.published["step_s"] / 64 / 866.77 - 1) < 1e-3
    sc = _scenario(p, modern.default_suite())
    assert (sc.grad_accum, sc.model.micro_batch, sc.parallel.dp, sc.parallel.cp, sc.layout.world) == (4, 1, 32, 2, 64)
    assert sc.grad_accum * sc.model.micro_batch * sc.parallel.dp * sc.model.seq_len == 128 * 8192


def test_mlperf_points_run_the_logged_batches_and_the_shipped_scenario_is_the_eos_512_point():
    """MLPerf Training GPT-3 175B: each point's micro-batches a step are the gradient_accumulation_steps its logs
    print (global batch / (DP x micro-batch)) on its config's TP x PP (v), and scenarios/gpt3-175b-mlperf31-h100.yaml is
    the v3.1 Eos 512-GPU point's scenario, section for section."""
    from tests.conftest import assert_shipped_is_point
    from zsim.validate.scale import _scenario

    logged = {"mlperf30-gpt3-nvidia-512": 128, "mlperf30-gpt3-coreweave-1536": 64, "mlperf30-gpt3-coreweave-3584": 24,
              "mlperf31-gpt3-eos-4096": 16, "mlperf31-gpt3-eos-10752": 8, "mlperf40-gpt3-eos-512": 72,
              "mlperf40-gpt3-eos-11616": 6}
    points, _ = load_suite(modern.default_suite())
    mlperf = {p.id: p for p in points if p.id.startswith("mlperf")}
    assert len(mlperf) == 72 and sum(p.half == "held_out" for p in mlperf.values()) == 39
    # UF's 405B runs on DGX B200: TP 4 x PP 8 (v 8) x CP 2 on 8 whole nodes a replica (TP_PP_DP_MAPPING), FP8 tensorwise
    # with FP8 parameters, no userbuffer TP overlap (commented out in its config), 144 micro-batches a replica
    for pid, dp, nodes in (("mlperf51-llama405b-uf-256", 4, 32), ("mlperf51-llama405b-uf-448", 7, 56)):
        sc = _scenario(mlperf[pid], modern.default_suite())
        assert (sc.grad_accum, sc.parallel.dp, sc.parallel.mp, sc.parallel.pp, sc.parallel.cp, sc.parallel.rank_order,
                sc.cluster.nodes, sc.cluster.gpus_per_node) == (144, dp, 4, 8, 2, "tp-cp-pp-dp", nodes, 8), pid
        assert (sc.precision.fp8, sc.precision.fp8_params, sc.parallel.tp_comm_overlap) == ("current", True, False), pid
    # MLPerf's GB200 runs: 64 GPUs (16 trays) of each NVL72 rack, TP_PP_DP_MAPPING (a replica in its rack) but on
    # Tyche's 256-GPU run, whose config leaves it unset; the v5.1 8B runs on one whole rack and on 8 racks
    for pid, racks, order in (("mlperf50-llama405b-tyche-256", 4, "tp-cp-dp-pp"),
                              ("mlperf50-llama405b-carina-2496", 39, "tp-cp-pp-dp"),
                              ("mlperf51-llama8b-gb200-512", 8, "tp-cp-pp-dp")):
        sc = _scenario(mlperf[pid], modern.default_suite())
        assert (sc.cluster.nodes, sc.cluster.gpus_per_node, sc.cluster.nics_per_node, sc.parallel.rank_order) == \
            (racks, 64, 64, order), pid
    sc = _scenario(mlperf["mlperf51-llama8b-gb200-72"], modern.default_suite())
    assert (sc.cluster.nodes, sc.cluster.gpus_per_node, sc.layout.dp_shape.spans_nodes) == (1, 72, False)
    # MLPerf v5.1's NVFP4 405B runs: TP 4 (GB200) or 2 (GB300) x PP 8 (v 8) x CP 2 in 64 GPUs of each rack, NVFP4, no
    # FP8 parameters, no userbuffer TP overlap (config_common_fp4.sh), the accumulation the logs print
    for pid, accum, mp, racks, gpu in (("mlperf51-llama405b-tyche-512", 144, 4, 8, "GB200-185GB"),
                                       ("mlperf51-llama405b-hsg-2560", 24, 4, 40, "GB200-185GB"),
                                       ("mlperf51-llama405b-hsg-5120", 16, 4, 80, "GB200-185GB"),
                                       ("mlperf51-llama405b-theia-512", 72, 2, 8, "GB300-278GB")):
        sc = _scenario(mlperf[pid], modern.default_suite())
        assert (sc.grad_accum, sc.parallel.mp, sc.parallel.pp, sc.parallel.cp, sc.parallel.virtual_stages) == \
            (accum, mp, 8, 2, 8), pid
        assert (sc.cluster.nodes, sc.cluster.gpus_per_node, sc.cluster.gpu.name, sc.parallel.rank_order) == \
            (racks, 64, gpu, "tp-cp-pp-dp"), pid
        assert (sc.precision.fp4, sc.precision.fp8, sc.precision.fp8_params, sc.parallel.tp_comm_overlap) == \
            ("nvfp4", "none", False, False), pid
    # MLPerf v5.0's Llama 3.1 405B: TP 8 (H100) or 4 (H200) x PP 8 (v 8) x CP 2, the accumulation the logs print
    for pid, accum, mp in (("mlperf50-llama405b-eos-512", 288, 8), ("mlperf50-llama405b-eos-8192", 24, 8),
                           ("mlperf50-llama405b-nebius-h200-512", 144, 4)):
        sc = _scenario(mlperf[pid], modern.default_suite())
        assert (sc.grad_accum, sc.parallel.mp, sc.parallel.pp, sc.parallel.cp, sc.parallel.virtual_stages) == \
            (accum, mp, 8, 2, 8), pid
    for pid, accum in logged.items():
        sc = _scenario(mlperf[pid], modern.default_suite())
        layout = (4, 8, 4) if pid == "mlperf40-gpt3-eos-512" else (4, 6, 8) if pid.startswith("mlperf40") else (4, 8, 12)
        assert (sc.grad_accum, sc.parallel.mp, sc.parallel.pp, sc.parallel.virtual_stages) == (accum, *layout), pid
        assert sc.precision.fp8 == "delayed" and sc.cluster.nvls == pid.startswith("mlperf30"), pid
        assert sc.precision.fp8_params == pid.startswith("mlperf40"), pid
    assert_shipped_is_point("gpt3-175b-mlperf31-h100.yaml", "mlperf31-gpt3-eos-512")


def _tiny_suite(tmp_path):
    """A suite file of two tiny held-out points (their published step made up) and a series of both."""
    def point(pid, dp):
        return {"id": pid, "cluster": "c", "half": "held_out", "framework": "Megatron-LM", "quote": "made up",
                "published": {"step_s": 1.0},
                "scenario": {"model": {"layers": 2, "hidden": 256, "heads": 4, "seq_len": 128, "vocab": 1024,
                                       "micro_batch": 1, "global_batch": 8},
                             "parallel": {"dp": dp, "mp": 1}, "zero": {"stage": 0}, "precision": {"dtype": "fp16"},
                             "hardware": {"profile": "dgx-a100", "nodes": 1}}}
    suite = {"points": [point("tiny-a", 8), point("tiny-b", 4)],
             "series": [{"name": "tiny a to b", "points": ["tiny-a", "tiny-b"]}]}
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(suite))
    return path


def test_point_runs_the_matching_points_and_the_series_they_complete(tmp_path):
    """`zsim validate modern --point`: one id runs that point alone (the series, missing a point, is not checked);
    a pattern matching both runs both and checks the series; the report names the subset."""
    import json

    path = _tiny_suite(tmp_path)
    out = tmp_path / "r.json"
    main(["validate", "modern", "--suite-file", str(path), "--point", "tiny-b", "--json", str(out)])
    one = json.loads(out.read_text())
    assert [p["name"] for p in one["points"]] == ["tiny-b"] and one["only"] == ["tiny-b"]
    assert not any(c["group"] == "series" for c in one["checks"])
    assert any("a subset: 1 of the suite's 2 points" in n for n in one["notes"])
    main(["validate", "modern", "--suite-file", str(path), "--point", "tiny-*", "--json", str(out)])
    both = json.loads(out.read_text())
    assert sorted(p["name"] for p in both["points"]) == ["tiny-a", "tiny-b"]
    assert [c["group"] for c in both["checks"]].count("series") == 1


def test_a_subset_of_calibration_points_has_no_held_out_check(tmp_path):
    """--point on calibration points alone: no held-out median to judge (not an infinite one that fails); the whole
    suite with an empty held-out half still fails it."""
    import json

    path = _tiny_suite(tmp_path)
    path.write_text(path.read_text().replace("held_out", "calibration"))
    out = tmp_path / "r.json"
    assert main(["validate", "modern", "--suite-file", str(path), "--point", "tiny-a", "--json", str(out)]) == 0
    assert not any(c["group"] == "held-out half" for c in json.loads(out.read_text())["checks"])
    assert main(["validate", "modern", "--suite-file", str(path), "--json", str(out)]) == 1
    held = [c for c in json.loads(out.read_text())["checks"] if c["group"] == "held-out half"]
    assert len(held) == 1 and not held[0]["passed"]


def test_point_matching_nothing_or_on_another_suite_exits_2_naming_it(tmp_path, capsys):
    path = _tiny_suite(tmp_path)
    assert main(["validate", "scale", "--suite-file", str(path), "--point", "tiny-c"]) == 2
    err = capsys.readouterr().err
    assert "--point tiny-c: no point of the suite has a matching id; did you mean" in err and "'tiny-a'" in err
    assert "Traceback" not in err
    assert main(["validate", "megatron", "--point", "x"]) == 2
    assert "--point applies to the scale and modern suites" in capsys.readouterr().err


def test_step_deficit_prints_the_missing_ms_a_step_of_a_point():
    """benchmarks/step_deficit.py (docs/validation.md, "What the 8B runs across nodes miss"), run as a process on one
    point: its row says the published step minus zsim's in ms, as the suite's own residual gives them."""
    import subprocess
    import sys
    from pathlib import Path

    from zsim.validate.scale import residual

    root = Path(__file__).resolve().parents[1]
    point_id = "mlperf51-llama8b-b200-16"
    out = subprocess.run([sys.executable, str(root / "benchmarks" / "step_deficit.py"), point_id],
                         capture_output=True, text=True, check=True, cwd=root).stdout.splitlines()
    rows = [line.split() for line in out if line.startswith(point_id)]
    assert len(rows) == 1
    points, _ = load_suite(modern.default_suite())
    r = residual(next(p for p in points if p.id == point_id), modern.default_suite())
    published, simulated, missing_ms = float(rows[0][2]), float(rows[0][3]), float(rows[0][4])
    assert abs(published - r.published_s) < 1e-4 and abs(simulated - r.simulated_s) < 1e-4
    assert abs(missing_ms - 1e3 * (r.published_s - r.simulated_s)) < 0.1
    assert float(rows[0][5]) > 0  # the data-parallel collectives beside compute: 16 GPUs over two nodes
    from zsim.validate.scale import _scenario

    accum = _scenario(next(p for p in points if p.id == point_id), modern.default_suite()).grad_accum
    assert abs(float(rows[0][8]) - missing_ms / accum) < 0.1  # the same difference a micro-batch
    # the what-if column: zsim's step with the side collectives' unexposed time added, against the published step
    side_s, exposed_s = float(rows[0][5]) / 1e3, float(rows[0][6]) / 1e3
    in_line = (r.simulated_s + max(side_s - exposed_s, 0.0)) / r.published_s - 1
    assert float(rows[0][9].rstrip("%")) == pytest.approx(100 * in_line, abs=0.15)
    assert float(rows[0][9].rstrip("%")) > 100 * (r.simulated_s / r.published_s - 1)  # its side traffic is not all exposed


def test_point_scenario_writes_a_file_that_runs_to_the_suites_step(tmp_path):
    """benchmarks/point_scenario.py: a point's scenario as a file (from_hf made absolute) that `zsim run` loads and
    simulates to the step the suite reports for the point; an unknown id exits 2 naming it."""
    import subprocess
    import sys
    from pathlib import Path

    from zsim import api
    from zsim.engine.simulation import simulate
    from zsim.validate.scale import residual

    root = Path(__file__).resolve().parents[1]
    point_id = "bridge2604-qwen3-30b-gb300-8"  # from_hf, one node: seconds
    out = tmp_path / "p.yaml"
    subprocess.run([sys.executable, str(root / "benchmarks" / "point_scenario.py"), point_id, str(out)],
                   capture_output=True, text=True, check=True, cwd=tmp_path)
    result = simulate(api.load(out))
    points, _ = load_suite(modern.default_suite())
    r = residual(next(p for p in points if p.id == point_id), modern.default_suite())
    assert abs(result.total_seconds / len(result.step_seconds) - r.simulated_s) < 1e-9
    bad = subprocess.run([sys.executable, str(root / "benchmarks" / "point_scenario.py"), "no-such-point",
                          str(tmp_path / "q.yaml")], capture_output=True, text=True, cwd=tmp_path)
    assert bad.returncode == 2 and "no-such-point" in bad.stderr and "Traceback" not in bad.stderr
