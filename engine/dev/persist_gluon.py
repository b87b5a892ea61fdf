"""Issue 14, run 25 (engine/dev/PERF.md): can a grid barrier cost ~1.5-2 us when the next product's first
pipeline stages are already in SHARED memory before the spin? A device probe, not engine code, written
in Gluon (triton.experimental.gluon: explicit shared memory, TMA, mbarriers), which Triton's pipeliner
cannot express (runs 23-24). One shape: a chain of L products of different [N, K] = [4096, 4096] bf16
matrices (o-like) at 8 rows, x_{l+1} = x_l W_l^T; one persistent kernel, grid = the SMs, program p owning
output columns [p * BN, (p + 1) * BN) of every product (BN 32: 128 tiles), its K loop a ring of NS
shared-memory stages (W [BN, BK] and x [8 or 16, BK] per stage, one TMA each, one mbarrier a stage), m16n8k16
MMAs from shared memory. Variants, at equal bytes:
  (c') no barriers: after each product the ring is refilled at once (dependencies ignored);
  (c'') no barriers, the next product's whole ring (W and x) issued right after each tile (the ceiling);
  (b') a grid barrier (release add, acquire spin) after each product, the ring filled after the spin;
  (g)  (b') where each program issues the next product's first S stages of W (TMA into the ring, the
       stage's mbarrier expecting W and x bytes) BEFORE it arrives and spins; after the spin only x of
       those stages, then the rest of the ring.
Reports ms, the boundary ((x) - (c')) / L in us, registers / shared memory, and bits: (g) against (b')
(same K order: must be equal) and both against a float32 torch chain (rounded to bf16 each product).

    PYTHONPATH=. python3 -m engine.dev.persist_gluon --out $OUT [--reps 9] [--xrows 8|16]
    PYTHONPATH=/tmp/t36:. python3 -m engine.dev.persist_gluon --out /tmp/pg --compile-check   # CPU: sm_90
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, mma_v2, tma

SPIN = gl.constexpr(1 << 22)  # polls before a barrier gives up (sets Err; later barriers then skip): no hang
_FENCE = gl.constexpr("fence.proxy.async.global; mov.u32 $0, 0;")  # generic stores -> TMA (async proxy) reads
VARIANTS = {  # name -> (barrier, W stages issued before the spin, or before the next product without one)
    "(c') no barriers": (False, 0),
    "(c'') no barriers, whole next ring staged after each product": (False, 16),
    "(b') barriers, ring filled after the spin": (True, 0),
    "(g) 2 stages of W in shared memory before the spin": (True, 2),
    "(g) 4 stages before the spin": (True, 4),
    "(g) 8 stages before the spin": (True, 8),
    "(g) whole ring (16 stages) before the spin": (True, 16),
}


@gluon.jit
def _issue(wd, xd, w_s, x_s, bars, l, j, row0, N: gl.constexpr, BK: gl.constexpr, NS: gl.constexpr,
           W: gl.constexpr, X: gl.constexpr, EXPECT: gl.constexpr):
    """Stage j of product l into ring slot j % NS: W's [BN, BK] tile and/or x's [16, BK]; EXPECT sets the
    slot's mbarrier to wait for both (the arrival is the expect: one a phase)."""
    s = j % NS
    bar = bars.index(s)
    if EXPECT:
        mbarrier.expect(bar, wd.block_type.nbytes + xd.block_type.nbytes)
    if W:
        tma.async_copy_global_to_shared(wd, [l * N + row0, j * BK], bar, w_s.index(s))
    if X:  # an [8, BK] box fills the slot's first 8 rows (rows 8-15 feed only output rows never stored)
        if xd.block_type.shape[0] == 8:
            tma.async_copy_global_to_shared(xd, [l * 8, j * BK], bar, x_s.index(s).slice(0, 8))
        else:
            tma.async_copy_global_to_shared(xd, [l * 8, j * BK], bar, x_s.index(s))


