"""Issue 14, round 5, fifth device call (run 21, engine/dev/PERF.md): what folding add+RMSNorm into
the product that reads it would buy, timed only (not exact: the norm's sum here is not the
standalone kernel's order, which needs its 8-warp [4096] layout). Each program of the probe kernel
re-reads the round's rows of x and the residual, sums the squares of each row, then runs the
product's K loop on the normalized tiles (rounded where add_rmsnorm rounds): q/k/v (skinny) and
gated gate/up, 8 rows, chains of 36 launches on the 36 layers' shapes in one CUDA graph, against
add_rmsnorm + the product as the round runs them. Not engine code.

    PYTHONPATH=. python3 -m engine.dev.round5_probe --out $OUT
"""
from __future__ import annotations

import json
import sys
import time

import torch
import triton
import triton.language as tl

import engine.dev.round2 as R2
import engine.kernels_skinny as S
from engine.kernels_fused import add_rmsnorm

RES, say = R2.RES, R2.say


@triton.jit
def _probe_kernel(X, R, NW, XO, W, Y, M, N, K, eps, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, KB: tl.constexpr, GATED: tl.constexpr, K_STEPS: tl.constexpr):
    pid = tl.program_id(0)
    rm = tl.arange(0, BLOCK_M)
    c = tl.arange(0, KB)
    inv = tl.zeros([BLOCK_M], tl.float32)
    for m in range(0, M):  # each row's sum of squares, one row at a time as add_rmsnorm's programs do
        x = (tl.load(X + m * K + c).to(tl.float32) + tl.load(R + m * K + c).to(tl.float32)).to(X.dtype.element_ty)
        if pid == 0:
            tl.store(XO + m * K + c, x)
        xf = x.to(tl.float32)
        inv = tl.where(rm == m, 1.0 / tl.sqrt(tl.sum(xf * xf, 0) / K + eps), inv)
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    xm = rm[:, None] < M
    accg = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    accu = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K_STEPS):
        ko = k0 * BLOCK_K + rk
        xt = (tl.load(X + rm[:, None] * K + ko[None, :], mask=xm, other=0.0).to(tl.float32)
              + tl.load(R + rm[:, None] * K + ko[None, :], mask=xm, other=0.0).to(tl.float32)).to(X.dtype.element_ty)
        h = (xt.to(tl.float32) * inv[:, None]).to(X.dtype.element_ty).to(tl.float32)
        h = (h * tl.load(NW + ko).to(tl.float32)[None, :]).to(X.dtype.element_ty)
        wp = W + rn[:, None].to(tl.int64) * K + ko[None, :]
        accg = tl.dot(h, tl.trans(tl.load(wp)), accg)
        if GATED:
            accu = tl.dot(h, tl.trans(tl.load(wp + N * K)), accu)
    if GATED:
        g = accg.to(Y.dtype.element_ty).to(tl.float32)
        sg = (g / (1.0 + tl.exp(-g))).to(Y.dtype.element_ty).to(tl.float32)
        out = sg * accu.to(Y.dtype.element_ty).to(tl.float32)
    else:
        out = accg
    tl.store(Y + rm[:, None] * N + rn[None, :], out.to(Y.dtype.element_ty), mask=xm)


def probe(x, r, nw, w, gated: bool, c: S.SkinnyConfig, warps: int, interpret: bool = False):
    m, k = x.shape
    n = w.shape[0] // (2 if gated else 1)
    xo, y = torch.empty_like(x), torch.empty(m, n, dtype=x.dtype, device=x.device)
    _probe_kernel[(triton.cdiv(n, c.block_n),)](x, r, nw, xo, w, y, m, n, k, 1e-6, BLOCK_M=16, BLOCK_N=c.block_n,
                                                 BLOCK_K=c.block_k, KB=triton.next_power_of_2(k), GATED=gated,
                                                 K_STEPS=k // c.block_k, num_warps=warps, num_stages=c.num_stages)
    return xo, y


def chain_us(fn, n: int) -> float:
    import engine.dev.round4_call1 as C1
    return C1.graph_us(C1.chain_graph(fn, n)) / n


def main(argv):
    dry = "--dry-run" in argv  # the CPU, the interpreter, small shapes, each chain run once untimed
    if dry:
        R2.OUT = argv[argv.index("--out") + 1]
        t0 = time.perf_counter()
        dev, dt, n_layers, rows, hid = "cpu", torch.float32, 2, 8, 64
        shapes = (("q/k/v", (96, 64), False, S.SkinnyConfig(16, 32)), ("gated gate/up", (96, 64), True, S.SkinnyConfig(16, 32)))
        timed = lambda fn, n: [fn(i) for i in range(n)] and 0.0  # noqa: E731
    else:
        t0 = R2.begin(argv)
        dev, dt, n_layers, rows, hid = "cuda", torch.bfloat16, 36, 8, 4096
        shapes = (("q/k/v", (6144, 4096), False, S.config_for(6144, 4096, 8)),
                  ("gated gate/up", (24576, 4096), True, S.GATED[(24576, 4096, 16)]))
        timed = chain_us
    out = RES.setdefault("probe", {})
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(rows, hid, generator=g, device=dev).to(dt)
    r = torch.randn(rows, hid, generator=g, device=dev).to(dt)
    nw = (1 + 0.1 * torch.randn(hid, generator=g, device=dev)).to(dt)
    for name, shape, gated, c in shapes:
        ws = [(torch.randn(*shape, generator=g, device=dev) * 0.02).to(dt) for _ in range(n_layers)]
        prod = (lambda h, w: S.gate_up_silu(h, w, config=c)) if gated else (lambda h, w: S.skinny(h, w, config=c))
        ref = prod(add_rmsnorm(x, r, nw, 1e-6)[1], ws[0])
        res = {"config": str(c)}
        res["norm + product us"] = timed(lambda i: prod(add_rmsnorm(x, r, nw, 1e-6)[1], ws[i]), n_layers)
        res["product alone us"] = timed(lambda i: prod(x, ws[i]), n_layers)
        for warps in (4, 8):
            y = probe(x, r, nw, ws[0], gated, c, warps)[1]
            res[f"folded, {warps} warps us"] = timed(lambda i: probe(x, r, nw, ws[i], gated, c, warps), n_layers)
            res[f"folded, {warps} warps: rel. diff to the two"] = float((y.float() - ref.float()).norm()
                                                                       / ref.float().norm())
        out[name] = res
        say(name, json.dumps(res))
        ws = None
        if not dry:
            torch.cuda.empty_cache()
    R2.finish(t0)


if __name__ == "__main__":
    main(sys.argv[1:])
