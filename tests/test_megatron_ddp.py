"""zero.implementation megatron-core (zsim.zero.megatron_ddp): Megatron-Core's buckets as core_r0.8.0 lays them
out, the reductions and gathers the plan makes of them, the memory they hold, and the loader's refusals."""

from __future__ import annotations

import pytest

from tests.conftest import small_dict, small_scenario
from zsim.cli import main
from zsim.scenario.scenario import build_scenario
from zsim.errors import ZsimError
from zsim.workload.transformer import Module
from zsim.zero.megatron_ddp import Bucket, bucket_elements, chunk_buckets, ddp_buckets, grad_bytes
from zsim.zero.plan import build_plan, rank_model_states, scenario_workload


def _module(name: str, *tensors: int) -> Module:
    return Module(name=name, params=sum(tensors), fwd_flops=0.0, fwd_hbm_bytes=0.0, saved_bytes=0, checkpoint_bytes=0,
                  mp_allreduce_bytes=0, mp_allreduces_fwd=0, mp_allreduces_bwd=0, tensors=tensors)


MODS = [_module("embed", 100, 10), _module("layer.0", 50, 30), _module("layer.1", 50, 30), _module("head", 5)]


def test_default_bucket_size_is_megatron_cores():
    # distributed_data_parallel.py @ core_r0.8.0: max(40000000, 1000000 * dp)
    assert bucket_elements(8, None) == 40_000_000
    assert bucket_elements(48, None) == 48_000_000
    assert bucket_elements(48, 1234) == 1234
    assert grad_bytes("bf16") == 4 and grad_bytes("fp32") == 4 and grad_bytes("fp16") == 2


def test_buckets_close_from_the_models_end_at_the_tensor_that_fills_them():
    # backward order: head 5, layer.1 30 then 50 (85 >= 80: closes at layer.1), layer.0 30 then 50 (80),
    # embed 10 then 100 (110)
    plain = ddp_buckets(MODS, dp=1, limit=80, distributed=False, bucketed=True)
    assert plain == [Bucket(85, "layer.1", ("layer.1", "head")), Bucket(80, "layer.0", ("layer.0",)),
                     Bucket(110, "embed", ("embed",))]
    # a tensor that fills a bucket mid-module leaves the rest of the module to the next bucket
    split = ddp_buckets(MODS, dp=1, limit=60, distributed=False, bucketed=True)
    assert [b.elements for b in split] == [85, 80, 110]
    split = ddp_buckets(MODS, dp=1, limit=30, distributed=False, bucketed=True)
    assert split[0] == Bucket(35, "layer.1", ("layer.1", "head")) and split[1] == Bucket(50, "layer.1", ("layer.1",))
    assert [b.elements for b in split] == [35, 50, 30, 50, 110]
    assert sum(b.elements for b in split) == sum(m.params for m in MODS)


def test_the_distributed_optimizer_pads_params_to_64_and_buckets_to_lcm_dp_128():
    # dp 3: lcm(3, 128) = 384. One bucket: head 5 -> pad 64 + 30 = 94 -> 128 + 50 = 178 -> 192 + 30 = 222 ->
    # 256 + 50 = 306 -> 320 + 10 = 330 -> 384 + 100 = 484, padded to 768
    (one,) = ddp_buckets(MODS, dp=3, limit=10**9, distributed=True, bucketed=True)
    assert one.elements == 768 and one.closer == "embed"
    assert one.modules == ("embed", "layer.0", "layer.1", "head")
    # bucketing off (a later pipeline stage or chunk): one bucket whatever the limit
    assert len(ddp_buckets(MODS, dp=3, limit=10, distributed=True, bucketed=False)) == 1
    # the tied word embedding (embed's tensor 0) in a bucket of its own, the rest closed before it
    shared = ddp_buckets(MODS, dp=1, limit=10**9, distributed=False, bucketed=False, shared=frozenset({("embed", 0)}))
    assert [b.elements for b in shared] == [175, 100]


