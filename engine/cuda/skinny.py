"""Skinny matmuls for decode rounds: y [M, N] = x [M, K] @ W [N, K]^T with M <= 64 rows.

A decode round multiplies a handful of rows by every weight matrix, so its time is the time to
stream the weights. At the round's fixed 8 rows cuBLAS picks a GEMM tile that reads qwen3-8b's
weights at ~82 % of copy bandwidth (86 % at one row). Here each program owns
BLOCK_N output columns and walks all of K in BLOCK_K steps, the rows padded to 16 for the tensor
cores (to 32 or 64 for rounds of that many lanes), so the weights stream through once with
several tiles in flight per program. A config may also cut K into `split_k` fixed ranges (more
programs in flight for the narrow matrices): each range's float32 partial goes to a scratch
buffer and the last program of a column block to arrive (an atomic counter) sums the partials
in range order 0, 1, 2, ...: which program arrives last never changes a bit.
A split sums K in another order than one chain, which every other kernel here and cuBLAS (where it
does not split) share: a row's split-K bits are no prompt cut's product's, so a mixed forward must
multiply that weight twice. The one-rank H200 tables hold no split (down in one chain cost the round
nothing: tools/down_probe.py); tensor parallel's shapes keep theirs (mixed runs at one rank).

Row invariance: an output element is its row times its column, summed over K in BLOCK_K chunks
in order (then over the K ranges in order), with one MMA shape whatever the other rows hold; a
row count up to 16 never changes a row's bits (a round runs at one fixed row count anyway). BLOCK_K sets that order, so a config is part of the numerics: configs are fixed
per weight shape and device (SkinnyTables; H200's measured there), never autotuned at run time.

Shapes are taken only where they were measured faster than cuBLAS (the device's tables); any other
goes to F.linear, and so does every shape on a device no tables were measured on. Folding silu*up
into the down projection's load was tried and measured 6x slower than silu_mul + cuBLAS on the
H200, so it is not here.
Runs under TRITON_INTERPRET=1 on the CPU (tests/engine/test_skinny.py).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Mapping

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from engine.cuda import ring as R
from engine.cuda.fused import silu_mul
from engine.cuda.launch import INTERPRET, PLAIN, LaunchMode, pdl_enter

MAX_ROWS = 64


@dataclass(frozen=True)
class SkinnyConfig:
    block_n: int = 32
    block_k: int = 256
    num_warps: int = 4
    num_stages: int = 4
    split_k: int = 1


# (N, K) or (N, K, padded rows) -> config, or None where cuBLAS was as fast. Measured on the H200
# (us per product over >= 1 GiB of weight copies in one CUDA graph, cuBLAS beside it): qwen3-8b at 16 rows (1 to 16 lanes), 32 rows (17 to 32) and 64 rows (33 to 64);
# qwen3-32b at 16 rows, whole and one rank's at tensor parallel 2 (its other row counts: cuBLAS).
H200_CONFIGS: Mapping[tuple, SkinnyConfig | None] = MappingProxyType({
    (6144, 4096): SkinnyConfig(64, 256, 4, 4),        # q/k/v   15.7 us vs cuBLAS 15.8
    (4096, 4096): SkinnyConfig(32, 128, 4, 6),        # o       12.0 us vs 13.4
    (24576, 4096): SkinnyConfig(32, 256, 4, 4),       # gate/up 51.7 us vs 56.2
    # down: one K chain, the grid cut's bits (a mixed forward runs it in one launch with a prompt cut's
    # rows); 27.9 us against 28.3 in 2 K ranges at 16 rows, the ring's 27.1 either way at 8
    (4096, 12288): SkinnyConfig(32, 256, 4, 4),       # down    (31.9 us cuBLAS)
    (151936, 4096): SkinnyConfig(64, 128, 4, 6),      # lm_head 291.6 us vs 352.5
    (6144, 4096, 32): None,                           # cuBLAS 16.4 us, best skinny 19.0
    (4096, 4096, 32): SkinnyConfig(32, 128, 4, 6),    # 13.4 us vs 14.2
    (24576, 4096, 32): None,                          # cuBLAS 52.0 us, best skinny 52.7
    (4096, 12288, 32): SkinnyConfig(32, 256, 4, 4),   # 30.9 us, one K chain (2 ranges: 29.8; cuBLAS 30.6)
    (151936, 4096, 32): SkinnyConfig(64, 128, 4, 4),  # 299.3 us vs 301.8
    (6144, 4096, 64): None,                           # cuBLAS 16.3 us, best skinny 21.3
    # o at 64 rows: cuBLAS 12.3 us alone, 32x128 12.4; in the round (PDL) the Triton tiles are 0.09 ms
    # a round faster on qwen3-8b
    (4096, 4096, 64): SkinnyConfig(32, 128, 4, 6),
    (24576, 4096, 64): None,                          # cuBLAS 53.4 us, best skinny 55.4
    (4096, 12288, 64): SkinnyConfig(32, 128, 4, 6),   # 30.5 us vs 33.1
    (151936, 4096, 64): SkinnyConfig(128, 128, 4, 4),  # 300.0 us vs 358.5
    # qwen3-32b, 16 rows (q/k/v 10240 x 5120: cuBLAS 31.5 us, best skinny 33.2)
    (5120, 8192, 16): SkinnyConfig(32, 256, 4, 4),     # o       27.6 us vs 29.4
    (51200, 5120, 16): SkinnyConfig(64, 128, 4, 6),    # gate/up 124.7 us vs 132.3
    (5120, 25600, 16): SkinnyConfig(32, 256, 4, 4),    # down    69.4 us, one K chain (2 ranges 71.0; cuBLAS 72.1)
    (151936, 5120, 16): SkinnyConfig(64, 128, 4, 6),   # lm_head 352.0 us vs 360.6
    # qwen3-32b at tensor parallel 2, one rank's shapes, 16 rows (each rank's products timed in the
    # round tools/tp_check.py runs; cuBLAS at 4 rows)
    (5120, 5120, 16): None,                            # q/k/v   cuBLAS 16.0 us, best skinny 17.3
    (5120, 4096, 16): None,                            # o       cuBLAS 13.8 us, best skinny 14.9
    (25600, 5120, 16): SkinnyConfig(64, 128, 4, 6),    # gate/up 68.8 us vs 71.8 (the gated kernel takes it)
    (5120, 12800, 16): SkinnyConfig(128, 128, 4, 4, 2),  # down  39.0 us vs 39.1 (64x256: 39.9; round -0.09 ms)
    (75968, 5120, 16): SkinnyConfig(32, 128, 4, 6),    # lm_head 181.9 us vs 186.0
})
H200_SMEM = 232_448  # bytes of shared memory a program may take on the H200 (sm_90)
# A device of no known tables: the shared memory every CUDA device since sm_20 gives a program.
SAFE_SMEM = 49_152


def block_m(m: int) -> int:
    """Rows a product is padded to for the tensor cores: 16, 32 or 64."""
    return max(16, triton.next_power_of_2(m))


@dataclass(frozen=True)
class SkinnyTables:
    """The skinny kernels' configs for one device class: `configs` (N, K) or (N, K, padded rows) ->
    config (None: cuBLAS), `gated` (2I, K, padded rows) -> the gated kernel's config, `smem` the
    shared memory a program may take, `default` the config of shapes not in `configs` (None: cuBLAS;
    tests set one to run the kernel on any shape). Part of the numerics: the runner picks them once."""

    configs: Mapping[tuple, SkinnyConfig | None] = field(default_factory=dict)
    gated: Mapping[tuple, SkinnyConfig] = field(default_factory=dict)
    smem: int = SAFE_SMEM
    default: SkinnyConfig | None = None

    def with_entries(self, configs=(), gated=()) -> "SkinnyTables":
        """These tables plus `configs` / `gated` entries [N, K, padded rows, SkinnyConfig fields (None:
        cuBLAS), ...], as tools/bench_skinny.py writes them (device checks: tools/tp_check.py --skinny)."""
        c, g = dict(self.configs), dict(self.gated)
        for n, k, rows, cfg, *_ in configs:
            c[(n, k, rows)] = SkinnyConfig(**cfg) if cfg else None
        for n, k, rows, cfg, *_ in gated:
            g[(n, k, rows)] = SkinnyConfig(**cfg)
        return replace(self, configs=MappingProxyType(c), gated=MappingProxyType(g))


def config_for(n: int, k: int, rows: int, tables: SkinnyTables) -> SkinnyConfig | None:
    """The config for weight shape (N, K) at `rows` rows: (N, K, padded rows) first, then (N, K)."""
    c = tables.configs
    return c.get((n, k, block_m(rows)), c.get((n, k), tables.default))


def smem(c: SkinnyConfig, bm: int) -> int:
    """Shared memory the pipelined x and W tiles take (bf16); Triton refuses a launch above the limit."""
    return (bm + c.block_n) * c.block_k * 2 * c.num_stages


def supports(x: torch.Tensor, w: torch.Tensor, config: SkinnyConfig | None = None,
             tables: SkinnyTables | None = None) -> bool:
    """Whether skinny() takes this product (else use F.linear)."""
    n, k = w.shape
    t = tables or tables_for(w.device)
    c = config or config_for(n, k, x.shape[0], t)
    return (c is not None and x.dim() == 2 and x.shape[1] == k and _fits(c, n, k, x.shape[0], t)
            and w.is_contiguous() and x.stride(1) == 1 and x.dtype == w.dtype)


@triton.jit
def _step(xp, wp, xm, wn, acc, BLOCK_K: tl.constexpr):
    w = tl.load(wp, mask=wn, other=0.0)
    x = tl.load(xp, mask=xm, other=0.0)
    return tl.dot(x, tl.trans(w), acc), xp + BLOCK_K, wp + BLOCK_K


@triton.jit
def _skinny_kernel(X, W, Y, Part, Count, M, N, K, stride_xm, stride_wn, stride_ym,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, K_STEPS: tl.constexpr,
                   SPLIT_K: tl.constexpr, PDL_: tl.constexpr = 0):
    pdl_enter(PDL_)
    pid = tl.program_id(0)
    sk = tl.program_id(1)
    rm = tl.arange(0, BLOCK_M)
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    xm = rm[:, None] < M
    wn = rn[:, None] < N
    k0 = sk * (K // SPLIT_K)
    xp = X + rm[:, None] * stride_xm + k0 + rk[None, :]
    wp = W + rn[:, None].to(tl.int64) * stride_wn + k0 + rk[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if K_STEPS:  # the interpreter (older Triton's cannot loop to a run-time bound)
        for _ in range(0, K_STEPS):
            acc, xp, wp = _step(xp, wp, xm, wn, acc, BLOCK_K)
    else:
        for _ in range(0, K // SPLIT_K, BLOCK_K):
            acc, xp, wp = _step(xp, wp, xm, wn, acc, BLOCK_K)
    ymask = xm & (rn[None, :] < N)
    if SPLIT_K == 1:
        tl.store(Y + rm[:, None] * stride_ym + rn[None, :], acc.to(Y.dtype.element_ty), mask=ymask)
    else:
        tile = rm[:, None] * N + rn[None, :]
        tl.store(Part + sk * BLOCK_M * N + tile, acc, mask=ymask)
        # every thread's partial stored, then release it and acquire the others' (acq_rel, gpu
        # scope); the last to arrive sums the ranges in order
        tl.debug_barrier()
        if tl.atomic_add(Count + pid, 1) == SPLIT_K - 1:
            total = tl.load(Part + tile, mask=ymask, other=0.0, cache_modifier=".cg")
            for s in range(1, SPLIT_K):
                total += tl.load(Part + s * BLOCK_M * N + tile, mask=ymask, other=0.0, cache_modifier=".cg")
            tl.store(Y + rm[:, None] * stride_ym + rn[None, :], total.to(Y.dtype.element_ty), mask=ymask)
            tl.atomic_xchg(Count + pid, 0)  # ready for the next launch (graph replays too)


@triton.jit
def _gstep(xp, gp, up, xm, wn, accg, accu, BLOCK_K: tl.constexpr):
    x = tl.load(xp, mask=xm, other=0.0)
    accg = tl.dot(x, tl.trans(tl.load(gp, mask=wn, other=0.0)), accg)
    accu = tl.dot(x, tl.trans(tl.load(up, mask=wn, other=0.0)), accu)
    return accg, accu, xp + BLOCK_K, gp + BLOCK_K, up + BLOCK_K


@triton.jit
def _gated_kernel(X, W, Y, M, I, K, stride_xm, stride_wn, stride_ym,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, K_STEPS: tl.constexpr,
                  PDL_: tl.constexpr = 0):
    """silu(x @ Wg^T) * (x @ Wu^T) for W = [Wg; Wu] ([2I, K]): each program owns BLOCK_N columns of
    both halves, then rounds as the unfused path does (each product to Y's dtype, silu to it)."""
    pdl_enter(PDL_)
    pid = tl.program_id(0)
    rm = tl.arange(0, BLOCK_M)
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    xm = rm[:, None] < M
    wn = rn[:, None] < I
    xp = X + rm[:, None] * stride_xm + rk[None, :]
    gp = W + rn[:, None].to(tl.int64) * stride_wn + rk[None, :]
    up = gp + I * stride_wn
    accg = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    accu = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if K_STEPS:  # the interpreter
        for _ in range(0, K_STEPS):
            accg, accu, xp, gp, up = _gstep(xp, gp, up, xm, wn, accg, accu, BLOCK_K)
    else:
        for _ in range(0, K, BLOCK_K):
            accg, accu, xp, gp, up = _gstep(xp, gp, up, xm, wn, accg, accu, BLOCK_K)
    g = accg.to(Y.dtype.element_ty).to(tl.float32)
    u = accu.to(Y.dtype.element_ty).to(tl.float32)
    sg = (g / (1.0 + tl.exp(-g))).to(Y.dtype.element_ty).to(tl.float32)
    tl.store(Y + rm[:, None] * stride_ym + rn[None, :], (sg * u).to(Y.dtype.element_ty), mask=xm & (rn[None, :] < I))


# (2I, K, padded rows) -> config of the gated kernel (gate/up with silu*up folded in); absent:
# the two kernels (linear, then silu_mul).
# Measured on the H200: qwen3-8b at 16 rows, 54.5 us against 58.2 for the two, bitwise equal to them;
# qwen3-32b at 16 rows, at N = 1 and one rank's at N = 2 (tools/tp_check.py's round), bitwise equal to the two.
H200_GATED: Mapping[tuple[int, int, int], SkinnyConfig] = MappingProxyType({
    (24576, 4096, 16): SkinnyConfig(32, 256, 4, 4),
    (51200, 5120, 16): SkinnyConfig(32, 128, 4, 6),   # 123.2 us vs 125.8 for the two
    (25600, 5120, 16): SkinnyConfig(32, 128, 4, 6),   # N = 2: 66.7 us vs 71.3 (74.3 with cuBLAS's gate/up)
})
H200 = SkinnyTables(H200_CONFIGS, H200_GATED, H200_SMEM)


@functools.cache
def tables_for(device: torch.device) -> SkinnyTables:
    """The tables measured on this device's class (the H200: compute capability 9.0 and its name);
    elsewhere none (every product through cuBLAS), with the device's own shared-memory limit."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return SkinnyTables()
    props = torch.cuda.get_device_properties(device)
    if (props.major, props.minor) == (9, 0) and "H200" in props.name:
        return H200
    return SkinnyTables(smem=getattr(props, "shared_memory_per_block_optin", SAFE_SMEM) or SAFE_SMEM)


def ring_split(n: int, k: int, rows: int, tables: SkinnyTables, gated: bool = False) -> int | None:
    """The K ranges engine/cuda/ring.py runs weight shape (N, K) at `rows` rows in: the Triton config's
    (so the ring's bits are the Triton kernel's); None where the ring does not take the shape."""
    c = tables.gated.get((n, k, block_m(rows))) if gated else config_for(n, k, rows, tables)
    split = None if c is None else 1 if gated else c.split_k
    return split if split is not None and R.plan(n, k, rows, split, gated) else None


def route(n: int, k: int, rows: int, tables: SkinnyTables, gated: bool = False, ring: bool = False) -> tuple:
    """The kernel linear() (gated: gate_up_silu()) runs weight shape (N, K) on at `rows` rows, and its
    tiles: ("ring", split), ("gated" or "skinny", config, padded rows), ("cublas", rows); gated's
    fallback prefixes linear()'s route with "silu". A row's bits follow its route (its tiles and K
    order), so row counts with equal routes give a row the same bits. `ring`: whether the TMA ring
    takes products (the launch mode's ring, and the ring working here)."""
    bm = block_m(rows)
    if gated:
        split = ring_split(n, k, rows, tables, gated=True)
        if ring and split is not None:
            return ("ring", split)
        c = tables.gated.get((n, k, bm))
        if c is not None and _fits(c, n, k, rows, tables) and n % 2 == 0 and gated_smem(c, bm) <= tables.smem:
            return ("gated", c, bm)
        return ("silu",) + route(n, k, rows, tables, ring=ring)
    c = config_for(n, k, rows, tables)
    if c is None or not _fits(c, n, k, rows, tables):
        return ("cublas", rows)
    split = ring_split(n, k, rows, tables)
    return ("ring", split) if ring and split is not None else ("skinny", c, bm)


def _fits(c: SkinnyConfig, n: int, k: int, rows: int, tables: SkinnyTables) -> bool:
    """supports()'s conditions on the shapes alone."""
    return rows <= MAX_ROWS and smem(c, block_m(rows)) <= tables.smem and k % (c.block_k * c.split_k) == 0


def _on_ring(x, w, split: int | None, mode: LaunchMode, ring: R.Ring | None, gated: bool = False,
             out=None) -> torch.Tensor | None:
    """The product on the ring where the mode asks for it and this runner's ring works, else (or
    where it fails) None."""
    if not mode.ring or split is None or ring is None or not ring.available():
        return None
    return ring.try_product(x, w, split, gated, mode.pdl_on() > 0, out) if R.takes(x, w, split, gated) else None


def gated_smem(c: SkinnyConfig, bm: int) -> int:
    return (bm + 2 * c.block_n) * c.block_k * 2 * c.num_stages


def gate_up_silu(x: torch.Tensor, w: torch.Tensor, config: SkinnyConfig | None = None, *,
                 mode: LaunchMode = PLAIN, tables: SkinnyTables | None = None,
                 ring: R.Ring | None = None) -> torch.Tensor:
    """silu(gate) * up of x times the fused gate/up matrix w ([2I, K]) -> [M, I]: one kernel where
    the tables' `gated` (or `config`) has the shape, else linear() then silu_mul. tables: the
    device's (default: tables_for(w.device)); mode and ring: how it launches, and the runner's ring."""
    m, (n, k) = x.shape[0], w.shape
    t = tables or tables_for(w.device)
    c = config or t.gated.get((n, k, block_m(m)))
    y = _on_ring(x, w, None if config is not None else ring_split(n, k, m, t, gated=True), mode, ring, gated=True)
    if y is not None:
        return y
    if c is None or not supports(x, w, c, t) or n % 2 or gated_smem(c, block_m(m)) > t.smem:
        return silu_mul(linear(x, w, mode=mode, tables=t, ring=ring), mode)
    y = torch.empty(m, n // 2, dtype=w.dtype, device=w.device)
    grid = triton.cdiv(n // 2, c.block_n)
    _gated_kernel[(grid,)](
        x, w, y, m, n // 2, k, x.stride(0), w.stride(0), y.stride(0),
        BLOCK_M=block_m(m), BLOCK_N=c.block_n, BLOCK_K=c.block_k, K_STEPS=k // c.block_k if INTERPRET else 0,
        PDL_=min(mode.pdl_on(), 2), num_warps=c.num_warps, num_stages=c.num_stages, **mode.opts())
    return y


def skinny(x: torch.Tensor, w: torch.Tensor, config: SkinnyConfig | None = None, *, mode: LaunchMode = PLAIN,
           tables: SkinnyTables | None = None) -> torch.Tensor:
    """x [M, K] times w [N, K]^T -> [M, N] in w's dtype."""
    t = tables or tables_for(w.device)
    c = config or config_for(*w.shape, x.shape[0], t)
    if not supports(x, w, c, t):
        raise ValueError(f"skinny: unsupported product x {tuple(x.shape)} {x.dtype} by w {tuple(w.shape)} "
                         f"{w.dtype} (no config, or shape/dtype/layout it does not take)")
    return _launch(x, w, c, mode)


_scratch: dict = {}  # split-K partials and arrival counters, one pair per shape


def _launch(x: torch.Tensor, w: torch.Tensor, c: SkinnyConfig, mode: LaunchMode = PLAIN,
            out: torch.Tensor | None = None) -> torch.Tensor:
    m, (n, k) = x.shape[0], w.shape
    bm, grid_n = block_m(m), triton.cdiv(n, c.block_n)
    y = torch.empty(m, n, dtype=w.dtype, device=w.device) if out is None else out
    part = count = y
    if c.split_k > 1:  # allocated once per shape, before a graph capture uses it (warm-up rounds)
        key = (n, bm, grid_n, c.split_k, w.device)
        if key not in _scratch:
            _scratch[key] = (torch.empty(c.split_k, bm, n, dtype=torch.float32, device=w.device),
                             torch.zeros(grid_n, dtype=torch.int32, device=w.device))
        part, count = _scratch[key]
    _skinny_kernel[(grid_n, c.split_k)](
        x, w, y, part, count, m, n, k, x.stride(0), w.stride(0), y.stride(0),
        BLOCK_M=bm, BLOCK_N=c.block_n, BLOCK_K=c.block_k,
        K_STEPS=k // (c.block_k * c.split_k) if INTERPRET else 0, SPLIT_K=c.split_k,
        PDL_=min(mode.pdl_on(), 2), num_warps=c.num_warps, num_stages=c.num_stages, **mode.opts())
    return y


def linear(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None = None, *, mode: LaunchMode = PLAIN,
           tables: SkinnyTables | None = None, ring: R.Ring | None = None) -> torch.Tensor:
    """F.linear(x, w) for a decode round: skinny when it takes the shape. out: a contiguous [M, N]
    to write into (engine/parallel/fused.py: symmetric memory), the same bits. tables: the device's
    (default: tables_for(w.device)); mode and ring: how it launches, and the runner's ring."""
    t = tables or tables_for(w.device)
    c = config_for(*w.shape, x.shape[0], t)
    if supports(x, w, c, t):
        y = _on_ring(x, w, ring_split(*w.shape, x.shape[0], t), mode, ring, out=out)
        return y if y is not None else _launch(x, w, c, mode, out)
    return F.linear(x, w) if out is None else torch.mm(x, w.t(), out=out)  # F.linear's mm for 2-D x
