"""Extract the per-step times of MLPerf Training submissions' logs into steps.csv (this folder; SOURCE.md says
which repositories, commits and systems). Plain Python 3, stdlib only.

    python3 tools/extract.py /path/to/training_results_v3.0 ... | gzip -9 -n > steps.csv.gz   # and writes systems.csv

Each argument is a local git checkout (or bare mirror) of github.com/mlcommons/training_results_vX.Y. For every
result_*.txt of the systems listed in SYSTEMS it reads the ':::MLLOG' lines (any prefix before them, as Nebius's
'   0: ' rank tags, is dropped) and writes one row per logged step: NeMo's per-step timer (tracked_stats
"train_step_timing", "train_step_timing in s" or "train_step_time", seconds), or for a log without one (v4.0) one row
per block_start/block_stop interval with the tokens it trained (kind "block"); and each system's logged
global_batch_size, gradient_accumulation_steps and max_sequence_length into systems.csv."""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
from pathlib import Path

SYSTEMS = {  # round -> system folders (results/<system>/<benchmark>) taken as points of `zsim validate modern`
    "v3.0": ["NVIDIA/results/dgxh100_n64_nemo/gpt3", "NVIDIA/results/dgxh100_n96_nemo/gpt3",
             "NVIDIA_CoreWeave/results/coreweave_hgxh100_n96_ngc23.04_pytorch/gpt3",
             "NVIDIA_CoreWeave/results/coreweave_hgxh100_n192_ngc23.04_pytorch/gpt3",
             "NVIDIA_CoreWeave/results/coreweave_hgxh100_n448_ngc23.04_pytorch/gpt3"],
    "v3.1": ["NVIDIA/results/eos_n64_ngc23.09_nemo/gpt3", "NVIDIA/results/eos_n96_ngc23.09_nemo/gpt3",
             "NVIDIA/results/eos-dfw_n512_ngc23.09_nemo/gpt3", "NVIDIA/results/eos-dfw_n768_ngc23.09_nemo/gpt3",
             "NVIDIA/results/eos-dfw_n1024_ngc23.09_nemo/gpt3", "NVIDIA/results/eos-dfw_n1280_ngc23.09_nemo/gpt3",
             "NVIDIA/results/eos-dfw_n1344_ngc23.09_nemo/gpt3", "Azure+NVIDIA/results/ND_H100_v5_n1344_pytorch/gpt3"],
    "v4.0": ["NVIDIA/results/eos_n64_ngc24.04_nemo/gpt3", "NVIDIA/results/eos-dfw_n1344_ngc24.04_nemo/gpt3",
             "NVIDIA/results/eos-dfw_n1452_ngc24.04_nemo/gpt3"],
    "v4.1": ["NVIDIA/results/eos_n32_ngc24.09_nemo/gpt3", "NVIDIA/results/eos_n64_ngc24.09_nemo/gpt3",
             "NVIDIA/results/b200_n8_preview_nemo/gpt3"],
    "v5.0": ["NVIDIA/results/eos-dfw_n64_ngc25.01_nemo/llama31_405b", "NVIDIA/results/eos-dfw_n256_ngc25.01_nemo/llama31_405b",
             "NVIDIA/results/eos-dfw_n304_ngc25.01_nemo/llama31_405b", "NVIDIA/results/eos-dfw_n320_ngc25.01_nemo/llama31_405b",
             "NVIDIA/results/eos-dfw_n1024_ngc25.01_nemo/llama31_405b",
             "Nebius/results/nebius_soperator_8xH200_n64_ngc25.01_nemo/llama31_405b",
             "Nebius/results/nebius_soperator_8xH200_n128_ngc25.01_nemo/llama31_405b",
             "NVIDIA/results/tyche_ngpu256_ngc25.04_nemo/llama31_405b", "NVIDIA/results/tyche_ngpu512_ngc25.04_nemo/llama31_405b",
             "IBM+CoreWeave+NVIDIA/results/carina_ngpu512_ngc25.04_nemo/llama31_405b",
             "IBM+CoreWeave+NVIDIA/results/carina_ngpu1024_ngc25.04_nemo/llama31_405b",
             "IBM+CoreWeave+NVIDIA/results/carina_ngpu1536_ngc25.04_nemo/llama31_405b",
             "IBM+CoreWeave+NVIDIA/results/carina_ngpu2048_ngc25.04_nemo/llama31_405b",
             "IBM+CoreWeave+NVIDIA/results/carina_ngpu2496_ngc25.04_nemo/llama31_405b"],
    "v5.1": ["University-of-Florida/results/hpg.dgxb200x8.n1/llama31_8b",
             "University-of-Florida/results/hpg.dgxb200x8.n8/llama31_8b",
             "NVIDIA/results/tyche_ngpu72_ngc25.09_nemo/llama31_8b", "NVIDIA/results/tyche_ngpu512_ngc25.09_nemo/llama31_8b",
             "Dell/results/2xXE9680Lx8B200-SXM-180GB/llama31_8b", "Dell/results/2xXE9685Lx8B200-SXM-180GB/llama31_8b",
             "Oracle/results/8xBM.GPU.B200.8/llama31_8b", "Verda/results/b200_8x8_ngc25.09/llama31_8b",
             "NVIDIA/results/tyche_ngpu512_ngc25.09_nemo/llama31_405b", "NVIDIA/results/hsg_ngpu2560_ngc25.09_nemo/llama31_405b",
             "NVIDIA/results/hsg_ngpu5120_ngc25.09_nemo/llama31_405b", "NVIDIA/results/theia_ngpu512_ngc25.09_nemo/llama31_405b",
             "NVIDIA/results/theia_ngpu72_ngc25.09_nemo/llama31_8b", "NVIDIA/results/theia_ngpu512_ngc25.09_nemo/llama31_8b",
             "NVIDIA/results/tyche_ngpu8_ngc25.09_nemo/llama31_8b", "NVIDIA/results/theia_ngpu8_ngc25.09_nemo/llama31_8b",
             "Oracle/results/1xBM.GPU.B200.8/llama31_8b", "Nebius/results/nebius_b200_n1/llama31_8b",
             "Nebius/results/nebius_b200_n2/llama31_8b", "Nebius/results/nebius_b200_n4/llama31_8b",
             "Supermicro/results/AS-4126GS-NBR-LCC/llama31_8b", "Supermicro/results/SYS-422GS-NBRT-LCC/llama31_8b",
             "Nebius/results/nebius_b300_n1/llama31_8b", "Dell/results/1xXE9780x8B300-SXM-270GB/llama31_8b",
             "Supermicro/results/AS-8126GS-NB3RT/llama31_8b", "Lambda/results/gb300_n18_ngc25.04_nemo/llama31_8b",
             # the twelfth session's (2026-11-29): Dell's and Lenovo's 1-node B200 and B300 runs, UF's 2-32-node 8B
             # and 32- and 56-node 405B runs (their logs print no configuration; each submitter's config of the node
             # count is published)
             "Dell/results/1xXE9680Lx8B200-SXM-180GB/llama31_8b", "Lenovo/results/SR680aV3-8xB200_SXM_180GB/llama31_8b",
             "Lenovo/results/SR780aV3-8xB200_SXM_180GB/llama31_8b", "Lenovo/results/SR680aV4-8xB300_SXM/llama31_8b",
             "University-of-Florida/results/hpg.dgxb200x8.n2/llama31_8b",
             "University-of-Florida/results/hpg.dgxb200x8.n4/llama31_8b",
             "University-of-Florida/results/hpg.dgxb200x8.n16/llama31_8b",
             "University-of-Florida/results/hpg.dgxb200x8.n32/llama31_8b",
             "University-of-Florida/results/hpg.dgxb200x8.n32/llama31_405b",
             "University-of-Florida/results/hpg.dgxb200x8.n56/llama31_405b",
             # HPE's 8-node H200 run (its log prints its configuration)
             "HPE/results/HPE-Cray-XD670-H200-SXM5-141GB_n8_25.09/llama31_8b",
             # Cisco's 8- and 16-node DGX H100 runs (logs without a configuration; its configs of both node counts)
             "Cisco/results/hpf_n8/llama31_8b", "Cisco/results/hpf_n16/llama31_8b"],
}
TIMERS = ("train_step_timing", "train_step_timing in s", "train_step_time")