def _scenario(**zero):
    return small_scenario(model={"grad_accum": 3}, parallel={"dp": 8, "mp": 4},
                          zero={"stage": 1, "activation_checkpointing": False, "implementation": "megatron-core",
                                "ddp_bucket_elements": 400_000, **zero},
                          precision={"dtype": "bf16"}, hardware={"profile": "dgx-a100", "nodes": 4})


def test_buckets_are_reduce_scattered_in_fp32_as_the_last_backward_completes_them():
    s = _scenario(overlap_comm=True)
    w = scenario_workload(s)
    plan = build_plan(s, w)
    buckets = chunk_buckets(s, w.modules)
    assert len(buckets) > 1
    reductions = [op for op in plan.ops if op.name.startswith("reduce_scatter/grads.")]
    assert [op.nbytes for op in reductions] == [4 * b.elements for b in buckets]
    assert all(op.stream == "comm" and op.micro_batch == s.grad_accum - 1 for op in reductions)
    for op, bucket in zip(reductions, buckets):  # each waits for the backward of the module that closes it
        (dep,) = op.deps
        assert plan.ops[dep].name == f"bwd/{bucket.closer}"
    # the first bucket leaves before backward ends: compute follows it on the compute stream
    first = plan.ops.index(reductions[0])
    assert any(op.name.startswith("bwd/") for op in plan.ops[first:])
    # the gradient buffer is fp32: 4 bytes a parameter, and the step copies none of it
    grads = [a for op in plan.ops for a in op.allocs if a.category == "grads"]
    assert sum(a.nbytes for a in grads) == 4 * w.params_per_mp_rank
    copy = next(op for op in plan.ops if op.name == "optimizer/grads_copy")
    assert sum(a.nbytes for a in copy.allocs) == 0


def test_without_overlap_comm_the_buffer_is_one_bucket_reduced_in_line():
    s = _scenario(overlap_comm=False)
    plan = build_plan(s, scenario_workload(s))
    (reduction,) = [op for op in plan.ops if op.name.startswith("reduce_scatter/grads.")]
    assert reduction.stream == "compute"


def test_parameters_are_gathered_after_the_step_or_under_the_next_forward():
    after = build_plan(_scenario(), scenario_workload(_scenario()))
    opt = next(i for i, op in enumerate(after.ops) if op.name == "optimizer/step")
    gathers = [i for i, op in enumerate(after.ops) if op.name.startswith("all_gather/params.")]
    assert gathers and min(gathers) > opt and all(after.ops[i].stream == "compute" for i in gathers)

    s = _scenario(overlap_param_gather=True)
    w = scenario_workload(s)
    under = build_plan(s, w)
    gathers = [i for i, op in enumerate(under.ops) if op.name.startswith("all_gather/params.")]
    buckets = list(reversed(chunk_buckets(s, w.modules)))  # forward order
    assert [under.ops[i].nbytes for i in gathers] == [2 * b.elements for b in buckets]
    assert all(under.ops[i].stream == "comm" and under.ops[i].micro_batch == 0 for i in gathers)
    for m in w.modules:  # each module's first forward waits for every bucket that holds its parameters
        if not m.params:
            continue
        fwd = next(op for op in under.ops if op.name == f"fwd/{m.name}" and op.micro_batch == 0)
        wanted = {gathers[j] for j, b in enumerate(buckets) if m.name in b.modules}
        assert wanted and wanted <= set(fwd.deps), m.name
        later = next(op for op in under.ops if op.name == f"fwd/{m.name}" and op.micro_batch == 1)
        assert not set(later.deps) & set(gathers)


