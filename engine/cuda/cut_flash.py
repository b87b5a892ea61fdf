"""A prompt cut's causal attention whose bits do not depend on where the cuts fall.

`prefill.py` splits a cut's keys at the cut's own start (a dense prefix and a causal square,
merged by log-sum-exp), so a row's sum over keys is ordered by the cut's boundaries: a cut sized
by a time budget (mixed forwards) moves every prompt row's bits off the grid's. Here everything
that orders a row's arithmetic sits at absolute positions:

- query tiles: tile j holds positions [j*BM, (j+1)*BM); a cut [start, end) runs the tiles it
  touches, its rows placed at their own offsets (the rest zero and never stored), so a row always
  sits at the same place in the same tile shape, whatever the rows beside it;
- key blocks: block b covers keys [b*BN, (b+1)*BN), walked from block 0 upwards in one order;
  blocks wholly before the tile's first position go unmasked, the rest masked to key <= position,
  both split points set by the tile alone. A block wholly past a row's position leaves its running
  max, sum and accumulator bit for bit unchanged (alpha = exp2(0) = 1, p = 0, acc + 0), so a cut
  ending earlier or later changes only blocks that change nothing; and a masked block gives the
  keys at or before a row what an unmasked one does, so a query tile lower than a key block
  (BM < BN: twice the programs for a small cut) walks each row through the same blocks in the
  same order. Where its dots run the same instruction shape (a taller tile only repeats it), a
  row then has the same bits at either height: `plan_tiles` checks that on the device and times
  both;
- key splits (to fill the GPU when a cut has few tiles): split s covers keys
  [s*SPLIT, (s+1)*SPLIT), SPLIT a multiple of BM and BN, so a row's splits are those before its own
  position; partial (acc, m, l) merged in split order 0, 1, ... (a row with one split is
  normalized in place; the merge of one split is that same division).

The cut's start, row count and lane are read from the device (`cut_attention_at`), so one
compiled kernel serves every cut and a CUDA graph can carry it; `cut_attention` writes them there
for an eager call. GQA: query head h reads KV head h // (H / KVH). The cache layout is the one
`prefill.cut_attention` reads: k, v [L, KVH, d] views of one lane and layer.
Under TRITON_INTERPRET=1 it runs on the CPU (tests/engine/test_cut_flash.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634


@dataclass(frozen=True)
class CutFlashConfig:
    """The tile shapes fix the bits: a row's result is a function of (config, position, keys)."""
    block_m: int = 128  # query positions a tile
    # keys a block: 128 ran a 32k prompt's attention at 479 TFLOP/s in 1,024-row cuts on the H200,
    # 64 at 437, block_m 64 at 424 (receipts/mixed-products/20261202-0459-h200-attention.md)
    block_n: int = 128
    # keys a split (a multiple of block_m): at 128-row cuts 8,192 ran 2x faster than no split (one
    # tile a head leaves most SMs idle) and cost nothing at 1,024 (437 against 452 TFLOP/s); 2,048,
    # because a mixed forward's 64-row cut deep in a prompt ran one program a head and split, each
    # walking all 8,192 keys of its split (5.5 ms a forward on qwen3-8b at 8k-16k keys, one wave)
    split: int = 2048
    warps: int = 8
    stages: int = 3
    # K and V through tensor descriptors (Hopper's bulk tensor copies): the same values into the same
    # arithmetic, so the same bits; on the H200 1-3 % faster at every cut size, measured twice
    # (receipts/mixed-products/20261203-1912-h200-cut-tma.md, 20261204-0319-h200-cut-ws.md): for_device
    # turns it on from capability 9
    tma: bool = False

    def __post_init__(self):
        if (max(self.block_m, self.block_n) % min(self.block_m, self.block_n)
                or self.split % max(self.block_m, self.block_n)):
            raise ValueError(f"block_m and block_n must divide one another and split both: {self}")


def for_device(device: torch.device) -> CutFlashConfig:
    """The runner's config on `device`: K and V by tensor descriptors where the GPU copies tensors in
    bulk (Hopper on); the bits are the same either way."""
    return CutFlashConfig(tma=device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9)


