"""Issue 14, runs 26-27 (engine/dev/PERF.md): run 25's Gluon product chain (engine/dev/persist_gluon.py: L products
of [4096, 4096] bf16 at 8 rows, one persistent kernel, program p owning columns p * 32.. of every product)
with the ring WARP-SPECIALIZED (gl.warp_specialize): a 1-warp loader partition issues every TMA copy into
the ring after waiting on the slot's "empty" mbarrier, and runs the grid barrier; the 4 MMA warps wait on
"ready", load a group of 4 stages into registers, release those slots ("empty", after one barrier of the
partition's warps), and run the MMAs. Run 25's single-partition ring streamed at only 53 % of copy.
Variants (same bytes, same K order):
  (c) no barriers: the loader streams product after product;
  (b) a grid barrier after each product, run by the loader once the MMA warps' stores are done (a
      "stored" mbarrier); the ring refilled after the spin;
  (g) (b) where the loader issues the next product's first S stages of W before it arrives and spins,
      and their x after the spin.
Run 26's ring shapes were BK 64 x 16 / 64 x 32 / 128 x 16 (best: 128 x 16 at 87 % of copy). Run 27 (RINGS)
cuts the MMA warps' work a stage, to stream at copy rate: one "empty" arrive a 4-stage group (G4), the
group's 4 waits before its loads (W), BK 256 stages (2 a group), and wgmma straight from shared memory (WG:
no register copy; x's slot is 64 rows, 8 of them real). Run 28 (WX) keeps x's slot at 8 rows under wgmma:
each 64-row A view runs on into the next slots, so wgmma fits BK 128 x 16 and BK 256 x 8. Each ring has its
own K order; every variant of a ring shares it. (g) runs S = 8 and S = NS / 2 (the whole ring of 16 only lost).

    PYTHONPATH=. python3 -m engine.dev.persist_ws --out $OUT [--reps 15] [--rings BK128x16WX,BK256x8WX]
    PYTHONPATH=/tmp/t36:. python3 -m engine.dev.persist_ws --out /tmp/pw --compile-check   # CPU: sm_90
"""
from __future__ import annotations

import json
import statistics
import sys

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, mma_v2, tma, warpgroup_mma, warpgroup_mma_wait

from engine.dev.persist_gluon import (_FENCE, SPIN, _mma4, _stage, chain_tensors, cli, compile_one, layouts,
                                     reference, run_once, time_interleaved)

# name -> (BK, NS, P stages an MMA group, G stages released by one "empty" arrive, WF the group's waits first,
# WG wgmma from shared memory, WX x's slot 8 rows: wgmma's 64-row A view runs on into the next slots, run 28)
RINGS = {"BK128x16": (128, 16, 4, 1, False, False, False), "BK128x16G4": (128, 16, 4, 4, False, False, False),
         "BK128x16G4W": (128, 16, 4, 4, True, False, False), "BK64x16G4W": (64, 16, 4, 4, True, False, False),
         "BK256x8G2": (256, 8, 2, 2, False, False, False), "BK64x16WG": (64, 16, 4, 4, True, True, False),
         "BK128x8WG": (128, 8, 4, 4, True, True, False), "BK64x16WX": (64, 16, 4, 4, True, True, True),
         "BK128x16WX": (128, 16, 4, 4, True, True, True), "BK256x8WX": (256, 8, 2, 2, True, True, True)}
VARIANTS = {"(c) no barriers": (False, 0), "(b) barriers, ring refilled after the spin": (True, 0),
            "(g) 4 stages": (True, 4), "(g) 8 stages": (True, 8), "(g) 16 stages": (True, 16)}


