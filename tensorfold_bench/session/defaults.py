"""The shared engine flags (`EngineSetup`), the device presets (defaults sized to the device) and
the flag checks every command's settings use."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from tensorfold_bench.errors import FlagError


@dataclass
class EngineSetup:
    """Engine flags every variant shares (a variant's own args come after and win)."""

    model: str = "cpu"
    device: str = "cpu"
    dtype: str | None = None
    parallel: int = 4
    tensor_parallel: int = 1  # engine ranks (tfengine --tensor-parallel); 1: the flag is not passed
    prefill_rows: int = 256
    max_model_len: int | None = None
    seed: int = 0
    trace: bool = True
    extra_args: list[str] = field(default_factory=list)

    def flags(self) -> list[str]:
        f = ["--model", self.model, "--device", self.device, "--parallel", str(self.parallel),
             "--prefill-rows", str(self.prefill_rows), "--seed", str(self.seed)]
        if self.dtype:
            f += ["--dtype", self.dtype]
        if self.tensor_parallel != 1:
            f += ["--tensor-parallel", str(self.tensor_parallel)]
        if self.max_model_len:
            f += ["--max-model-len", str(self.max_model_len)]
        if self.trace:
            f += ["--trace"]
        return f + list(self.extra_args)


@dataclass(frozen=True)
class DevicePreset:
    """A device's defaults. The sweep's are sized so that `tfbench sweep --levels 1,2,4,8` ends in
    minutes: on two CPU cores the cuda sizes (256 tokens, 4 cells, 3 reps) took about 27 minutes."""

    model: str
    b_at: float
    b_tokens: int
    prefill_rows: int
    dtype: str | None
    sweep_tokens: int = 256
    sweep_cells: int = 4
    sweep_reps: int = 3


DEVICE_PRESETS = {"cpu": DevicePreset("cpu", 3.0, 4096, 256, None, sweep_tokens=64, sweep_cells=2, sweep_reps=2),
                  "cuda": DevicePreset("qwen3-8b", 5.0, 32000, 1024, "bfloat16")}
FULL = "cuda"  # the device whose defaults are not scaled down


def device_preset(device: str) -> DevicePreset:
    if device not in DEVICE_PRESETS:
        raise FlagError("--device", f"must be cpu or cuda, not {device!r}")
    return DEVICE_PRESETS[device]


def sized(device: str, given: dict[str, object], fields: dict[str, str]) -> tuple[dict[str, object], list[str]]:
    """Each flag's value: as given, else the device preset's; and a line for every default that is
    smaller than on the full device (the receipt says what was scaled down).
    `given`: flag -> value or None; `fields`: flag -> DevicePreset field."""
    pre, full = device_preset(device), DEVICE_PRESETS[FULL]
    out, notes = {}, []
    for flag, v in given.items():
        if v is not None:
            out[flag] = v
            continue
        mine, theirs = getattr(pre, fields[flag]), getattr(full, fields[flag])
        out[flag] = mine
        if mine != theirs:
            notes.append(f"{flag} {mine} ({theirs} on {FULL})")
    return out, notes


def scaled_note(device: str, notes: list[str]) -> dict:
    """The receipt's settings entry for what the device's defaults scaled down."""
    return {"scaled_down": f"Sized to the {device} device: " + ", ".join(notes) + "." if notes else None}


def positive(flag: str, v: float | int | None) -> None:
    """A finite positive number (NaN and infinity would hang or pass every check)."""
    if v is not None and not (v > 0 and math.isfinite(v)):
        raise FlagError(flag, f"must be a finite positive number, not {v}")


def check_margin(margin: float, flag: str = "--margin") -> None:
    if not 0 <= margin < 1:
        raise FlagError(flag, f"must be a fraction in [0, 1), not {margin}")


def engine_setup(*, device: str, model: str | None, dtype: str | None, parallel: int | None,
                 prefill_rows: int | None, max_model_len: int | None, seed: int, trace: bool,
                 engine_args: list[str] | None, tensor_parallel: int = 1) -> EngineSetup:
    """The shared engine flags from the command's flags, with the device preset's defaults."""
    pre = device_preset(device)
    for flag, v in (("--parallel", parallel), ("--prefill-rows", prefill_rows), ("--max-model-len", max_model_len)):
        positive(flag, v)
    positive("--tensor-parallel", tensor_parallel)
    return EngineSetup(model=model or pre.model, device=device, dtype=dtype or pre.dtype, parallel=parallel or 4,
                       prefill_rows=prefill_rows or pre.prefill_rows, max_model_len=max_model_len, seed=seed,
                       trace=trace, extra_args=list(engine_args or []), tensor_parallel=tensor_parallel)
