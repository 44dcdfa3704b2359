"""A micro-batch's pass copied from the one before it (zsim.zero.pass_copy) is the pass build_plan builds:
the whole plan, op for op and field for field, equals the plan with every pass built, across the shipped
scenarios and drawn combinations of every option that shapes a pass."""

import dataclasses
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import ROOT, small_scenario
from zsim.errors import ZsimError
from zsim.scenario.scenario import load_scenario
from zsim.zero.ops import PlanBuilder
from zsim.zero.pass_copy import PassRecord, copy_pass
from zsim.zero.plan import build_plan, build_unit_plan, scenario_workload

SCENARIOS = sorted(p for p in (ROOT / "scenarios").rglob("*.yaml") if p.parent.name != "whatif")


def _same_plans(scenario) -> None:
    """Assert the plan with copied passes is the plan built pass by pass, and the unit plan and its
    Second are that plan's at 2 micro-batches (_same_unit)."""
    workload = scenario_workload(scenario)
    copied, built = build_plan(scenario, workload), build_plan(scenario, workload, copy_passes=False)
    assert len(copied.ops) == len(built.ops)
    for i, (a, b) in enumerate(zip(copied.ops, built.ops)):
        assert a == b, (i, a, b)
    assert copied == built
    if scenario.run.steps == 1 and scenario.layout.pp == 1:
        _same_unit(dataclasses.replace(scenario, grad_accum=2))


def _same_unit(two) -> None:
    """build_unit_plan(two) is build_plan(two, every pass built) with micro-batch 1 cut out and the optimizer
    step's dependencies on it moved to micro-batch 0's counterparts, and its Second gives micro-batch 1's
    dependencies and allocations (under micro-batch 0's tags); None exactly where micro-batch 1 is not
    micro-batch 0 with pass_copy's changes."""
    workload = scenario_workload(two)
    full, unit = build_plan(two, workload, copy_passes=False), build_unit_plan(two, workload)
    opt = next(i for i, op in enumerate(full.ops) if op.name.startswith("optimizer/"))
    n0 = sum(op.micro_batch == 0 for op in full.ops[:opt])
    first, second = full.ops[:n0], full.ops[n0:opt]
    suffix = ".s0.m0"

    def as_first(op):  # micro-batch 1's op under micro-batch 0's tags and index
        return op._replace(micro_batch=0, allocs=tuple(a._replace(tag=a.tag.replace(".s0.m1", suffix)) for a in op.allocs),
                           frees=tuple(t.replace(".s0.m1", suffix) for t in op.frees))

    alike = len(second) == n0 and all(
        as_first(b)._replace(deps=(), allocs=()) == a._replace(deps=(), allocs=()) for a, b in zip(first, second))
    if two.zero.stage < 2 or not alike:
        assert unit is None
        return
    assert unit is not None
    plan, later = unit
    tail = tuple(op._replace(deps=tuple(d - n0 if d >= n0 else d for d in op.deps)) for op in full.ops[2 * n0:])
    assert plan == dataclasses.replace(full, ops=first + tail)
    for k, (a, b) in enumerate(zip(first, second)):
        assert later.deps(a, k) == b.deps, (k, a, b)
        assert later.allocs(a, later.suffix) == as_first(b).allocs, (k, a, b)


def _shipped(path: Path, accum: int, steps: int):
    """The shipped scenario at `accum` micro-batches and `steps` steps, at 4 layers where it allows (the
    rule does not depend on how many; the flagship's 128 would take seconds), else as many as it has;
    None where it refuses `accum` (an interleaved pipeline needs a multiple of its stages)."""
    for layers in (["model.layers=4"], []):
        try:
            return load_scenario(path, [*layers, f"model.grad_accum={accum}", "model.global_batch=null",
                                        f"run.steps={steps}"])
        except ZsimError:
            continue
    return None


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: str(p.relative_to(ROOT / "scenarios")))
def test_shipped_scenarios_copy_their_passes_exactly(path: Path):
    tried = [s for s in (_shipped(path, accum, steps) for accum, steps in ((3, 1), (2, 2), (8, 1), (32, 1))) if s is not None]
    assert tried, f"{path} refuses every accumulation tried"
    for scenario in tried[:2]:
        _same_plans(scenario)


