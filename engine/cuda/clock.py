"""In-kernel clocks for profiling the split attention: where a split-attention program's time
goes between its phases, read from the SM's cycle counter. Only the probe gives the runner a clock
buffer (engine/cuda/kernels.py CudaKernels.clock); without one the kernels compile without them
(the split kernel's CLOCK_ constexpr is off).

A stamp takes a value computed from the data of the phase before it, so it is read when that data has
arrived, not when its loads were issued.
"""
from __future__ import annotations

import triton
import triton.language as tl

# The probe's buffer: [layers, programs, SLOTS] int64 on the device, set before it captures its graphs;
# layer i's decode_attention passes clock[i] to the split kernel; program p (a row's first split, KV
# head p % KVH of row p // KVH) writes its slots at p.
SLOTS = tl.constexpr(10)
# slots: 0 entry, 1 after the PDL wait, 2 the positions read, 3 q ready (its norm, RoPE and K/V write),
# 4 the keys walked, 5 the output stored (cycles); 6 / 7 the global timer at 1 / 5 (ns); 8 the global
# timer at entry; 9 the SM the program ran on

_CYCLES = tl.constexpr("mov.u64 $0, %clock64;")
_NS = tl.constexpr("mov.u64 $0, %globaltimer;")
_SM = tl.constexpr("mov.u32 $0, %smid;")


@triton.jit
def stamp(Clock, at, slot, dep, on, NS: tl.constexpr = False):
    """The cycle counter (NS: the global timer) into Clock[at + slot] where `on`, read once `dep` (an
    int32 scalar computed from the phase's data) is known."""
    t = tl.inline_asm_elementwise(_NS if NS else _CYCLES, "=l,r", [dep], dtype=tl.int64, is_pure=False, pack=1)
    tl.store(Clock + at + slot, t, mask=on)


@triton.jit
def stamp_sm(Clock, at, on):
    """The SM's id into Clock[at + 9] where `on`."""
    sm = tl.inline_asm_elementwise(_SM, "=r,r", [at.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)
    tl.store(Clock + at + 9, sm.to(tl.int64), mask=on)
