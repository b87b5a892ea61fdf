"""What a runner's device is called, for /v1/engine and the receipts: a GPU's name, compute
capability, CUDA version and driver; a CPU's model, the cores this process may use, the compute
threads and the vector instructions its kernels can use. Read once at start-up; nothing here is on
a hot path."""
from __future__ import annotations

import os
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


def _cpu_model() -> str:
    """The CPU's marketing name (/proc/cpuinfo's first `model name`), else what platform says."""
    from engine.cpu.isa import cpuinfo
    return cpuinfo("model name") or platform.processor() or platform.machine() or "cpu"


def cpu_isa() -> str:
    """The widest vector instructions torch's CPU kernels use here, and the bf16 units: the same
    weights can round differently on an AVX2 machine than on an AVX-512 one, so a receipt says which."""
    from engine.cpu.isa import capped
    isa = [torch.backends.cpu.get_cpu_capability()]
    if capped():  # --cpu-isa: the bf16 units are there but unused
        return f"{isa[0]} (capped; the CPU has AVX-512)"
    for name, probe in (("AMX", "_is_amx_tile_supported"), ("avx512_bf16", "_is_avx512_bf16_supported")):
        try:
            if getattr(torch.cpu, probe)():
                isa.append(name)
        except (AttributeError, RuntimeError):
            pass
    return ", ".join(isa)


def cpu_identity() -> dict:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"model": _cpu_model(), "arch": platform.machine(), "cores": cores, "threads": torch.get_num_threads(),
            "isa": cpu_isa()}


def identity(device: torch.device) -> dict:
    if device.type == "cpu":
        cpu = cpu_identity()
        return {"device": "cpu", "device_name": cpu["model"], "compute_capability": None, "cuda_version": None,
                "driver": None, "cpu": cpu}
    dev = {"device": device.type, "device_name": platform.processor() or platform.machine() or "cpu",
           "compute_capability": None, "cuda_version": torch.version.cuda, "driver": _driver()}
    if device.type == "cuda":
        idx = device.index or 0
        dev["device_name"] = torch.cuda.get_device_name(idx)
        dev["compute_capability"] = ".".join(map(str, torch.cuda.get_device_capability(idx)))
    return dev
