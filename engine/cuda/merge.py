"""Split partials of the decode attention (engine/cuda/decode_attention.py) merged by their log-sum-exp, split 0,
1, 2, ... in order: inside the split kernel by each (row, KV head)'s last-arriving program
(`fold_tail`, LaunchMode.fold_combine), or by the combine kernel a (row, head) at a time (`merge_split`). The
same operations in the same order either way, so both give the same bits (tests/engine/test_kernels_fold.py).
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def fold_tail(acc, lse, Opart, Lse, Out, Count, row, kvh, s, n, heads, gmask, stride_or, stride_oh, stride_os,
              stride_lr, stride_lh, stride_out, KVH, D: tl.constexpr, GROUP_PAD: tl.constexpr, NSPLIT: tl.constexpr,
              DYNAMIC: tl.constexpr):
    """The combine inside the split kernel. A row of one split: its program merges its own partial
    (in registers, the values it would have stored). Else each split stores its partial and the
    last of the n to arrive merges them all, read back in split order."""
    d = tl.arange(0, D)
    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l = tl.zeros([GROUP_PAD], tl.float32)
    out = tl.zeros([GROUP_PAD, D], tl.float32)
    optr = Out + row * stride_out + heads[:, None] * D + d[None, :]
    if n == 1:
        m, l, out = _merge_values(lse, acc, n > 0, m, l, out)
        tl.store(optr, (out / l[:, None]).to(Out.dtype.element_ty), mask=gmask[:, None])
    else:
        ob = Opart + row * stride_or + heads[:, None] * stride_oh + d[None, :]
        lb = Lse + row * stride_lr + heads * stride_lh
        tl.store(ob + s * stride_os, acc, mask=gmask[:, None])
        tl.store(lb + s, lse, mask=gmask)
        # every thread's partial stored, then release them and acquire the others' (acq_rel, gpu
        # scope), as kernels_skinny's split K does
        tl.debug_barrier()
        cnt = Count + row * KVH + kvh
        if tl.atomic_add(cnt, 1) == n - 1:
            if DYNAMIC:
                for j in range(0, n):
                    m, l, out = _merge_group(ob, lb, j, n, gmask, stride_os, m, l, out)
            else:
                for j in range(0, NSPLIT):
                    m, l, out = _merge_group(ob, lb, j, n, gmask, stride_os, m, l, out)
            tl.store(optr, (out / l[:, None]).to(Out.dtype.element_ty), mask=gmask[:, None])
            tl.atomic_xchg(cnt, 0)  # ready for the next launch (graph replays too)


@triton.jit
def _merge_group(ob, lb, s, n, gmask, stride_os, m, l, acc):
    """merge_split for a group of heads (m, l [G], acc [G, D]): split s's partial read back through L2
    (.cg: other programs of this launch wrote it)."""
    # masks in the pointers' shapes (the interpreter refuses a scalar one)
    take = gmask & ((gmask.to(tl.int32) * 0 + s) < n)
    lse = tl.load(lb + s, mask=take, other=float("-inf"), cache_modifier=".cg")
    o = tl.load(ob + s * stride_os, mask=take[:, None], other=0.0, cache_modifier=".cg")
    return _merge_values(lse, o, s < n, m, l, acc)


@triton.jit
def _merge_values(lse, o, valid, m, l, acc):
    """merge_split's operations, element by element, on a group's split partial (lse [G], o [G, D])."""
    lse = tl.where(valid, lse, float("-inf"))
    m_new = tl.maximum(m, lse)
    a = tl.exp(m - m_new)
    b = tl.exp(lse - m_new)
    acc = tl.where(valid, acc * a[:, None] + o * b[:, None], acc)
    l = tl.where(valid, l * a + b, l)
    return tl.where(valid, m_new, m), l, acc


@triton.jit
def merge_split(Opart, Lse, row, h, s, n, stride_or, stride_oh, stride_os, stride_lr, stride_lh, m, l, acc,
                D: tl.constexpr):
    """Fold split s (if s < n) into the running (m, l, acc)."""
    d = tl.arange(0, D)
    valid = s < n
    lse = tl.load(Lse + row * stride_lr + h * stride_lh + s, mask=valid, other=float("-inf"))
    # the mask in the pointer's shape: Triton 3.9's interpreter refuses a scalar mask on a vector load
    o = tl.load(Opart + row * stride_or + h * stride_oh + s * stride_os + d, mask=(d * 0 + s) < n, other=0.0)
    lse = tl.where(valid, lse, float("-inf"))
    m_new = tl.maximum(m, lse)
    a = tl.exp(m - m_new)
    b = tl.exp(lse - m_new)
    acc = tl.where(valid, acc * a + o * b, acc)
    l = tl.where(valid, l * a + b, l)
    return tl.where(valid, m_new, m), l, acc
