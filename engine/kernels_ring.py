"""Decode products on Hopper through a TMA ring (Gluon): y [M, N] = x [M, K] @ W [N, K]^T, M <= 8.

Why: a decode round is 144 weight products of a few rows, and engine/kernels_skinny.py's Triton
kernels stream each at 70-88 % of copy bandwidth, losing ~4.5-5 us at every product's start and end
(engine/dev/PERF.md runs 16 and 23). Here each program is warp-specialized: one loader warp keeps a
ring of 16 shared-memory stages (W [32, 128] and x's 8 rows a stage, one mbarrier each) full with TMA
copies, walking all of its tiles back to back, and the 4 MMA warps run wgmma straight from shared
memory (x's 8-row slots viewed as wgmma's 64-row A: the other 56 rows' outputs are never stored).
That ring streams at 98.6 % of copy (run 28). With programmatic dependent launch the loader asks
for its first S stages of W before `griddepcontrol.wait`, so a product's weights stream while the
kernel before it ends (the weights never depend on it); only x waits.

Bits: an output element is its row times its column summed over K in k16 steps, in order, in one
float32 chain a K range (then the ranges summed in order), as engine/kernels_skinny.py's kernel does
with the same config's split_k, and the gated form rounds as its gated kernel does. Whether the
tensor cores' wgmma and mma.sync round the same is the device's to say (engine/dev/ring_probe.py).

The add+RMSNorm after o and after down (kernels_fused.add_rmsnorm: x + y and its norm) can ride in the
same launch (product_norm, NORM): each program's tiles stored, an 8-warp partition counts the program in;
the last M programs to arrive wait for the rest and norm a row each, with the Triton kernel's layout and
operations (its PTX arithmetic, op for op), so the bits are its own (logits equal on the H200). It saves
the norm kernel's launch and a dependent-kernel boundary, but its count-and-spin tail costs more than they
do under PDL 3 (~1.6 us a norm after o): +0.08 ms a round (engine/dev/PERF.md runs 34-35), so FOLD_NORM is off.

Not interpretable (Gluon); tests/test_kernels_ring.py compiles it for sm_90 on the CPU and checks the
PTX (staged copies before the wait, x after it, wgmma, no spills), and the host-side choices.
"""
from __future__ import annotations

import functools

import torch

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
    # written for triton 3.6's Gluon (the H200's); later ones renamed these and refuse the 64-row view
    HAVE_GLUON = hasattr(tma, "async_copy_global_to_shared") and hasattr(gl.shared_memory_descriptor, "_reinterpret")
except Exception:  # no Triton, or one without Gluon's Hopper ops: the Triton kernels take the products
    HAVE_GLUON = False

_BN, _BK, _NS, _P, _XR = 32, 128, 16, 4, 8  # W rows a stage (at most), K a stage, stages, stages a group, x rows
_STAGED = 8  # stages of W asked for before the wait (run 27: half the ring; the whole ring only lost)
MAX_ROWS = _XR
_NORM_N, _NORM_REGS = 4096, 96  # the folded add+RMSNorm's row width (qwen3-8b's hidden) and its registers
FOLD_NORM = False  # the add+RMSNorm after o and down folded into their ring: bitwise equal, but measured
# 0.08 ms a round slower (engine/dev/PERF.md run 35), so off; engine/dev/ring_probe.py turns it on


@functools.cache
def available() -> bool:
    """Gluon with Hopper's TMA and wgmma, and a Hopper GPU."""
    return HAVE_GLUON and torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


