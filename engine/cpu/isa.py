"""Which vector instructions the CPU paths use, and a cap below the machine's own.

The same 2-core machines come with AVX-512 and avx512_bf16 one day and with AVX2 alone the
next, and the engine takes a different path on each (bf16 through oneDNN, or float32 with the
widened-bf16 round). `tfengine serve --cpu-isa avx2` runs the AVX2 path on an AVX-512 machine:
it caps torch's kernels (`ATEN_CPU_CAPABILITY`), MKL's (`MKL_ENABLE_INSTRUCTIONS`) and
oneDNN's (`ONEDNN_MAX_CPU_ISA`) before torch loads, and the engine's own choices — the dtype,
the C kernels' compile flags — follow torch's capability, not the CPU's flags. So both paths
can be tested and measured on one machine, side by side.

Kept apart from engine.cpu.packed so the CLI can apply a cap without importing torch.
"""
from __future__ import annotations

import functools
import os
from pathlib import Path

# --cpu-isa's values: the environment each sets for torch, MKL and oneDNN ("native" sets none)
CAPS = {
    "native": {},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
}


def cap_env(isa: str) -> dict[str, str]:
    """The environment variables that put torch, MKL and oneDNN at `isa` (a key of CAPS)."""
    if isa not in CAPS:
        raise ValueError(f"--cpu-isa must be one of {', '.join(CAPS)}, not {isa!r}")
    return dict(CAPS[isa])


def apply_cap(isa: str, torch_loaded: bool) -> None:
    """Set the cap's variables in this process; torch reads them when it loads, so a cap asked for
    after that cannot take effect and is refused rather than half applied."""
    env = cap_env(isa)
    if env and torch_loaded and any(os.environ.get(k) != v for k, v in env.items()):
        raise RuntimeError(f"--cpu-isa {isa} must be set before torch loads (set {' '.join(f'{k}={v}' for k, v in env.items())} "
                           f"in the environment instead)")
    os.environ.update(env)


@functools.cache
def cpuinfo(*keys: str) -> str | None:
    """The value of /proc/cpuinfo's first line starting with one of `keys` (the CPU does not change
    under a process: read once), or None where there is none to read."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(keys):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_flags() -> set[str]:
    """The CPU's feature flags (/proc/cpuinfo), empty where there is none to read."""
    return set((cpuinfo("flags", "Features") or "").split())


def capability() -> str:
    """torch's CPU capability ("DEFAULT", "AVX2", "AVX512", ...): the CPU's widest, or the cap."""
    import torch
    return torch.backends.cpu.get_cpu_capability()


def capped() -> bool:
    """Whether torch runs below AVX-512 on a CPU that has it (an --cpu-isa cap, or ATen's own
    variable set by hand)."""
    return "avx512f" in cpu_flags() and not capability().upper().startswith("AVX512")


def c_flags() -> list[str]:
    """What the C kernels add to -march=native so they use the ISA torch uses: below an AVX-512
    cap they must not emit AVX-512 (its FMA order and widths would differ from an AVX2 machine's)."""
    return ["-mno-avx512f"] if capped() else []
