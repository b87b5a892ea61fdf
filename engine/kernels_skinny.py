"""Skinny matmuls for decode rounds: y [M, N] = x [M, K] @ W [N, K]^T with M <= 16 rows.

A decode round multiplies a handful of rows by every weight matrix, so its time is the time to
stream the weights. At the round's fixed 8 rows cuBLAS picks a GEMM tile that reads qwen3-8b's
weights at ~82 % of copy bandwidth (86 % at one row; engine/dev/PERF.md run 4). Here each program owns
BLOCK_N output columns and walks all of K in BLOCK_K steps, the rows padded to 16 for the tensor
cores, so the weights stream through once with several tiles in flight per program.

Row invariance: an output element is its row times its column, summed over K in BLOCK_K chunks
in order, with one MMA shape whatever the other rows hold; the row count M never changes a
row's bits. BLOCK_K sets that order, so a config is part of the numerics: configs are fixed
per weight shape (CONFIGS, measured on the H200), never autotuned at run time.

Shapes are taken only where they were measured faster than cuBLAS (CONFIGS); any other goes to
F.linear. Folding silu*up into the down projection's load was tried and measured 6x slower than
silu_mul + cuBLAS on the H200 (engine/dev/PERF.md run 5), so it is not here.
Runs under TRITON_INTERPRET=1 on the CPU (tests/test_skinny.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from engine.kernels import INTERPRET

MAX_ROWS = 16


@dataclass(frozen=True)
class SkinnyConfig:
    block_n: int = 32
    block_k: int = 256
    num_warps: int = 4
    num_stages: int = 4


# Shapes not in CONFIGS use DEFAULT; None: cuBLAS (tests set a DEFAULT to run the kernel on any shape).
DEFAULT: SkinnyConfig | None = None
# (N, K) -> config, or None where cuBLAS was as fast: measured by engine/dev/bench_skinny.py on the H200.
# qwen3-8b's shapes, engine/dev/PERF.md run 5 (second call); each beat cuBLAS at 8 rows in that run.
CONFIGS: dict[tuple[int, int], SkinnyConfig | None] = {
    (6144, 4096): SkinnyConfig(64, 256, 4, 4),     # q/k/v   15.7 us vs 15.9
    (4096, 4096): SkinnyConfig(32, 128, 4, 6),     # o       11.8 us vs 13.3
    (24576, 4096): SkinnyConfig(32, 128, 4, 6),    # gate/up 50.6 us vs 54.1
    (4096, 12288): SkinnyConfig(32, 128, 4, 6),    # down    30.8 us vs 32.5 (with silu_mul)
    (151936, 4096): SkinnyConfig(64, 128, 4, 6),   # lm_head 282.5 us vs 330.3
}


def config_for(n: int, k: int) -> SkinnyConfig | None:
    return CONFIGS.get((n, k), DEFAULT)


def supports(x: torch.Tensor, w: torch.Tensor, config: SkinnyConfig | None = None) -> bool:
    """Whether skinny() takes this product (else use F.linear)."""
    n, k = w.shape
    c = config or config_for(n, k)
    return (c is not None and x.dim() == 2 and x.shape[0] <= MAX_ROWS and x.shape[1] == k
            and k % c.block_k == 0 and w.is_contiguous() and x.stride(1) == 1 and x.dtype == w.dtype)


@triton.jit
def _step(xp, wp, xm, wn, acc, BLOCK_K: tl.constexpr):
    w = tl.load(wp, mask=wn, other=0.0)
    x = tl.load(xp, mask=xm, other=0.0)
    return tl.dot(x, tl.trans(w), acc), xp + BLOCK_K, wp + BLOCK_K


@triton.jit
def _skinny_kernel(X, W, Y, M, N, K, stride_xm, stride_wn, stride_ym,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, K_STEPS: tl.constexpr):
    pid = tl.program_id(0)
    rm = tl.arange(0, BLOCK_M)
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    xm = rm[:, None] < M
    wn = rn[:, None] < N
    xp = X + rm[:, None] * stride_xm + rk[None, :]
    wp = W + rn[:, None].to(tl.int64) * stride_wn + rk[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if K_STEPS:  # the interpreter (older Triton's cannot loop to a run-time bound)
        for _ in range(0, K_STEPS):
            acc, xp, wp = _step(xp, wp, xm, wn, acc, BLOCK_K)
    else:
        for _ in range(0, K, BLOCK_K):
            acc, xp, wp = _step(xp, wp, xm, wn, acc, BLOCK_K)
    tl.store(Y + rm[:, None] * stride_ym + rn[None, :], acc.to(Y.dtype.element_ty), mask=xm & (rn[None, :] < N))


def skinny(x: torch.Tensor, w: torch.Tensor, config: SkinnyConfig | None = None) -> torch.Tensor:
    """x [M, K] times w [N, K]^T -> [M, N] in w's dtype."""
    c = config or config_for(*w.shape)
    if not supports(x, w, c):
        raise ValueError(f"skinny: unsupported product x {tuple(x.shape)} {x.dtype} by w {tuple(w.shape)} "
                         f"{w.dtype} (no config, or shape/dtype/layout it does not take)")
    return _launch(x, w, c)


def _launch(x: torch.Tensor, w: torch.Tensor, c: SkinnyConfig) -> torch.Tensor:
    m, (n, k) = x.shape[0], w.shape
    y = torch.empty(m, n, dtype=w.dtype, device=w.device)
    _skinny_kernel[(triton.cdiv(n, c.block_n),)](
        x, w, y, m, n, k, x.stride(0), w.stride(0), y.stride(0),
        BLOCK_M=MAX_ROWS, BLOCK_N=c.block_n, BLOCK_K=c.block_k, K_STEPS=k // c.block_k if INTERPRET else 0,
        num_warps=c.num_warps, num_stages=c.num_stages)
    return y


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """F.linear(x, w) for a decode round: skinny when it takes the shape."""
    c = config_for(*w.shape)
    return _launch(x, w, c) if supports(x, w, c) else F.linear(x, w)

