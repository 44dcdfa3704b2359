"""ZeRO-R in whole simulations: Pa, Pa+cpu, CB, MD, checkpoint every k; DeepSpeed's estimators; the
paper's Table 2 and Table 3 (C1-C5); the memory timeline outputs; OOM through the CLI."""

import copy
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import ROOT, small_scenario
from zsim.cli import main
from zsim.commands.maxsize import max_layers, max_params_model_states
from zsim.console.units import parse_bytes
from zsim.config.yamlfile import read_yaml_mapping
from zsim.engine.simulation import simulate
from zsim.memory.timeline import CSV_COLUMNS, keep_indices, timeline_facts
from zsim.report.facts import facts
from zsim.zero.buckets import padded_bucket
from zsim.zero.model_states import model_states, stage_partition
from zsim.zero.residual import stage1_flat_gradient_bytes, step_gradient_bytes

MP4 = {"parallel": {"dp": 8, "mp": 4}}


def checkpoint_allocs(result, where="gpu"):
    """Bytes of the forward's checkpoint allocations in the plan (tags ckpt.<layer>)."""
    from zsim.workload.transformer import build_workload
    from zsim.zero.plan import build_plan

    s = result.scenario
    plan = build_plan(s, build_workload(s.model, s.parallel.mp, s.precision.dtype))
    return sum(a.nbytes for op in plan.ops if op.name.startswith("fwd/") for a in op.allocs
               if a.tag.startswith("ckpt.") and a.where == where)


def test_pa_cuts_checkpoint_memory_by_the_mp_degree_and_adds_an_mp_all_gather():
    plain = simulate(small_scenario(**MP4))
    pa = simulate(small_scenario(**MP4, zero={"partition_activations": True}))
    layers = plain.scenario.model.layers
    assert checkpoint_allocs(pa) * 4 == checkpoint_allocs(plain) > 0
    # One all-gather of the layer input per checkpoint, on the MP group (ZeRO §6.1, §8) ...
    gather = pa.comm[("mp", "all_gather")]
    assert gather.count == layers and gather.payload_bytes == layers * plain.workload.blocks[0].checkpoint_bytes
    # ... which is 1/12 of a block's MP all-reduce traffic (2 fwd + 2 recompute + 2 bwd all-reduces,
    # each counted 2S in the paper's convention): "less than 10%" (§8).
    block_allreduce = 6 * 2 * plain.workload.blocks[0].mp_allreduce_bytes
    assert gather.payload_bytes / layers * 12 == block_allreduce
    assert ("mp", "all_gather") not in plain.comm


