"""The name of the processor a benchmark ran on: which setting trains fastest depends on it, not only on its
instruction set (README, "Precision and attention on this CPU")."""

import platform
from pathlib import Path

import torch


def device_name(device: torch.device | str) -> str:
    """A CUDA device's GPU name, else the CPU's model name (/proc/cpuinfo on Linux, else what the platform reports)."""
    if torch.device(device).type == "cuda":
        return torch.cuda.get_device_name(device)
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()
