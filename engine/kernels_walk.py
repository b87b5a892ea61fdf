"""The key walk of one split of the decode attention (engine/kernels.py): the split's keys reduced
in BLOCK-row steps from its start, online softmax in float32. A block's arithmetic is `_scores` then
`_weigh`, whichever walk runs; the walks differ only in when each block's K and V are asked for
(engine/kernels.py WALK), so they give the same bits (tests/test_kernels_fold.py).
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _kv(kbase, vbase, start, hi, stride_kt, D: tl.constexpr, BLOCK_: tl.constexpr):
    """The K and V rows [start, start + BLOCK) masked to < hi (masked rows: no memory touched)."""
    d = tl.arange(0, D)
    t = start + tl.arange(0, BLOCK_)
    at = t[:, None].to(tl.int64) * stride_kt + d[None, :]
    return (tl.load(kbase + at, mask=(t < hi)[:, None], other=0.0),
            tl.load(vbase + at, mask=(t < hi)[:, None], other=0.0))


@triton.jit
def _scores(q, k, start, hi, m_i, l_i, scale, BLOCK_: tl.constexpr):
    """A block's scores against the running max and sum: (new max, rescale of the old, p, new sum).
    A fully masked block leaves m and l bit for bit unchanged (alpha 1, p 0)."""
    t = start + tl.arange(0, BLOCK_)
    qk = tl.dot(q, tl.trans(k)) * scale
    qk = tl.where((t < hi)[None, :], qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(qk - m_new[:, None])
    return m_new, alpha, p, l_i * alpha + tl.sum(p, 1)


@triton.jit
def _weigh(acc, alpha, p, v):
    return acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)


@triton.jit
def _block(q, kbase, vbase, start, hi, stride_kt, m_i, l_i, acc, scale, D: tl.constexpr, BLOCK_: tl.constexpr):
    """One block, WALK 0: K, its scores, then V (asked for once the scores are issued)."""
    d = tl.arange(0, D)
    t = start + tl.arange(0, BLOCK_)
    tmask = t < hi
    k = tl.load(kbase + t[:, None].to(tl.int64) * stride_kt + d[None, :], mask=tmask[:, None], other=0.0)
    m_new, alpha, p, l_i = _scores(q, k, start, hi, m_i, l_i, scale, BLOCK_)
    v = tl.load(vbase + t[:, None].to(tl.int64) * stride_kt + d[None, :], mask=tmask[:, None], other=0.0)
    return m_new, l_i, _weigh(acc, alpha, p, v)


@triton.jit
def _step(q, kbase, vbase, k, v, start, hi, stride_kt, m_i, l_i, acc, scale, D: tl.constexpr,
          BLOCK_: tl.constexpr, WALK_: tl.constexpr):
    """One block with its K and V asked for together (WALK_ 1), or given (k, v: asked for a block
    earlier) while the next block's are asked for (WALK_ 2). Returns the next (k, v)."""
    if WALK_ == 1:
        k, v = _kv(kbase, vbase, start, hi, stride_kt, D, BLOCK_)
        kn, vn = k, v  # (not used: the next step asks for its own)
    else:
        kn, vn = _kv(kbase, vbase, start + BLOCK_, hi, stride_kt, D, BLOCK_)
    m_new, alpha, p, l_i = _scores(q, k, start, hi, m_i, l_i, scale, BLOCK_)
    return m_new, l_i, _weigh(acc, alpha, p, v), kn, vn


@triton.jit
def walk(q, kbase, vbase, lo, hi, stride_kt, m_i, l_i, acc, scale, D: tl.constexpr, SPLIT_: tl.constexpr,
         BLOCK_: tl.constexpr, DYNAMIC: tl.constexpr, WALK_: tl.constexpr):
    """The split's keys [lo, hi) in BLOCK-row steps from lo, into the running (m, l, acc)."""
    if WALK_ == 0:
        if DYNAMIC:
            for start in range(lo, hi, BLOCK_):
                m_i, l_i, acc = _block(q, kbase, vbase, start, hi, stride_kt, m_i, l_i, acc, scale, D, BLOCK_)
        else:  # the interpreter cannot loop to a run-time bound: visit every block, masked
            for b in range(0, SPLIT_ // BLOCK_):
                m_i, l_i, acc = _block(q, kbase, vbase, lo + b * BLOCK_, hi, stride_kt, m_i, l_i, acc, scale, D,
                                       BLOCK_)
    else:
        k, v = _kv(kbase, vbase, lo, hi if WALK_ == 2 else lo, stride_kt, D, BLOCK_)  # WALK_ 1: none asked for
        if DYNAMIC:
            for start in range(lo, hi, BLOCK_):
                m_i, l_i, acc, k, v = _step(q, kbase, vbase, k, v, start, hi, stride_kt, m_i, l_i, acc, scale, D,
                                            BLOCK_, WALK_)
        else:
            for b in range(0, SPLIT_ // BLOCK_):
                m_i, l_i, acc, k, v = _step(q, kbase, vbase, k, v, lo + b * BLOCK_, hi, stride_kt, m_i, l_i, acc,
                                            scale, D, BLOCK_, WALK_)
    return m_i, l_i, acc
