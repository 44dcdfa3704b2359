"""Which machine an input was measured on, and the refusal to blend two machines in one fit.

A calibrated profile describes one machine. Samples of another machine fitted into it give terms that
describe neither: issue 26 found DGX-2 nccl-tests tables (12 V100-SXM3 GPUs in one process on one
NVSwitch host) fitted onto the DGX-1 base (8 V100-SXM2 per node, a cube-mesh) written without a word
at a 62% median busbw error, because the DGX-1 profile placed the 12 GPUs on two nodes joined by
InfiniBand. So every input says what it knows about its machine (`Machine`), and `check_machines`
refuses (CalibrationError, exit 2) when

* two inputs name different GPUs (or CPUs): fit each on its own profile, never blended;
* an input's GPU (or CPU) is not the base profile's;
* an input ran more GPUs on one host than the base profile's nodes hold (NCCL's paths inside a node
  are not the ones between nodes, so the base's topology is not the measured one).

What an input does not state (a DeepBench table names no GPU; a runtime trace of a CPU run names no
GPU) cannot be checked: it is listed as "not stated" in the provenance, not guessed.

Where each input's machine comes from:
* nccl-tests tables: the `#  Rank  N ... on HOST device D [bus] NAME` header lines (NVIDIA/nccl-tests
  src/common.cu prints one per rank: host name and cudaDeviceProp.name);
* Kineto traces: `deviceProperties[0].name` of each rank's file (torch.profiler writes cudaDeviceProp);
* runtime traces: `metadata.gpu.name` (or a string `metadata.gpu`) for GPU runs, and
  `metadata.host_facts.cpu_model` (runtime/host.py, /proc/cpuinfo) for CPU runs;
* simulated traces: `metadata.hardware.gpu`, the GPU of the profile they were simulated on.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any


# nccl-tests' per-rank header line (src/common.cu: "#  Rank %2d Group %2d Pid %6d on %10s device %2d [%s] %s"),
# older releases without "Group"
_RANK_LINE = re.compile(r"^#\s*Rank\s+\d+\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device\s+\d+\s+\[[^\]]*\]\s+(.+?)\s*$")
# Vendor prefixes CUDA puts in front of a part's name ("Tesla V100-SXM2-32GB" before 2020, "NVIDIA
# A100-SXM4-40GB" after); the hardware profiles name the part without them.
_VENDOR = re.compile(r"^(?:nvidia\s+|tesla\s+)+", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Machine:
    """What one input states about the machine it was measured on; None where it does not say.

    gpu: the device name CUDA reported (e.g. 'Tesla V100-SXM3-32GB'); cpu: the CPU model of a CPU run;
    hosts: how many hosts ran it; per_host: the most GPUs (or ranks) one host ran."""

    source: str
    gpu: str | None = None
    cpu: str | None = None
    hosts: int | None = None
    per_host: int | None = None

    def facts(self) -> dict[str, Any]:
        """The stated facts, for the provenance ('not stated' when there are none)."""
        out = {k: v for k, v in (("gpu", self.gpu), ("cpu", self.cpu), ("hosts", self.hosts),
                                  ("per_host", self.per_host)) if v is not None}
        return out or {"stated": "nothing (cannot be checked against the base or the other inputs)"}


def part(name: str) -> str:
    """A device name without vendor prefixes, upper case: 'Tesla V100-SXM2-32GB' → 'V100-SXM2-32GB'."""
    return _VENDOR.sub("", name.strip()).upper()


def this_cpu() -> str:
    """This machine's CPU model name: /proc/cpuinfo's first "model name" on Linux, else platform.processor()
    (what the runtime records as host_facts.cpu_model, runtime/host.py)."""
    import platform

    info = Path("/proc/cpuinfo")
    if info.is_file():
        for line in info.read_text(errors="replace").splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def cpu_part(name: str) -> str:
    """A CPU model name without its clock suffix ('... Processor @ 2.50GHz' → '... Processor'), upper case:
    /proc/cpuinfo prints the clock on some hypervisors and not on others for the same part (this project's
    dev-2core profile was probed without it; its traces carry it)."""
    return re.sub(r"\s*@\s*[\d.]+\s*[GM]Hz\s*$", "", name.strip(), flags=re.IGNORECASE).upper()


def table_machine(path: Path, text: str) -> Machine:
    """The machine of one nccl-tests table, from its Rank header lines (`text`: the file's text)."""
    hosts: Counter[str] = Counter()
    gpus: set[str] = set()
    for line in text.splitlines():
        m = _RANK_LINE.match(line)
        if m:
            hosts[m.group(1)] += 1
            gpus.add(m.group(2))
    if not hosts:
        return Machine(str(path))
    return Machine(str(path), gpu=" / ".join(sorted(gpus)), hosts=len(hosts), per_host=max(hosts.values()))


def kineto_machine(source: str, device_names: list[str]) -> Machine:
    """The machine of a Kineto job from its ranks' device names ('unknown' where a file had none)."""
    names = sorted({n for n in device_names if n and n != "unknown"})
    return Machine(source, gpu=" / ".join(names) if names else None)


def run_machine(source: str, metadata: dict[str, Any]) -> Machine:
    """The machine of a runtime (or simulated) trace from its metadata (see the module docstring)."""
    gpu = metadata.get("gpu")
    gpu = gpu.get("name") if isinstance(gpu, dict) else gpu
    device = metadata.get("device_facts")  # the runtime's (runtime/device_facts.py): {"gpu": cudaDeviceProp.name}
    if gpu is None and isinstance(device, dict):
        gpu = device.get("gpu")
    hardware = metadata.get("hardware")
    if gpu is None and isinstance(hardware, dict):  # a simulated trace: the GPU of the profile it ran on
        gpu = hardware.get("gpu")
    facts = metadata.get("host_facts") if isinstance(metadata.get("host_facts"), dict) else {}
    on_cpu = str(metadata.get("device", "")).startswith("cpu") or metadata.get("backend") == "gloo"
    cpu = facts.get("cpu_model") if on_cpu else None
    per_host = facts.get("ranks_on_host")
    return Machine(source, gpu=str(gpu) if isinstance(gpu, str) and gpu else None,
                   cpu=str(cpu) if isinstance(cpu, str) and cpu else None,
                   per_host=per_host if isinstance(per_host, int) and per_host > 0 else None)


def profile_parts(cluster: Any) -> tuple[set[str], str | None]:
    """(the GPU part names the base profile accepts, its CPU model) of a loaded Cluster: its GPU's
    `name` and `device_names` (hwprofiles/gpus/), or for a host profile its `cpu`."""
    host = getattr(cluster, "host", None)
    if host is not None:
        return set(), getattr(host, "cpu", None)
    return {part(cluster.gpu.name), *(part(n) for n in getattr(cluster.gpu, "device_names", ()))}, None


def _sources(paths: list[str]) -> str:
    """Paths named compactly: the tables of one folder as 'FOLDER (N files)'."""
    by_parent: dict[str, list[str]] = {}
    for p in paths:
        by_parent.setdefault(str(Path(p).parent) if p.endswith(".txt") else p, []).append(p)
    return ", ".join(ps[0] if len(ps) == 1 else f"{parent} ({len(ps)} files)" for parent, ps in by_parent.items())


def mismatches(machines: list[Machine], cluster: Any, profile: str) -> list[str]:
    """Every reason the inputs cannot be fitted together onto `profile` (empty: they can), one line
    per reason, naming the inputs it concerns."""
    reasons: dict[str, list[str]] = {}  # reason -> the inputs it concerns
    for kind in ("gpu", "cpu"):
        stated = {m.source: getattr(m, kind) for m in machines if getattr(m, kind)}
        if len({(part if kind == "gpu" else cpu_part)(v) for v in stated.values()}) > 1:
            by_value: dict[str, list[str]] = {}
            for src, value in stated.items():
                by_value.setdefault(value, []).append(src)
            reasons["the inputs ran on different " + kind.upper() + "s (" + "; ".join(
                f"{_sources(srcs)}: {value}" for value, srcs in by_value.items()) + "): fit each machine on its own "
                "profile"] = []
    accepted, cpu = profile_parts(cluster)
    per_node = getattr(cluster, "gpus_per_node", None)
    for m in machines:
        if m.gpu and accepted and not {part(g) for g in m.gpu.split(" / ")} <= accepted:
            reasons.setdefault(f"ran on {m.gpu}, but profile '{profile}' is a {cluster.gpu.name} system", []).append(m.source)
        if m.cpu and cpu and cpu_part(m.cpu) != cpu_part(cpu):
            reasons.setdefault(f"ran on {m.cpu}, but host profile '{profile}' was measured on {cpu}", []).append(m.source)
        if m.per_host and m.gpu and per_node and m.per_host > per_node:
            reasons.setdefault(f"ran {m.per_host} GPUs on one host, but a node of '{profile}' has {per_node} (the base "
                               f"would place them on {-(-m.per_host // per_node)} nodes, over links the measurement "
                               "never used)", []).append(m.source)
    return [f"{_sources(srcs)} {reason}" if srcs else reason for reason, srcs in reasons.items()]


def check_machines(machines: list[Machine], cluster: Any, profile: str) -> None:
    """Raise MachineMismatch naming every reason the inputs are not all of the base profile's machine."""
    from zsim.calibrate.collectives import Refusal

    reasons = mismatches(machines, cluster, profile)
    if reasons:
        raise Refusal("inputs from another machine than the base profile's, or from several machines, are not "
                      "blended into one fit (nothing written)", reasons)