def test_pa_cpu_moves_checkpoints_to_host_over_the_offload_stream():
    s = small_scenario(**MP4, zero={"partition_activations": True, "cpu_offload_activations": True,
                                    "cpu_offload_overlap": True})
    r = simulate(s)
    part = -(-r.workload.blocks[0].checkpoint_bytes // 4)
    assert r.host_ledger.peak == s.model.layers * part  # every partition on the host at the end of forward
    assert r.host_ledger.allocated == 0  # all back by the end of the step
    copies = [e for e in r.events if e.get("cat") == "offload"]
    assert len(copies) == 2 * s.model.layers and {e["args"]["op"] for e in copies} == {"d2h", "h2d"}
    assert r.offload_seconds == pytest.approx(2 * s.model.layers * (part / s.cluster.offload.bytes_per_s))


def test_checkpoint_every_k_layers_keeps_ceil_l_over_k():
    one = simulate(small_scenario(model={"layers": 5}))
    two = simulate(small_scenario(model={"layers": 5}, zero={"checkpoint_every": 2}))
    per = one.workload.blocks[0].checkpoint_bytes
    assert checkpoint_allocs(one) == 5 * per and checkpoint_allocs(two) == 3 * per
    recompute = [e["name"] for e in two.events if e["name"].startswith(("recompute/layer", "bwd/layer"))]
    # Backward recomputes a segment in forward order, then runs its layers' backward in reverse.
    assert recompute[:3] == ["recompute/layer.4", "bwd/layer.4", "recompute/layer.2"]
    assert recompute[3:6] == ["recompute/layer.3", "bwd/layer.3", "bwd/layer.2"]


def test_without_cb_stages_0_to_2_reduce_from_a_fused_4psi_fp32_buffer():
    for stage in (0, 1, 2):
        r = simulate(small_scenario(zero={"stage": stage, "constant_buffers": False}))
        psi = r.workload.params_per_mp_rank
        reductions = [e for e in r.events if e["name"].startswith(("all_reduce/grads.bucket", "reduce_scatter/grads"))]
        # traffic in fp16, the bucket padded to a multiple of 2·Nd in stages 1-2 (zsim.zero.buckets)
        nd = r.scenario.layout.dp
        assert len(reductions) == 1 and reductions[0]["args"]["bytes"] == 2 * (padded_bucket(psi, nd) if stage else psi)
        assert r.ledger.peak_reserved >= r.ledger.peak >= r.model_states.total + 4 * psi  # the 4Ψ fp32 buffer
        # With CB the staging buffer is one bucket of fp16 gradients, whatever the model size; stage 1
        # (DeepSpeed v0.2) flattens a second copy of all gradients, then stages each interval's list.
        bucket = 10_000
        cb = simulate(small_scenario(zero={"stage": stage, "reduce_bucket_elements": bucket}))
        if stage == 1:
            flat = [a for a in _plan_allocs(cb) if a.tag.startswith("flat_grads.")]
            lists = [a for a in _plan_allocs(cb) if a.tag.startswith("rs_list")]
            assert sum(a.nbytes for a in flat) == stage1_flat_gradient_bytes(psi, 8, bucket, 2) >= 2 * psi
            assert {a.nbytes for a in flat} == {2 * (bucket // 8)}  # one sub-partition each
            assert lists and all(a.nbytes == 2 * (bucket // 8) * 8 for a in lists)
            continue
        staging = [op_alloc for op_alloc in _plan_allocs(cb) if op_alloc.tag.startswith("bucket.")]
        assert staging and all(a.nbytes == 2 * bucket for a in staging)


def _plan_allocs(result):
    from zsim.workload.transformer import build_workload
    from zsim.zero.plan import build_plan

    s = result.scenario
    plan = build_plan(s, build_workload(s.model, s.parallel.mp, s.precision.dtype))
    return [a for op in plan.ops for a in op.allocs]


def test_deepspeed_zero2_estimator_agrees_exactly():
    """stage_1_and_2.py estimate_zero2_model_states_mem_needs: 2Ψ + 18Ψ/N bytes without offload.
    zsim: model states 2Ψ + 14Ψ/N plus the fp32 gradient partition the step reads, 4Ψ/N."""
    for psi, n in ((7_500_000_000, 64), (1_000_000_000, 8), (6_400, 16)):
        part = stage_partition(psi, n, 2)
        zsim = model_states(psi, n, 2).total + step_gradient_bytes(2, part, "fp16", part).held
        assert zsim == 2 * psi + int(18 * psi / n)


def test_deepspeed_zero3_estimator_largest_layer_term_agrees_and_the_rest_differs_by_2psi_over_n():
    """stage3.py estimate_zero3_model_states_mem_needs: 4·largest_layer + 18Ψ/N. zsim holds the largest
    module's gathered fp16 parameters and its fp16 gradient while it runs backward (2L + 2L), and
    16Ψ/N of model states (Table 1): DeepSpeed's 18 counts 2 bytes/param more (docs/memory.md)."""
    from zsim.workload.transformer import build_workload
    from zsim.zero.plan import build_plan

    s = small_scenario(parallel={"dp": 32, "mp": 1}, zero={"stage": 3})
    w = build_workload(s.model, 1)
    plan = build_plan(s, w)
    largest = max(w.modules, key=lambda m: m.params)
    gathered = next(a.nbytes for op in plan.ops if op.name == f"all_gather/params.{largest.name}" for a in op.allocs
                    if a.category == "params")
    grad = next(a.nbytes for op in plan.ops if op.name == f"bwd/{largest.name}" for a in op.allocs
                if a.category == "grads")
    assert gathered + grad == 4 * largest.params  # the estimator's 4·largest_layer_params, exactly
    psi, n = w.params_per_mp_rank, 32
    states = model_states(psi, n, 3, tensors=w.tensors)
    assert 18 * psi / n - states.total == pytest.approx(2 * psi / n, rel=0.01)


@pytest.mark.parametrize(("mp", "row"), [(1, (2, 7.6, 14.4, 128)), (2, (4, 15.2, 28.8, 256)),
                                         (4, (8, 30.4, 57.6, 512)), (8, (16, 60.8, 115.2, 1024)),
                                         (16, (32, 121.6, 230.4, 2048))])
def test_table_2_theoretical_columns_within_1_percent(mp, row):
    # ZeRO Table 2: Nd = 64, 32 GB V100 (32e9 bytes), billions of parameters per stage.
    for stage, printed in enumerate(row):
        got = max_params_model_states(parse_bytes("32GB"), 64, mp, stage) / 1e9
        assert abs(got - printed) / printed < 0.01, (mp, stage, got, printed)


def test_c1_to_c5_max_model_size_grows_in_the_papers_order():
    """ZeRO Figure 6 / Table 3 at a fixed batch and MP 16, with MD as the paper describes it (the
    scenarios' md_checkpoints: reserved): C1 < C3 < C2 < C4 < C5. With MD as DeepSpeed's code does it,
    C1 has no checkpoint buffer (no Pa) and its checkpoints' memory is free again when stage 1 makes its
    gradient copy: C1 and C3 are then both bound at the start of backward, where Pos and Pos+g hold
    nearly the same, and come out within a layer of each other; Pa, Pos+g and Pa+cpu still order the
    rest (docs/memory.md, "The paper's C1-C5")."""
    layer = 12 * 8192**2 + 13 * 8192  # one block's parameters at hidden 8192
    for md, strict in (("reserved", True), ("deepspeed", False)):
        sizes = {}
        for c in range(1, 6):
            data = read_yaml_mapping(ROOT / f"scenarios/paper/C{c}-100B-400gpu.yaml")
            data["zero"]["md_checkpoints"] = md
            sizes[c] = max_layers(data).params
        if strict:
            assert sizes[1] < sizes[3] < sizes[2] < sizes[4] < sizes[5], sizes
        else:
            assert abs(sizes[1] - sizes[3]) <= layer and max(sizes[1], sizes[3]) < sizes[2] < sizes[4] < sizes[5], sizes


def test_fp32_training_runs_and_holds_16_psi_over_n():
    r = simulate(small_scenario(precision={"dtype": "fp32"}))
    psi = r.workload.params_per_mp_rank
    assert r.model_states.total == 16 * stage_partition(psi, 8, 3, r.workload.tensors)
    assert r.workload.blocks[0].checkpoint_bytes == 4 * 128 * 2 * 256  # 4-byte activations


scenarios = st.fixed_dictionaries({
    "stage": st.integers(0, 3), "layers": st.integers(1, 4), "mp": st.sampled_from([1, 2, 4]),
    "pa": st.sampled_from(["off", "pa", "pa+cpu"]), "cb": st.booleans(), "md": st.booleans(),
    "every": st.integers(1, 3), "steps": st.integers(1, 2),
})


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(p=scenarios)
def test_memory_invariants_with_zero_r(p):
    s = small_scenario(model={"layers": p["layers"]}, parallel={"dp": 32 // p["mp"], "mp": p["mp"]},
                       zero={"stage": p["stage"], "partition_activations": p["pa"] != "off",
                             "cpu_offload_activations": p["pa"] == "pa+cpu", "constant_buffers": p["cb"],
                             "defragment": p["md"], "checkpoint_every": p["every"]},
                       run={"steps": p["steps"]})
    r = simulate(s)
    times, rows = r.ledger.timeline()
    reserved = r.ledger.reserved_timeline()
    assert (rows >= 0).all() and (reserved >= rows.sum(axis=1)).all()  # never negative; reserved ≥ allocated
    states = r.model_states
    context = r.ledger.totals["context"]
    # all else freed: gradients too (DeepSpeed frees them in the step), the context stays
    assert rows[-1].tolist() == [states.params, 0, states.optimizer, 0, 0, context]
    assert r.host_ledger.allocated == 0
    assert {t for t in r.ledger.live if not t.startswith("context.")} == {"model.params", "model.optimizer"}


def test_timeline_downsampling_keeps_the_exact_peaks():
    r = simulate(small_scenario(model={"layers": 8}, run={"steps": 3}))
    t = timeline_facts(r.ledger, max_points=20)
    assert t["samples"] > 60 and t["points"] <= 24
    assert max(t["allocated"]) == r.ledger.peak and max(t["reserved"]) == r.ledger.peak_reserved
    allocated = np.array([1, 5, 2, 9, 3, 3, 1, 0])
    assert set(keep_indices(allocated, allocated, max_points=2).tolist()) >= {0, 3, 7}


def test_run_writes_csv_png_and_timeline_json(tmp_path):
    out = tmp_path / "o"
    assert main(["run", "scenarios/paper/7.5B-64gpu-stage3.yaml", "-o", str(out), "--set", "run.steps=1",
                 "--plot", "wait"]) == 0
    header = (out / "memory.csv").read_text().splitlines()[0].split(",")
    assert tuple(header) == CSV_COLUMNS
    f = json.loads((out / "result.json").read_text())
    assert f["memory"]["reserved_peak_bytes"] >= f["memory"]["peak_bytes"]
    assert max(f["memory"]["timeline"]["reserved"]) == f["memory"]["reserved_peak_bytes"]
    assert (out / "memory.png").stat().st_size > 10_000
    trace = json.loads((out / "trace.json").read_text())
    counter = next(e for e in trace["traceEvents"] if e["ph"] == "C")
    assert set(counter["args"]) == {"params", "grads", "optimizer", "activations", "buffers", "context", "fragmentation"}


def test_oom_reports_time_rank_class_and_category_and_exits_3(tmp_path, capsys):
    code = main(["run", "scenarios/paper/C1-100B-400gpu.yaml", "--no-plot", "-o", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 3
    assert "zsim: out of memory at t = " in err and "on rank class 0 (all 400 ranks)" in err
    assert "activations (arena.checkpoints" in err  # the paper's MD: the reserved checkpoint buffer


def _plan(**zero):
    from zsim.zero.plan import build_plan
    from zsim.workload.transformer import build_workload

    s = small_scenario(zero={"stage": 2, "defragment": True, **zero}, run={"steps": 1})
    return build_plan(s, build_workload(s.model, s.parallel.mp, s.precision.dtype))


def test_md_checkpoint_slots_come_from_the_allocator_at_the_first_forward_and_go_in_backward():
    """DeepSpeed v0.2 contiguous checkpointing (with Pa): the first checkpointed forward of a micro-batch
    allocates every layer's slot at once through the caching allocator, each slot is freed with its
    layer's saved tensors, so the memory serves the rest of the step; there is no checkpoint arena."""
    plan = _plan(partition_activations=True)
    assert dict(plan.arenas).keys() == {"grads"}
    ckpt = {op.name: [a for a in op.allocs if a.tag.startswith("ckpt.")] for op in plan.ops}
    first = ckpt["fwd/layer.0"]
    assert [a.tag.split(".s")[0] for a in first] == [f"ckpt.layer.{i}" for i in range(4)]
    assert all(a.arena == "" and a.nbytes == first[0].nbytes for a in first)
    assert not any(ckpt[f"fwd/layer.{i}"] for i in range(1, 4))
    freed = {tag for op in plan.ops if op.name.startswith(("recompute/", "bwd/", "all_gather/activations"))
             for tag in op.frees}
    assert {a.tag for a in first} <= freed


def test_md_without_pa_keeps_checkpoints_per_layer():
    """Without Pa, DeepSpeed has no contiguous checkpoint buffer (configure() asserts Pa for it): each
    layer's forward allocates its own checkpoint, and MD is the gradients' buffer alone."""
    plan = _plan(partition_activations=False)
    assert dict(plan.arenas).keys() == {"grads"}
    for i in range(4):
        op = next(o for o in plan.ops if o.name == f"fwd/layer.{i}")
        assert [a.tag.split(".s")[0] for a in op.allocs if a.tag.startswith("ckpt.")] == [f"ckpt.layer.{i}"]


def test_maxsize_cli_model_states_and_bad_input(capsys):
    assert main(["maxsize", "--dp", "64", "--mp", "16", "--stage", "1", "--gpu-mem", "32GB", "--json", "-"]) == 0
    table = json.loads(capsys.readouterr().out)
    assert abs(table["params"]["1"] / 1e9 - 121.6) / 121.6 < 0.01
    assert main(["maxsize", "--dp", "64", "--gpu-mem", "lots"]) == 2  # argparse's error, returned (issue 13)
    assert main(["maxsize", "--dp", "64"]) == 2  # model-states mode needs --gpu-mem


def test_memory_calculator_residual_states_follow_the_flags():
    from zsim.commands.memory import residual_table

    shape = dict(hidden=8192, seq=1024, batch=16, layers=125)
    plain = residual_table(100_000_000_000, 25, 16, 1, **shape)
    pa = residual_table(100_000_000_000, 25, 16, 1, **shape, pa=True)
    cpu = residual_table(100_000_000_000, 25, 16, 1, **shape, pa=True, pa_cpu=True)
    assert plain["checkpoints"] == 125 * 2 * 1024 * 16 * 8192 == 16 * pa["checkpoints"]
    assert cpu["checkpoints"] == 0 and cpu["host"] == pa["checkpoints"]
    every4 = residual_table(100_000_000_000, 25, 16, 1, **shape, every=4)
    assert every4["checkpoints"] == 32 * (plain["checkpoints"] // 125)  # ceil(125 / 4) checkpoints
    assert every4["working"] == 4 * plain["working"]  # a segment of 4 layers recomputed at once
    assert residual_table(100_000_000_000, 25, 16, 1, **shape, cb=False)["gradient_buffer"] == 4 * 100_000_000_000 // 16
    assert plain["gradient_buffer"] == 2 * 500_000_000
    # the loss at the end of forward: fp16 logits, their fp32 copy, the cross-entropy's clone, its softmax,
    # over T tokens and the padded vocabulary's V/mp columns (51,200 at MP 16); fp32 training has no cast
    assert plain["loss"] == (2 + 4 + 4 + 4) * 1024 * 16 * 51200 // 16
    assert residual_table(100_000_000_000, 25, 16, 1, **shape, dtype="fp32")["loss"] == 12 * 1024 * 16 * 51200 // 16
    assert residual_table(2_500_000_000, 128, 1, 2, hidden=1920, seq=1024, batch=24)["loss"] == 14 * 1024 * 24 * 50304


def test_the_simulated_loss_holds_what_the_calculator_says():
    """The head's forward in a simulated plan allocates the calculator's loss bytes (saved softmax and
    input, plus the logits' copies freed when the forward ends)."""
    from zsim.commands.memory import residual_table
    from zsim.workload.transformer import build_workload
    from zsim.zero.plan import build_plan

    scenario = small_scenario(zero={"stage": 2})
    plan = build_plan(scenario, build_workload(scenario.model, scenario.parallel.mp, scenario.precision.dtype))
    head = next(op for op in plan.ops if op.name.startswith("fwd/head"))
    m, lay = scenario.model, scenario.layout
    e_sbh = 2 * m.seq_len * m.micro_batch * m.hidden
    held = sum(a.nbytes for a in head.allocs) - e_sbh
    expect = residual_table(10**9, lay.dp, lay.mp, 2, hidden=m.hidden, seq=m.seq_len, batch=m.micro_batch,
                            heads=m.heads, vocab=m.vocab)["loss"]
    assert held == expect
    work = [a.tag for a in head.allocs if a.tag.startswith("fwork")]
    assert len(work) == 3 and set(work) <= set(head.frees)  # freed when the forward ends


def test_md_reserved_holds_every_checkpoint_in_one_arena_with_or_without_pa():
    """md_checkpoints: reserved, the paper's §6.3 reading: one arena of every checkpoint of a micro-batch,
    reserved for the run, whether the checkpoints are partitioned (Pa) or not."""
    for pa in (False, True):
        plan = _plan(partition_activations=pa, md_checkpoints="reserved")
        arenas = dict(plan.arenas)
        ckpts = [a for op in plan.ops if op.name.startswith("fwd/layer.") for a in op.allocs if a.tag.startswith("ckpt.")]
        assert len(ckpts) == 4 and all(a.arena == "checkpoints" for a in ckpts)
        assert arenas["checkpoints"] == 4 * ckpts[0].nbytes and "grads" in arenas


def test_maxsize_simulates_until_the_allocator_settles():
    """C1 (the paper's shape, 32 heads) at 77 layers with DeepSpeed's MD fits three steps and runs out of
    memory in the fourth: maxsize keeps doubling the steps while the allocator's state at a step's end
    still changes, and so does not call it a fit; at 72 layers the state repeats from the second step."""
    from zsim.commands.maxsize import fits
    from zsim.scenario.scenario import build_scenario

    data = read_yaml_mapping(ROOT / "scenarios/paper/C1-100B-400gpu.yaml")
    data["zero"]["md_checkpoints"] = "deepspeed"
    three = copy.deepcopy(data)
    three["model"]["layers"], three["run"] = 77, {"steps": 3}
    three["model"].pop("global_batch")
    assert simulate(build_scenario(three, source="<test>", default_name="c1"), trace=False).fits
    late = fits(data, 77, None)
    assert not late.fits and late.steps == 4  # two steps fit but had not settled; the fourth ran out of memory
    early = fits(data, 72, None)
    assert early.fits and early.settled and early.steps == 2


def test_pa_cpu_copies_in_line_as_deepspeed_or_overlapped_when_asked():
    """DeepSpeed's Pa+cpu (`partition.cpu()`, `get_full_inputs(..., device=cuda_device)`) copies in line on
    the compute stream, the way back when the segment recomputes (`fetch/`); cpu_offload_overlap copies on
    the offload stream and brings each partition back one segment ahead (`prefetch/`)."""
    for overlap, stream, back in ((False, "compute", "fetch/"), (True, "offload", "prefetch/")):
        plan = _plan(partition_activations=True, cpu_offload_activations=True, cpu_offload_overlap=overlap)
        copies = [op for op in plan.ops if op.transfer]
        assert copies and {op.stream for op in copies} == {stream}
        assert {op.name.split("activations")[0] for op in copies} == {"offload/", back}
        # each copy back comes before its segment's all-gather in the plan (and, in line, in time)
        names = [op.name for op in plan.ops]
        for op in copies:
            if op.name.startswith(back):
                layer = op.name.split("activations.")[1].split(".s")[0]
                assert names.index(op.name) < names.index(f"all_gather/activations.{layer}")