@triton.jit
def _block(q, K, V, kb, kr, kc, pos, kv_len, s_kt, m_i, l_i, acc, qk_scale, D: tl.constexpr, BN: tl.constexpr,
           MASKED: tl.constexpr, TMA: tl.constexpr):
    """Keys [kb, kb + BN) into the running (m, l, acc), in the log2 domain. TMA: K, V descriptors of
    the [lanes * L, KVH * d] cache, this lane and head at row kr, column kc (keys past kv_len are
    read as they lie and masked below; V zeroed there, as the masked load gives it)."""
    d = tl.arange(0, D)
    key = kb + tl.arange(0, BN)
    kmask = key < kv_len
    if TMA:
        k = K.load([kr + kb, kc])
    else:
        offs = key[:, None].to(tl.int64) * s_kt + d[None, :]
        k = tl.load(K + offs, mask=kmask[:, None], other=0.0)
    qk = tl.dot(q, tl.trans(k)) * qk_scale
    if MASKED:
        qk = tl.where(key[None, :] <= pos[:, None], qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(qk - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    if TMA:
        v = V.load([kr + kb, kc])
        if MASKED:
            v = tl.where(kmask[:, None], v, 0.0)
    else:
        v = tl.load(V + offs, mask=kmask[:, None], other=0.0)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc


@triton.jit
def _cut_kernel(Q, K, V, Out, Opart, Mpart, Lpart, Meta,
                s_qt, s_qh, s_kl, s_kt, s_kh, s_ot, s_ps, s_pt, s_ms, s_mt, qk_scale,
                G: tl.constexpr, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, SPLIT: tl.constexpr,
                TMA: tl.constexpr):
    # the cut (start, rows, lane) is read from the device, so a CUDA graph captured for a row
    # capacity replays for any cut that fits it; the grid covers the capacity and programs past
    # the cut's tiles (or past a tile's splits) do nothing
    start = tl.load(Meta)
    T = tl.load(Meta + 1)
    lane = tl.load(Meta + 2).to(tl.int64)
    end = start + T
    tile0 = start // BM
    n_tiles = (end - 1) // BM + 1 - tile0
    p0 = tl.program_id(0)
    tile = tile0 + (n_tiles - 1 - p0)  # the deepest tiles (longest walks) first
    h = tl.program_id(1)
    s = tl.program_id(2)
    ts = tile * BM
    nsplit = ts // SPLIT + 1  # SPLIT % BM == 0: every row of the tile has this many splits
    if (p0 < n_tiles) & (s < nsplit):
        pos = ts + tl.arange(0, BM)
        rmask = (pos >= start) & (pos < end)
        row = (pos - start).to(tl.int64)
        d = tl.arange(0, D)
        q = tl.load(Q + row[:, None] * s_qt + h * s_qh + d[None, :], mask=rmask[:, None], other=0.0)
        kvh = h // G
        if TMA:  # K, V: descriptors of the [lanes * L, KVH * d] view, this lane's rows, this head's columns
            kr = (lane * (s_kl // s_kt)).to(tl.int32)
            kc = kvh * D
            Kh = K
            Vh = V
        else:
            kr = 0
            kc = 0
            Kh = K + lane * s_kl + kvh * s_kh
            Vh = V + lane * s_kl + kvh * s_kh
        m_i = tl.full([BM], float("-inf"), tl.float32)
        l_i = tl.zeros([BM], tl.float32)
        acc = tl.zeros([BM, D], tl.float32)
        lo = s * SPLIT
        top = lo + SPLIT
        full = tl.minimum(ts // BN * BN, top)  # blocks wholly before the tile: no row masks any
        hi = tl.minimum(tl.minimum(ts + BM, end), top)
        for kb in range(lo, full, BN):
            m_i, l_i, acc = _block(q, Kh, Vh, kb, kr, kc, pos, end, s_kt, m_i, l_i, acc, qk_scale, D, BN, False, TMA)
        for kb in range(full, hi, BN):
            m_i, l_i, acc = _block(q, Kh, Vh, kb, kr, kc, pos, end, s_kt, m_i, l_i, acc, qk_scale, D, BN, True, TMA)
        if nsplit == 1:
            o = acc / l_i[:, None]
            tl.store(Out + row[:, None] * s_ot + h * D + d[None, :], o.to(Out.dtype.element_ty), mask=rmask[:, None])
        else:
            tl.store(Opart + s * s_ps + row[:, None] * s_pt + h * D + d[None, :], acc, mask=rmask[:, None])
            tl.store(Mpart + s * s_ms + row * s_mt + h, m_i, mask=rmask)
            tl.store(Lpart + s * s_ms + row * s_mt + h, l_i, mask=rmask)


@triton.jit(do_not_specialize=["NS"])
def _merge_kernel(Out, Opart, Mpart, Lpart, Meta, NS, s_ot, s_ps, s_pt, s_ms, s_mt,
                  D: tl.constexpr, BR: tl.constexpr, SPLIT: tl.constexpr):
    """Rows of two splits or more: their partials merged in split order (the rows of one split
    were written by the kernel). NS: at least the splits of the cut's deepest row; a split past
    a row's own leaves its sums unchanged."""
    start = tl.load(Meta)
    T = tl.load(Meta + 1)
    r = tl.program_id(0) * BR + tl.arange(0, BR)
    h = tl.program_id(1)
    d = tl.arange(0, D)
    n = (start + r) // SPLIT + 1
    rmask = (r < T) & (n > 1)
    r64 = r.to(tl.int64)
    m = tl.full([BR], float("-inf"), tl.float32)
    l = tl.zeros([BR], tl.float32)
    acc = tl.zeros([BR, D], tl.float32)
    # a split past a row's own changes nothing, so the loop stops at the cut's deepest row's (a
    # graph's NS covers the deepest cut it may carry)
    for s in range(0, tl.minimum(NS, (start + T - 1) // SPLIT + 1)):
        valid = rmask & (s < n)
        ms = tl.load(Mpart + s * s_ms + r64 * s_mt + h, mask=valid, other=float("-inf"))
        ls = tl.load(Lpart + s * s_ms + r64 * s_mt + h, mask=valid, other=0.0)
        os = tl.load(Opart + s * s_ps + r64[:, None] * s_pt + h * D + d[None, :], mask=valid[:, None], other=0.0)
        m_new = tl.where(valid, tl.maximum(m, ms), m)
        a = tl.exp2(m - m_new)
        b = tl.exp2(ms - m_new)
        acc = tl.where(valid[:, None], acc * a[:, None] + os * b[:, None], acc)
        l = tl.where(valid, l * a + ls * b, l)
        m = m_new
    o = acc / tl.where(rmask, l, 1.0)[:, None]
    tl.store(Out + r64[:, None] * s_ot + h * D + d[None, :], o.to(Out.dtype.element_ty), mask=rmask[:, None])


def cut_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int,
                  config: CutFlashConfig = CutFlashConfig()) -> torch.Tensor:
    """q [T, H, d] at positions [start, start+T) (rows may be strided, d contiguous); k, v [L, KVH, d]
    of one lane and layer, L >= start + T (keys from start + T on are never read). Causal with
    the diagonal bottom-right. Returns [T, H*d] in q's dtype."""
    t = q.shape[0]
    if t == 0:
        return torch.empty(0, q.shape[1] * q.shape[2], dtype=q.dtype, device=q.device)
    c = config
    end = start + t
    # through pinned memory without blocking: a pageable copy waits for the stream, and one a layer
    # kept the host from queueing the next layer's launches while this one ran
    meta = torch.tensor([start, t, 0], dtype=torch.int32, pin_memory=q.is_cuda).to(q.device, non_blocking=True)
    tiles = (end - 1) // c.block_m + 1 - start // c.block_m
    return _launch(q, k[None], v[None], meta, tiles, (end - 1) // c.split + 1, c)


def cut_attention_at(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: torch.Tensor, max_len: int,
                     config: CutFlashConfig = CutFlashConfig()) -> torch.Tensor:
    """The same attention for a cut given on the device, so that a CUDA graph can carry it: meta
    int32 [start, rows, lane] (rows <= q's rows; q's rows past them come back unwritten); k, v
    [lanes, L, KVH, d] of one layer; max_len: the most keys any cut reads (sizes the grid).
    Every row's bits are those `cut_attention` gives it: the same kernels, the same walk."""
    c = config
    return _launch(q, k, v, meta, -(-q.shape[0] // c.block_m) + 1, -(-max_len // c.split), c)


def _launch(q, k, v, meta, tiles: int, ns: int, c: CutFlashConfig) -> torch.Tensor:
    """Both kernels over a grid of `tiles` query tiles and `ns` key splits (at least the cut's)."""
    t, h, d = q.shape
    kvh = k.shape[2]
    if q.stride(2) != 1 or k.stride(3) != 1 or k.stride() != v.stride():
        raise ValueError("cut_flash needs d contiguous and k, v of one layout")
    out = torch.empty(t, h * d, dtype=q.dtype, device=q.device)
    # the partials' strides as allocated, and float32 placeholders where every row is normalized in
    # place: a cut of one split and a cut of several then launch the same compiled kernel (Triton
    # compiles one per argument types and alignments), so a tile's arithmetic cannot differ
    sp, sm = (t * h * d, h * d), (t * h, h)
    if ns > 1:
        opart = torch.empty(ns, t, h, d, dtype=torch.float32, device=q.device)
        mpart = torch.empty(ns, t, h, dtype=torch.float32, device=q.device)
        lpart = torch.empty_like(mpart)
    else:
        opart = mpart = lpart = torch.empty(1, dtype=torch.float32, device=q.device)
    qk_scale = d ** -0.5 * LOG2E
    kk, vv = (_descriptor(k, c), _descriptor(v, c)) if c.tma else (k, v)
    _cut_kernel[(tiles, h, ns)](
        q, kk, vv, out, opart, mpart, lpart, meta,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), k.stride(2), out.stride(0), *sp, *sm, qk_scale,
        G=h // kvh, D=d, BM=c.block_m, BN=c.block_n, SPLIT=c.split, TMA=c.tma, num_warps=c.warps,
        num_stages=c.stages)
    if ns > 1:
        br = 32
        _merge_kernel[(triton.cdiv(t, br), h)](out, opart, mpart, lpart, meta, ns, out.stride(0), *sp, *sm,
                                               D=d, BR=br, SPLIT=c.split, num_warps=4)
    return out


def _descriptor(x: torch.Tensor, c: CutFlashConfig):
    """x [lanes, L, KVH, d] as a descriptor of its [lanes * L, KVH * d] rows, blocks of [block_n, d]."""
    from triton.tools.tensor_descriptor import TensorDescriptor
    lanes, length, kvh, d = x.shape
    if x.stride(2) != d or x.stride(0) != length * x.stride(1):
        raise ValueError("cut_flash's tma config needs each lane's rows of KVH * d contiguous, lanes adjacent")
    return TensorDescriptor(x, [lanes * length, kvh * d], [x.stride(1), 1], [c.block_n, d])


def plan_tiles(base: CutFlashConfig, candidates, rows: int, max_len: int, heads: int, kvh: int, d: int,
               device, dtype, time_ms=None) -> CutFlashConfig:
    """The config a graph of `rows` cut rows runs: the fastest by `time_ms(config, run)` of base and
    those `candidates` that give every row base's bits, checked on random q, k, v at cuts across tiles
    and splits (on the device: whether a lower tile keeps the bits is the dot's instruction shape's to
    say, not the math's); `run` runs cuts at four depths down to the deepest `max_len` allows (a small
    cut's programs fill the SMs' waves unevenly, and how unevenly moves with the depth's splits).
    time_ms None (nothing to time on): base."""
    if time_ms is None:
        return base
    g = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(rows, heads, d, generator=g, device=device, dtype=dtype)
    k = torch.randn(1, max_len, kvh, d, generator=g, device=device, dtype=dtype)
    v = torch.randn(1, max_len, kvh, d, generator=g, device=device, dtype=dtype)
    deep = (max_len - rows) // base.block_n * base.block_n

    def run(c, start, t):
        meta = torch.tensor([start, t, 0], dtype=torch.int32, device=device)
        return cut_attention_at(q, k, v, meta, max_len, c)[:t]

    # (start, rows): on the grid, across a split off the tile grid, deepest, and shorter than the graph
    cuts = [(st, rows) for st in sorted({0, min(deep, base.split + base.block_m // 2), deep, max(0, deep - 3)})]
    cuts.append((deep, max(1, rows - 5)))
    want = [run(base, *cut) for cut in cuts]

    def keeps_bits(c) -> bool:
        try:
            return all(torch.equal(run(c, *cut), w) for cut, w in zip(cuts, want))
        except Exception:  # a shape the device cannot run (shared memory, registers): not a candidate
            return False
    same = [base] + [c for c in candidates if c != base and keeps_bits(c)]
    depths = [deep * i // 4 // base.block_n * base.block_n for i in (1, 2, 3, 4)]
    return min(same, key=lambda c: time_ms(c, lambda: [run(c, st, rows) for st in depths]))


def causal_flops(prompt: int, heads: int, head_dim: int) -> float:
    """The causal attention of a prompt of `prompt` tokens, one layer: q.k and p.v, 2 FLOP a
    multiply-add, over the keys each row sees (row p sees p + 1)."""
    return 4.0 * heads * head_dim * prompt * (prompt + 1) / 2

