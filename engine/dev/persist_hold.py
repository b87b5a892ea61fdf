"""Issue 14, run 24 (engine/dev/PERF.md): persist_probe's variant (e), a persistent product chain whose
programs load the first HOLD K steps of their first weight tile of the next product into registers
between arriving at a grid barrier and spinning on it, then read x and consume the held tiles with
tl.dot in the same K order as the skinny kernels (so the same bits), then run the pipelined K loop
from step HOLD. A device probe, not engine code; persist_probe times it beside (a)-(d)."""
from __future__ import annotations

import triton
import triton.language as tl

SPIN = tl.constexpr(1 << 20)  # spins before a barrier gives up (sets Err; later barriers then skip): no hang


@triton.jit
def _step(X, sx, i, M, w, v, a0, a1, KR: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr,
          KIND: tl.constexpr):
    """K step i of a tile given its weight tile(s) w (and v: up rows or K range 1), as _tile's loop body."""
    rm = tl.arange(0, BM)
    xm = rm[:, None] < M
    xp = X + rm[:, None] * sx + tl.arange(0, BK)[None, :] + i * BK
    x = tl.load(xp, mask=xm, other=0.0, cache_modifier=".cg")  # past L1: written by other SMs
    a0 = tl.dot(x, tl.trans(w), a0)
    if KIND == 1:
        a1 = tl.dot(x, tl.trans(v), a1)
    if KIND == 2:
        a1 = tl.dot(tl.load(xp + KR, mask=xm, other=0.0, cache_modifier=".cg"), tl.trans(v), a1)
    return a0, a1


@triton.jit
def _wt(W, t, J, N: tl.constexpr, K: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, KIND: tl.constexpr,
        MASKED: tl.constexpr = False, on=True):
    """Step J's weight tile(s) of tile t: (w, v), v = w for a plain product (MASKED: zeros unless on)."""
    KR: tl.constexpr = K // 2 if KIND == 2 else K
    WOFF: tl.constexpr = N * K if KIND == 1 else KR
    wp = W + (t * BN + tl.arange(0, BN))[:, None].to(tl.int64) * K + tl.arange(0, BK)[None, :] + J * BK
    if MASKED:
        w = tl.load(wp, mask=on, other=0.0)
    else:
        w = tl.load(wp)
    v = w
    if KIND != 0:
        if MASKED:
            v = tl.load(wp + WOFF, mask=on, other=0.0)
        else:
            v = tl.load(wp + WOFF)
    return w, v


@triton.jit
def _take(W, t, T, N: tl.constexpr, K: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, KIND: tl.constexpr,
          HOLD: tl.constexpr):
    """The first HOLD steps' weight tiles of tile min(t, T - 1) (a program with no tile loads a
    neighbour's and drops it); unused slots repeat step 0's."""
    tt = tl.minimum(t, T - 1)
    w0, v0 = _wt(W, tt, 0, N, K, BN, BK, KIND, False, True)
    w1, v1, w2, v2, w3, v3 = w0, v0, w0, v0, w0, v0
    if HOLD > 1:
        w1, v1 = _wt(W, tt, 1, N, K, BN, BK, KIND, False, True)
    if HOLD > 2:
        w2, v2 = _wt(W, tt, 2, N, K, BN, BK, KIND, False, True)
    if HOLD > 3:
        w3, v3 = _wt(W, tt, 3, N, K, BN, BK, KIND, False, True)
    return w0, v0, w1, v1, w2, v2, w3, v3


