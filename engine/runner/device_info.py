"""What a runner's device is called, for /v1/engine and the receipts: its name, compute
capability, CUDA version and driver. Read once at start-up; nothing here is on a hot path."""
from __future__ import annotations

import platform
import shutil
import subprocess

import torch


def _driver() -> str | None:
    """The NVIDIA driver's version from nvidia-smi, or None where there is none to ask."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    out = r.stdout.strip()
    return out.splitlines()[0] if r.returncode == 0 and out else None


def identity(device: torch.device) -> dict:
    dev = {"device": device.type, "device_name": platform.processor() or platform.machine() or "cpu",
           "compute_capability": None, "cuda_version": torch.version.cuda, "driver": _driver()}
    if device.type == "cuda":
        idx = device.index or 0
        dev["device_name"] = torch.cuda.get_device_name(idx)
        dev["compute_capability"] = ".".join(map(str, torch.cuda.get_device_capability(idx)))
    return dev
