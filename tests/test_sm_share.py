"""fabric.sm_contention (zsim.engine.sm_share): collectives beside compute hold SMs and the compute stream runs on
the rest; the fluid rate in closed form, who holds how many SMs, a whole step, and the refusals."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import simpy
import yaml

from tests.conftest import small_dict, small_scenario
from zsim.engine.simulation import simulate
from zsim.engine.sm_share import DEEPEP_SMS, TE_BULK_SMS, TE_RING_SMS, SmShare, held_sms
from zsim.errors import ZsimError
from zsim.fabric.collective import nccl_channels
from zsim.scenario.scenario import build_scenario
from zsim.zero.ops import Op


def _share_run(holds: list[tuple[float, float, int]], seconds: float, sms: int = 132) -> float:
    """When a compute op of `seconds` alone, started at 0, ends while holds (start, end, SMs) come and go."""
    env = simpy.Environment()
    share = SmShare(env, sms)
    ended = []

    def holder(start: float, end: float, n: int):
        yield env.timeout(start)
        share.hold(n)
        yield env.timeout(end - start)
        share.release(n)

    def compute():
        yield from share.compute(seconds)
        ended.append(env.now)

    for h in holds:
        env.process(holder(*h))
    env.process(compute())
    env.run()
    assert share.held == 0
    return ended[0]


def test_a_hold_slows_the_compute_by_the_share_of_sms_it_takes_while_it_lasts():
    assert _share_run([], 1.0) == 1.0
    # 33 of 132 SMs held for 0.25 s of the op: 0.25 s at 3/4 speed, 0.0625 s of work left over
    assert _share_run([(0.25, 0.5, 33)], 1.0) == pytest.approx(1.0625, rel=1e-12)
    # held from before the op to after it: the whole op at 3/4 speed
    assert _share_run([(0.0, 5.0, 33)], 1.0) == pytest.approx(4 / 3, rel=1e-12)
    # two holds at once add up; after the op they change nothing
    assert _share_run([(0.0, 0.5, 33), (0.0, 0.5, 33), (2.0, 3.0, 66)], 1.0) == pytest.approx(1.25, rel=1e-12)
    # more than every SM held: the compute keeps one
    assert _share_run([(0.0, 10.0, 200)], 0.01, sms=100) == pytest.approx(1.0, rel=1e-12)


def _op(**kw) -> Op:
    return Op(name="x", stream=kw.pop("stream", "comm"), step=0, micro_batch=0, **kw)


def test_who_holds_how_many_sms():
    s = small_scenario(parallel={"dp": 4, "mp": 4}, hardware={"profile": "dgx-a100", "nodes": 2})
    c = s.cluster
    assert held_sms(_op(collective="reduce_scatter", group="dp", nbytes=1), c, "alltoall") == nccl_channels(c) == 12
    assert held_sms(_op(collective="all_to_all", group="ep", nbytes=1), c, "alltoall") == 12
    assert held_sms(_op(collective="all_to_all", group="ep", nbytes=1), c, "deepep") == DEEPEP_SMS == 20
    assert held_sms(_op(stream="tp", collective="reduce_scatter", group="mp", nbytes=1), c, "alltoall") == TE_BULK_SMS
    assert held_sms(_op(stream="tp", collective="all_gather", group="mp", nbytes=1), c, "alltoall") == TE_RING_SMS
    # in line on the compute stream nothing computes beside it; pipeline sends are not counted; compute holds none
    assert held_sms(_op(stream="compute", collective="all_reduce", group="mp", nbytes=1), c, "alltoall") == 0
    assert held_sms(_op(collective="send", group="pp", nbytes=1), c, "alltoall") == 0
    assert held_sms(_op(stream="compute", flops=1.0), c, "alltoall") == 0


def _zero3(contention: bool):
    return small_scenario(model={"grad_accum": 4}, parallel={"dp": 4, "mp": 4}, zero={"stage": 3, "overlap_comm": True},
                          hardware={"profile": "dgx-a100", "nodes": 2}, fabric={"sm_contention": contention})


def test_a_step_with_contention_is_its_compute_alone_plus_what_the_held_sms_cost():
    off, on = simulate(_zero3(False)), simulate(_zero3(True))
    assert off.contention_seconds == 0.0
    assert on.contention_seconds > 0.0
    # the compute stream's time: the same kernels alone, plus the time lost to the SMs collectives held
    assert on.compute_seconds - on.contention_seconds == pytest.approx(off.compute_seconds, rel=1e-9)
    assert on.step_seconds[0] > off.step_seconds[0]
    # no more than every side collective's time at the rate it leaves (12 of the A100's 108 SMs)
    side = sum(st.seconds for (group, kind), st in on.comm.items())
    assert on.contention_seconds <= side * 12 / (108 - 12)
    # every micro-batch simulated: the repeat proof adds compute alone (zsim.engine.repeat.applies)
    assert on.repeated_micro_batches == 0


def test_tp_overlap_holds_transformer_engines_sms_beside_the_gemms():
    def s(contention):
        return small_scenario(model={"grad_accum": 2, "layers": 4, "hidden": 1024, "heads": 16, "seq_len": 1024},
                              parallel={"dp": 4, "mp": 8, "sequence_parallel": True, "tp_comm_overlap": True},
                              zero={"stage": 1, "activation_checkpointing": False}, precision={"dtype": "bf16"},
                              hardware={"profile": "dgx-a100", "nodes": 4}, fabric={"sm_contention": contention})
    off, on = simulate(s(False)), simulate(s(True))
    assert on.contention_seconds > 0.0 and on.step_seconds[0] > off.step_seconds[0]
    assert on.compute_seconds - on.contention_seconds == pytest.approx(off.compute_seconds, rel=1e-9)


HOST = {"model": {"layers": 2, "hidden": 64, "heads": 4, "seq_len": 32, "vocab": 256, "micro_batch": 2},
        "parallel": {"dp": 2, "mp": 1}, "zero": {"stage": 3, "activation_checkpointing": False},
        "precision": {"dtype": "fp32"}, "hardware": {"profile": "dev-2core", "nodes": 1}}


@pytest.mark.parametrize("base, fabric, words", [
    (small_dict(parallel={"dp": 4, "mp": 4}, hardware={"profile": "dgx-a100", "nodes": 2}),
     {"sm_contention": True, "mode": "per_rank"}, "class mode only"),
    (small_dict(parallel={"dp": 4, "mp": 4}, hardware={"profile": "dgx-a100", "nodes": 2}),
     {"sm_contention": True, "degrade": [{"link": "nic", "node": 0, "factor": 0.5}]}, "class mode only"),
    (HOST, {"sm_contention": True}, "for GPUs"),
])
def test_refused_where_it_is_not_modelled(base, fabric, words):
    with pytest.raises(ZsimError, match=words) as info:
        build_scenario({**base, "fabric": fabric}, source="<test>", default_name="smc")
    assert "fabric.sm_contention" in str(info.value)


def test_zsim_run_prints_and_writes_the_contention(tmp_path):
    doc = {"name": "smc", "model": {"layers": 4, "hidden": 1024, "heads": 16, "seq_len": 512, "vocab": 32000,
                                    "micro_batch": 1, "grad_accum": 2},
           "parallel": {"dp": 16, "mp": 1}, "zero": {"stage": 3},
           "hardware": {"profile": "dgx-a100", "nodes": 2}, "fabric": {"sm_contention": True}}
    path = tmp_path / "smc.yaml"
    path.write_text(yaml.safe_dump(doc))
    out = subprocess.run([sys.executable, "-m", "zsim", "run", str(path), "-o", str(tmp_path / "out")],
                         capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "s of it lost to the SMs collectives held)" in out.stdout
    facts = json.loads((tmp_path / "out" / "result.json").read_text())
    assert facts["fabric"]["sm_contention"] is True
    assert facts["time"]["sm_contention_seconds_per_step"] > 0
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**doc, "fabric": {"sm_contention": True, "mode": "per_rank"}}))
    out = subprocess.run([sys.executable, "-m", "zsim", "run", str(bad)], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 2 and "fabric.sm_contention" in out.stderr and "Traceback" not in out.stderr


def test_a_callers_per_rank_mode_is_refused_too():
    """simulate(mode='per_rank') bypasses the loader's check: only rank 0 would share its SMs, so it is refused."""
    with pytest.raises(ZsimError, match="per-rank mode with fabric.sm_contention"):
        simulate(_zero3(True), mode="per_rank")
