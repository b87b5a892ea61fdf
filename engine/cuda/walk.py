"""The key walk of one split of the decode attention (engine/cuda/decode_attention.py): the split's keys reduced
in BLOCK-row steps from its start, online softmax in float32. A block's K is loaded, scored, then
its V loaded and weighed; loading K and V together, or the next block's ahead, measured slower on
the H200 (those walks are at commit 9a5a3df).
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _block(q, kbase, vbase, start, hi, stride_kt, m_i, l_i, acc, scale, D: tl.constexpr, BLOCK_: tl.constexpr):
    """One BLOCK of keys [start, start + BLOCK) masked to < hi. A fully masked block leaves m, l and
    acc bit for bit unchanged (alpha 1, p 0)."""
    d = tl.arange(0, D)
    t = start + tl.arange(0, BLOCK_)
    tmask = t < hi
    k = tl.load(kbase + t[:, None].to(tl.int64) * stride_kt + d[None, :], mask=tmask[:, None], other=0.0)
    qk = tl.dot(q, tl.trans(k)) * scale
    qk = tl.where(tmask[None, :], qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(qk - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    v = tl.load(vbase + t[:, None].to(tl.int64) * stride_kt + d[None, :], mask=tmask[:, None], other=0.0)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc


@triton.jit
def walk(q, kbase, vbase, lo, hi, stride_kt, m_i, l_i, acc, scale, D: tl.constexpr, SPLIT_: tl.constexpr,
         BLOCK_: tl.constexpr, DYNAMIC: tl.constexpr):
    """The split's keys [lo, hi) in BLOCK-row steps from lo, into the running (m, l, acc)."""
    if DYNAMIC:
        for start in range(lo, hi, BLOCK_):
            m_i, l_i, acc = _block(q, kbase, vbase, start, hi, stride_kt, m_i, l_i, acc, scale, D, BLOCK_)
    else:  # the interpreter cannot loop to a run-time bound: visit every block, masked
        for b in range(0, SPLIT_ // BLOCK_):
            m_i, l_i, acc = _block(q, kbase, vbase, lo + b * BLOCK_, hi, stride_kt, m_i, l_i, acc, scale, D, BLOCK_)
    return m_i, l_i, acc
