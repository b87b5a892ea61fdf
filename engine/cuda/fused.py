"""Fused Triton kernels for the CUDA forward: what a plain PyTorch layer spends ~40 small kernels on.

- `add_rmsnorm(x, r, w)`: x + r (rounded to x's dtype, the new residual) and its RMSNorm, one pass.
- `qk_norm_rope_write(qkv, ...)`: per-head RMSNorm of q and k, RoPE, and the K/V rows written
  into the cache at (lane, position): one kernel instead of ~30.
- `silu_mul(gate_up)`: silu(gate) * up.
- `embed_rmsnorm(table, ids, w)`: the embedding rows gathered and normed, one pass (the first norm).
- `argmax_rows(logits)`: torch.argmax(logits, -1)'s ids (the first maximum; a NaN counts as the
  largest), each row in chunks reduced side by side, the last chunk's program to arrive merging them.
Each row is computed by its own program from its own data only, so these are row-invariant.
Arithmetic in float32, rounded once to the model dtype (HF rounds a few more times in between;
the difference is rounding-level and checked against a float32 reference on the device).
Runs under TRITON_INTERPRET=1 on the CPU (tests/engine/test_runner.py).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.cuda.decode_attention import LOADS_FIRST
from engine.cuda.launch import PLAIN, LaunchMode, pdl_enter, pdl_launch, pdl_wait
from engine.cuda.prefetch import l2_prefetch, line_offsets


@triton.jit
def _add_rmsnorm_kernel(X, R, W, XOut, Y, N, eps, HAS_R: tl.constexpr, BLOCK: tl.constexpr,
                        PDL_: tl.constexpr = 0, PREFETCH_: tl.constexpr = False, Ids=None,
                        GATHER: tl.constexpr = False, WFIRST_: tl.constexpr = True):
    row = tl.program_id(0).to(tl.int64)
    pdl_launch(PDL_)
    if PREFETCH_:  # the weight and the residual row (written kernels ago) into L2 while the product runs
        lines = line_offsets(BLOCK, W)
        l2_prefetch(W + lines, lines < N)
        if HAS_R:
            l2_prefetch(R + row * N + lines, lines < N)
    pdl_wait(PDL_)
    c = tl.arange(0, BLOCK)
    m = c < N
    src = tl.load(Ids + row).to(tl.int64) if GATHER else row  # GATHER: X is the embedding table
    x = tl.load(X + src * N + c, mask=m, other=0.0)
    if WFIRST_:  # the weight asked for beside x, not after the sum (engine/cuda/decode_attention.py LOADS_FIRST)
        w = tl.load(W + c, mask=m, other=0.0)
    if HAS_R:
        x = (x.to(tl.float32) + tl.load(R + row * N + c, mask=m, other=0.0).to(tl.float32)).to(XOut.dtype.element_ty)
    if HAS_R or GATHER:
        tl.store(XOut + row * N + c, x, mask=m)
    xf = x.to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(xf * xf, 0) / N + eps)
    if not WFIRST_:
        w = tl.load(W + c, mask=m, other=0.0)
    y = (xf * inv).to(Y.dtype.element_ty).to(tl.float32) * w.to(tl.float32)
    tl.store(Y + row * N + c, y.to(Y.dtype.element_ty), mask=m)


def add_rmsnorm(x: torch.Tensor, r: torch.Tensor | None, w: torch.Tensor, eps: float, mode: LaunchMode = PLAIN):
    """Returns (x + r, rmsnorm(x + r) * w); with r None, (x, rmsnorm(x) * w). mode: how it launches
    (engine/cuda/launch.py), as every launcher here takes it."""
    rows, n = x.shape
    y = torch.empty_like(x)
    xo = torch.empty_like(x) if r is not None else x
    _norm(rows, n, x, r if r is not None else x, w, xo, y, eps, HAS_R=r is not None, mode=mode,
          PREFETCH_=mode.prefetch_on())
    return xo, y


def embed_rmsnorm(table: torch.Tensor, ids: torch.Tensor, w: torch.Tensor, eps: float, mode: LaunchMode = PLAIN):
    """Returns (table[ids], rmsnorm(table[ids]) * w): add_rmsnorm(embedding(ids), None, w) in one
    kernel, the same bits (the rows are copied, then normed as add_rmsnorm norms them)."""
    rows, n = ids.shape[0], table.shape[1]
    x = torch.empty(rows, n, dtype=table.dtype, device=table.device)
    y = torch.empty_like(x)
    _norm(rows, n, table, x, w, x, y, eps, HAS_R=False, PREFETCH_=False, Ids=ids, GATHER=True, mode=mode)
    return x, y


def _norm(rows: int, n: int, x, r, w, xo, y, eps: float, mode: LaunchMode, **consts) -> None:
    """_add_rmsnorm_kernel over `rows` rows of n elements: a program a row, one launch."""
    _add_rmsnorm_kernel[(rows,)](x, r, w, xo, y, n, eps, BLOCK=triton.next_power_of_2(n), PDL_=mode.pdl_on(),
                                 WFIRST_=rows in LOADS_FIRST, num_warps=8 if n >= 2048 else 4, **consts, **mode.opts())


@triton.jit
def _qk_norm_rope_kernel(QKV, WQ, WK, Cos, Sin, QOut, KC, VC, Lanes, Pos,
                         stride_row, stride_cb, stride_ct, stride_ch, eps,
                         H: tl.constexpr, KVH: tl.constexpr, D: tl.constexpr, PDL_: tl.constexpr = 0):
    pdl_enter(PDL_)
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)  # 0..H-1: q heads, H..H+KVH-1: k heads, then v heads
    half = tl.arange(0, D // 2)
    base = QKV + row * stride_row + head * D
    x1 = tl.load(base + half).to(tl.float32)
    x2 = tl.load(base + D // 2 + half).to(tl.float32)
    pos = tl.load(Pos + row).to(tl.int64)
    if head < H + KVH:
        inv = 1.0 / tl.sqrt((tl.sum(x1 * x1, 0) + tl.sum(x2 * x2, 0)) / D + eps)
        if head < H:
            w1 = tl.load(WQ + half).to(tl.float32)
            w2 = tl.load(WQ + D // 2 + half).to(tl.float32)
        else:
            w1 = tl.load(WK + half).to(tl.float32)
            w2 = tl.load(WK + D // 2 + half).to(tl.float32)
        n1 = (x1 * inv).to(QOut.dtype.element_ty).to(tl.float32) * w1
        n2 = (x2 * inv).to(QOut.dtype.element_ty).to(tl.float32) * w2
        n1 = n1.to(QOut.dtype.element_ty).to(tl.float32)
        n2 = n2.to(QOut.dtype.element_ty).to(tl.float32)
        c1 = tl.load(Cos + pos * D + half).to(tl.float32)
        s1 = tl.load(Sin + pos * D + half).to(tl.float32)
        c2 = tl.load(Cos + pos * D + D // 2 + half).to(tl.float32)
        s2 = tl.load(Sin + pos * D + D // 2 + half).to(tl.float32)
        o1 = n1 * c1 - n2 * s1
        o2 = n2 * c2 + n1 * s2
        if head < H:
            qb = QOut + row * (H * D) + head * D
            tl.store(qb + half, o1.to(QOut.dtype.element_ty))
            tl.store(qb + D // 2 + half, o2.to(QOut.dtype.element_ty))
        else:
            lane = tl.load(Lanes + row).to(tl.int64)
            kb = KC + lane * stride_cb + pos * stride_ct + (head - H) * stride_ch
            tl.store(kb + half, o1.to(KC.dtype.element_ty))
            tl.store(kb + D // 2 + half, o2.to(KC.dtype.element_ty))
    else:
        lane = tl.load(Lanes + row).to(tl.int64)
        vb = VC + lane * stride_cb + pos * stride_ct + (head - H - KVH) * stride_ch
        tl.store(vb + half, x1.to(VC.dtype.element_ty))
        tl.store(vb + D // 2 + half, x2.to(VC.dtype.element_ty))


def qk_norm_rope_write(qkv, wq, wk, cos, sin, kc, vc, lanes, positions, n_heads, n_kv, head_dim, eps,
                       mode: LaunchMode = PLAIN):
    """qkv [rows, (H + 2 KVH) * D] -> q [rows, H, D] normed and rotated; k (normed, rotated) and v
    written into kc/vc ([lanes, max_len, KVH, D], one layer) at (lanes[r], positions[r])."""
    rows = qkv.shape[0]
    q = torch.empty(rows, n_heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    _qk_norm_rope_kernel[(rows, n_heads + 2 * n_kv)](
        qkv, wq, wk, cos, sin, q, kc, vc, lanes, positions,
        qkv.stride(0), kc.stride(0), kc.stride(1), kc.stride(2), eps,
        H=n_heads, KVH=n_kv, D=head_dim, PDL_=mode.pdl_on(), num_warps=1, **mode.opts())
    return q


@triton.jit
def _silu_mul_kernel(GU, Out, I, BLOCK: tl.constexpr, PDL_: tl.constexpr = 0):
    pdl_enter(PDL_)
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = c < I
    g = tl.load(GU + row * 2 * I + c, mask=m, other=0.0).to(tl.float32)
    u = tl.load(GU + row * 2 * I + I + c, mask=m, other=0.0).to(tl.float32)
    s = (g / (1.0 + tl.exp(-g))).to(Out.dtype.element_ty).to(tl.float32)
    tl.store(Out + row * I + c, (s * u).to(Out.dtype.element_ty), mask=m)


def silu_mul(gu: torch.Tensor, mode: LaunchMode = PLAIN, out: torch.Tensor | None = None) -> torch.Tensor:
    """silu(gate) * up of gu [rows, 2I] (gate first), into `out` [rows, I] (contiguous) where given."""
    rows, two_i = gu.shape
    i = two_i // 2
    if out is None:
        out = torch.empty(rows, i, dtype=gu.dtype, device=gu.device)
    elif out.shape != (rows, i) or not out.is_contiguous():
        raise ValueError(f"silu_mul: out {tuple(out.shape)} for gu {tuple(gu.shape)}: needs ({rows}, {i}), contiguous")
    block = 1024
    _silu_mul_kernel[(rows, triton.cdiv(i, block))](gu, out, i, BLOCK=block, PDL_=mode.pdl_on(), num_warps=4,
                                                    **mode.opts())
    return out


ARGMAX_CHUNK = 4096  # a row's logits a program reduces: 38 programs a row at qwen3's 151,936


@triton.jit
def _argmax_kernel(X, Out, Val, Idx, Count, N, stride_x, CHUNKS, CHUNK: tl.constexpr, CHUNKS_PAD: tl.constexpr,
                   PDL_: tl.constexpr = 0):
    """Program (row, g): chunk g's first maximum (a NaN first: torch.argmax's order) as (value,
    index, or value NaN), stored; the row's last program to arrive reads every chunk's back in order
    and keeps the first of the largest (the first NaN if any), so which program arrives last does
    not matter."""
    pdl_enter(PDL_)
    row = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1)
    offs = g * CHUNK + tl.arange(0, CHUNK)
    m = offs < N
    v = tl.load(X + row * stride_x + offs, mask=m, other=float("-inf")).to(tl.float32)
    nan = (v != v) & m
    first_nan = tl.min(tl.where(nan, offs, N), 0)
    top = tl.max(tl.where(nan, float("-inf"), v), 0)
    first_top = tl.min(tl.where(m & (v == top), offs, N), 0)
    has_nan = first_nan < N
    tl.store(Val + row * CHUNKS + g, tl.where(has_nan, float("nan"), top))
    tl.store(Idx + row * CHUNKS + g, tl.where(has_nan, first_nan, first_top))
    tl.debug_barrier()  # every thread's stores before the arrival (acq_rel, gpu scope)
    if tl.atomic_add(Count + row, 1) == CHUNKS - 1:
        j = tl.arange(0, CHUNKS_PAD)
        mj = j < CHUNKS
        vals = tl.load(Val + row * CHUNKS + j, mask=mj, other=float("-inf"), cache_modifier=".cg")
        idx = tl.load(Idx + row * CHUNKS + j, mask=mj, other=N, cache_modifier=".cg")
        nans = (vals != vals) & mj
        best = tl.max(tl.where(nans, float("-inf"), vals), 0)
        pick = tl.where(tl.max(nans.to(tl.int32), 0) > 0, nans, mj & (vals == best))
        tl.store(Out + row, tl.min(tl.where(pick, idx, N), 0).to(tl.int64))
        tl.atomic_xchg(Count + row, 0)  # ready for the next launch (graph replays too)


_argmax_scratch: dict = {}


def argmax_rows(logits: torch.Tensor, out: torch.Tensor | None = None, mode: LaunchMode = PLAIN) -> torch.Tensor:
    """torch.argmax(logits, -1) for a decode round's [rows, vocab] logits, into `out` (int64) if
    given: chunks of each row side by side instead of one program walking it (the H200's argmax of
    qwen3's 151,936 logits took 9 us a round)."""
    logits = logits if logits.stride(-1) == 1 else logits.contiguous()
    rows, n = logits.shape
    chunks = triton.cdiv(n, ARGMAX_CHUNK)
    key = (rows, chunks, logits.device)
    if key not in _argmax_scratch:  # allocated once, before a graph capture uses it (warm-up rounds)
        _argmax_scratch[key] = (torch.empty(rows, chunks, dtype=torch.float32, device=logits.device),
                                torch.empty(rows, chunks, dtype=torch.int32, device=logits.device),
                                torch.zeros(rows, dtype=torch.int32, device=logits.device))
    val, idx, count = _argmax_scratch[key]
    out = torch.empty(rows, dtype=torch.long, device=logits.device) if out is None else out
    _argmax_kernel[(rows, chunks)](logits, out, val, idx, count, n, logits.stride(0), chunks, CHUNK=ARGMAX_CHUNK,
                                   CHUNKS_PAD=triton.next_power_of_2(chunks), PDL_=mode.pdl_on(), num_warps=4,
                                   **mode.opts())
    return out
