"""In-kernel clocks for a dev probe (engine/dev/attn_clock.py): where a split-attention program's time
goes between its phases, read from the SM's cycle counter. The engine never sets CLOCK, so its kernels
compile without them (the split kernel's CLOCK_ constexpr is off).

A stamp takes a value computed from the data of the phase before it, so it is read when that data has
arrived, not when its loads were issued.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

# [layers, programs, SLOTS] int64 on the device, set by the probe before it captures its graphs:
# decode_attention(i, ...) passes CLOCK[i] to the split kernel; program p (a row's first split, KV head
# p % KVH of row p // KVH) writes its slots at p.
CLOCK: torch.Tensor | None = None
SLOTS = tl.constexpr(8)
# slots: 0 entry, 1 after the PDL wait, 2 the positions read, 3 q ready (its norm, RoPE and K/V write),
# 4 the keys walked, 5 the output stored (cycles); 6 / 7 the global timer at 1 / 5 (ns)
PHASES = ("wait", "positions", "q/k", "walk", "tail")

_CYCLES = tl.constexpr("mov.u64 $0, %clock64;")
_NS = tl.constexpr("mov.u64 $0, %globaltimer;")


@triton.jit
def stamp(Clock, at, slot, dep, on, NS: tl.constexpr = False):
    """The cycle counter (NS: the global timer) into Clock[at + slot] where `on`, read once `dep` (an
    int32 scalar computed from the phase's data) is known."""
    t = tl.inline_asm_elementwise(_NS if NS else _CYCLES, "=l,r", [dep], dtype=tl.int64, is_pure=False, pack=1)
    tl.store(Clock + at + slot, t, mask=on)
