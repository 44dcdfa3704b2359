"""What a traced run records about the device it ran on: GPU name and memory, driver, CUDA, cuDNN and
NCCL versions (issue 26: a measured trace must say which machine made it), and the subset of
`torch.cuda.memory_stats()` that zsim's allocator model is compared with."""

from __future__ import annotations

import platform
import shutil
import subprocess
from typing import Any

import torch

# torch.cuda.memory_stats() keys kept per step (PyTorch docs, "torch.cuda.memory_stats"): the peaks of
# what tensors hold (allocated), what the caching allocator holds (reserved), blocks split but not in use
# (inactive_split: fragmentation), and the allocator's flush-and-retry count (num_alloc_retries: "number
# of failed cudaMalloc calls that result in a cache flush and retry").
MEMORY_STATS = ("allocated_bytes.all.peak", "allocated_bytes.all.current", "reserved_bytes.all.peak",
                "reserved_bytes.all.current", "active_bytes.all.peak", "inactive_split_bytes.all.peak",
                "inactive_split_bytes.all.current", "num_alloc_retries", "num_ooms", "num_device_alloc",
                "num_device_free", "num_sync_all_streams")


def cuda_memory_stats(stats: dict[str, Any]) -> dict[str, int]:
    """The kept keys of a `torch.cuda.memory_stats()` dict (absent ones left out: older torch lacks some)."""
    return {key: int(stats[key]) for key in MEMORY_STATS if key in stats}


def device_facts(device: torch.device) -> dict[str, Any]:
    """Facts about `device`: on CUDA the GPU, its memory and the software stack; on CPU the processor."""
    facts: dict[str, Any] = {"type": device.type, "cuda_build": torch.version.cuda}
    if device.type != "cuda":
        facts["processor"] = platform.processor() or platform.machine()
        return facts
    props = torch.cuda.get_device_properties(device)
    facts.update({
        "gpu": props.name, "memory_bytes": int(props.total_memory), "multiprocessors": props.multi_processor_count,
        "capability": f"{props.major}.{props.minor}", "cudnn": torch.backends.cudnn.version(),
        "nccl": _nccl_version(), "driver": _driver_version()})
    return facts


def _nccl_version() -> str | None:
    try:
        version = torch.cuda.nccl.version()
    except (AttributeError, RuntimeError):
        return None
    return ".".join(str(v) for v in version) if isinstance(version, tuple) else str(version)


def _driver_version() -> str | None:
    """The NVIDIA driver, from nvidia-smi (torch does not expose it); None where it is not installed."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.split()
    return lines[0] if out.returncode == 0 and lines else None
