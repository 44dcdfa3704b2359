"""Where the step of a `zero.implementation: deepspeed-0.5` point of `zsim validate scale` goes: the list copies
(the reduce-scatters' input lists, the gathers' copy-outs), the gathers' transfers, the copy-out launches on
the 'host' lane (beside the transfers), and the compute. The figures behind docs/zero-implementations.md
("How the last row came about").

Run: .venv/bin/python benchmarks/deepspeed05_lists.py [POINT ...]   (~10 s for the six Selene points)

Seconds of step 0 of rank 0, from the simulated trace: `copy/grads.*` (reduce-scatter lists, host-bound:
Nd narrows and Nd copy launches per tensor), `fetch_host/*` (the host's narrows and Python before each gather,
the device idle), `copy/params.*` (the copy-outs' GPU time), `launch/params.*`
(their launches, on the 'host' lane while the transfer runs), `all_gather/params.*` (the per-tensor
transfers, in line) and the forward, recompute and backward kernels.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from zsim.engine.simulation import simulate  # noqa: E402
from zsim.scenario.scenario import build_scenario  # noqa: E402
from zsim.validate import scale  # noqa: E402

PARTS = (("RS lists", "copy/grads."), ("fetch host", "fetch_host/"), ("copy-outs", "copy/params."),
         ("launches", "launch/params."),
         ("gathers", "all_gather/params."), ("fwd+rec+bwd", ("fwd/", "recompute/", "bwd/")))


def breakdown(point) -> tuple[float, dict[str, float]]:
    """(step seconds, seconds per part of PARTS) of `point`'s scenario, one step simulated with its trace."""
    data = {"name": point.id, **copy.deepcopy(point.scenario), "run": {"steps": 1}}
    result = simulate(build_scenario(data, source="scale.yaml", default_name=point.id), trace=True)
    spans = [e for e in result.events if e.get("ph") == "X" and e.get("pid") == 0]
    parts = {name: sum(e["dur"] for e in spans if e["name"].startswith(prefix)) / 1e6 for name, prefix in PARTS}
    return result.step_seconds[0], parts


def main(ids: list[str]) -> None:
    points, _ = scale.load_suite(scale.default_suite())
    chosen = [p for p in points if p.scenario and p.scenario.get("zero", {}).get("implementation") == "deepspeed-0.5"
              and (not ids or p.id in ids)]
    unknown = sorted(set(ids) - {p.id for p in chosen})
    if unknown:
        sys.exit(f"deepspeed05_lists: {', '.join(unknown)}: not a deepspeed-0.5 point of zsim/validate/suites/scale.yaml")
    print("seconds of step 0: RS lists = the reduce-scatters' input lists; fetch host = the host's narrows and Python\n"
          "before each gather; copy-outs = the gathers' copy-outs on the GPU; launches = their launches, on the host lane\n"
          "beside the transfers; gathers = the per-tensor transfers")
    print(f"{'point':<16}{'half':<13}{'step s':>8}" + "".join(f"{name:>13}" for name, _ in PARTS))
    for p in chosen:
        step, parts = breakdown(p)
        print(f"{p.id:<16}{p.half:<13}{step:8.1f}" + "".join(f"{parts[name]:13.1f}" for name, _ in PARTS))


if __name__ == "__main__":
    main(sys.argv[1:])