@gluon.jit
def _stage(x_s, w_s, bars, j, NS: gl.constexpr, a_l: gl.constexpr, b_l: gl.constexpr):
    """Wait for stage j's slot, then its x and W tiles into registers as MMA operands."""
    s = j % NS
    mbarrier.wait(bars.index(s), (j // NS) & 1)
    return x_s.index(s).load(a_l), w_s.index(s).permute((1, 0)).load(b_l)


@gluon.jit
def _mma4(a0, b0, a1, b1, a2, b2, a3, b3, c0, c1, c2, c3):
    """A group's 4 MMAs, one an accumulator chain (runs 25-27)."""
    return mma_v2(a0, b0, c0), mma_v2(a1, b1, c1), mma_v2(a2, b2, c2), mma_v2(a3, b3, c3)


@gluon.jit
def _tile(wd, xd, w_s, x_s, bars, l, row0, mma: gl.constexpr, a_l: gl.constexpr, b_l: gl.constexpr,
          N: gl.constexpr, BK: gl.constexpr, NS: gl.constexpr, KT: gl.constexpr, BN: gl.constexpr):
    """The K loop of product l, 4 stages an iteration (one CTA barrier before their slots are refilled,
    4 independent accumulator chains): run 25's first call, one stage an iteration, ran at 42 % of copy."""
    c0 = gl.zeros([16, BN], gl.float32, layout=mma)
    c1, c2, c3 = c0, c0, c0
    for i in range(KT // 4):
        a0, b0 = _stage(x_s, w_s, bars, 4 * i, NS, a_l, b_l)
        a1, b1 = _stage(x_s, w_s, bars, 4 * i + 1, NS, a_l, b_l)
        a2, b2 = _stage(x_s, w_s, bars, 4 * i + 2, NS, a_l, b_l)
        a3, b3 = _stage(x_s, w_s, bars, 4 * i + 3, NS, a_l, b_l)
        gl.thread_barrier()  # every warp has these slots in registers before TMA overwrites them
        if 4 * i + NS < KT:
            for u in gl.static_range(4):
                _issue(wd, xd, w_s, x_s, bars, l, 4 * i + u + NS, row0, N, BK, NS, True, True, True)
        c0, c1, c2, c3 = _mma4(a0, b0, a1, b1, a2, b2, a3, b3, c0, c1, c2, c3)
    return (c0 + c1) + (c2 + c3)


@gluon.jit
def _barrier(Bar, Err, target, warm):
    """Grid barrier: every warp's stores issued, made visible to TMA, one release add; spin (acquire)
    until the count reaches target. Err set (and later barriers skipped) after SPIN polls."""
    gl.thread_barrier()
    gl.inline_asm_elementwise(_FENCE, "=r,r", [warm], dtype=gl.int32, is_pure=False, pack=1)
    n = gl.atomic_add(Bar, 1, sem="release", scope="gpu") + 1
    if gl.atomic_add(Err, 0, sem="relaxed", scope="gpu") == 0:
        i = 0
        while (n < target) & (i < SPIN):
            n = gl.atomic_add(Bar, 0, sem="acquire", scope="gpu")
            i += 1
        if n < target:
            gl.atomic_add(Err, 1, sem="relaxed", scope="gpu")
    gl.thread_barrier()
    gl.inline_asm_elementwise(_FENCE, "=r,r", [warm], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _chain_kernel(wd, xd, A, Bar, Err, G, L: gl.constexpr, N: gl.constexpr, K: gl.constexpr,
                  BN: gl.constexpr, BK: gl.constexpr, NS: gl.constexpr, BARRIER: gl.constexpr, S: gl.constexpr):
    """A[l + 1] = A[l] W_l^T for l < L (A [L + 1, 8, K] bf16, W [L * N, K]); program p: columns p * BN..
    of each product (programs past N / BN only keep the barriers)."""
    gl.static_assert((K // BK) % (2 * NS) == 0)  # every product starts at slot 0, phase 0
    gl.static_assert((S <= NS) & (NS % 4 == 0))
    KT: gl.constexpr = K // BK
    pid = gl.program_id(0)
    on = pid < N // BN
    row0 = gl.minimum(pid, N // BN - 1) * BN  # an idle program's address stays in bounds (never issued)
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 4], instr_shape=[16, 8])
    a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=8)
    b_l: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=8)
    w_s = gl.allocate_shared_memory(gl.bfloat16, [NS, BN, BK], wd.layout)
    x_s = gl.allocate_shared_memory(gl.bfloat16, [NS, 16, BK], xd.layout)
    bars = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
    for j0 in gl.static_range(NS):
        mbarrier.init(bars.index(j0), count=1)
    rm = gl.arange(0, 16, layout=gl.SliceLayout(1, mma))
    rn = row0 + gl.arange(0, BN, layout=gl.SliceLayout(0, mma))
    warm = gl.full([16], 0, gl.int32, layout=gl.SliceLayout(1, mma))
    for l in range(L):
        if on:  # the ring: stages S.. of this product (0.. before the first, or without staging)
            first = S if l > 0 else 0
            for j in gl.static_range(NS):
                if j >= first:
                    _issue(wd, xd, w_s, x_s, bars, l, j, row0, N, BK, NS, True, True, True)
            acc = _tile(wd, xd, w_s, x_s, bars, l, row0, mma, a_l, b_l, N, BK, NS, KT, BN)
            out = A + (l + 1) * 8 * K + rm[:, None] * K + rn[None, :]
            gl.store(out, acc.to(gl.bfloat16), mask=rm[:, None] < 8)
            if (S > 0) & (l + 1 < L):  # (g): the next product's first S stages of W, before the spin
                gl.thread_barrier()
                for j in gl.static_range(S):
                    _issue(wd, xd, w_s, x_s, bars, l + 1, j, row0, N, BK, NS, True, False, True)
        if BARRIER:
            _barrier(Bar, Err, G * (l + 1), warm)
        if on & (S > 0) & (l + 1 < L):  # x of the staged stages, now that it is written
            for j in gl.static_range(S):
                _issue(wd, xd, w_s, x_s, bars, l + 1, j, row0, N, BK, NS, False, True, False)
    for j1 in gl.static_range(NS):
        mbarrier.invalidate(bars.index(j1))


def layouts():
    return (gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2),
            gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2))


BKEY, BKEY2 = "boundary us (x - c') / L", "boundary us (x - c'') / L"
SHAPE = dict(L=144, N=4096, K=4096, BN=32, BK=64, NS=16)  # 144 products: the round's boundary count
XROWS = {"XR": 8}  # rows of x a stage's TMA box brings (--xrows 16: run 25's two calls)


def compile_check(out: dict):
    """The CPU: every variant compiled for sm_90 (the device's triton 3.6 when PYTHONPATH has it);
    registers and spills from ptxas -v, shared memory, and the PTX's TMA, mbarrier, MMA and fence counts."""
    wl, xl = layouts()
    sig = {"wd": f"tensordesc<bf16[{SHAPE['BN']}, {SHAPE['BK']}],{wl!r}>",
           "xd": f"tensordesc<bf16[{XROWS['XR']}, {SHAPE['BK']}],{xl!r}>",
           "A": "*bf16", "Bar": "*i32", "Err": "*i32", "G": "i32"}
    keys = ("cp.async.bulk.tensor", "mbarrier.try_wait", "mma.sync", "fence.proxy.async.global", "atom.release.gpu",
            "atom.global.gpu.release", "ld.global.gpu.acquire", "atom.acquire.gpu", "atom.global.gpu.acquire")
    for name, (bar, s) in VARIANTS.items():
        compile_one(_chain_kernel, sig, dict(SHAPE) | {"BARRIER": bar, "S": s}, keys, out, name)


def compile_one(fn, sig, constexprs, keys, out, name):
    """fn compiled for sm_90 with 4 warps into out[name]: shared memory, the PTX's counts of keys,
    registers and spills (ptxas -v); or the error (the others still compile)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    import engine.dev.persist_hold as PH
    try:
        src = GluonASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs={(2,): [["tt.divisibility", 16]]})
        k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    except Exception as e:
        out[name] = {"error": repr(e)[-1500:]}
        print(name, out[name]["error"], flush=True)
        return
    out[name] = {"shared": k.metadata.shared, **{key: k.asm["ptx"].count(key) for key in keys}}
    rep = PH.asm_report(k)
    out[name].update({x: rep[x] for x in ("regs", "spill_store_B", "spill_load_B")})
    print(name, json.dumps(out[name]), flush=True)


class Chain:
    """L random [N, K] bf16 weights (std 1/sqrt(K): x keeps its magnitude) and A [L + 1, 8, K]."""

    def __init__(self, L, N, K, BN, BK, NS, XR, **_):
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
        self.W, self.A, self.x0, self.bar, self.err = chain_tensors(L, N, K)
        wl, xl = layouts()
        self.wd = TensorDescriptor.from_tensor(self.W, [BN, BK], wl)
        self.xd = TensorDescriptor.from_tensor(self.A.view((L + 1) * 8, K), [XR, BK], xl)  # 16: 8 rows unused
        self.L, self.N, self.K, self.BN, self.BK, self.NS = L, N, K, BN, BK, NS
        self.bytes = self.W.numel() * 2

    def launch(self, grid, barrier, s):
        self.bar.zero_()  # one counter, counting G per barrier within a launch
        return _chain_kernel[(grid,)](self.wd, self.xd, self.A, self.bar, self.err, grid, L=self.L, N=self.N, K=self.K,
                                      BN=self.BN, BK=self.BK, NS=self.NS, BARRIER=barrier, S=s, num_warps=4)

    def reference(self):
        return reference(self.x0, self.W, self.L, self.N)


def chain_tensors(L, N, K):
    """Seeded weights W [L * N, K] (std 1/sqrt(K): x keeps its magnitude), A [L + 1, 8, K], x0 [8, K],
    the barrier counter and its error flag (runs 25-26 share them)."""
    import torch
    g = torch.Generator(device="cuda").manual_seed(25)
    W = torch.empty(L * N, K, dtype=torch.bfloat16, device="cuda").normal_(0, K ** -0.5, generator=g)
    A = torch.zeros(L + 1, 8, K, dtype=torch.bfloat16, device="cuda")
    x0 = torch.randn(8, K, generator=g, device="cuda").to(torch.bfloat16)
    return W, A, x0, torch.zeros(1, dtype=torch.int32, device="cuda"), torch.zeros(1, dtype=torch.int32, device="cuda")


def reference(x0, W, L, N):
    """float32 products, each rounded to bf16 (the kernel's order of K differs: not bitwise)."""
    x, outs = x0.float(), []
    for l in range(L):
        x = (x @ W[l * N:(l + 1) * N].float().T).to(W.dtype).float()
        outs.append(x)
    return outs


def run_once(ch, launch, ref, out, name):
    """One launch from x0 (A and the error flag reset) into out[name]: registers, shared memory, barrier
    timeouts, max relative error against the float32 chain. Returns A[1:], or None (the error in
    out[name]: a variant that fails loses only itself)."""
    import torch
    try:
        ch.A.zero_(), ch.A[0].copy_(ch.x0), ch.err.zero_()
        k = launch()
        torch.cuda.synchronize()
    except Exception as e:
        out[name] = {"error": repr(e)[-2000:]}
        print(name, out[name]["error"], flush=True)
        return None
    got = ch.A[1:].clone()
    err = max(float((got[l].float() - ref[l]).abs().max() / ref[l].abs().max()) for l in range(len(ref)))
    out[name] = {"regs": getattr(k, "n_regs", None), "spills": getattr(k, "n_spills", None),
                 "shared": k.metadata.shared, "barrier timeouts": int(ch.err.item()), "max rel err vs torch": err}
    return got


def time_interleaved(names, launch, reps):
    """ms a launch for each name: reps samples of 10 launches, interleaved so drift hits all alike."""
    import torch
    ts = {n: [] for n in names}
    st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(reps):
        for n in ts:
            st.record()
            for _ in range(10):
                launch(n)
            en.record()
            en.synchronize()
            ts[n].append(st.elapsed_time(en) / 10)
    return ts


def device(out: dict, reps: int, save):
    import torch
    from engine.dev.bench import copy_bandwidth
    out["triton"], out["torch"] = __import__("triton").__version__, torch.__version__
    out["device"], grid = torch.cuda.get_device_name(0), torch.cuda.get_device_properties(0).multi_processor_count
    out["copy_bandwidth_Bps"] = copy_bandwidth("cuda")
    ch = Chain(**SHAPE, **XROWS)
    out["x rows a stage"] = XROWS["XR"]
    ref, outs, ok = ch.reference(), {}, {}
    for name, (bar, s) in VARIANTS.items():
        got = run_once(ch, lambda: ch.launch(grid, bar, s), ref, out, name)
        if got is None:
            continue
        outs[name] = got
        ok[name] = not out[name]["barrier timeouts"]
        print(name, json.dumps(out[name]), flush=True)
        save()  # a later variant that hangs still leaves these
    b = "(b') barriers, ring filled after the spin"
    for name in outs:
        if name != b and b in outs:
            out[name]["elements differing from (b')"] = int((outs[name] != outs[b]).sum())
    ts = time_interleaved([n for n in ok if ok[n]], lambda n: ch.launch(grid, *VARIANTS[n]), reps)
    roof = ch.bytes / out["copy_bandwidth_Bps"] * 1e3
    out["roof ms"] = roof
    c, c2 = list(VARIANTS)[:2]
    for n, t in ts.items():
        ms = statistics.median(t)
        out[n].update({"ms": ms, "of roofline": roof / ms, "all": t, "barrier timeouts after timing": int(ch.err.item())})
        if c in ts:
            out[n][BKEY] = (ms - statistics.median(ts[c])) / ch.L * 1e3
        if c2 in ts:
            out[n][BKEY2] = (ms - statistics.median(ts[c2])) / ch.L * 1e3
        print(f"{n:52s} {ms:.3f} ms {roof / ms:6.1%} of {roof:.3f}  boundary {out[n].get(BKEY, 0):.2f} us"
              f" (vs c'' {out[n].get(BKEY2, 0):.2f})"
              f"  ({min(t):.3f}-{max(t):.3f})", flush=True)
    out["copy_bandwidth_Bps after"] = copy_bandwidth("cuda")


def cli(argv, name, out, compile_check, device, reps):
    """--out DIR (NAME.json, saved after each step and at the end), --compile-check or the device run."""
    od = argv[argv.index("--out") + 1] if "--out" in argv else f"/tmp/{name}"
    os.makedirs(od, exist_ok=True)
    t0 = time.perf_counter()

    def save():
        out["total_s"] = time.perf_counter() - t0
        with open(os.path.join(od, f"{name}.json"), "w") as f:
            json.dump(out, f, indent=1)
    try:
        if "--compile-check" in argv:
            compile_check(out)
        else:
            device(out, int(argv[argv.index("--reps") + 1]) if "--reps" in argv else reps, save)
    finally:
        save()
    print("done", out["total_s"], flush=True)


def main(argv):
    XROWS["XR"] = int(argv[argv.index("--xrows") + 1]) if "--xrows" in argv else 8
    assert XROWS["XR"] in (8, 16), "--xrows is 8 or 16"
    cli(argv, "persist_gluon", {"shape": SHAPE}, compile_check, device, 9)


if __name__ == "__main__":
    main(sys.argv[1:])
