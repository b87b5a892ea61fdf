"""A prompt cut's causal attention on the CPU, in query tiles at absolute positions.

The rows of a cut [start, end) are taken in tiles of TILE rows whose boundaries are multiples of
TILE (absolute positions, not the cut's): a tile [ts, te) attends over the lane's keys [0, te),
its rows padded with zeros where the cut covers only part of it, each row masked to the keys at
or before its own position (masked keys weigh exactly zero). Every call's shape is therefore set
by the tile alone, so a row's bits depend on its own lane's keys and its position, never on where
the cuts fall (R, a resumed prompt) nor on the other rows.

- bfloat16: two matmuls a tile and KV head through oneDNN (avx512_bf16 or AMX, accumulating in
  float32), GQA by stacking each KV head's query heads as rows (no repeated K/V), softmax over the
  bf16 scores with torch's float32 internals. The scores are rounded to bf16 once, as the decode
  round's attention does (engine.cpu.packed.decode_attention_buckets). On an AMD EPYC core
  (avx512_bf16, no AMX) a 4,096-token prompt's attention, one layer: ~175 ms against ~300 ms for
  float32 flash with its prefix converted every cut.
- float32: the CPU flash kernel a tile, over the keys before the tile (no mask) and the tile's
  own square causal block, merged by their log-sum-exps (a mask tensor sends flash down a slower
  path).
"""
from __future__ import annotations

import torch

TILE = 256  # query rows a tile: tile boundaries are multiples of this many positions


def tile_for(rows: int) -> int:
    """The tile for cuts of `rows` rows (--prefill-rows R): R itself up to TILE, so only a
    prompt's last cut pads a tile (cuts of 64 in tiles of 256 did 4x the attention work); an R
    above TILE and not a multiple of it pads up to two partial tiles a cut."""
    return rows if rows <= TILE else TILE


def describe(dtype: torch.dtype, rows: int) -> str:
    """What /v1/engine says of the CPU cut attention."""
    how = "oneDNN matmuls + softmax, bf16" if dtype == torch.bfloat16 else "flash, fp32"
    return f"query tiles of {tile_for(rows)} at absolute positions ({how})"


def future(rows: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
    """Added to a tile's own block of scores: -inf where key column c lies after query row r,
    else 0 (x + 0 is x exactly; an add took 4.4 ms a layer where masked_fill_ took 10.2)."""
    return torch.zeros(rows, cols, dtype=dtype).masked_fill_(torch.ones(rows, cols, dtype=torch.bool).triu(1),
                                                             float("-inf"))


class FutureMasks:
    """A runner's `future` masks, made once a shape (engine/cpu/kernels.py CpuKernels owns one):
    a prompt's cuts reuse the few tile shapes there are."""

    def __init__(self, most: int = 8):
        self.most = most
        self.made: dict[tuple[int, int, torch.dtype], torch.Tensor] = {}

    def __call__(self, rows: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
        key = (rows, cols, dtype)
        if key not in self.made:
            if len(self.made) >= self.most:
                self.made.pop(next(iter(self.made)))
            self.made[key] = future(rows, cols, dtype)
        return self.made[key]


def cut_attention_cpu(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, tile: int = TILE,
                      pad: bool = True, masks=future) -> torch.Tensor:
    """q [T, H, d] at positions [start, start+T); k, v [L, KVH, d]: the lane's cache rows, at
    least up to the cut's end (rows past it are read by the last tile and weigh exactly zero, so
    they must be finite: the cache is zero-filled). Returns [T, H*d] in q's dtype.
    pad=False (bf16, where the runner's start-up check found the products row-invariant,
    engine.cpu.packed.rows_invariant): a tile the cut covers in part multiplies only the cut's
    rows, not zero rows up to the tile (a 64-token prompt in tiles of 256: 0.3 against 1.5 ms a
    layer), with the same bits a row. masks(rows, cols, dtype): the `future` masks (a runner's
    FutureMasks keeps them; by default made each call)."""
    t, h, d = q.shape
    end, rows = start + t, k.shape[0]
    one = _tile_bf16 if q.dtype == torch.bfloat16 else _tile_flash
    pad = pad or one is _tile_flash
    out = torch.empty(t, h * d, dtype=q.dtype, device=q.device)
    for ts in range(start // tile * tile, end, tile):
        te = min(ts + tile, rows)
        a, b = max(start, ts), min(end, te)
        qt = q[a - start:b - start]
        if not pad:
            out[a - start:b - start] = _tile_bf16(qt, k[:te], v[:te], ts, masks, a - ts)
            continue
        if (a, b) != (ts, te):  # the cut covers part of the tile: the rest are zero rows
            qt = q.new_zeros(te - ts, h, d).index_copy_(0, torch.arange(a - ts, b - ts), qt)
        out[a - start:b - start] = one(qt, k[:te], v[:te], ts, masks)[a - ts:b - ts]
    return out


def _tile_bf16(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ts: int, masks, r0: int = 0) -> torch.Tensor:
    """One tile (its rows from r0 on), one KV head at a time: 2-D products on strided views of
    the cache (a batched product over KV heads copied them, and its 16 MB of scores left the
    cache: 283 against 240 ms for one layer of a 4,096-token prompt, same run), the scores'
    buffer reused by every head and the softmax done in it (another 6 %)."""
    n, h, d = q.shape
    s, kvh = k.shape[0], k.shape[1]
    rep = h // kvh
    qs = (q.float() * d ** -0.5).to(q.dtype)  # the scale on q (exact when d is a power of 4)
    qg = qs.view(n, kvh, rep, d).permute(1, 2, 0, 3).reshape(kvh, rep * n, d)
    later = masks(n, s - ts, q.dtype) if r0 == 0 else masks(s - ts, s - ts, q.dtype)[r0:r0 + n]
    out = torch.empty(kvh, rep * n, d, dtype=q.dtype, device=q.device)
    sc = torch.empty(rep * n, s, dtype=q.dtype, device=q.device)
    for j in range(kvh):
        torch.mm(qg[j], k[:, j].t(), out=sc)  # float32 sums, rounded to bf16
        sc.view(rep, n, s)[..., ts:].add_(later)
        torch.softmax(sc, -1, out=sc)
        torch.mm(sc, v[:, j], out=out[j])
    return out.view(kvh, rep, n, d).permute(2, 0, 1, 3).reshape(n, h * d)


def _tile_flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ts: int, masks=None) -> torch.Tensor:
    """One tile through the CPU's float32 flash kernel."""
    n, h, d = q.shape
    rep = h // k.shape[1]
    qh = q.float().transpose(0, 1)[None]
    kh = k.float().transpose(0, 1).repeat_interleave(rep, 0)[None]  # the private op takes no GQA
    vh = v.float().transpose(0, 1).repeat_interleave(rep, 0)[None]
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    o, lse = flash(qh, kh[:, :, ts:], vh[:, :, ts:], 0.0, True)[:2]
    if ts:
        o0, lse0 = flash(qh, kh[:, :, :ts], vh[:, :, :ts], 0.0, False)[:2]
        m = torch.maximum(lse, lse0)
        a, b = (lse0 - m).exp()[..., None], (lse - m).exp()[..., None]
        o = (o0 * a + o * b) / (a + b)
    return o[0].transpose(0, 1).reshape(n, h * d).to(q.dtype)