options = st.fixed_dictionaries({
    "stage": st.integers(0, 3),
    "implementation": st.sampled_from(["paper", "deepspeed-0.2", "deepspeed-0.5", "deepspeed-0.14", "megatron-core"]),
    "param_gather": st.booleans(),  # megatron-core at stage 1: overlap_param_gather
    "tp_overlap": st.booleans(),  # parallel.tp_comm_overlap, where SP allows it (a MoE model: its experts whole)
    "ckpt": st.booleans(),
    "every": st.integers(1, 3),
    "pa": st.booleans(),
    "offload": st.booleans(),
    "md": st.booleans(),
    "cb": st.booleans(),
    "overlap": st.booleans(),
    "prefetch": st.integers(0, 3),
    "bucket": st.sampled_from([10_000, 300_000, 10**9]),
    "mp": st.sampled_from([1, 2, 4]),
    "accum": st.integers(2, 4),
    "steps": st.integers(1, 2),
    "moe": st.booleans(),
    "loss": st.sampled_from(["megatron", "torch"]),
    "granularity": st.sampled_from(["full", "selective"]),
    "sp": st.booleans(),
    "attention": st.sampled_from(["standard", "flash2"]),
    "md_checkpoints": st.sampled_from(["deepspeed", "reserved"]),
    "offload_overlap": st.booleans(),
    "coordinator": st.sampled_from([None, (2_000, 50_000, 20_000)]),  # deepspeed-0.5's prefetch, live, reuse
})


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(p=options)
def test_drawn_options_copy_their_passes_exactly(p):
    model = {"grad_accum": p["accum"], "loss": p["loss"] if p["mp"] == 1 else "megatron", "attention": p["attention"]}
    parallel = {"dp": 32 // p["mp"], "mp": p["mp"], "sequence_parallel": p["sp"] and p["mp"] > 1,
                "tp_comm_overlap": p["tp_overlap"] and p["sp"] and p["mp"] > 1 and not p["moe"]}
    if p["moe"]:
        model["moe"] = {"experts": 4, "top_k": 2}
        parallel.update(ep=4, sequence_parallel=p["mp"] > 1)  # Megatron-LM's rule for MoE with TP
        if p["tp_overlap"] and p["mp"] > 1:  # a MoE block's attention pair, its experts whole
            parallel.update(expert_mp=1, tp_comm_overlap=True)
    implementation = "paper" if p["implementation"] == "deepspeed-0.2" and p["stage"] == 3 else p["implementation"]
    megatron = implementation == "megatron-core"
    if megatron:  # Megatron-Core: stages 0-1, its own buffers (the loader refuses the rest)
        p = {**p, "stage": p["stage"] % 2, "md": False, "cb": True}
    selective = p["ckpt"] and p["granularity"] == "selective"
    # Pa splits full-recompute checkpoints over MP (none under SP); checkpoint_every groups full recompute's layers
    pa = p["pa"] and p["ckpt"] and p["mp"] > 1 and not parallel["sequence_parallel"] and not selective
    try:
        scenario = small_scenario(
            model=model,
            parallel=parallel,
            zero={"stage": p["stage"], "implementation": implementation, "activation_checkpointing": p["ckpt"],
                  "checkpoint_every": p["every"] if p["ckpt"] and not selective else 1, "partition_activations": pa, "cpu_offload_activations": p["offload"] and pa,
                  "defragment": p["md"], "constant_buffers": p["cb"], "overlap_comm": p["overlap"],
                  "prefetch_layers": p["prefetch"], "reduce_bucket_elements": p["bucket"],
                  "recompute_granularity": p["granularity"] if p["ckpt"] else "full",
                  "md_checkpoints": p["md_checkpoints"], "cpu_offload_overlap": p["offload_overlap"],
                  **({"overlap_param_gather": p["param_gather"]} if megatron and p["stage"] == 1 else {}),
                  **({"ddp_bucket_elements": p["bucket"]} if megatron else {}),
                  **(dict(zip(("prefetch_bucket_elements", "max_live_elements", "max_reuse_elements"), p["coordinator"]))
                     if p["coordinator"] and implementation == "deepspeed-0.5" and p["stage"] == 3 else {})},
            run={"steps": p["steps"]},
            **({"hardware": {"profile": "dgx-h100", "nodes": 4}} if p["attention"] == "flash2" else {}))
    except ZsimError:  # a combination the loader refuses (stage 3 MoE under a DeepSpeed implementation)
        return
    _same_plans(scenario)


pipelines = st.fixed_dictionaries({
    "pp": st.sampled_from([2, 4]),
    "schedule": st.sampled_from(["gpipe", "1f1b", "interleaved"]),
    "accum_per_stage": st.integers(1, 3),
    "stage": st.integers(0, 1),
    "ckpt": st.booleans(),
    "mp": st.sampled_from([1, 2]),
    "steps": st.integers(1, 2),
    "moe": st.booleans(),
    "megatron": st.sampled_from([None, False, True]),  # megatron-core, without or with overlap_param_gather
})


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(p=pipelines)
def test_drawn_pipelines_copy_their_passes_exactly(p):
    """A pipeline stage copies a chunk's forward or backward from its previous one, across the other passes,
    sends and receives between them: the plan equals the one built pass by pass."""
    interleaved = p["schedule"] == "interleaved"
    model = {"layers": 8, "grad_accum": p["pp"] * p["accum_per_stage"]}
    parallel = {"dp": 32 // (p["mp"] * p["pp"]), "mp": p["mp"], "pp": p["pp"], "pipeline_schedule": p["schedule"],
                **({"virtual_stages": 2} if interleaved else {})}
    if p["moe"]:
        model["moe"] = {"experts": 4, "top_k": 2}
        parallel.update(ep=2, sequence_parallel=p["mp"] > 1)
    try:
        megatron = {} if p["megatron"] is None else {"implementation": "megatron-core", "ddp_bucket_elements": 300_000,
                                                    "overlap_param_gather": p["megatron"] and p["stage"] == 1}
        scenario = small_scenario(model=model, parallel=parallel, run={"steps": p["steps"]},
                                  zero={"stage": p["stage"], "activation_checkpointing": p["ckpt"], **megatron})
    except ZsimError:  # a layout the loader refuses
        return
    _same_plans(scenario)


