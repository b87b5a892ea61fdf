"""A compiled Triton kernel's CUDA function attributes, set through the driver (ctypes; Triton sets
only the dynamic shared memory limit, and asks for the most shared memory only for kernels over 48 KB).

The preferred shared-memory carveout: how much of an SM's unified L1 / shared memory the driver
configures as shared memory when the function runs, which bounds how many of its programs an SM
holds at once (engine/dev/PERF.md runs 78-80).
"""
from __future__ import annotations

import ctypes
import functools

CARVEOUT_ATTRIBUTE = 9  # CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
DEFAULT = -1  # CU_SHAREDMEM_CARVEOUT_DEFAULT: the driver's choice

_set: dict[int, int] = {}  # CUfunction -> the carveout last set


@functools.cache
def _driver():
    return ctypes.CDLL("libcuda.so.1")


def carveout(kernel, percent: int, driver=None) -> None:
    """Ask for `percent` (0-100, or DEFAULT) of the SM's L1 / shared memory as shared memory whenever
    `kernel` (Triton's compiled kernel, as a launch returns it) runs; once per value."""
    fn = kernel.function
    if _set.get(fn, DEFAULT) == percent:
        return
    rc = (driver or _driver()).cuFuncSetAttribute(ctypes.c_void_p(fn), ctypes.c_int(CARVEOUT_ATTRIBUTE),
                                                   ctypes.c_int(percent))
    if rc != 0:
        raise RuntimeError(f"cuFuncSetAttribute(preferred shared memory carveout {percent}) failed: CUresult {rc}")
    _set[fn] = percent
