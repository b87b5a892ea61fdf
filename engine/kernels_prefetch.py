"""L2 prefetches in the decode round, all of them hints (no register held, no bit moved):

- The small kernels' inputs, asked for between their PDL launch and their wait (engine/kernels.py
  pdl_launch / pdl_wait): the split attention's first split (`prefetch_first_split`) and the norms'
  weight and residual row (engine/kernels_fused.py). KernelConfig.prefetch_rows.
- The next product's weights (`weights_prefetch`): the split attention's programs left without an
  item stream the o product's weights into L2 after their wait, while the few busy ones attend and
  the memory would otherwise idle. KernelConfig.weights_rows.
The decode graph's capture turns each on for its rounds of few rows (kernels_skinny.launch_mode's
`prefetch` and `weights`).
"""
from __future__ import annotations

import triton
import triton.language as tl

# Under PDL, what a small kernel will read that the kernel before it does not write (the K/V rows
# below a row's position, the norms' weights, the residual row, the RoPE tables) is asked into L2
# before its wait, so after the wait those loads are L2 hits, not DRAM round trips. Off here; the
# decode graph's capture turns it on (launch_mode) for its rounds of few rows (KernelConfig.prefetch_rows: at one
# row -0.017 / -0.022 ms a round at contexts 128 / 4,000; at eight rows +0.015 / +0.2, engine/dev/PERF.md
# run 54).
PREFETCH = False
# K/V rows of each row's first split the attention asks into L2 (0: only the norms' weights and RoPE
# rows). Every split's rows at once was 0.2-0.5 ms a round slower at 4,000 tokens: up to 131 MB a
# layer pulled in while the q/k/v product streams (run 52).
PREFETCH_ROWS = 64
# prefetch.global.L2: the line holding the address brought into L2 where the flag is set. A hint: no
# register is held through the wait, and a later load reads what memory holds then (L2 is where the
# GPU's memory is coherent), so it may target rows another kernel is about to write.
# The split attention (engine/kernels.py) at one row and a short context keeps 8 of its programs busy
# for ~7 us (engine/dev/PERF.md run 57) while nothing streams; o waits for it, then reads its 32 MB.
# Where WEIGHTS is on, its idle programs share o's weights out as cp.async.bulk.prefetch.L2 (the TMA
# unit fetches the range; the program exits at once) after the wait, when q/k/v no longer streams.
WEIGHTS = False
_PREFETCH = tl.constexpr("{ .reg .pred %p; setp.ne.b32 %p, $2, 0; @%p prefetch.global.L2 [$1]; mov.u32 $0, 0; }")


def prefetch_on() -> bool:
    """Whether the PDL kernels ask their inputs into L2 before the wait (never without PDL)."""
    from engine.kernels import pdl_on  # (engine.kernels imports this module)
    return bool(PREFETCH and pdl_on())


def weights_on() -> bool:
    """Whether the split attention's idle programs ask the next product's weights into L2."""
    from engine.kernels import pdl_on
    return bool(WEIGHTS and pdl_on())


def prefetch_rows() -> int:
    """The split attention's PREFETCH_ constexpr: K/V rows asked for (0: the tables only; -1: none)."""
    return PREFETCH_ROWS if prefetch_on() else -1


@triton.jit
def l2_prefetch(ptrs, on):
    """Each address's line into L2 where `on` (module doc of PREFETCH): a hint, never a load."""
    tl.inline_asm_elementwise(_PREFETCH, "=r,l,r", [ptrs, on.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)


# cp.async.bulk.prefetch.L2 (sm_90): $2 bytes from $1 (16-byte aligned, a multiple of 16) into L2.
_BULK = tl.constexpr("{ .reg .pred %p; setp.gt.s32 %p, $2, 0; @%p cp.async.bulk.prefetch.L2.global [$1], $2; "
                     "mov.u32 $0, 0; }")
LANES = tl.constexpr(128)  # the split kernel's 4 warps' threads (a smaller tensor would be replicated)
CHUNKS = 128  # bulk prefetches a program (its first CHUNKS threads one each): weights_prefetch's CHUNKS_


@triton.jit
def weights_prefetch(W, n, part, parts, CHUNKS_: tl.constexpr):
    """Part `part` of `parts` of W's n elements into L2: CHUNKS_ bulk prefetches of whole 16-byte
    units (an odd tail under 16 bytes is left out; it is a hint)."""
    unit: tl.constexpr = 128 // W.dtype.element_ty.primitive_bitwidth  # elements in 16 bytes
    n = n.to(tl.int64)
    per = ((n + parts - 1) // parts + unit * CHUNKS_ - 1) // (unit * CHUNKS_) * (unit * CHUNKS_)
    chunk = per // CHUNKS_
    lane = tl.arange(0, LANES).to(tl.int64)
    start = part.to(tl.int64) * per + lane * chunk
    size = tl.where(lane < CHUNKS_, tl.minimum(chunk, tl.maximum(n - start, 0)) // unit * 16, 0)
    tl.inline_asm_elementwise(_BULK, "=r,l,r", [W + start, size.to(tl.int32)], dtype=tl.int32, is_pure=False,
                              pack=1)


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