def wanted(ns, s):
    """(c), (b), (g) S = 8 and S = NS / 2 (run 27: staging the whole ring of 16 only loses)."""
    return s in (0, 8, ns // 2) and s <= ns
SHAPE = dict(L=144, N=4096, K=4096, BN=32)


@gluon.jit
def _load(wd, xd, w_s, x_s, ready, empty, t, l, j, row0, N: gl.constexpr, BK: gl.constexpr, NS: gl.constexpr,
          W: gl.constexpr, X: gl.constexpr, EXPECT: gl.constexpr, G: gl.constexpr, XC: gl.constexpr):
    """Global stage t (product l, K step j) into slot t % NS: wait until the MMA warps released the slot's
    previous stage (t - NS; slots s // G share one "empty" barrier, so a group's later waits pass at once),
    then W's [BN, BK] and / or x's 8 rows (XC > 0: XC [8, 64] copies into x's [8, 64] slots s * XC..);
    EXPECT arms "ready" for both."""
    s = t % NS
    if EXPECT:
        mbarrier.wait(empty.index(s // G), ((t // NS) + 1) & 1, pred=t >= NS)
        mbarrier.expect(ready.index(s), wd.block_type.nbytes + xd.block_type.nbytes * (XC if XC > 0 else 1))
    if W:
        tma.async_copy_global_to_shared(wd, [l * N + row0, j * BK], ready.index(s), w_s.index(s))
    if X & (XC == 0):
        tma.async_copy_global_to_shared(xd, [l * 8, j * BK], ready.index(s), x_s.index(s).slice(0, 8))
    if X & (XC > 0):
        for c in gl.static_range(XC):
            tma.async_copy_global_to_shared(xd, [l * 8, j * BK + 64 * c], ready.index(s), x_s.index(s * XC + c))


@gluon.jit
def _loader(wd, xd, w_s, x_s, ready, empty, stored, Bar, Err, L: gl.constexpr, N: gl.constexpr, K: gl.constexpr,
            BN: gl.constexpr, BK: gl.constexpr, NS: gl.constexpr, BARRIER: gl.constexpr, S: gl.constexpr,
            G: gl.constexpr, XC: gl.constexpr):
    """The 1-warp partition: every TMA copy, and the grid barrier (arrive after the stores, spin)."""
    KT: gl.constexpr = K // BK
    pid = gl.program_id(0)
    NP = gl.num_programs(0)  # the grid (G is the release group)
    on = pid < N // BN
    row0 = gl.minimum(pid, N // BN - 1) * BN
    warm = gl.full([32], 0, gl.int32, layout=gl.BlockedLayout([1], [32], [1], [0]))
    for l in range(L):
        if on:
            first = S if l > 0 else 0
            for j in range(first, KT):
                _load(wd, xd, w_s, x_s, ready, empty, l * KT + j, l, j, row0, N, BK, NS, True, True, True, G, XC)
            if (S > 0) & (l + 1 < L):  # (g): W of the next product's first S stages, before the spin
                for q in gl.static_range(S):
                    _load(wd, xd, w_s, x_s, ready, empty, (l + 1) * KT + q, l + 1, q, row0, N, BK, NS,
                          True, False, True, G, XC)
        if BARRIER & (l + 1 < L):  # 143 barriers: none after the last product
            if on:
                mbarrier.wait(stored, l & 1)  # the MMA warps' stores of product l issued and fenced
            gl.inline_asm_elementwise(_FENCE, "=r,r", [warm], dtype=gl.int32, is_pure=False, pack=1)
            n = gl.atomic_add(Bar, 1, sem="release", scope="gpu") + 1
            if gl.atomic_add(Err, 0, sem="relaxed", scope="gpu") == 0:
                i = 0
                while (n < NP * (l + 1)) & (i < SPIN):
                    n = gl.atomic_add(Bar, 0, sem="acquire", scope="gpu")
                    i += 1
                if n < NP * (l + 1):
                    gl.atomic_add(Err, 1, sem="relaxed", scope="gpu")
            gl.inline_asm_elementwise(_FENCE, "=r,r", [warm], dtype=gl.int32, is_pure=False, pack=1)
        if on & (S > 0) & (l + 1 < L):  # x of the staged stages, now that it is written
            for q in gl.static_range(S):
                _load(wd, xd, w_s, x_s, ready, empty, (l + 1) * KT + q, l + 1, q, row0, N, BK, NS,
                      False, True, False, G, XC)


@gluon.jit
def _k4(x_s, w_s, ready, empty, l, c0, KT: gl.constexpr, NS: gl.constexpr, G: gl.constexpr, a_l: gl.constexpr,
        b_l: gl.constexpr, WF: gl.constexpr):
    """Product l's K loop, 4 stages a group, 4 accumulator chains summed in a fixed order (run 25's K order)."""
    c1, c2, c3 = c0, c0, c0
    for i in range(KT // 4):
        t = l * KT + 4 * i
        if WF:  # the group's 4 waits first, then its loads
            for u in gl.static_range(4):
                mbarrier.wait(ready.index((t + u) % NS), ((t + u) // NS) & 1)
            a0, b0 = x_s.index(t % NS).load(a_l), w_s.index(t % NS).permute((1, 0)).load(b_l)
            a1, b1 = x_s.index((t + 1) % NS).load(a_l), w_s.index((t + 1) % NS).permute((1, 0)).load(b_l)
            a2, b2 = x_s.index((t + 2) % NS).load(a_l), w_s.index((t + 2) % NS).permute((1, 0)).load(b_l)
            a3, b3 = x_s.index((t + 3) % NS).load(a_l), w_s.index((t + 3) % NS).permute((1, 0)).load(b_l)
        else:
            a0, b0 = _stage(x_s, w_s, ready, t, NS, a_l, b_l)
            a1, b1 = _stage(x_s, w_s, ready, t + 1, NS, a_l, b_l)
            a2, b2 = _stage(x_s, w_s, ready, t + 2, NS, a_l, b_l)
            a3, b3 = _stage(x_s, w_s, ready, t + 3, NS, a_l, b_l)
        gl.thread_barrier()  # this partition's warps: every warp has the 4 slots in registers
        for u in gl.static_range(4 // G):  # free them: one "empty" arrive a G-slot barrier
            mbarrier.arrive(empty.index(((t + u * G) % NS) // G))
        c0, c1, c2, c3 = _mma4(a0, b0, a1, b1, a2, b2, a3, b3, c0, c1, c2, c3)
    return (c0 + c1) + (c2 + c3)


@gluon.jit
def _k2(x_s, w_s, ready, empty, l, c0, KT: gl.constexpr, NS: gl.constexpr, G: gl.constexpr, a_l: gl.constexpr,
        b_l: gl.constexpr):
    """Product l's K loop, 2 (BK 256) stages a group, 2 accumulator chains."""
    c1 = c0
    for i in range(KT // 2):
        t = l * KT + 2 * i
        a0, b0 = _stage(x_s, w_s, ready, t, NS, a_l, b_l)
        a1, b1 = _stage(x_s, w_s, ready, t + 1, NS, a_l, b_l)
        gl.thread_barrier()
        for u in gl.static_range(2 // G):
            mbarrier.arrive(empty.index(((t + u * G) % NS) // G))
        c0 = mma_v2(a0, b0, c0)
        c1 = mma_v2(a1, b1, c1)
    return c0 + c1


@gluon.jit
def _kwg(x_s, w_s, ready, empty, l, c0, KT: gl.constexpr, NS: gl.constexpr):
    """Product l's K loop by wgmma straight from shared memory (x's slot is 64 rows, 56 of them never
    written: their output rows are dropped), 4 stages a group on one accumulator chain; a group's slots
    are released (one arrive) once the next group's wgmmas are issued and the group's own are complete."""
    acc = c0
    for i in range(KT // 4):
        t = l * KT + 4 * i
        for u in gl.static_range(4):
            mbarrier.wait(ready.index((t + u) % NS), ((t + u) // NS) & 1)
        for u in gl.static_range(4):
            acc = warpgroup_mma(x_s.index((t + u) % NS), w_s.index((t + u) % NS).permute((1, 0)), acc,
                                is_async=True)
        acc = warpgroup_mma_wait(4, deps=[acc])  # the previous group's 4 are complete
        if i > 0:
            mbarrier.arrive(empty.index(((t - 4) % NS) // 4))
    acc = warpgroup_mma_wait(0, deps=[acc])
    mbarrier.arrive(empty.index(((l * KT + KT - 4) % NS) // 4))
    return acc


@gluon.jit
def _kwx(x_s, w_s, ready, empty, l, c0, KT: gl.constexpr, NS: gl.constexpr, P: gl.constexpr, XC: gl.constexpr):
    """wgmma with x's slot kept at 8 rows: x is NS * XC [8, 64] slots (as many spare); a wgmma's A is the
    64-row view starting at its slot, rows 8.. being the next slots (output rows never stored). A stage is XC
    wgmmas of K 64; a group of P stages is released once the next group's wgmmas are issued and its own are
    complete. (The ring unrolled, static slots, spills: ~256 hoisted descriptors.)"""
    acc = c0
    for i in range(KT // P):
        t = l * KT + P * i
        for u in gl.static_range(P):
            mbarrier.wait(ready.index((t + u) % NS), ((t + u) // NS) & 1)
        for u in gl.static_range(P):
            for c in gl.static_range(XC):
                a = x_s.index(((t + u) % NS) * XC + c)._reinterpret(gl.bfloat16, [64, 64], x_s.layout)
                acc = warpgroup_mma(a, w_s.index((t + u) % NS).slice(64 * c, 64, dim=1).permute((1, 0)), acc,
                                    is_async=True)
        acc = warpgroup_mma_wait(P * XC, deps=[acc])  # the previous group's are complete
        if i > 0:
            mbarrier.arrive(empty.index(((t - P) % NS) // P))
    acc = warpgroup_mma_wait(0, deps=[acc])
    mbarrier.arrive(empty.index(((l * KT + KT - P) % NS) // P))
    return acc


@gluon.jit
def _mma(x_s, w_s, ready, empty, stored, A, L: gl.constexpr, N: gl.constexpr, K: gl.constexpr,
         BN: gl.constexpr, BK: gl.constexpr, NS: gl.constexpr, BARRIER: gl.constexpr, P: gl.constexpr,
         G: gl.constexpr, WF: gl.constexpr, WG: gl.constexpr, WX: gl.constexpr):
    """The 4 MMA warps (default partition): P stages a group (_k4 / _k2), then the product's stores."""
    KT: gl.constexpr = K // BK
    pid = gl.program_id(0)
    XM: gl.constexpr = 64 if WG else 16  # rows of the accumulator (8 of them real)
    if WG:
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16])
    else:
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 4], instr_shape=[16, 8])
    a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=8)
    b_l: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=8)
    rm = gl.arange(0, XM, layout=gl.SliceLayout(1, mma))
    rn = gl.minimum(pid, N // BN - 1) * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, mma))
    warm = gl.full([XM], 0, gl.int32, layout=gl.SliceLayout(1, mma))
    if pid < N // BN:
        for l in range(L):
            c0 = gl.zeros([XM, BN], gl.float32, layout=mma)
            if WX:
                acc = _kwx(x_s, w_s, ready, empty, l, c0, KT, NS, P, BK // 64)
            elif WG:
                acc = _kwg(x_s, w_s, ready, empty, l, c0, KT, NS)
            elif P == 4:
                acc = _k4(x_s, w_s, ready, empty, l, c0, KT, NS, G, a_l, b_l, WF)
            else:
                acc = _k2(x_s, w_s, ready, empty, l, c0, KT, NS, G, a_l, b_l)
            gl.store(A + (l + 1) * 8 * K + rm[:, None] * K + rn[None, :], acc.to(gl.bfloat16), mask=rm[:, None] < 8)
            if BARRIER:  # stores -> TMA readers (async proxy), then tell the loader
                gl.inline_asm_elementwise(_FENCE, "=r,r", [warm], dtype=gl.int32, is_pure=False, pack=1)
                gl.thread_barrier()
                mbarrier.arrive(stored)


@gluon.jit
def _ws_kernel(wd, xd, A, Bar, Err, L: gl.constexpr, N: gl.constexpr, K: gl.constexpr, BN: gl.constexpr,
               BK: gl.constexpr, NS: gl.constexpr, BARRIER: gl.constexpr, S: gl.constexpr, P: gl.constexpr,
               G: gl.constexpr, WF: gl.constexpr, WG: gl.constexpr, WX: gl.constexpr):
    """A[l + 1] = A[l] W_l^T for l < L (A [L + 1, 8, K] bf16, W [L * N, K])."""
    gl.static_assert((K // BK) % (2 * NS) == 0)
    gl.static_assert((S <= NS) & ((K // BK) % P == 0) & (P % G == 0) & (NS % P == 0))
    w_s = gl.allocate_shared_memory(gl.bfloat16, [NS, BN, BK], wd.layout)
    gl.static_assert((not WG) or (G == P))
    XC: gl.constexpr = BK // 64 if WX else 0
    if WX:  # 8-row [8, 64] slots, XC a stage, and as many spare (7 needed, shapes are powers of 2): the last
        x_s = gl.allocate_shared_memory(gl.bfloat16, [2 * NS * XC, 8, 64], xd.layout)  # slot's 64 rows fit
    else:
        x_s = gl.allocate_shared_memory(gl.bfloat16, [NS, 64 if WG else 16, BK], xd.layout)  # rows 8.. never written
    ready = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NS // G, 1], mbarrier.MBarrierLayout())
    stored = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    for j in gl.static_range(NS):
        mbarrier.init(ready.index(j), count=1)
    for j in gl.static_range(NS // G):
        mbarrier.init(empty.index(j), count=1)
    mbarrier.init(stored, count=1)
    gl.warp_specialize([(_mma, (x_s, w_s, ready, empty, stored, A, L, N, K, BN, BK, NS, BARRIER, P, G, WF, WG, WX)),
                        (_loader, (wd, xd, w_s, x_s, ready, empty, stored, Bar, Err, L, N, K, BN, BK, NS, BARRIER, S,
                                   G, XC))],
                       [1], [48])


def compile_check(out: dict):
    """Every ring and variant compiled for sm_90 (triton 3.6 when PYTHONPATH has it): registers, spills,
    shared memory, and the PTX's TMA, mbarrier, MMA, named-barrier and setmaxnreg counts."""
    wl, xl = layouts()
    keys = ("cp.async.bulk.tensor", "mbarrier.try_wait", "mbarrier.arrive", "mma.sync", "bar.sync", "barrier.sync",
            "setmaxnreg", "wgmma.mma_async", "wgmma.commit_group", "wgmma.wait_group", "fence.proxy.async.global", "atom.global.gpu.release", "ld.global.gpu.acquire")
    for ring, (bk, ns, p, g, wf, wg, wx) in RINGS.items():
        sig = {"wd": f"tensordesc<bf16[{SHAPE['BN']}, {bk}],{wl!r}>", "xd": f"tensordesc<bf16[8, {64 if wx else bk}],{xl!r}>",
               "A": "*bf16", "Bar": "*i32", "Err": "*i32"}
        for name, (bar, s) in VARIANTS.items():
            if wanted(ns, s):
                compile_one(_ws_kernel, sig, dict(SHAPE) | {"BK": bk, "NS": ns, "BARRIER": bar, "S": s, "P": p, "G": g,
                                                                "WF": wf, "WG": wg, "WX": wx},
                            keys, out, f"{ring} {name}")


class Setup:
    """L random [N, K] bf16 weights (std 1/sqrt(K)), A [L + 1, 8, K], one pair of descriptors a ring."""

    def __init__(self, L, N, K, BN):
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
        self.W, self.A, self.x0, self.bar, self.err = chain_tensors(L, N, K)  # run 25's weights and x
        wl, xl = layouts()
        x2 = self.A.view((L + 1) * 8, K)
        self.desc = {r: (TensorDescriptor.from_tensor(self.W, [BN, bk], wl),
                         TensorDescriptor.from_tensor(x2, [8, 64 if wx else bk], xl)) for r, (bk, *_, wx) in RINGS.items()}
        self.bytes = self.W.numel() * 2

    def launch(self, grid, ring, barrier, s):
        self.bar.zero_()
        bk, ns, p, g, wf, wg, wx = RINGS[ring]
        wd, xd = self.desc[ring]
        return _ws_kernel[(grid,)](wd, xd, self.A, self.bar, self.err, **SHAPE, BK=bk, NS=ns, BARRIER=barrier, S=s,
                                   P=p, G=g, WF=wf, WG=wg, WX=wx, num_warps=4)

    def reference(self, L, N, **_):
        return reference(self.x0, self.W, L, N)


def check(out, su, grid, save):
    """Each ring x variant once: registers, bits against (b) of its ring and the float32 chain."""
    ref, outs, ok = su.reference(**SHAPE), {}, []
    # every ring's (c) first, the mma.sync rings before the wgmma ones: a later hang leaves the figures before it
    order = [(n, r) for wg in (False, True) for n in VARIANTS for r in RINGS if RINGS[r][5] == wg]
    for name, ring in order:
        (bar, s), key = VARIANTS[name], f"{ring} {name}"
        if not wanted(RINGS[ring][1], s):
            continue
        got = run_once(su, lambda: su.launch(grid, ring, bar, s), ref, out, key)
        if got is None:
            continue
        outs[key] = got
        b = f"{ring} (b) barriers, ring refilled after the spin"
        if bar and b in outs and key != b:
            out[key]["elements differing from (b)"] = int((outs[key] != outs[b]).sum())
        w0 = next((f"{r} (b) barriers, ring refilled after the spin" for r in RINGS if RINGS[r][5]), None)
        if RINGS[ring][5] and bar and s == 0 and w0 in outs and key != w0:  # wgmma rings: one K order
            out[key][f"elements differing from {w0.split(' ', 1)[0]} (b)"] = int((outs[key] != outs[w0]).sum())
        if not out[key]["barrier timeouts"]:
            ok.append(key)
        if not bar:  # a quick figure now (5 x 10 launches); the interleaved timing follows
            q = time_interleaved([key], lambda _: su.launch(grid, ring, bar, s), 5)[key]
            out[key]["ms quick"] = statistics.median(q)
        print(key, json.dumps(out[key]), flush=True)
        save()
    return ok


def device(out: dict, reps: int, save):
    import torch
    from engine.dev.bench import copy_bandwidth
    out["triton"], out["torch"] = __import__("triton").__version__, torch.__version__
    out["device"], grid = torch.cuda.get_device_name(0), torch.cuda.get_device_properties(0).multi_processor_count
    out["copy_bandwidth_Bps"] = copy_bandwidth("cuda")
    su = Setup(**SHAPE)
    ok = check(out, su, grid, save)
    ts = time_interleaved(ok, lambda key: su.launch(grid, key.split(" ", 1)[0], *VARIANTS[key.split(" ", 1)[1]]), reps)
    roof = su.bytes / out["copy_bandwidth_Bps"] * 1e3
    out["roof ms"] = roof
    for key, t in ts.items():
        ms, c = statistics.median(t), f"{key.split(' ', 1)[0]} (c) no barriers"
        out[key].update({"ms": ms, "of roofline": roof / ms, "all": t, "barrier timeouts after timing": int(su.err.item())})
        if c in ts:
            out[key]["boundary us (x - c) / (L - 1)"] = (ms - statistics.median(ts[c])) / (SHAPE["L"] - 1) * 1e3
        print(f"{key:52s} {ms:.3f} ms {roof / ms:6.1%} of {roof:.3f}  boundary "
              f"{out[key].get('boundary us (x - c) / (L - 1)', 0):.2f} us  ({min(t):.3f}-{max(t):.3f})", flush=True)
    out["copy_bandwidth_Bps after"] = copy_bandwidth("cuda")


def main(argv):
    if "--rings" in argv:  # a comma-separated subset of RINGS, in RINGS' order
        keep = argv[argv.index("--rings") + 1].split(",")
        assert set(keep) <= set(RINGS), f"--rings names {sorted(set(keep) - set(RINGS))}, not rings"
        for r in [r for r in RINGS if r not in keep]:
            del RINGS[r]
    cli(argv, "persist_ws", {"shape": SHAPE, "rings": RINGS}, compile_check, device, 15)


if __name__ == "__main__":
    main(sys.argv[1:])
