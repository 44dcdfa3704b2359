"""The Kineto importer matches NCCL kernels within their process group, and takes send/recv kernels
as communication (issue 26): synthetic traces of 4 ranks in two kinds of groups, and the real ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zsim.errors import ConfigError
from zsim.trace.kineto import _algorithm, read_rank
from zsim.trace.kineto_run import read_kineto

AR = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"  # NCCL >= 2.19 naming


def kernel(ts, dur, name=AR, stream=7, **args):
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": stream,
            "args": {"stream": stream, **args}}


def allreduce(ts, dur, ranks, pg, nelems=1024, stream=7):
    return kernel(ts, dur, stream=stream, **{"Collective name": "allreduce", "In msg nelems": nelems,
                                             "Out msg nelems": nelems, "Group size": len(ranks), "dtype": "Float",
                                             "Process Group Name": pg, "Process Group Ranks": str(list(ranks))})


def write(folder: Path, rank: int, world: int, events: list) -> Path:
    folder.mkdir(exist_ok=True)
    path = folder / f"rank{rank}.pt.trace.json"
    path.write_text(json.dumps({"traceEvents": events, "distributedInfo": {"rank": rank, "world_size": world}}))
    return path


def test_collectives_are_matched_within_their_group_not_across(tmp_path):
    """4 ranks: DP groups {0,2} {1,3} ("1", "2") on stream 7 and MP groups {0,1} {2,3} ("3", "4") on
    stream 9, each rank interleaving them differently in time. Matching the k-th NCCL kernel of every rank
    (the old behaviour) would pair rank 0's DP all-reduce with rank 1's MP one."""
    dp = {0: (0, 2), 2: (0, 2), 1: (1, 3), 3: (1, 3)}
    mp = {0: (0, 1), 1: (0, 1), 2: (2, 3), 3: (2, 3)}
    dp_name = {(0, 2): "1", (1, 3): "2"}
    mp_name = {(0, 1): "3", (2, 3): "4"}
    # (start, dur) of each rank's DP and MP all-reduce: in DP group {0,2} rank 2 arrives last (t=50) and its
    # kernel (10 us) is the transfer; in MP group {0,1} rank 1 arrives last (t=31)
    dp_times = {0: (40, 20), 2: (50, 10), 1: (5, 14), 3: (12, 7)}
    mp_times = {0: (10, 25), 1: (31, 4), 2: (20, 6), 3: (21, 5)}
    for r in range(4):
        write(tmp_path, r, 4, [allreduce(*dp_times[r], dp[r], dp_name[dp[r]], nelems=4096),
                               allreduce(*mp_times[r], mp[r], mp_name[mp[r]], nelems=256, stream=9)])
    run = read_kineto([tmp_path])
    matched = run.matched()
    assert len(matched) == 4 and all(len(m) == 2 for m in matched)
    assert all(len({c.key for c in m}) == 1 and len({c.nbytes for c in m}) == 1 for m in matched)
    transfers = {(m[0].ranks, m[0].nbytes): max(m, key=lambda c: c.start_us).dur_us for m in matched}
    assert transfers == {((0, 2), 4096 * 4): 10, ((1, 3), 4096 * 4): 7, ((0, 1), 256 * 4): 4, ((2, 3), 256 * 4): 5}
    assert sorted(s.seconds * 1e6 for s in run.samples()) == [4, 5, 7, 10]
    assert all(s.group == 2 for s in run.samples())


def test_trace_driven_replay_waits_for_the_members_of_each_group_only(tmp_path):
    """The identity replay (measured transfers kept) of the two-group run, with a send kernel on each rank
    kept at its measured time, reproduces the measured span: a collective starts when its own group's
    members are ready, not when every rank is."""
    from zsim.calibrate.kineto_replay import replay_kineto

    dp = {0: (0, 2), 2: (0, 2), 1: (1, 3), 3: (1, 3)}
    mp = {0: (0, 1), 1: (0, 1), 2: (2, 3), 3: (2, 3)}
    dp_times = {0: (40, 20), 2: (50, 10), 1: (5, 14), 3: (12, 7)}
    mp_times = {0: (10, 25), 1: (31, 4), 2: (20, 6), 3: (21, 5)}
    for r in range(4):
        write(tmp_path, r, 4, [allreduce(*dp_times[r], dp[r], str(dp[r]), nelems=4096),
                               allreduce(*mp_times[r], mp[r], str(mp[r]), nelems=256, stream=9),
                               kernel(70, 6, SENDRECV_NEW, **{"Collective name": "send", "In msg nelems": 10,
                                                              "dtype": "Float"}),
                               kernel(0, 3, "void at::native::vectorized_elementwise_kernel<4>()")])
    result = replay_kineto(read_kineto([tmp_path]), None)
    assert result["measured_span_s"] == pytest.approx(76e-6) and result["simulated_span_s"] == pytest.approx(76e-6)


def test_two_groups_of_the_same_ranks_are_kept_apart_by_name(tmp_path):
    """DDP's default group and a second group over the same two ranks: matched by name, not by ranks."""
    for r, (a, b) in enumerate([((0, 3), (10, 8)), ((5, 4), (2, 9))]):  # each rank issues them in its own order
        write(tmp_path, r, 2, [allreduce(*a, (0, 1), "0", nelems=100), allreduce(*b, (0, 1), "1", nelems=200)])
    run = read_kineto([tmp_path])
    assert sorted((m[0].pg, m[0].nbytes) for m in run.matched()) == [("0", 400), ("1", 800)]


