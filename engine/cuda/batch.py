"""A matmul whose row results do not depend on the batch: y [M, N] = x [M, K] @ W [N, K]^T.

For filling several short prompts in one forward (CudaRunner._forward_many: one ForwardPlan of several cuts):
a row's bits must be the same whether its prompt runs alone or beside others. cuBLAS picks its
kernel (tile shape, split-K) by M, so a row's sum order changes with the batch. Here every
output tile is BLOCK_M x BLOCK_N summed over K in BLOCK_K steps from 0 up, never split; the
config depends on the weight's shape only (CONFIGS), never on M, so a row's result is a function
of that row and W alone, whatever M, whichever tile row it lands in.

Programs walk the M tiles of one column block together (pid -> column block major), so the
column block's weights come from HBM once and from L2 for the other row tiles.

The tiles take 1.5-2x cuBLAS's time on the H200. cuBLAS is row-invariant too at row counts
where its kernel does not split K: `adopt_buckets` checks that bitwise for a model's shapes at
start-up (on the H200 every multiple of 128 from 384 to 2,048 passed) and returns the Buckets the
runner keeps; a shape in them runs cuBLAS at the smallest checked count >= M (ModelRunner.prefill_many
pads the forward's rows once, `Buckets.padded_rows`), in chunks of the largest.
Runs under TRITON_INTERPRET=1 on the CPU (tests/engine/test_prefill_many.py, tests/engine/test_batch_buckets.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from engine.cuda.launch import INTERPRET


@dataclass(frozen=True)
class TileConfig:
    block_m: int = 64
    block_n: int = 128
    block_k: int = 64
    num_warps: int = 4
    num_stages: int = 4
    tma: bool = False  # tiles through the tensor-memory accelerator (Hopper) instead of pointers


DEFAULT = TileConfig()
# (N, K) -> config; part of the numerics (it fixes the sum order), so constants, never autotuned.
CONFIGS: Mapping[tuple[int, int], TileConfig] = MappingProxyType({})


@triton.jit
def _step(xp, wp, acc, BLOCK_K: tl.constexpr):
    return tl.dot(tl.load(xp), tl.trans(tl.load(wp)), acc), xp + BLOCK_K, wp + BLOCK_K


@triton.jit
def _tile_kernel(X, W, Y, M, N, K, stride_xm, stride_wn, stride_ym,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, K_STEPS: tl.constexpr):
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    pid_n = pid // tiles_m
    pid_m = pid % tiles_m
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    # rows past M (and columns past N) read row M-1 (N-1) again instead of masking: unmasked
    # loads pipeline better; those results are never stored
    xp = X + tl.minimum(rm, M - 1)[:, None] * stride_xm + rk[None, :]
    wp = W + tl.minimum(rn, N - 1)[:, None] * stride_wn + rk[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if K_STEPS:  # the interpreter
        for _ in range(0, K_STEPS):
            acc, xp, wp = _step(xp, wp, acc, BLOCK_K)
    else:
        for _ in range(0, K, BLOCK_K):
            acc, xp, wp = _step(xp, wp, acc, BLOCK_K)
    tl.store(Y + rm[:, None] * stride_ym + rn[None, :], acc.to(Y.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def _tile_tma_kernel(XD, WD, YD, M, N, K,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, K_STEPS: tl.constexpr):
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    om = (pid % tiles_m) * BLOCK_M
    on = (pid // tiles_m) * BLOCK_N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if K_STEPS:  # the interpreter
        for i in range(0, K_STEPS):
            acc = tl.dot(XD.load([om, i * BLOCK_K]), WD.load([on, i * BLOCK_K]).T, acc)
    else:
        for k in range(0, K, BLOCK_K):
            acc = tl.dot(XD.load([om, k]), WD.load([on, k]).T, acc)
    YD.store([om, on], acc.to(YD.dtype))  # rows past M are clipped by the copy engine


@dataclass(frozen=True)
class Buckets:
    """(N, K) -> row counts at which cuBLAS gave every row the same bits, whatever the count and the
    row's place (bucket_check, at start-up: adopt_buckets); such shapes run through cuBLAS at the
    smallest count >= M (rows padded with zeros), in chunks of the largest. Empty: the tiles for
    every shape."""

    table: Mapping[tuple[int, int], tuple[int, ...]] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def rows(self) -> tuple[int, ...]:
        """The checked row counts (every shape's are the same), () when none."""
        return next(iter(self.table.values()), ())

    def padded_rows(self, m: int) -> int:
        """Rows a forward of m rows is padded to, so that every product runs at a checked count: m
        when there are none."""
        rows = self.rows
        if not rows:
            return m
        return -(-m // rows[-1]) * rows[-1] if m > rows[-1] else next(b for b in rows if b >= m)


NO_BUCKETS = Buckets()


def bucketed(x: torch.Tensor, w: torch.Tensor, buckets: tuple[int, ...]) -> torch.Tensor:
    """F.linear at fixed row counts only: chunks of buckets[-1] rows, the last padded to a bucket."""
    m, top, outs = x.shape[0], buckets[-1], []
    for a in range(0, m, top):
        rows = min(top, m - a)
        b = next(b for b in buckets if b >= rows)
        xp = x[a:a + rows] if b == rows else torch.cat([x[a:a + rows], x.new_zeros(b - rows, x.shape[1])])
        outs.append(F.linear(xp, w)[:rows])
    return outs[0] if len(outs) == 1 else torch.cat(outs)


def bucket_check(w: torch.Tensor, buckets: tuple[int, ...], shifts=(0, 1, 37, 64, 128), seed: int = 0) -> tuple[int, ...]:
    """The buckets at which F.linear gives each row the bits it has at the largest bucket, at every
    shift of the rows (another tile row, other neighbours): random rows, bitwise."""
    g = torch.Generator(device=w.device).manual_seed(seed)
    top = buckets[-1]
    n = top + max(shifts)
    x = torch.randn(n, w.shape[1], device=w.device, generator=g).to(w.dtype)
    ref = torch.empty(n, w.shape[0], dtype=w.dtype, device=w.device)
    for a in sorted({*range(0, n - top + 1, top), n - top}):  # every reference row from a call of `top` rows
        ref[a:a + top] = F.linear(x[a:a + top], w)
    ok = []
    for b in buckets:
        if all(torch.equal(F.linear(x[s:s + b], w), ref[s:s + b]) for s in shifts):
            ok.append(b)
    return tuple(ok)


CANDIDATES = tuple(range(128, 2049, 128))


def adopt_buckets(weights: list[torch.Tensor], candidates: tuple[int, ...] = CANDIDATES) -> Buckets:
    """Check every weight shape (bucket_check); the row counts all of them passed become the
    Buckets of each shape, if the largest candidate is among them (chunks of it must stay exact).
    NO_BUCKETS when cuBLAS failed the check and the tiles stay."""
    common = set(candidates)
    for w in weights:
        common &= set(bucket_check(w, candidates))
    rows = tuple(sorted(common))
    if rows and rows[-1] == candidates[-1]:
        return Buckets(MappingProxyType({tuple(w.shape): rows for w in weights}))
    return NO_BUCKETS


def matmul(x: torch.Tensor, w: torch.Tensor, buckets: Buckets = NO_BUCKETS) -> torch.Tensor:
    """x [M, K] times w [N, K]^T -> [M, N] in w's dtype, rows independent of M. buckets: the
    runner's adopted cuBLAS row counts (adopt_buckets)."""
    m, (n, k) = x.shape[0], w.shape
    if (n, k) in buckets.table:
        return bucketed(x, w, buckets.table[(n, k)])
    return tiles(x, w, CONFIGS.get((n, k), DEFAULT))


def tiles(x: torch.Tensor, w: torch.Tensor, c: TileConfig = DEFAULT) -> torch.Tensor:
    """x [M, K] times w [N, K]^T through the tiles of config c: each output element one float32 chain
    over K from 0 up, whatever M and c's tile shape (so the same bits as any other such chain)."""
    m, (n, k) = x.shape[0], w.shape
    if k % c.block_k or x.shape[1] != k or x.stride(1) != 1 or not w.is_contiguous():
        raise ValueError(f"batch matmul: x {tuple(x.shape)} by w {tuple(w.shape)}: K must be a multiple of "
                         f"{c.block_k} and both row-major")
    y = torch.empty(m, n, dtype=w.dtype, device=w.device)
    if m == 0:
        return y
    grid = (triton.cdiv(m, c.block_m) * triton.cdiv(n, c.block_n),)
    steps = k // c.block_k if INTERPRET else 0
    if c.tma:
        from triton.tools.tensor_descriptor import TensorDescriptor as TD
        _tile_tma_kernel[grid](TD.from_tensor(x, [c.block_m, c.block_k]), TD.from_tensor(w, [c.block_n, c.block_k]),
                               TD.from_tensor(y, [c.block_m, c.block_n]), m, n, k,
                               BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k, K_STEPS=steps,
                               num_warps=c.num_warps, num_stages=c.num_stages)
        return y
    _tile_kernel[grid](x, w, y, m, n, k, x.stride(0), w.stride(0), y.stride(0),
                       BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k,
                       K_STEPS=steps, num_warps=c.num_warps, num_stages=c.num_stages)
    return y
