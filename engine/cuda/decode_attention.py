"""Triton decode attention whose reduction order depends on the row's own length only.

Split-K flash decoding with a FIXED split size: the keys [0, pos] of a row's lane are cut into
splits of SPLIT rows (absolute boundaries), each split reduced in BLOCK-row steps from its start
(online softmax, float32), and the partial results combined split 0, 1, 2, ... in order. Nothing
in that order depends on the other rows of the batch or on how many rows there are, so a row's
bits are the same whichever neighbours decode beside it. The grid is fixed (at most GRID_PER_SM
programs a SM), so the launch can be captured in a CUDA graph; each program walks its share of the
(split, row, KV head) items the longest row needs, and splits past a row's own length return at
once. One program serves all query heads of one KV head (GQA).

The split's key walk is engine/cuda/walk.py; the merge of a row's splits, folded into the split
kernel or in the combine kernel, engine/cuda/merge.py.

Runs under TRITON_INTERPRET=1 on the CPU too (tests/engine/test_runner.py checks it against the loop).
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from engine.cuda.clock import SLOTS, stamp, stamp_sm
from engine.cuda.launch import INTERPRET, PLAIN, LaunchMode, pdl_enter, pdl_launch, pdl_wait
from engine.cuda.merge import fold_tail, merge_split
from engine.cuda.prefetch import prefetch_first_split, prefetch_rows
from engine.cuda.qkfold import qk_heads
from engine.cuda.walk import walk

SPLIT = 256
BLOCK = 64
# The split kernel's programs a SM at most: its grid stops growing with the KV cache's length. One
# program an item (rows x KV heads x max splits) is 8,256 programs at --parallel 8 and 32,784 tokens,
# 0.16 ms a round slower at context 128 than 32 a SM (4,224); 8 a SM was no better at 1 stream and
# slower at 8 streams (qwen3-8b, H200). Below 4,224 items the grid is one an item.
GRID_PER_SM = 32
# The split kernel's warps a program (2 and 8 measured slower than 4 on the H200).
WARPS = 4
# The round's padded rows at which the small kernels on its path (the add+RMSNorm, the split kernel's q/k
# norm and rotation) ask every load before any arithmetic, where the norm's weight, the rotation's tables and
# V came after the sums: one trip to L2 on the path, not two to four. The same arithmetic. Not at 64 rows:
# there the loads held across the sums cost the split kernel more than the trips (measured on the H200).
LOADS_FIRST = {1, 2, 4, 8}
# The split kernel's software-pipeline stages by the round's padded rows (Triton's default, 3, elsewhere).
# As launched (strides divisible by 16) 3 stages take 71.7 KB of shared memory a program on sm_90, so an
# SM holds three: at 64 rows items past 396 (of 512 at context 128) start one item, 13 us, late. 2 stages take 38.9 KB and 128 registers, four a SM; 1 stage 22.5 KB but 168 registers, three.
STAGES: dict[int, int] = {64: 2}
# The decode graph's folds of the split attention's neighbours, the same bits (LaunchMode.fold_combine /
# fold_qk_norm, from KernelConfig; off in eager calls, which run the plain kernels):
# - fold_combine: the combine done by each (row, KV head)'s last-arriving split program
#   (engine/cuda/merge.py fold_tail): qwen3-8b's round -0.072 ms on the H200. Loading V beside K, or
#   a block ahead, measured no faster.
# - fold_qk_norm: the q/k per-head RMSNorm + RoPE + K/V cache write done by the split kernel
#   (engine/cuda/qkfold.py): -0.025 ms more.


@triton.jit
def _split_kernel(Q, K, V, Lanes, Pos, Opart, Lse, Out, Count,
                  stride_qr, stride_qh,
                  stride_kb, stride_kt, stride_kh,
                  stride_or, stride_oh, stride_os,
                  stride_lr, stride_lh,
                  stride_out,
                  scale, P, KVH,
                  GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, D: tl.constexpr,
                  SPLIT_: tl.constexpr, BLOCK_: tl.constexpr, DYNAMIC: tl.constexpr, NSPLIT: tl.constexpr = 0,
                  FOLD: tl.constexpr = False, PDL_: tl.constexpr = 0,
                  QKV=None, stride_qkv=0, WQ=None, WK=None, Cos=None, Sin=None, eps=0.0, H: tl.constexpr = 0,
                  QKN: tl.constexpr = False, P_PAD: tl.constexpr = 1, ITEMS: tl.constexpr = 1,
                  PREFETCH_: tl.constexpr = -1, Clock=None, CLOCK_: tl.constexpr = False,
                  LOADS_FIRST_: tl.constexpr = True):
    """Each program takes the items w = pid, pid + G, ... of the (split, row, KV head) space, split
    slowest, up to the splits the longest row needs: a short context's items are the first
    rows x KV heads, and the grid (at most GRID_PER_SM a SM) does not grow with max_model_len."""
    pid = tl.program_id(0)
    g = tl.num_programs(0)
    pk = P * KVH
    if CLOCK_:  # (engine/cuda/clock.py: a dev probe's phases of each row's first split)
        stamp(Clock, pid * SLOTS, 0, pid, pid < pk)
        stamp(Clock, pid * SLOTS, 8, pid, pid < pk, NS=True)
        stamp_sm(Clock, pid * SLOTS, pid < pk)
    pdl_launch(PDL_)
    if PREFETCH_ >= 0:  # a row's first split's inputs into L2 while the q/k/v product runs
        if pid < pk:
            prefetch_first_split(K, V, Lanes, Pos, pid // KVH, pid % KVH, stride_kb, stride_kt, stride_kh, D,
                            PREFETCH_, WQ, WK, Cos, Sin, QKN)
    pdl_wait(PDL_)
    if DYNAMIC:
        r = tl.arange(0, P_PAD)
        # int64 (the positions'); an int32 item index measured no faster
        if CLOCK_:
            stamp(Clock, pid * SLOTS, 1, pid, pid < pk)
            stamp(Clock, pid * SLOTS, 6, pid, pid < pk, NS=True)
        most = tl.max(tl.load(Pos + r, mask=r < P, other=0)) + 1
        if CLOCK_:
            stamp(Clock, pid * SLOTS, 2, most.to(tl.int32), pid < pk)
        for w in range(pid, pk * ((most + SPLIT_ - 1) // SPLIT_), g):
            _split_item(Q, K, V, Lanes, Pos, Opart, Lse, Out, Count, w // pk, (w % pk) // KVH, w % KVH,
                        stride_qr, stride_qh, stride_kb, stride_kt, stride_kh, stride_or, stride_oh, stride_os,
                        stride_lr, stride_lh, stride_out, scale, KVH, GROUP, GROUP_PAD, D, SPLIT_, BLOCK_, DYNAMIC,
                        NSPLIT, FOLD, QKV, stride_qkv, WQ, WK, Cos, Sin, eps, H, QKN, Clock, CLOCK_,
                        LF_=LOADS_FIRST_)
    else:  # the interpreter cannot loop to a run-time bound: ITEMS turns, past the last masked
        for i in range(0, ITEMS):
            w = pid + i * g
            if w < pk * NSPLIT:
                _split_item(Q, K, V, Lanes, Pos, Opart, Lse, Out, Count, w // pk, (w % pk) // KVH, w % KVH,
                            stride_qr, stride_qh, stride_kb, stride_kt, stride_kh, stride_or, stride_oh,
                            stride_os, stride_lr, stride_lh, stride_out, scale, KVH, GROUP, GROUP_PAD, D, SPLIT_,
                            BLOCK_, DYNAMIC, NSPLIT, FOLD, QKV, stride_qkv, WQ, WK, Cos, Sin, eps, H, QKN,
                            LF_=LOADS_FIRST_)


@triton.jit
def _split_item(Q, K, V, Lanes, Pos, Opart, Lse, Out, Count, s, row, kvh,
                stride_qr, stride_qh, stride_kb, stride_kt, stride_kh, stride_or, stride_oh, stride_os,
                stride_lr, stride_lh, stride_out, scale, KVH,
                GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, D: tl.constexpr, SPLIT_: tl.constexpr,
                BLOCK_: tl.constexpr, DYNAMIC: tl.constexpr, NSPLIT: tl.constexpr, FOLD: tl.constexpr,
                QKV, stride_qkv, WQ, WK, Cos, Sin, eps, H: tl.constexpr, QKN: tl.constexpr,
                Clock=None, CLOCK_: tl.constexpr = False, LF_: tl.constexpr = True):
    """Split s of one row's KV head: its keys reduced, then stored (or combined: FOLD)."""
    lane = tl.load(Lanes + row).to(tl.int64)
    length = tl.load(Pos + row).to(tl.int32) + 1
    lo = s * SPLIT_
    if lo < length:
        g = tl.arange(0, GROUP_PAD)
        d = tl.arange(0, D)
        gmask = g < GROUP
        heads = kvh * GROUP + g
        if QKN:  # norm and rotate q and k, write K/V, from the q/k/v product (engine/cuda/qkfold.py)
            n = (length + SPLIT_ - 1) // SPLIT_
            qn = qk_heads(QKV, WQ, WK, Cos, Sin, K + lane * stride_kb, V + lane * stride_kb, row,
                          tl.load(Pos + row).to(tl.int64), kvh, s == n - 1, stride_qkv, stride_kt, stride_kh, eps,
                          H, KVH, GROUP, GROUP_PAD, D, LF_)
            # q goes through memory and is read back by the load below, as the unfolded kernel reads
            # it: attending with the tile in registers gave other bits.
            # The barrier also orders the K/V rows just written before the split holding pos reads them.
            tl.store(Q + row * stride_qr + heads[:, None] * stride_qh + d[None, :], qn, mask=gmask[:, None])
            tl.debug_barrier()
        q = tl.load(Q + row * stride_qr + heads[:, None] * stride_qh + d[None, :], mask=gmask[:, None], other=0.0)
        if CLOCK_:
            stamp(Clock, (row * KVH + kvh) * SLOTS, 3, tl.max(tl.max(q.to(tl.float32), 1), 0).to(tl.int32), s == 0)
        m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
        l_i = tl.zeros([GROUP_PAD], tl.float32)
        acc = tl.zeros([GROUP_PAD, D], tl.float32)
        hi = tl.minimum(lo + SPLIT_, length)
        kbase = K + lane * stride_kb + kvh * stride_kh
        vbase = V + lane * stride_kb + kvh * stride_kh
        m_i, l_i, acc = walk(q, kbase, vbase, lo, hi, stride_kt, m_i, l_i, acc, scale, D, SPLIT_, BLOCK_, DYNAMIC)
        if CLOCK_:
            stamp(Clock, (row * KVH + kvh) * SLOTS, 4, tl.max(l_i, 0).to(tl.int32), s == 0)
        acc = acc / l_i[:, None]
        lse = m_i + tl.log(l_i)
        n = (length + SPLIT_ - 1) // SPLIT_
        if FOLD:
            fold_tail(acc, lse, Opart, Lse, Out, Count, row, kvh, s, n, heads, gmask, stride_or, stride_oh,
                      stride_os, stride_lr, stride_lh, stride_out, KVH, D, GROUP_PAD, NSPLIT, DYNAMIC)
        else:
            tl.store(Opart + row * stride_or + heads[:, None] * stride_oh + s * stride_os + d[None, :], acc,
                     mask=gmask[:, None])
            tl.store(Lse + row * stride_lr + heads * stride_lh + s, lse, mask=gmask)
        if CLOCK_:
            stamp(Clock, (row * KVH + kvh) * SLOTS, 5, tl.max(lse, 0).to(tl.int32), s == 0)
            stamp(Clock, (row * KVH + kvh) * SLOTS, 7, tl.max(lse, 0).to(tl.int32), s == 0, NS=True)