def test_overlapping_the_dp_traffic_shortens_a_step_across_nodes():
    """The same run under DeepSpeed v0.2's stage 1 (reduce after backward, gather after the step) and under
    Megatron-Core's overlap: the overlapped step is shorter, and no longer than its compute allows."""
    from zsim.engine.simulation import simulate

    base = small_dict(model={"grad_accum": 2, "layers": 8, "hidden": 1024, "seq_len": 512},
                      parallel={"dp": 8, "mp": 4}, precision={"dtype": "bf16"}, hardware={"profile": "dgx-a100", "nodes": 4},
                      zero={"stage": 1, "activation_checkpointing": False, "overlap_comm": True})
    v02 = simulate(build_scenario(base, source="<test>"))
    base["zero"].update(implementation="megatron-core", overlap_param_gather=True, ddp_bucket_elements=2_000_000)
    mcore = simulate(build_scenario(base, source="<test>"))
    assert mcore.step_seconds[-1] < v02.step_seconds[-1]
    assert mcore.step_seconds[-1] >= mcore.compute_seconds


def test_model_states_count_the_fp32_gradient_buffer():
    s = _scenario()
    w = scenario_workload(s)
    states = rank_model_states(s, w)
    padded = sum(b.elements for b in chunk_buckets(s, w.modules))
    assert padded % 8 == 0 and padded >= w.params_per_mp_rank
    assert states.grads == 4 * padded
    assert states.params == 2 * padded


@pytest.mark.parametrize("zero, key", [
    ({"stage": 2, "implementation": "megatron-core"}, "zero.implementation"),
    ({"stage": 1, "implementation": "megatron-core", "constant_buffers": False}, "zero.constant_buffers"),
    ({"stage": 1, "implementation": "megatron-core", "defragment": True}, "zero.defragment"),
    ({"stage": 1, "overlap_param_gather": True}, "zero.overlap_param_gather"),
    ({"stage": 0, "implementation": "megatron-core", "overlap_param_gather": True}, "zero.overlap_param_gather"),
    ({"stage": 1, "ddp_bucket_elements": 1000}, "zero.ddp_bucket_elements"),
])
def test_the_loader_refuses_what_megatron_core_has_not(zero, key):
    with pytest.raises(ZsimError, match=key.replace(".", r"\.")):
        small_scenario(zero={"activation_checkpointing": False, **zero})


def test_zsim_run_names_the_key_and_exits_2(tmp_path, capsys):
    import yaml

    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(small_dict(zero={"stage": 3, "implementation": "megatron-core"})))
    assert main(["run", str(path), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "zero.implementation" in err and "megatron-core" in err and "Traceback" not in err


def test_a_pipeline_buckets_only_its_first_stage_and_sums_the_tied_embedding_in_fp32():
    """pp 2, tied head: stage 0 is bucketed with the word embedding a bucket of its own (reduced last, after the
    embedding's backward); stage 1 is one bucket but for the head's copy of that weight, its own bucket, reduced
    right after the head's backward; both then all-reduce the fp32 embedding gradient over the embedding group."""
    s = small_scenario(model={"grad_accum": 4, "layers": 4}, parallel={"dp": 4, "mp": 4, "pp": 2,
                                                                        "pipeline_schedule": "1f1b"},
                       zero={"stage": 1, "activation_checkpointing": False, "implementation": "megatron-core",
                             "ddp_bucket_elements": 300_000},
                       precision={"dtype": "bf16"}, hardware={"profile": "dgx-a100", "nodes": 4})
    w = scenario_workload(s)
    plan = build_plan(s, w)
    embed = w.modules[0].tensors[0]
    for stage, closers in ((0, None), (1, ["head", "layer.2"])):
        ops = [op for op in plan.ops if op.stage == stage]
        reductions = [op for op in ops if op.name.startswith("reduce_scatter/grads.")]
        names = [plan.ops[op.deps[0]].name for op in reductions]  # the backward each waits for
        if closers is not None:  # the head's word-embedding copy alone, then the rest of the stage
            assert names == [f"bwd/{c}" for c in closers]
            assert reductions[0].nbytes >= 4 * embed
        else:  # several buckets, the embedding's own last (closed by the embedding's backward)
            assert len(reductions) > 2 and names[-1] == "bwd/embed"
            assert embed <= reductions[-1].nbytes // 4 < embed + 128 * 4
        (summed,) = [op for op in ops if op.name == "all_reduce/embed"]
        assert summed.nbytes == 4 * embed and summed.group == "embed"