@triton.jit
def _tile_h(X, sx, W, Y, sy, t, M, N: tl.constexpr, K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
            BK: tl.constexpr, ST: tl.constexpr, KIND: tl.constexpr, HOLD: tl.constexpr, SEL: tl.constexpr,
            w0, v0, w1, v1, w2, v2, w3, v3):
    """Tile t of a product (persist_probe._tile's K order and epilogue), steps 0 .. HOLD - 1 from
    the held tiles, the rest pipelined from memory. SEL: one pipelined loop over all steps, the
    held steps' loads masked off and their tiles selected in (so the loop's prologue need not wait
    for x and the held dots)."""
    KR: tl.constexpr = K // 2 if KIND == 2 else K
    tl.static_assert(HOLD <= KR // BK)
    a0 = tl.zeros((BM, BN), dtype=tl.float32)
    a1 = tl.zeros((BM, BN), dtype=tl.float32)
    if SEL:
        for i in tl.range(0, KR // BK, num_stages=ST):
            w, v = _wt(W, t, i, N, K, BN, BK, KIND, True, i >= HOLD)
            w, v = tl.where(i == 0, w0, w), tl.where(i == 0, v0, v)
            if HOLD > 1:
                w, v = tl.where(i == 1, w1, w), tl.where(i == 1, v1, v)
            if HOLD > 2:
                w, v = tl.where(i == 2, w2, w), tl.where(i == 2, v2, v)
            if HOLD > 3:
                w, v = tl.where(i == 3, w3, w), tl.where(i == 3, v3, v)
            a0, a1 = _step(X, sx, i, M, w, v, a0, a1, KR, BM, BK, KIND)
    else:
        if HOLD > 0:
            a0, a1 = _step(X, sx, 0, M, w0, v0, a0, a1, KR, BM, BK, KIND)
        if HOLD > 1:
            a0, a1 = _step(X, sx, 1, M, w1, v1, a0, a1, KR, BM, BK, KIND)
        if HOLD > 2:
            a0, a1 = _step(X, sx, 2, M, w2, v2, a0, a1, KR, BM, BK, KIND)
        if HOLD > 3:
            a0, a1 = _step(X, sx, 3, M, w3, v3, a0, a1, KR, BM, BK, KIND)
        for i in tl.range(HOLD, KR // BK, num_stages=ST):
            w, v = _wt(W, t, i, N, K, BN, BK, KIND, False, True)
            a0, a1 = _step(X, sx, i, M, w, v, a0, a1, KR, BM, BK, KIND)
    rm = tl.arange(0, BM)
    _epilogue(Y, sy, rm, t * BN + tl.arange(0, BN), rm[:, None] < M, a0, a1, KIND)


@triton.jit
def _epilogue(Y, sy, rm, rn, xm, a0, a1, KIND: tl.constexpr):
    """Store a tile: x @ W^T (0), silu(g) * u rounded as _gated_kernel does (1), range 0 + range 1 (2)."""
    if KIND == 1:
        g = a0.to(Y.dtype.element_ty).to(tl.float32)
        u = a1.to(Y.dtype.element_ty).to(tl.float32)
        out = (g / (1.0 + tl.exp(-g))).to(Y.dtype.element_ty).to(tl.float32) * u
    elif KIND == 2:
        out = a0 + a1
    else:
        out = a0
    tl.store(Y + rm[:, None] * sy + rn[None, :], out.to(Y.dtype.element_ty), mask=xm)


@triton.jit
def _product(X, sx, W, Y, sy, pid, G, T, M, N: tl.constexpr, K: tl.constexpr, BM: tl.constexpr,
             BN: tl.constexpr, BK: tl.constexpr, ST: tl.constexpr, KIND: tl.constexpr, HOLD: tl.constexpr,
             SEL: tl.constexpr, w0, v0, w1, v1, w2, v2, w3, v3):
    """This program's tiles pid, pid + G, .. of a product, the first from its held steps."""
    if pid < T:
        _tile_h(X, sx, W, Y, sy, pid, M, N, K, BM, BN, BK, ST, KIND, HOLD, SEL, w0, v0, w1, v1, w2, v2, w3, v3)
    for t in range(pid + G, T, G):
        _tile_h(X, sx, W, Y, sy, t, M, N, K, BM, BN, BK, ST, KIND, 0, False, w0, v0, w1, v1, w2, v2, w3, v3)


@triton.jit
def _arrive(Bar, b):
    """Every thread's stores issued, then one release arrival at counter b; returns the count."""
    tl.debug_barrier()
    return tl.atomic_add(Bar + b, 1, sem="release", scope="gpu") + 1


@triton.jit
def _wait(Bar, Err, b, n, G, pid):
    """Spin (acquire) until all G arrived at b; program 0 then resets counter b - 1 (every program has
    left its spin once all arrived at b; the last counter is reset at the kernel's exit)."""
    if tl.atomic_add(Err, 0, sem="relaxed", scope="gpu") == 0:
        i = 0
        while (n < G) & (i < SPIN):
            n = tl.atomic_add(Bar + b, 0, sem="acquire", scope="gpu")
            i += 1
        if n < G:
            tl.atomic_add(Err, 1, sem="relaxed", scope="gpu")
    tl.debug_barrier()
    if (pid == 0) & (b > 0):
        tl.atomic_xchg(Bar + b - 1, 0, sem="relaxed", scope="gpu")


@triton.jit
def _exit(Bar, n, G):
    """At the kernel's exit: the last program to arrive at counter n resets it and counter n - 1 (the last barrier's)."""
    if tl.atomic_add(Bar + n, 1, sem="acq_rel", scope="gpu") == G - 1:
        tl.atomic_xchg(Bar + n - 1, 0, sem="relaxed", scope="gpu")
        tl.atomic_xchg(Bar + n, 0, sem="relaxed", scope="gpu")


@triton.jit
def _hold_kernel(D, Q, O, H, WQ, WO, WG, WD, Bar, Err, M, G, L: tl.constexpr, HID: tl.constexpr,
                 NQ: tl.constexpr, I: tl.constexpr, BM: tl.constexpr,
                 BNQ: tl.constexpr, BKQ: tl.constexpr, STQ: tl.constexpr,
                 BNO: tl.constexpr, BKO: tl.constexpr, STO: tl.constexpr,
                 BNG: tl.constexpr, BKG: tl.constexpr, STG: tl.constexpr,
                 BND: tl.constexpr, BKD: tl.constexpr, STD: tl.constexpr, HOLD: tl.constexpr,
                 SEL: tl.constexpr):
    """persist_probe._persist_kernel's chain and barriers; between each arrival and its spin the
    program loads the next product's held steps (layer 0's q/k/v before the loop)."""
    pid = tl.program_id(0)
    TQ: tl.constexpr = NQ // BNQ
    TO: tl.constexpr = HID // BNO
    TG: tl.constexpr = I // BNG
    TD: tl.constexpr = HID // BND
    q0, r0, q1, r1, q2, r2, q3, r3 = _take(WQ, pid, TQ, NQ, HID, BNQ, BKQ, 0, HOLD)
    for l in range(L):
        l64 = tl.cast(l, tl.int64)
        _product(D + l * M * HID, HID, WQ + l64 * NQ * HID, Q + l * M * NQ, NQ, pid, G, TQ, M, NQ, HID,
                 BM, BNQ, BKQ, STQ, 0, HOLD, SEL, q0, r0, q1, r1, q2, r2, q3, r3)
        n = _arrive(Bar, 4 * l)
        w0, v0, w1, v1, w2, v2, w3, v3 = _take(WO + l64 * HID * HID, pid, TO, HID, HID, BNO, BKO, 0, HOLD)
        _wait(Bar, Err, 4 * l, n, G, pid)
        _product(Q + l * M * NQ, NQ, WO + l64 * HID * HID, O + l * M * HID, HID, pid, G, TO, M, HID, HID,
                 BM, BNO, BKO, STO, 0, HOLD, SEL, w0, v0, w1, v1, w2, v2, w3, v3)
        n = _arrive(Bar, 4 * l + 1)
        w0, v0, w1, v1, w2, v2, w3, v3 = _take(WG + l64 * 2 * I * HID, pid, TG, I, HID, BNG, BKG, 1, HOLD)
        _wait(Bar, Err, 4 * l + 1, n, G, pid)
        _product(O + l * M * HID, HID, WG + l64 * 2 * I * HID, H + l * M * I, I, pid, G, TG, M, I, HID,
                 BM, BNG, BKG, STG, 1, HOLD, SEL, w0, v0, w1, v1, w2, v2, w3, v3)
        n = _arrive(Bar, 4 * l + 2)
        w0, v0, w1, v1, w2, v2, w3, v3 = _take(WD + l64 * HID * I, pid, TD, HID, I, BND, BKD, 2, HOLD)
        _wait(Bar, Err, 4 * l + 2, n, G, pid)
        _product(H + l * M * I, I, WD + l64 * HID * I, D + (l + 1) * M * HID, HID, pid, G, TD, M, HID, I,
                 BM, BND, BKD, STD, 2, HOLD, SEL, w0, v0, w1, v1, w2, v2, w3, v3)
        n = _arrive(Bar, 4 * l + 3)
        ln = tl.minimum(l64 + 1, L - 1)  # the last layer re-reads its own (dropped)
        q0, r0, q1, r1, q2, r2, q3, r3 = _take(WQ + ln * NQ * HID, pid, TQ, NQ, HID, BNQ, BKQ, 0, HOLD)
        _wait(Bar, Err, 4 * l + 3, n, G, pid)
    _exit(Bar, 4 * L, G)


def run_hold(ch, grid: int, hold: int, sel: bool = False):
    """(e): persist_probe.Chain ch through the held-tile kernel, `grid` programs."""
    c = ch.consts(True, 0)
    c.pop("BARRIER"), c.pop("PF")
    return _hold_kernel[(grid,)](ch.D, ch.Q, ch.O, ch.H, ch.WQ, ch.WO, ch.WG, ch.WD, ch.bar, ch.err, ch.M, grid,
                                 HOLD=hold, SEL=sel, **c, num_warps=4, num_stages=4)


def asm_report(k) -> dict:
    """A kernel compiled on the CPU: registers and spills (the bundled ptxas -v on its PTX) and, in
    its SASS, the global loads issued between each barrier arrival (a release atomic) and the first
    poll of its spin (the weights held across the barrier: run 24 checks none sink past it)."""
    import os
    import re
    import subprocess
    import tempfile
    bindir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    out = {}
    with tempfile.TemporaryDirectory() as d:
        ptx, cubin = os.path.join(d, "k.ptx"), os.path.join(d, "k.cubin")
        open(ptx, "w").write(k.asm["ptx"])
        open(cubin, "wb").write(k.asm["cubin"])
        px = [os.path.join(bindir, n) for n in ("ptxas-blackwell", "ptxas") if os.path.exists(os.path.join(bindir, n))]
        v = subprocess.run([px[0], "-arch=sm_90a", "-v", ptx, "-o", os.path.join(d, "o")],
                           capture_output=True, text=True).stderr
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", v)
        r = re.search(r"Used (\d+) registers", v)
        out.update(regs=int(r.group(1)) if r else v[-200:], spill_store_B=int(m.group(1)) if m else None,
                   spill_load_B=int(m.group(2)) if m else None)
        sass = subprocess.run([os.path.join(bindir, "cuobjdump"), "-sass", cubin], capture_output=True, text=True).stdout
    ins = [ln.split("*/", 1)[1].strip() for ln in sass.splitlines() if re.match(r"\s*/\*[0-9a-f]{4,}\*/", ln)]
    between, open_ = [], None  # arrival: the release add; the spin starts at Err's check (a strong 32-bit load)
    for s in ins:
        if "ATOMG.E.ADD.STRONG.GPU" in s and open_ is None:
            open_ = 0
        elif open_ is not None and "LDG.E.STRONG.GPU" in s:
            between.append(open_)
            open_ = None
        elif open_ is not None and "LDG.E.128 " in s:  # plain (weights); x's .cg loads are LDG.E.128.STRONG.GPU
            open_ += 1
    out["sass weight LDG.128 between arrival and spin"] = between[:8]
    out["sass lines"] = len(ins)
    return out
