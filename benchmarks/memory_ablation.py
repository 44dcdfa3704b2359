"""The paper's C1-C5 (ZeRO Figure 6) largest models under zsim's memory model, and with one term of it
removed at a time, to show what each term is worth (docs/memory.md, "The paper's C1-C5").

    .venv/bin/python benchmarks/memory_ablation.py [final no_context one_pool one_step two_steps bucket5e8 md_deepspeed one_flat]

Each variant patches one piece of the model in this process only: `no_context` drops the CUDA context,
cuBLAS and NCCL reservations; `one_pool` serves every stream from one allocator pool; `one_step` searches
with one simulated step, `two_steps` with two, instead of until the allocator settles; `bucket5e8` uses
DeepSpeed's default buckets instead of the Megatron examples' 5e7; `md_deepspeed` holds checkpoints as
DeepSpeed's MD does (zero.md_checkpoints: deepspeed) instead of the paper's reserved buffer; `one_flat`
makes stage 1's second gradient copy one 2Ψ block instead of DeepSpeed's one tensor per sub-partition. Prints one line per variant (billions of parameters, layers). Minutes on 2 cores.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import zsim.commands.maxsize as maxsize
import zsim.zero.plan as plan
import zsim.zero.reductions as reductions
from zsim.scenario.scenario import build_scenario
from zsim.config.yamlfile import read_yaml_mapping
from zsim.engine.simulation import simulate
from zsim.memory.allocator import CachingAllocator
from zsim.memory.context import ContextMemory

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ("final", "no_context", "one_pool", "one_step", "two_steps", "bucket5e8", "md_deepspeed", "one_flat")


def _one_step_fits(data, layers, gpu_bytes, profiles=None):
    trial = copy.deepcopy(data)
    trial["model"]["layers"] = layers
    trial["model"].pop("global_batch", None)
    trial["model"]["grad_accum"] = 1
    trial.setdefault("run", {})["steps"] = 1
    r = simulate(build_scenario(trial, source="<ablation>", default_name="ablation", gpu_memory_bytes=gpu_bytes,
                                profiles=profiles))
    return maxsize.Trial(r.fits, r.workload.total_params, r.ledger.peak_reserved, 1, False)


def run(variant: str) -> str:
    if variant == "no_context":
        plan.context_memory = lambda *args: ContextMemory(0, 0, {})
    elif variant == "one_pool":
        malloc = CachingAllocator.malloc
        CachingAllocator.malloc = lambda self, tag, nbytes, stream="compute": malloc(self, tag, nbytes, "compute")
    elif variant == "one_step":
        maxsize.fits = _one_step_fits
    elif variant == "one_flat":
        reductions._stage1_flat_copy = lambda e, sub, nd, intervals, tag: (
            plan.Alloc("buffers", e * sub * nd * intervals, tag("all"), stream="compute"),)
    elif variant == "two_steps":
        maxsize.MAX_STEPS = 2  # the first two steps only, settled or not
    row = []
    for c in range(1, 6):
        data = read_yaml_mapping(ROOT / f"scenarios/paper/C{c}-100B-400gpu.yaml")
        if variant == "bucket5e8":
            data["zero"].update(reduce_bucket_elements=500_000_000, allgather_bucket_elements=500_000_000)
        elif variant == "md_deepspeed":
            data["zero"]["md_checkpoints"] = "deepspeed"
        m = maxsize.max_layers(data)
        row.append(f"C{c} {m.params / 1e9:.1f}B ({m.layers})")
    return f"{variant:<11} " + " | ".join(row)


if __name__ == "__main__":
    import subprocess

    chosen = sys.argv[1:] or list(VARIANTS)
    if len(chosen) == 1:
        print(run(chosen[0]), flush=True)
    else:  # one process per variant: the patches must not leak into the next one
        for v in chosen:
            subprocess.run([sys.executable, __file__, v], check=True)
