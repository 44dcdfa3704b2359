"""Rewrite the golden key numbers after a deliberate model change: python -m tests.golden.regenerate
Review the diff: every changed number needs a reason in the commit message."""

import json
from pathlib import Path

from zsim.scenario.scenario import load_scenario
from zsim.engine.simulation import simulate
from zsim.report.facts import facts

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = {"1T-1024gpu": "scenarios/1T-1024gpu.yaml", "7.5B-64gpu-stage3": "scenarios/paper/7.5B-64gpu-stage3.yaml",
          "fig2-zero-100B": "scenarios/paper/fig2-zero-100B.yaml"}


def key_numbers(f: dict) -> dict:
    return {
        "params": f["model"]["params"],
        "params_per_mp_rank": f["model"]["params_per_mp_rank"],
        "model_states": f["memory"]["model_states"],
        "peak_bytes": f["memory"]["peak_bytes"],
        "peak_by_category": f["memory"]["peak_by_category"],
        "reserved_peak_bytes": f["memory"]["reserved_peak_bytes"],
        "fits": f["fits"],
        "step_seconds": f["time"]["step_seconds"],
        "compute_seconds_per_step": f["time"]["compute_seconds_per_step"],
        "dp_volume_bytes_per_step": f["comm"]["dp_volume_bytes_per_step"],
        "tflops_per_gpu": f["throughput"]["tflops_per_gpu"],
    }


def compute(name: str) -> dict:
    return key_numbers(facts(simulate(load_scenario(ROOT / GOLDEN[name]))))


if __name__ == "__main__":
    for name in GOLDEN:
        path = Path(__file__).parent / f"{name}.json"
        path.write_text(json.dumps(compute(name), indent=2) + "\n")
        print(f"wrote {path}")
