"""The q/k per-head RMSNorm, RoPE and K/V cache write (engine/cuda/fused.py
`_qk_norm_rope_kernel`) done inside the decode attention's split kernel (engine/cuda/decode_attention.py), so
the round loses that kernel's launch. The same bits as the kernel it replaces (checked on the
H200):

- Every operation after the sum of squares is the standalone kernel's, element by element.
- The sum of squares of a 64-element half head is where the bits could move: `tl.sum`'s order
  follows the layout Triton gives the tensor, and the standalone kernel runs one warp on a [64]
  vector, two elements a lane (lane l: 2l, 2l+1; the sm_90 code fuses them as
  fma(x[2l], x[2l], x[2l+1]^2)), then a butterfly across the 32 lanes (l + l^16, then ^8, ^4, ^2,
  ^1). The split kernel runs four warps on [heads, 64] tiles, so it spells that order out:
  `tl.fma` for the lane's pair, then five explicit halvings. IEEE addition is commutative, so each
  halving's operand order does not matter; its grouping does, and it is the butterfly's.
- The split kernel stores the q tile and reads it back with the unfolded kernel's own load before
  attending: q, K and V came out bitwise equal to the standalone kernel's, but attending with the
  tile straight from registers gave other bits in a few outputs.
Only for head_dim 128 (the lane layout above) with a spare row in the head tile for K
(engine.cuda.decode_attention.qk_fold_takes); other shapes keep the standalone kernel.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _halves(t, G: tl.constexpr, W: tl.constexpr):
    """[G, 2W] -> [G, W]: element r plus element r + W (one butterfly step)."""
    lo, hi = tl.split(tl.permute(tl.reshape(t, [G, 2, W]), (0, 2, 1)))
    return lo + hi


@triton.jit
def warp_sumsq(x, G: tl.constexpr):
    """sum(x * x) of each row of x [G, 64] (float32) in the one-warp kernel's order (module doc)."""
    a, b = tl.split(tl.reshape(x, [G, 32, 2]))
    t = tl.fma(a, a, b * b)
    t = _halves(_halves(_halves(_halves(_halves(t, G, 16), G, 8), G, 4), G, 2), G, 1)
    return tl.reshape(t, [G])


@triton.jit
def _norm_weights(WQ, WK, half, D: tl.constexpr):
    """The q and k norms' weights, each in its two halves: (k's first, q's first, k's second, q's second)."""
    return (tl.load(WK + half)[None, :], tl.load(WQ + half)[None, :],
            tl.load(WK + D // 2 + half)[None, :], tl.load(WQ + D // 2 + half)[None, :])


@triton.jit
def _rope_tables(Cos, Sin, pos, half, D: tl.constexpr):
    """The rotation's cos and sin at pos, each in its two halves: (cos, sin of the first; of the second)."""
    return (tl.load(Cos + pos * D + half).to(tl.float32)[None, :],
            tl.load(Sin + pos * D + half).to(tl.float32)[None, :],
            tl.load(Cos + pos * D + D // 2 + half).to(tl.float32)[None, :],
            tl.load(Sin + pos * D + D // 2 + half).to(tl.float32)[None, :])


@triton.jit
def qk_heads(QKV, WQ, WK, Cos, Sin, KC, VC, row, pos, kvh, write, stride_row, stride_ct, stride_ch, eps,
             H: tl.constexpr, KVH, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, D: tl.constexpr,
             LF: tl.constexpr = True):
    """The GROUP q heads of KV head kvh, normed and rotated: a [GROUP_PAD, D] tile whose rows past
    GROUP are not q (row GROUP computes K); where `write`, K (normed, rotated) and V of this KV
    head stored at row pos of KC / VC (the lane's caches). LF (engine/cuda/decode_attention.py LOADS_FIRST): every
    load asked for before any arithmetic (one trip to L2 on the round's path, where the norm's weights,
    the rotation's tables and V each came after the arithmetic before them)."""
    g = tl.arange(0, GROUP_PAD)
    half = tl.arange(0, D // 2)
    isk = g == GROUP
    head = tl.where(isk, H + kvh, kvh * GROUP + g)
    live = (g <= GROUP)[:, None]
    base = QKV + row * stride_row + head[:, None] * D + half[None, :]
    x1 = tl.load(base, mask=live, other=0.0).to(tl.float32)
    x2 = tl.load(base + D // 2, mask=live, other=0.0).to(tl.float32)
    if LF:
        vsrc = QKV + row * stride_row + (H + KVH + kvh) * D + half
        wk1, wq1, wk2, wq2 = _norm_weights(WQ, WK, half, D)
        c1, s1, c2, s2 = _rope_tables(Cos, Sin, pos, half, D)
        v1, v2 = tl.load(vsrc), tl.load(vsrc + D // 2)
    inv = 1.0 / tl.sqrt((warp_sumsq(x1, GROUP_PAD) + warp_sumsq(x2, GROUP_PAD)) / D + eps)
    if not LF:
        wk1, wq1, wk2, wq2 = _norm_weights(WQ, WK, half, D)
    w1 = tl.where(isk[:, None], wk1, wq1).to(tl.float32)
    w2 = tl.where(isk[:, None], wk2, wq2).to(tl.float32)
    dt = QKV.dtype.element_ty
    n1 = (x1 * inv[:, None]).to(dt).to(tl.float32) * w1
    n2 = (x2 * inv[:, None]).to(dt).to(tl.float32) * w2
    n1 = n1.to(dt).to(tl.float32)
    n2 = n2.to(dt).to(tl.float32)
    if not LF:
        c1, s1, c2, s2 = _rope_tables(Cos, Sin, pos, half, D)
    o1 = n1 * c1 - n2 * s1
    o2 = n2 * c2 + n1 * s2
    on = (half[None, :] * 0 + write.to(tl.int32)) > 0
    kb = KC + pos * stride_ct + kvh * stride_ch + g[:, None] * 0 + half[None, :]
    tl.store(kb, o1.to(KC.dtype.element_ty), mask=isk[:, None] & on)
    tl.store(kb + D // 2, o2.to(KC.dtype.element_ty), mask=isk[:, None] & on)
    if not LF:
        vsrc = QKV + row * stride_row + (H + KVH + kvh) * D + half
    vb = VC + pos * stride_ct + kvh * stride_ch + half
    if not LF:
        v1 = tl.load(vsrc)
    tl.store(vb, v1.to(tl.float32).to(VC.dtype.element_ty), mask=on.reshape([D // 2]))
    if not LF:
        v2 = tl.load(vsrc + D // 2)
    tl.store(vb + D // 2, v2.to(tl.float32).to(VC.dtype.element_ty), mask=on.reshape([D // 2]))
    return tl.reshape(tl.permute(tl.join(o1.to(dt), o2.to(dt)), (0, 2, 1)), [GROUP_PAD, D])
