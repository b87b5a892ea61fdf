"""The L2 prefetch of the decode round's small kernels, asked for between their PDL launch and
their wait (engine/cuda/decode_attention.py pdl_launch / pdl_wait): the split attention's first split
(`prefetch_first_split`) and the norms' weight and residual row (engine/cuda/fused.py).
The decode graph's capture turns it on for its rounds of few rows (LaunchMode.prefetch, from
KernelConfig.prefetch_rows; engine/cuda/launch.py).
"""
from __future__ import annotations

import triton
import triton.language as tl

from engine.cuda.launch import LaunchMode

# Under PDL, what a small kernel will read that the kernel before it does not write (the K/V rows
# below a row's position, the norms' weights, the residual row, the RoPE tables) is asked into L2
# before its wait, so after the wait those loads are L2 hits, not DRAM round trips. Off in eager
# calls; the decode graph's capture asks for it (LaunchMode.prefetch) in its rounds of few rows
# (KernelConfig.prefetch_rows: on qwen3-8b, H200, at one row -0.017 / -0.022 ms a round at contexts
# 128 / 4,000; at eight rows +0.015 / +0.2 ms).
# K/V rows of each row's first split the attention asks into L2 (0: only the norms' weights and RoPE
# rows). Every split's rows at once was 0.2-0.5 ms a round slower at 4,000 tokens: up to 131 MB a
# layer pulled in while the q/k/v product streams (measured on the H200).
PREFETCH_ROWS = 64
# prefetch.global.L2: the line holding the address brought into L2 where the flag is set. A hint: no
# register is held through the wait, and a later load reads what memory holds then (L2 is where the
# GPU's memory is coherent), so it may target rows another kernel is about to write.
_PREFETCH = tl.constexpr("{ .reg .pred %p; setp.ne.b32 %p, $2, 0; @%p prefetch.global.L2 [$1]; mov.u32 $0, 0; }")


def prefetch_rows(mode: LaunchMode) -> int:
    """The split attention's PREFETCH_ constexpr: K/V rows asked for (0: the tables only; -1: none)."""
    return PREFETCH_ROWS if mode.prefetch_on() else -1


@triton.jit
def l2_prefetch(ptrs, on):
    """Each address's line into L2 where `on` (the note above PREFETCH_ROWS): a hint, never a load."""
    tl.inline_asm_elementwise(_PREFETCH, "=r,l,r", [ptrs, on.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def line_offsets(LEN: tl.constexpr, X):
    """Element offsets of the 128-byte lines of a LEN-element run of X's type."""
    step: tl.constexpr = 1024 // X.dtype.element_ty.primitive_bitwidth
    return tl.arange(0, (LEN + step - 1) // step) * step


@triton.jit
def prefetch_first_split(K, V, Lanes, Pos, row, kvh, stride_kb, stride_kt, stride_kh, D: tl.constexpr,
                         ROWS: tl.constexpr, WQ, WK, Cos, Sin, QKN: tl.constexpr):
    """The first ROWS K/V rows of (row, KV head)'s first split (and with QKN the q/k norms' weights and
    the RoPE rows at its position) asked into L2. Runs before the PDL wait: the lane and position it
    reads were written before the round's first kernel, and it only prefetches, so no bit can move."""
    pos = tl.load(Pos + row).to(tl.int64)
    if ROWS > 0:
        lane = tl.load(Lanes + row).to(tl.int64)
        t = tl.arange(0, ROWS)
        cols = line_offsets(D, K)
        on = (t <= pos)[:, None] & (cols < D)[None, :]
        at = lane * stride_kb + kvh * stride_kh + t[:, None].to(tl.int64) * stride_kt + cols[None, :]
        l2_prefetch(K + at, on)
        l2_prefetch(V + at, on)
    if QKN:
        c = line_offsets(D, Cos)
        l2_prefetch(Cos + pos * D + c, c < D)
        l2_prefetch(Sin + pos * D + c, c < D)
        c = line_offsets(D, WQ)
        l2_prefetch(WQ + c, c < D)
        l2_prefetch(WK + c, c < D)
