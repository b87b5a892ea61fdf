"""`tfengine serve --cpu-isa avx2`: an AVX-512 machine runs the path an AVX2-only machine takes
(float32 with the widened-bf16 round, C kernels built without AVX-512), and says so."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

import fresh
from engine.cpu.isa import apply_cap, cap_env, cpu_flags

ROOT = Path(__file__).resolve().parents[2]
has_avx512 = pytest.mark.skipif("avx512f" not in cpu_flags(), reason="this CPU has no AVX-512: there is nothing to cap")


def engine(*args, env=None):
    return subprocess.run([sys.executable, "-m", "engine", *args], capture_output=True, text=True, timeout=300,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def test_the_caps_environment_and_an_unknown_isa():
    assert cap_env("native") == {}
    assert cap_env("avx2") == {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
                               "ONEDNN_MAX_CPU_ISA": "AVX2"}
    with pytest.raises(ValueError, match="--cpu-isa must be one of native, avx2"):
        cap_env("avx9")


def test_a_cap_asked_for_after_torch_loaded_is_refused(monkeypatch):
    for k in cap_env("avx2"):
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(RuntimeError, match="before torch loads"):
        apply_cap("avx2", torch_loaded=True)
    for k, v in cap_env("avx2").items():  # already in the environment that torch loaded with: nothing to refuse
        monkeypatch.setenv(k, v)
    apply_cap("avx2", torch_loaded=True)


def test_an_unknown_isa_is_a_flag_error():
    r = engine("serve", "--cpu-isa", "avx9", "--check")
    assert r.returncode == 2
    assert "--cpu-isa" in r.stderr and "Traceback" not in r.stderr


def print_isa_and_wide_build():
    """The ISA the engine names and its wide kernel's build, one a line (run by fresh.run: the cap's
    environment must be there before torch loads)."""
    from engine.config import Toolchain
    from engine.cpu.decode_attention import kernel
    from engine.cpu.wide import WideKernel
    from engine.runner.device_info import cpu_isa
    k = kernel(Toolchain())
    print(cpu_isa())
    print(WideKernel(k.lib).isa if k else "no compiler")


@has_avx512
def test_the_capped_engine_takes_the_avx2_path():
    assert "float32" in engine("serve", "--model", "tiny", "--cpu-isa", "avx2", "--check").stdout
    r = fresh.run(print_isa_and_wide_build, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT), **cap_env("avx2")})
    isa, wide = r.stdout.split("\n")[:2]
    assert isa == "AVX2 (capped; the CPU has AVX-512)", r.stderr
    assert wide in ("avx2+fma", "no compiler")  # the build's own name: no AVX-512 in it
