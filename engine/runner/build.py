"""The runner for a device: build_runner picks CpuRunner or CudaRunner by EngineConfig.device."""
from __future__ import annotations

import torch

from engine.config import ConfigError, EngineConfig
from engine.runner.cpu_runner import CpuRunner
from engine.runner.cuda_runner import CudaRunner
from engine.runner.model_runner import ModelRunner


def runner_class(device: str) -> type[ModelRunner]:
    """The runner of --device: CpuRunner or CudaRunner (a clear error for any other, or for CUDA
    where torch sees none)."""
    if device == "cpu":
        return CpuRunner
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(f"--device {device} asked for, but torch {torch.__version__} sees no CUDA device")
        return CudaRunner
    raise ConfigError(f"--device must be cpu or cuda, not {device!r}")


def build_runner(cfg: EngineConfig, model=None) -> ModelRunner:
    """The runner of cfg.device; `model`: reuse an already loaded (fused) model of the same shape."""
    return runner_class(cfg.device)(cfg, model=model)
