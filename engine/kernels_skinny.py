"""Skinny matmuls for decode rounds: y [M, N] = x [M, K] @ W [N, K]^T with M <= 16 rows.

A decode round multiplies a handful of rows by every weight matrix, so its time is the time to
stream the weights. At the round's fixed 8 rows cuBLAS picks a GEMM tile that reads qwen3-8b's
weights at ~82 % of copy bandwidth (86 % at one row; PERF.md run 4). Here each program owns
BLOCK_N output columns and walks all of K in BLOCK_K steps, the rows padded to 16 for the tensor
cores, so the weights stream through once with several tiles in flight per program.

Row invariance: an output element is its row times its column, summed over K in BLOCK_K chunks
in order, with one MMA shape whatever the other rows hold; the row count M never changes a
row's bits. BLOCK_K sets that order, so a config is part of the numerics: configs are fixed
per weight shape (CONFIGS, measured on the H200), never autotuned at run time.

`silu=True` takes x as a gate/up pair [M, 2K] and multiplies silu(gate) * up (rounded as
kernels_fused.silu_mul rounds: the same bits as silu_mul then skinny) while loading it: the MLP's down projection
without a separate silu kernel.
Runs under TRITON_INTERPRET=1 on the CPU (tests/test_skinny.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

MAX_ROWS = 16


@dataclass(frozen=True)
class SkinnyConfig:
    block_n: int = 32
    block_k: int = 256
    num_warps: int = 4
    num_stages: int = 4


DEFAULT = SkinnyConfig()
# (N, K) -> config; shapes not listed use DEFAULT. Filled from engine/bench_skinny.py on the H200.
CONFIGS: dict[tuple[int, int], SkinnyConfig] = {}


def config_for(n: int, k: int) -> SkinnyConfig:
    return CONFIGS.get((n, k), DEFAULT)


def supports(x: torch.Tensor, w: torch.Tensor, silu: bool = False, config: SkinnyConfig | None = None) -> bool:
    """Whether skinny() takes this product (else use F.linear)."""
    n, k = w.shape
    c = config or config_for(n, k)
    return (x.dim() == 2 and x.shape[0] <= MAX_ROWS and x.shape[1] == (2 * k if silu else k)
            and k % c.block_k == 0 and w.is_contiguous() and x.stride(1) == 1 and x.dtype == w.dtype)


@triton.jit
def _skinny_kernel(X, W, Y, M, N, K, stride_xm, stride_wn, stride_ym,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SILU: tl.constexpr):
    pid = tl.program_id(0)
    rm = tl.arange(0, BLOCK_M)
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    xm = rm[:, None] < M
    wn = rn[:, None] < N
    xp = X + rm[:, None] * stride_xm + rk[None, :]
    wp = W + rn[:, None].to(tl.int64) * stride_wn + rk[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in range(0, K, BLOCK_K):
        w = tl.load(wp, mask=wn, other=0.0)
        if SILU:
            g = tl.load(xp, mask=xm, other=0.0).to(tl.float32)
            u = tl.load(xp + K, mask=xm, other=0.0).to(tl.float32)
            s = (g / (1.0 + tl.exp(-g))).to(W.dtype.element_ty).to(tl.float32)
            x = (s * u).to(W.dtype.element_ty)
        else:
            x = tl.load(xp, mask=xm, other=0.0)
        acc = tl.dot(x, tl.trans(w), acc)
        xp += BLOCK_K
        wp += BLOCK_K
    tl.store(Y + rm[:, None] * stride_ym + rn[None, :], acc.to(Y.dtype.element_ty), mask=xm & (rn[None, :] < N))


def skinny(x: torch.Tensor, w: torch.Tensor, silu: bool = False, config: SkinnyConfig | None = None) -> torch.Tensor:
    """x [M, K] (or [M, 2K] gate/up with silu) times w [N, K]^T -> [M, N] in w's dtype."""
    if not supports(x, w, silu, config):
        raise ValueError(f"skinny: unsupported product x {tuple(x.shape)} {x.dtype} by w {tuple(w.shape)} "
                         f"{w.dtype} (silu={silu})")
    m, (n, k) = x.shape[0], w.shape
    c = config or config_for(n, k)
    y = torch.empty(m, n, dtype=w.dtype, device=w.device)
    _skinny_kernel[(triton.cdiv(n, c.block_n),)](
        x, w, y, m, n, k, x.stride(0), w.stride(0), y.stride(0),
        BLOCK_M=MAX_ROWS, BLOCK_N=c.block_n, BLOCK_K=c.block_k, SILU=silu,
        num_warps=c.num_warps, num_stages=c.num_stages)
    return y


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """F.linear(x, w) for a decode round: skinny when it takes the shape."""
    return skinny(x, w) if supports(x, w) else F.linear(x, w)


def silu_linear(gu: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """F.linear(silu(gate) * up, w) for a gate/up pair [M, 2K]."""
    if supports(gu, w, silu=True):
        return skinny(gu, w, silu=True)
    from engine.kernels_fused import silu_mul
    return F.linear(silu_mul(gu), w)