def test_a_group_count_that_differs_between_members_is_named(tmp_path):
    write(tmp_path, 0, 2, [allreduce(1, 1, (0, 1), "0"), allreduce(5, 1, (0, 1), "0")])
    write(tmp_path, 1, 2, [allreduce(1, 1, (0, 1), "0")])
    with pytest.raises(ConfigError, match=r"process group '0' \(ranks 0-1\) \{0: 2, 1: 1\}"):
        read_kineto([tmp_path])


@pytest.mark.parametrize("args, message", [
    ({"Process Group Ranks": "[0, 5]"}, "are not distinct ranks 0 to 1"),
    ({"Process Group Ranks": "[0, 0]"}, "are not distinct ranks"),
    ({"Process Group Ranks": "[0, 1, "}, "is not a list of ranks"),
    ({"Process Group Ranks": "[1]", "Group size": 1}, "rank 0 is not in its own collective's group"),
    ({"Process Group Ranks": "[]", "Group size": 1, "Process Group Name": "7"}, "a group of 1 of the 2 ranks"),
])
def test_a_group_the_trace_cannot_name_is_refused(tmp_path, args, message):
    event = allreduce(1, 1, (0, 1), "0")
    event["args"].update(args)
    with pytest.raises(ConfigError, match=message):
        read_rank(write(tmp_path, 0, 2, [event]))


def test_a_group_named_only_in_pg_config_takes_its_ranks_from_there(tmp_path):
    event = allreduce(1, 1, (0, 1), "5")
    event["args"].update({"Process Group Ranks": "[]", "Group size": 2})
    path = write(tmp_path, 2, 4, [dict(event, args={**event["args"], "Process Group Ranks": "[]"})])
    doc = json.loads(path.read_text())
    doc["distributedInfo"]["pg_config"] = [{"pg_name": "5", "ranks": [2, 3]}]
    path.write_text(json.dumps(doc))
    assert read_rank(path).collectives[0].ranks == (2, 3)


SENDRECV_OLD = "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)"
SENDRECV_NEW = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"


def test_send_and_recv_are_communication_not_compute(tmp_path):
    events = [kernel(1, 5, SENDRECV_NEW, **{"Collective name": "send", "In msg nelems": 10, "dtype": "Float"}),
              kernel(10, 5, SENDRECV_NEW, **{"Collective name": "recv", "Out msg nelems": 10, "dtype": "Float"}),
              kernel(20, 3, "void at::native::vectorized_elementwise_kernel<4>()")]
    rank = read_rank(write(tmp_path, 0, 2, events))
    assert [k["ts"] for k in rank.p2p] == [1, 10]
    assert [k["name"] for k in rank.kernels] == ["void at::native::vectorized_elementwise_kernel<4>()"]
    assert rank.collectives == []


def _launched(name, cat, ts, dur, tid, correlation=None, **args):
    if correlation is not None:
        args["correlation"] = correlation
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid, "args": args}


