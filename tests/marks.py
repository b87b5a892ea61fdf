"""Marks for tests that need something of the machine."""
import pytest

from engine.cpu.kernels import packs_bf16

# The CPU fast path's bf16 products go through oneDNN's packed weights, which need AVX-512 (bw, vl,
# dq) or AVX-NE-CONVERT; on an AVX2 machine the engine refuses --dtype bfloat16 on the CPU.
needs_cpu_bf16 = pytest.mark.skipif(not packs_bf16(), reason="this CPU has no packed bf16 products (AVX2 only)")


def bf16(value="bfloat16"):
    """A parametrize value (a tuple for several names) that needs the CPU's bf16 products."""
    return pytest.param(*(value if isinstance(value, tuple) else (value,)), marks=needs_cpu_bf16)
