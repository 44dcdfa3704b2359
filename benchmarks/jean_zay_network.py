"""BigScience's 52B ZeRO-3 runs on Jean Zay (zsim validate scale, cluster jean-zay-v100) with the network
of the datasheet and with the network Jean Zay's own all_reduce measured the same week: how much of the
miss is the network (docs/validation.md, "Jean Zay").

The measurement: github.com/bigscience-workshop/bigscience experiments/bandwidth/README.md (commit 6c80f84,
2021-05-24), a 4 GB fp32 all_reduce on 16 nodes / 64 GPUs, "algo throughput: 55.0766 Gbps" (44-57 when
run longer). Its script (all_reduce_bench.py at that commit) prints 2 x bytes / time in Gb/s, so the
busbw is 55.0766 / 16 x 2 x 63/64 = 6.78 GB/s. `hardware.nic_Gbps` is set so that zsim's own all_reduce
on that layout gives that busbw (one measurement: the rate it fixes is the network's, not a fit to
the training runs). Their January 2022 run on 4 nodes (NCCL 2.10.3, all_reduce_bench-32gb-4n.txt:
busbw 84.7 Gb/s = 10.6 GB/s) is printed beside zsim's at the same rate, as a check.

Run: .venv/bin/python benchmarks/jean_zay_network.py   (~5 s; prints three tables)
"""

from __future__ import annotations

import copy

from zsim.engine.simulation import simulate
from zsim.fabric.cluster import load_cluster
from zsim.fabric.perf import run_collective
from zsim.scenario.scenario import build_scenario
from zsim.validate import scale

BENCH_BUSBW = 55.0766 / 16 * 2 * 63 / 64  # GB/s: 16 nodes, 64 GPUs, 4 GB all_reduce, May 2021 (docstring)
CHECK_BUSBW = 84.7 / 8  # GB/s: 4 nodes, 16 GPUs, January 2022, NCCL 2.10.3 (docstring)
SIZE = 4 * 10**9  # bytes: the script's N x M fp32 matrix, 500000 x 2000 x 4


def busbw(nodes: int, nic_Gbps: float | None) -> float:
    """zsim's all_reduce busbw (GB/s) of SIZE bytes on `nodes` Jean Zay nodes, 4 GPUs each."""
    cluster = load_cluster("jean-zay-v100", nodes, nic_Gbps=nic_Gbps)
    return run_collective(cluster, "all_reduce", SIZE, 4 * nodes).busbw


def main() -> None:
    cluster = load_cluster("jean-zay-v100", 16)
    port = cluster.nic_bytes_per_s * 8 / 1e9 / cluster.network_efficiency  # Gb/s: the network profile's port
    measured_nic = port * BENCH_BUSBW / busbw(16, None)  # Gb/s a port; busbw scales with the NICs' rate at 4 GB
    print("all_reduce 4 GB, busbw GB/s          zsim datasheet  zsim at measured rate  Jean Zay measured")
    print(f"  16 nodes, 64 GPUs (May 2021)      {busbw(16, None):14.2f}  {busbw(16, measured_nic):21.2f}"
          f"  {BENCH_BUSBW:17.2f}")
    print(f"   4 nodes, 16 GPUs (Jan 2022)      {busbw(4, None):14.2f}  {busbw(4, measured_nic):21.2f}"
          f"  {CHECK_BUSBW:17.2f}")
    print(f"  (the measured rate: hardware.nic_Gbps={measured_nic:.1f})\n")
    suite = scale.default_suite()
    points, _ = scale.load_suite(suite)
    print(f"{'point':<12}{'half':<13}{'published s':>12}{'datasheet s':>12}{'error':>8}{'measured-net s':>15}{'error':>8}")
    for p in points:
        if p.cluster != "jean-zay-v100":
            continue
        steps = []
        for nic in (None, measured_nic):
            data = {"name": p.id, **copy.deepcopy(p.scenario), "run": {"steps": 1}}
            if nic is not None:
                data["hardware"]["nic_Gbps"] = round(nic, 3)
            steps.append(simulate(build_scenario(data, source=str(suite), default_name=p.id), trace=False)
                         .step_seconds[0])
        pub = float(p.published["step_s"])
        print(f"{p.id:<12}{p.half:<13}{pub:>12.1f}{steps[0]:>12.1f}{steps[0] / pub - 1:>+8.1%}"
              f"{steps[1]:>15.1f}{steps[1] / pub - 1:>+8.1%}")
    tp4 = next(p for p in points if p.id == "jz-52b-tp4")
    print("\njz-52b-tp4 against its log (meg_ds_zero_gpt2_perf_n16_nbs48_ms48.out, steps 1-3): forward 34.6-35.7 s, "
          "backward 85.9-90.3 s;\nafter step 1 max allocated 26,118 MiB, max reserved 28,234 MiB (torch.cuda, no "
          "CUDA context)")
    for nic in (None, measured_nic):
        data = {"name": tp4.id, **copy.deepcopy(tp4.scenario), "run": {"steps": 1}}
        if nic is not None:
            data["hardware"]["nic_Gbps"] = round(nic, 3)
        r = simulate(build_scenario(data, source=str(suite), default_name=tp4.id))
        spans = [e for e in r.events if e.get("ph") == "X"]
        bwd = min(e["ts"] for e in spans if e["name"].startswith(("bwd", "recompute")))
        opt = min(e["ts"] for e in spans if e["name"].startswith("optimizer"))
        context = r.ledger.peak_by_category["context"]
        print(f"  zsim, {'datasheet' if nic is None else 'measured'} network: forward {bwd / 1e6:.1f} s, backward "
              f"{(opt - bwd) / 1e6:.1f} s; allocated {(r.ledger.peak - context) / 2**20:,.0f} MiB, reserved "
              f"{(r.ledger.peak_reserved - context) / 2**20:,.0f} MiB")


if __name__ == "__main__":
    main()