def test_passes_are_copied_where_the_rule_applies(monkeypatch):
    """Stages 2-3 copy every pass after the first; stages 0-1 the middle ones (the last reduces); a second
    step builds its first (it waits for the first step) and copies from its second on."""
    import zsim.zero.plan as plan

    made: list[int] = []

    def counted(b, previous, reduce):
        record = copy_pass(b, previous, reduce)
        made.extend([record.mb] if record is not None else [])
        return record

    monkeypatch.setattr(plan, "copy_pass", counted)
    for stage, steps, copied in ((3, 1, [1, 2, 3]), (1, 1, [1, 2]), (2, 2, [1, 2, 3, 2, 3]), (0, 2, [1, 2, 2])):
        made.clear()
        scenario = small_scenario(model={"grad_accum": 4}, zero={"stage": stage}, run={"steps": steps})
        build_plan(scenario, scenario_workload(scenario))
        assert made == copied, (stage, steps)
        _same_plans(scenario)


def test_a_pass_is_copied_past_later_ops_but_not_when_it_waits_for_an_earlier_step_or_reduces_otherwise():
    b = PlanBuilder()
    b.add(name="fwd/x", stream="compute", micro_batch=0, allocs=(), frees=())
    b.add(name="fwd/x2", stream="compute", deps=(0,), micro_batch=0)
    record = PassRecord(0, 2, 0, 0, None, frozenset(), reduce=False)
    assert copy_pass(b, record, reduce=True) is None and len(b.ops) == 2
    b.add(name="send/pp.fwd", stream="compute", micro_batch=0)  # an op after the pass: the copy goes after it
    copied = copy_pass(b, record, reduce=False, mb=1)
    assert copied == PassRecord(3, 5, 0, 1, 2, frozenset(), False)
    assert [op.name for op in b.ops[3:]] == ["fwd/x", "fwd/x2"] and b.ops[4].deps == (3,)
    earlier = PlanBuilder()
    earlier.add(name="optimizer/step", stream="compute")
    earlier.add(name="fwd/x", stream="compute", deps=(0,), micro_batch=0)  # waits for op 0, not its entry
    assert copy_pass(earlier, PassRecord(1, 2, 0, 0, None, frozenset(), False), reduce=False) is None


def test_a_copy_renames_its_tensors_and_leaves_the_steps_gradients_to_the_first():
    from zsim.zero.ops import Alloc
    b = PlanBuilder()
    b.add(name="gather", stream="comm", micro_batch=0, allocs=(Alloc("params", 8, "gathered.fwd.x.s0.m0"),))
    b.add(name="bwd/x", stream="compute", deps=(0,), micro_batch=0,
          allocs=(Alloc("grads", 4, "grads.partition.s0"), Alloc("activations", 2, "dgrad.x.s0.m0")),
          frees=("gathered.fwd.x.s0.m0", "dgrad.x.s0.m0"))
    record = copy_pass(b, PassRecord(0, 2, 0, 0, None, frozenset({0}), True), reduce=True)
    assert record == PassRecord(2, 4, 0, 1, 1, frozenset({0}), True)
    gather, bwd = b.ops[2:]
    assert gather.deps == (1,) and gather.micro_batch == 1 and gather.allocs[0].tag == "gathered.fwd.x.s0.m1"
    assert bwd.deps == (2,) and [a.tag for a in bwd.allocs] == ["dgrad.x.s0.m1"]
    assert bwd.frees == ("gathered.fwd.x.s0.m1", "dgrad.x.s0.m1")
    assert b.last_compute == 3 and b.last_comm == 2
    # micro-batch 1 allocating the step's gradients again is not the rule: no copy of it
    assert copy_pass(b, PassRecord(2, 4, 0, 1, 1, frozenset({0}), True), reduce=True) is not None
    b.ops[5] = b.ops[5]._replace(allocs=(Alloc("grads", 4, "grads.partition.s0"),))
    assert copy_pass(b, PassRecord(4, 6, 0, 2, 3, frozenset({0}), True), reduce=True) is None