@triton.jit
def _combine_kernel(Opart, Lse, Pos, Out,
                    stride_or, stride_oh, stride_os,
                    stride_lr, stride_lh,
                    stride_out,
                    D: tl.constexpr, SPLIT_: tl.constexpr, NSPLIT: tl.constexpr, DYNAMIC: tl.constexpr,
                    PDL_: tl.constexpr = 0):
    pdl_enter(PDL_)
    row = tl.program_id(0)
    h = tl.program_id(1)
    length = tl.load(Pos + row).to(tl.int32) + 1
    n = (length + SPLIT_ - 1) // SPLIT_
    d = tl.arange(0, D)
    m = float("-inf")
    l = 0.0
    acc = tl.zeros([D], tl.float32)
    if DYNAMIC:
        for s in range(0, n):
            m, l, acc = merge_split(Opart, Lse, row, h, s, n, stride_or, stride_oh, stride_os, stride_lr,
                                    stride_lh, m, l, acc, D)
    else:
        for s in range(0, NSPLIT):
            m, l, acc = merge_split(Opart, Lse, row, h, s, n, stride_or, stride_oh, stride_os, stride_lr,
                                    stride_lh, m, l, acc, D)
    tl.store(Out + row * stride_out + h * D + d, (acc / l).to(Out.dtype.element_ty))