def git(repo: str, *args: str) -> str:
    return subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True, check=True).stdout


def main(repos: list[str]) -> None:
    """steps.csv on stdout (round, system, benchmark, log, kind, index, seconds, tokens) and systems.csv beside it (round,
    commit, system, benchmark, global_batch_size, gradient_accumulation_steps, seq_len); `system` is the results
    folder's name."""
    out = csv.writer(sys.stdout, lineterminator="\n")
    out.writerow(["round", "system", "benchmark", "log", "kind", "index", "seconds", "tokens"])
    facts = []
    for repo in repos:
        found = re.search(r"training_results_(v\d+\.\d+)", repo)
        if not found or found.group(1) not in SYSTEMS:
            sys.exit(f"{repo}: not a checkout of mlcommons/training_results_vX.Y of {', '.join(SYSTEMS)}")
        rnd = found.group(1)
        files = git(repo, "ls-tree", "-r", "--name-only", "HEAD").split()
        commit = git(repo, "rev-parse", "--short=9", "HEAD").strip()
        for path in SYSTEMS[rnd]:
            system, benchmark = path.split("/")[-2:]
            keys = {}
            for log in sorted(f for f in files if f.startswith(path + "/result_") and f.endswith(".txt")):
                steps, blocks, starts = [], [], {}
                for line in git(repo, "show", f"HEAD:{log}").splitlines():
                    if ":::MLLOG" not in line:
                        continue
                    e = json.loads(line.split(":::MLLOG", 1)[1])
                    key, value, block = e["key"], e["value"], e["metadata"].get("first_epoch_num")
                    if key in ("global_batch_size", "gradient_accumulation_steps", "max_sequence_length"):
                        keys[key] = value
                    elif key == "tracked_stats" and isinstance(value, dict):
                        steps += [value[t] for t in TIMERS if t in value]
                    elif key == "block_start" and block is not None:
                        starts[block] = e["time_ms"]
                    elif key == "block_stop" and block in starts:
                        blocks.append(((e["time_ms"] - starts[block]) / 1000, e["metadata"].get("epoch_count", "")))
                rows = [("step", t, "") for t in steps] or [("block", t, n) for t, n in blocks]
                for i, (kind, seconds, tokens) in enumerate(rows):
                    out.writerow([rnd, system, benchmark, log.rsplit("/", 1)[1], kind, i, f"{seconds:.6f}", tokens])
            facts.append([rnd, commit, system, benchmark, keys.get("global_batch_size"),
                          keys.get("gradient_accumulation_steps"), keys.get("max_sequence_length")])
    with open(Path(__file__).resolve().parents[1] / "systems.csv", "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["round", "commit", "system", "benchmark", "global_batch_size", "gradient_accumulation_steps",
                    "seq_len"])
        w.writerows(facts)


if __name__ == "__main__":
    main(sys.argv[1:])