if HAVE_GLUON:
    BN, BK, NS, P, XR = (gl.constexpr(v) for v in (_BN, _BK, _NS, _P, _XR))
    GDC = gl.constexpr("griddepcontrol.wait; griddepcontrol.launch_dependents; mov.u32 $0, 0;")
    # ld.acquire until the count reaches $2 (labels inside braces are local: CUTLASS's barrier waits do so)
    # the thread with $4 == 0: ld.acquire until the count ($1) is $3 past $2 (wrapping), then $0 = $3;
    # the others: $0 = $3 at once (labels inside braces are local: CUTLASS's barrier waits do so)
    SPIN = gl.constexpr("{ .reg .pred p, q; .reg .b32 v, d; mov.b32 $0, $3; setp.ne.s32 q, $4, 0; "
                        "@q bra SPIN_DONE; SPIN_AGAIN: ld.acquire.gpu.global.b32 v, [$1]; sub.s32 d, v, $2; "
                        "setp.lt.u32 p, d, $3; @p bra SPIN_AGAIN; mov.b32 $0, d; SPIN_DONE: mov.b32 v, 0; }")
    NORM_BLOCK, NORM_REGS = gl.constexpr(_NORM_N), gl.constexpr(_NORM_REGS)

    @gluon.jit
    def _a64(x_s, i):
        """x's 64-row wgmma A view from slot i on (rows 8.. are the next slots: outputs never stored)."""
        return x_s.index(i)._reinterpret(gl.bfloat16, [64, 64], x_s.layout)

    @gluon.jit
    def _stage(wd, xd, w_s, x_s, ready, empty, c, row0, up0, k, W: gl.constexpr, X: gl.constexpr,
               GATED: gl.constexpr, NB: gl.constexpr):
        """Stage c into slot c % NS: wait until the MMA warps released the slot's last use (c - NS;
        one "empty" barrier a P-stage group), arm "ready" for W and x, then W and / or x's copies."""
        s = c % NS
        if W:
            mbarrier.wait(empty.index(s // P), ((c // NS) + 1) & 1, pred=c >= NS)
            mbarrier.expect(ready.index(s), (2 * NB if GATED else NB) * BK * 2 + XR * BK * 2)
            tma.async_copy_global_to_shared(wd, [row0, k], ready.index(s), w_s.index(s).slice(0, NB))
            if GATED:
                tma.async_copy_global_to_shared(wd, [up0, k], ready.index(s), w_s.index(s).slice(NB, NB))
        if X:
            for q in gl.static_range(BK // 64):
                tma.async_copy_global_to_shared(xd, [0, k + 64 * q], ready.index(s), x_s.index(s * (BK // 64) + q))

    @gluon.jit
    def _loader(wd, xd, w_s, x_s, ready, empty, T, I, K, SPLIT: gl.constexpr, GATED: gl.constexpr,
                PDL: gl.constexpr, S: gl.constexpr, NB: gl.constexpr):
        """The 1-warp partition: every TMA copy of this program's tiles pid, pid + grid, ..."""
        pid, NP = gl.program_id(0), gl.num_programs(0)
        KT = K // BK
        if PDL:  # the first S stages' W before the wait; their x after it
            for q in gl.static_range(S):
                _stage(wd, xd, w_s, x_s, ready, empty, q, pid * NB, I + pid * NB, q * BK, True, False, GATED, NB)
            warm = gl.full([32], 0, gl.int32, layout=gl.BlockedLayout([1], [32], [1], [0]))
            gl.inline_asm_elementwise(GDC, "=r,r", [warm], dtype=gl.int32, is_pure=False, pack=1)
            for q in gl.static_range(S):
                _stage(wd, xd, w_s, x_s, ready, empty, q, pid * NB, I + pid * NB, q * BK, False, True, GATED, NB)
        c = 0
        for t in range(pid, T, NP):
            for j in range(KT):
                if (c >= S) | (not PDL):
                    _stage(wd, xd, w_s, x_s, ready, empty, c, t * NB, I + t * NB, j * BK, True, True, GATED, NB)
                c += 1

    @gluon.jit
    def _krange(x_s, w_s, ready, empty, c, KR, lay: gl.constexpr, GATED: gl.constexpr, NB: gl.constexpr):
        """KR stages from stage c on into one float32 chain (two with GATED: gate's, up's), P stages a
        group; a group's slots released once the next group's wgmmas are issued and its own complete."""
        XC: gl.constexpr = BK // 64
        acc = gl.zeros([64, NB], gl.float32, layout=lay)
        acu = gl.zeros([64, NB], gl.float32, layout=lay)
        for i in range(KR // P):
            t = c + P * i
            for u in gl.static_range(P):
                mbarrier.wait(ready.index((t + u) % NS), ((t + u) // NS) & 1)
            for u in gl.static_range(P):
                w = w_s.index((t + u) % NS)
                for q in gl.static_range(XC):
                    a = _a64(x_s, ((t + u) % NS) * XC + q)  # x's 64-row view from this slot on
                    if GATED:
                        acc = warpgroup_mma(a, w.slice(0, NB).slice(64 * q, 64, dim=1).permute((1, 0)), acc,
                                            is_async=True)
                        acu = warpgroup_mma(a, w.slice(NB, NB).slice(64 * q, 64, dim=1).permute((1, 0)), acu,
                                            is_async=True)
                    else:
                        acc = warpgroup_mma(a, w.slice(0, NB).slice(64 * q, 64, dim=1).permute((1, 0)), acc, is_async=True)
            if GATED:
                acc, acu = warpgroup_mma_wait(2 * P * XC, deps=[acc, acu])
            else:
                acc = warpgroup_mma_wait(P * XC, deps=[acc])
            if i > 0:
                mbarrier.arrive(empty.index(((t - P) % NS) // P))
        if GATED:
            acc, acu = warpgroup_mma_wait(0, deps=[acc, acu])
        else:
            acc = warpgroup_mma_wait(0, deps=[acc])
        mbarrier.arrive(empty.index(((c + KR - P) % NS) // P))
        return acc, acu

    @gluon.jit
    def _mma(x_s, w_s, ready, empty, Y, M, T, K, stride_y, SPLIT: gl.constexpr, GATED: gl.constexpr,
             NB: gl.constexpr, done=None):
        """The 4 MMA warps (default partition): each tile's K ranges, then its rows < M stored."""
        lay: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, NB, 16])
        pid, NP = gl.program_id(0), gl.num_programs(0)
        KR = K // BK // SPLIT
        rm = gl.arange(0, 64, layout=gl.SliceLayout(1, lay))
        c = 0
        for t in range(pid, T, NP):
            acc, acu = _krange(x_s, w_s, ready, empty, c, KR, lay, GATED, NB)
            c += KR
            for r in gl.static_range(1, SPLIT):  # the next K ranges, summed in order (split-K's bits)
                acc2, acu2 = _krange(x_s, w_s, ready, empty, c, KR, lay, GATED, NB)
                acc, acu = acc + acc2, acu + acu2
                c += KR
            rn = t * NB + gl.arange(0, NB, layout=gl.SliceLayout(0, lay))
            if GATED:  # as kernels_skinny's gated kernel: each product to bf16, silu to it, then the product
                g = acc.to(gl.bfloat16).to(gl.float32)
                u = acu.to(gl.bfloat16).to(gl.float32)
                sg = (g / (1.0 + gl.exp(-g))).to(gl.bfloat16).to(gl.float32)
                acc = sg * u
            gl.store(Y + rm[:, None] * stride_y + rn[None, :], acc.to(gl.bfloat16), mask=rm[:, None] < M)
        if done is not None:  # to the norm partition: every thread's tiles stored (its acq_rel atomic
            gl.thread_barrier()  # releases them at gpu scope, as kernels_skinny's split K does)
            mbarrier.arrive(done)

    @gluon.jit
    def _norm_row(X, R, W, XOut, H, row, stride_r, N, eps, BLOCK: gl.constexpr):
        """kernels_fused._add_rmsnorm_kernel's row, op for op, in the layout Triton gives it at its launches
        (8 warps, 8 elements a thread a step: 16-byte aligned rows): the same PTX arithmetic
        (tests/test_kernels_ring.py), so the same bits. R (the product, other programs') read through L2."""
        lay: gl.constexpr = gl.BlockedLayout([8], [32], [8], [0])
        c = gl.arange(0, BLOCK, layout=lay)
        m = c < N
        x = gl.load(X + row * N + c, mask=m, other=0.0)
        x = (x.to(gl.float32) + gl.load(R + row * stride_r + c, mask=m, other=0.0, cache_modifier=".cg")
             .to(gl.float32)).to(gl.bfloat16)
        gl.store(XOut + row * N + c, x, mask=m)
        xf = x.to(gl.float32)
        inv = 1.0 / gl.sqrt(gl.sum(xf * xf, 0) / N + eps)
        y = (xf * inv).to(gl.bfloat16).to(gl.float32) * gl.load(W + c, mask=m, other=0.0).to(gl.float32)
        gl.store(H + row * N + c, y.to(gl.bfloat16), mask=m)

    @gluon.jit
    def _one(ptr, v, sem: gl.constexpr):
        """atomic_add(ptr, v) by one thread of the 8-warp partition, its old value to all."""
        e = gl.arange(0, 256, layout=gl.BlockedLayout([1], [32], [8], [0]))
        old = gl.atomic_add(ptr + e * 0, gl.full([256], 0, gl.int32, e.type.layout) + v, mask=e == 0, sem=sem,
                            scope="gpu")
        return gl.sum(gl.where(e == 0, old, 0), 0)  # (a sum: the count may have wrapped negative)

    @gluon.jit
    def _norm(done, Y, X, NW, XOut, H, Cnt, M, stride_y, N, eps, PDL: gl.constexpr, BLOCK: gl.constexpr):
        """The 8-warp partition: once this program's tiles are stored, count it in (release); the last M
        programs to arrive take a row each, wait (acquire) for all the others, and add+RMSNorm it.
        Cnt only grows (NP a launch, NP a power of two: a launch's arrivals are one aligned block of NP
        even as it wraps), so nothing resets it and no launch waits on another atomic."""
        NP = gl.num_programs(0)
        mbarrier.wait(done, 0)
        old = _one(Cnt, 1, "acq_rel")
        row = (old & (NP - 1)) - (NP - M)
        if row >= 0:
            e = gl.arange(0, 256, layout=gl.BlockedLayout([1], [32], [8], [0]))
            if PDL:  # the residual and norm weight: written before this launch's wait (a no-op by now)
                gl.inline_asm_elementwise("griddepcontrol.wait; mov.u32 $0, 0;", "=r,r", [e], dtype=gl.int32,
                                          is_pure=False, pack=1)
            # one thread spins on the count with acquire loads, the others take it through the barrier of
            # the max; the row's loads depend on the value (lag 0)
            base = old - (old & (NP - 1))
            seen = gl.inline_asm_elementwise(SPIN, "=r,l,r,r,r", [Cnt + e * 0, e * 0 + base, e * 0 + NP, e],
                                             dtype=gl.int32, is_pure=False, pack=1)
            lag = gl.max(seen, 0) - NP
            _norm_row(X, Y + lag, NW, XOut, H, row.to(gl.int64), stride_y, N, eps, BLOCK)

    @gluon.jit
    def ring_kernel(wd, xd, Y, M, T, I, K, stride_y, SPLIT: gl.constexpr, GATED: gl.constexpr,
                    PDL: gl.constexpr, S: gl.constexpr, NB: gl.constexpr, X=None, NW=None, XOut=None, H=None,
                    Cnt=None, eps=0.0, NORM: gl.constexpr = False):
        """T tiles of NB columns (GATED: NB of gate at rows t * NB, the same of up at I + t * NB)."""
        XC: gl.constexpr = BK // 64
        w_s = gl.allocate_shared_memory(gl.bfloat16, [NS, BN, BK], wd.layout)
        # 8-row x slots, XC a stage, and as many spare: a wgmma's 64-row A view runs 7 slots on
        x_s = gl.allocate_shared_memory(gl.bfloat16, [2 * NS * XC, XR, 64], xd.layout)
        ready = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [NS // P, 1], mbarrier.MBarrierLayout())
        for j in gl.static_range(NS):
            mbarrier.init(ready.index(j), count=1)
        for j in gl.static_range(NS // P):
            mbarrier.init(empty.index(j), count=1)
        if NORM:  # + add+RMSNorm of the rows (x + y, its norm by NW) in 8 more warps
            done = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout()).index(0)
            mbarrier.init(done, count=1)
            gl.warp_specialize([(_mma, (x_s, w_s, ready, empty, Y, M, T, K, stride_y, SPLIT, GATED, NB, done)),
                                (_loader, (wd, xd, w_s, x_s, ready, empty, T, I, K, SPLIT, GATED, PDL, S, NB)),
                                (_norm, (done, Y, X, NW, XOut, H, Cnt, M, stride_y, I, eps, PDL, NORM_BLOCK))],
                               [1, 8], [48, NORM_REGS])
        else:
            gl.warp_specialize([(_mma, (x_s, w_s, ready, empty, Y, M, T, K, stride_y, SPLIT, GATED, NB)),
                                (_loader, (wd, xd, w_s, x_s, ready, empty, T, I, K, SPLIT, GATED, PDL, S, NB))],
                               [1], [48])



def layout():
    return gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)


# (N, K) or (2I, K, "gated") -> columns a tile, for the weight shapes where the ring measured faster
# than engine/kernels_skinny.py in the round (engine/dev/PERF.md runs 29-31); others stay Triton's.
SHAPES: dict[tuple, int] = {
    (6144, 4096): 32,            # qwen3-8b q/k/v
    (4096, 4096): 32,            # o
    (24576, 4096, "gated"): 16,  # gate/up, 16 columns of each
    (4096, 12288): 32,           # down
}  # lm_head (151936, 4096) ran 287.5 us a launch against Triton's 286.2; q/k/v in 16 columns 15.8 us against 15.1


def plan(n: int, k: int, rows: int, split: int, gated: bool) -> tuple[int, int] | None:
    """(tiles, columns a tile) where the ring takes the product, else None. The first STAGED stages
    are staged before the wait, so a program's first K range must have them."""
    nb = SHAPES.get((n, k, "gated") if gated else (n, k))
    if nb is None or rows > MAX_ROWS or split < 1 or k % (_BK * split) or (k // _BK // split) % _P:
        return None
    cols = n // 2 if gated else n
    if k // _BK // split < _STAGED or (gated and n % 2) or cols % nb:
        return None
    return cols // nb, nb


_descs: dict = {}


def _wdesc(w: torch.Tensor, nb: int):
    """W's TMA descriptor, made once per weight (a graph replays it; the weights never move)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    key = (w.data_ptr(), tuple(w.shape), nb)
    if key not in _descs:
        _descs[key] = TensorDescriptor.from_tensor(w, [nb, _BK], layout())
    return _descs[key]


def takes(x: torch.Tensor, w: torch.Tensor, split: int, gated: bool = False) -> bool:
    return (available() and x.is_cuda and x.dtype == w.dtype == torch.bfloat16 and x.dim() == 2
            and x.shape[1] == w.shape[1] and x.stride(1) == 1 and (x.stride(0) * 2) % 16 == 0
            and x.data_ptr() % 16 == 0 and w.is_contiguous()
            and plan(w.shape[0], w.shape[1], x.shape[0], split, gated) is not None)


def product(x: torch.Tensor, w: torch.Tensor, split: int = 1, gated: bool = False, pdl: bool = False,
            out: torch.Tensor | None = None) -> torch.Tensor:
    """x @ w^T in K ranges of `split` (gated: silu(x @ Wg^T) * (x @ Wu^T), w = [Wg; Wu]) -> [M, N or N/2].
    pdl: launched with programmatic dependent launch, W staged before the wait."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    m, (n, k) = x.shape[0], w.shape
    tiles, nb = plan(n, k, m, split, gated)
    cols = n // 2 if gated else n
    y = torch.empty(m, cols, dtype=w.dtype, device=w.device) if out is None else out
    xd = TensorDescriptor.from_tensor(x, [_XR, 64], layout())
    grid = min(tiles, torch.cuda.get_device_properties(x.device).multi_processor_count)
    ring_kernel[(grid,)](_wdesc(w, nb), xd, y, m, tiles, cols, k, y.stride(0), SPLIT=split, GATED=gated,
                        PDL=pdl, S=_STAGED if pdl else 0, NB=nb, num_warps=4, **({"launch_pdl": True} if pdl else {}))
    return y


_counts: dict = {}  # the folded norm's arrival count, one per device (grows by the grid a launch)


def norm_takes(x: torch.Tensor, a: torch.Tensor, w: torch.Tensor, norm_w: torch.Tensor, split: int) -> bool:
    """Whether product_norm takes x + a @ w^T and its RMSNorm: a product the ring takes, not gated, whose
    output rows are _NORM_N wide, with x [M, N] and norm_w [N] contiguous, 16-byte aligned bf16 beside it."""
    return (FOLD_NORM and takes(a, w, split) and w.shape[0] == _NORM_N and x.shape == (a.shape[0], _NORM_N)
            and x.is_contiguous() and x.dtype == norm_w.dtype == torch.bfloat16 and norm_w.shape == (_NORM_N,)
            and norm_w.is_contiguous() and x.device == a.device == norm_w.device
            and x.data_ptr() % 16 == 0 and norm_w.data_ptr() % 16 == 0  # else Triton compiles another layout
            and _pow2_grid(w.shape[0], w.shape[1], a.shape[0], split, a.device))


def _pow2_grid(n: int, k: int, rows: int, split: int, device) -> bool:
    """The grid product_norm launches is a power of two (the count's blocks stay aligned as it wraps)."""
    g = min(plan(n, k, rows, split, False)[0], torch.cuda.get_device_properties(device).multi_processor_count)
    return g & (g - 1) == 0


def product_norm(x: torch.Tensor, a: torch.Tensor, w: torch.Tensor, norm_w: torch.Tensor, eps: float,
                 split: int = 1, pdl: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """kernels_fused.add_rmsnorm(x, a @ w^T, norm_w, eps) in one launch, the same bits: the ring's
    product, then the last programs to finish norm a row each. Returns (x + y, its norm)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    m, (n, k) = a.shape[0], w.shape
    tiles, nb = plan(n, k, m, split, False)
    y, xo, h = (torch.empty(m, n, dtype=w.dtype, device=w.device) for _ in range(3))
    if a.device not in _counts:  # allocated on first use, before a graph capture takes it (warm-up)
        _counts[a.device] = torch.zeros(1, dtype=torch.int32, device=a.device)
    ad = TensorDescriptor.from_tensor(a, [_XR, 64], layout())
    grid = min(tiles, torch.cuda.get_device_properties(a.device).multi_processor_count)
    ring_kernel[(grid,)](_wdesc(w, nb), ad, y, m, tiles, n, k, y.stride(0), SPLIT=split, GATED=False,
                        PDL=pdl, S=_STAGED if pdl else 0, NB=nb, X=x, NW=norm_w, XOut=xo, H=h,
                        Cnt=_counts[a.device], eps=eps, NORM=True, num_warps=4,
                        **({"launch_pdl": True} if pdl else {}))
    return xo, h