_scratch: dict = {}


def decode_attention(kv, i: int, q: torch.Tensor, lanes: torch.Tensor, positions: torch.Tensor,
                     fold: bool | None = None, qk: tuple | None = None, programs: int | None = None,
                     mode: LaunchMode = PLAIN, clock: torch.Tensor | None = None) -> torch.Tensor:
    """q [P, H, D] at `positions` of `lanes` (KV rows already written). Returns [P, H*D].
    mode: how the kernels launch (PDL, the L2 prefetch; engine/cuda/launch.py).
    fold (default mode.fold_combine): the combine done by the split kernel's last program of each
    (row, KV head) instead of a second kernel, the same bits.
    qk = (wq, wk, cos, sin, H, eps): q is the q/k/v product [P, (H + 2 KVH) * D] instead, and the
    split kernel norms and rotates q and k and writes the K/V rows itself (engine/cuda/qkfold.py),
    as engine/cuda/fused.py qk_norm_rope_write would; only where qk_fold_takes() says so.
    programs: the split kernel's grid (default: every item on the interpreter, else at most
    GRID_PER_SM a SM); which program takes an item does not touch its bits.
    clock: [programs, SLOTS] int64, a dev probe's phase clocks (engine/cuda/clock.py); None: compiled out."""
    k, v = kv.k[i], kv.v[i]  # [lanes+1, M, KVH, D]
    kvh, max_len, d = k.shape[2], k.shape[1], k.shape[3]
    p, h = q.shape[0], (qk[4] if qk is not None else q.shape[1])
    group = h // kvh
    nsplit = triton.cdiv(max_len, SPLIT)
    fold = mode.fold_combine if fold is None else fold
    key = (p, h, d, nsplit, q.device)
    if key not in _scratch:  # allocated once, outside any graph capture's first use
        _scratch[key] = (torch.empty(p, h, nsplit, d, dtype=torch.float32, device=q.device),
                         torch.empty(p, h, nsplit, dtype=torch.float32, device=q.device),
                         torch.zeros(p, kvh, dtype=torch.int32, device=q.device))
    opart, lse, count = _scratch[key]
    out = torch.empty(p, h * d, dtype=q.dtype, device=q.device)
    q = q.contiguous()
    extra = {}
    if qk is not None:  # q is the q/k/v product: the kernel reads it there, and writes q for itself
        wq, wk, cos, sin, _, eps = qk
        extra = dict(QKV=q, stride_qkv=q.stride(0), WQ=wq, WK=wk, Cos=cos, Sin=sin, eps=eps, H=h, QKN=True)
        q = torch.empty(p, h, d, dtype=q.dtype, device=q.device)
    if clock is not None and not INTERPRET:  # a dev probe's phase clocks (engine/cuda/clock.py)
        extra.update(Clock=clock, CLOCK_=True)
    items = p * kvh * nsplit
    grid = programs or (items if INTERPRET else min(items, GRID_PER_SM * _sms(q.device)))
    _split_kernel[(grid,)](
        q, k, v, lanes, positions, opart, lse, out, count,
        q.stride(0), q.stride(1),
        k.stride(0), k.stride(1), k.stride(2),
        opart.stride(0), opart.stride(1), opart.stride(2),
        lse.stride(0), lse.stride(1),
        out.stride(0),
        d ** -0.5, p, kvh,
        GROUP=group, GROUP_PAD=group_pad(group), D=d, SPLIT_=SPLIT, BLOCK_=BLOCK,
        DYNAMIC=not INTERPRET, NSPLIT=nsplit, FOLD=fold, PDL_=mode.pdl_on(), P_PAD=triton.next_power_of_2(p),
        ITEMS=triton.cdiv(items, grid), PREFETCH_=prefetch_rows(mode), LOADS_FIRST_=p in LOADS_FIRST, num_warps=WARPS,
        **({"num_stages": STAGES[p]} if p in STAGES else {}), **extra, **mode.opts())
    if not fold:
        _combine_kernel[(p, h)](
            opart, lse, positions, out,
            opart.stride(0), opart.stride(1), opart.stride(2),
            lse.stride(0), lse.stride(1),
            out.stride(0),
            D=d, SPLIT_=SPLIT, NSPLIT=nsplit, DYNAMIC=not INTERPRET, PDL_=mode.pdl_on(), num_warps=1, **mode.opts())
    return out


@functools.cache
def _sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def group_pad(group: int) -> int:
    return max(16, triton.next_power_of_2(group))


def qk_fold_takes(n_heads: int, n_kv: int, head_dim: int) -> bool:
    """Whether the split kernel can do the q/k norm + RoPE + cache write (LaunchMode.fold_qk_norm):
    head_dim 128 (the order engine/cuda/qkfold.py reproduces) and a spare row in the head tile for K."""
    return head_dim == 128 and n_heads // n_kv < group_pad(n_heads // n_kv)