def test_older_send_recv_annotations_and_an_unannotated_sendrecv_kernel_are_point_to_point(tmp_path):
    """Older format: `nccl:send` / `nccl:recv` annotations launch ncclKernel_SendRecv kernels; a SendRecv
    kernel launched outside any annotation (a batched isend/irecv) is point-to-point too."""
    float_dims = {"Input Dims": [[256]], "Input type": ["float"]}
    events = [
        _launched("nccl:send", "user_annotation", 0, 10, 1, **float_dims),
        _launched("cudaLaunchKernel", "cuda_runtime", 2, 3, 1, correlation=11),
        _launched("nccl:all_reduce", "user_annotation", 20, 10, 1, **float_dims),
        _launched("cudaLaunchKernel", "cuda_runtime", 22, 3, 1, correlation=12),
        _launched("cudaLaunchKernel", "cuda_runtime", 40, 3, 1, correlation=13),
        kernel(5, 50, SENDRECV_OLD, correlation=11),
        kernel(60, 5, "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*)", correlation=12),
        kernel(70, 8, SENDRECV_OLD, correlation=13),
    ]
    rank = read_rank(write(tmp_path, 0, 2, events))
    assert [k["args"]["correlation"] for k in rank.p2p] == [11, 13]
    assert [(c.op, c.nbytes, c.dur_us) for c in rank.collectives] == [("all_reduce", 1024, 5)]
    assert rank.kernels == []


def test_older_annotations_are_linked_to_kernels_by_launch_not_by_issue_order(tmp_path):
    """Two host threads issue collectives (forward on the main thread, backward on autograd's, as in the
    DLRM trace): the kernel launched inside the broadcast annotation is the broadcast, though the
    all-reduce annotation on the other thread started first."""
    events = [
        _launched("nccl:all_reduce", "user_annotation", 0, 100, 1, **{"Input Dims": [[1000]], "Input type": ["float"]}),
        _launched("nccl:broadcast", "user_annotation", 10, 5, 2, **{"Input Dims": [[7]], "Input type": ["float"]}),
        _launched("cudaLaunchKernel", "cuda_runtime", 12, 1, 2, correlation=1),
        _launched("cudaLaunchKernel", "cuda_runtime", 90, 1, 1, correlation=2),
        kernel(20, 4, "ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclDevComm*)", correlation=1),
        kernel(95, 30, "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*)", correlation=2),
    ]
    rank = read_rank(write(tmp_path, 0, 2, events))
    assert [(c.op, c.nbytes) for c in rank.collectives] == [("broadcast", 28), ("all_reduce", 4000)]


def test_an_older_trace_with_collectives_on_two_streams_is_refused(tmp_path):
    """Without group names, two NCCL streams are two groups whose ranks the trace does not say."""
    ann = {"Input Dims": [[8]], "Input type": ["float"]}
    events = [_launched("nccl:all_reduce", "user_annotation", 0, 1, 1, **ann),
              _launched("nccl:all_reduce", "user_annotation", 5, 1, 1, **ann),
              kernel(2, 1, "ncclKernel_AllReduce_RING_LL_Sum_float()", stream=7),
              kernel(8, 1, "ncclKernel_AllReduce_RING_LL_Sum_float()", stream=9)]
    with pytest.raises(ConfigError, match=r"NCCL collectives on 2 streams \(7, 9\).*does not say which ranks"):
        read_rank(write(tmp_path, 0, 2, events))


@pytest.mark.parametrize("name, expected", [
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", "ring/LL"),
    ("ncclKernel_AllGather_RING_LL128_Sum_int8_t(ncclDevComm*)", "ring/LL128"),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "ring/LL"),
    ("ncclDevKernel_AllReduce_Sum_f32_TREE_SIMPLE(x)", "tree/Simple"),
    ("ncclDevKernel_AllReduce_Sum_bf16_NVLS_TREE_SIMPLE(x)", "nvls_tree/Simple"),
    ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", "?/?"),
])
def test_the_algorithm_and_protocol_are_read_from_either_naming(name, expected):
    assert _algorithm(name) == expected


# ---- the real traces (../shared/data/kineto) ------------------------------------------------------------

def test_dlrm_all_to_all_runs_sendrecv_kernels_and_stays_a_collective(shared_data):
    """NCCL implements all_to_all with SendRecv kernels: under an `nccl:all_to_all` annotation the kernel
    is that collective, found by its launch (the annotations come from two threads)."""
    run = read_kineto([shared_data / "kineto/dlrm-8xv100"])
    for r in run.ranks:
        assert [c.op for c in r.collectives].count("all_to_all") == 5 and r.p2p == []
        assert all(c.ranks == tuple(range(8)) for c in r.collectives)
        assert not any("SendRecv" in k["name"] or k["name"].startswith("nccl") for k in r.kernels)
    assert len(run.matched()) == 8 and all(len(m) == 8 for m in run.matched())


def test_a100_collectives_carry_their_named_group(shared_data):
    rank = read_rank(shared_data / "kineto/a100-2rank-nccl-metadata/rank0.pt.trace.json.gz")
    assert {c.key for c in rank.collectives} == {("0", (0, 1))}
    assert len(rank.collectives) == 21 and rank.p2p == []
