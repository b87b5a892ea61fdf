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
    # written for and measured with triton 3.6's Gluon (the H200's); later ones renamed these and refuse the
    # 64-row view, and Gluon's API moves between releases: any other takes the Triton kernels
    import triton
    HAVE_GLUON = (triton.__version__.startswith("3.6.") and hasattr(tma, "async_copy_global_to_shared")
                  and hasattr(gl.shared_memory_descriptor, "_reinterpret"))
except Exception:  # no Triton, or one without Gluon's Hopper ops: the Triton kernels take the products
    HAVE_GLUON = False

_BN, _BK, _NS, _P, _XR = 32, 128, 16, 4, 8  # W rows a stage (at most), K a stage, stages, stages a group, x rows
_STAGED = 8  # stages of W asked for before the wait (run 27: half the ring; the whole ring only lost)
STAGED: dict[tuple, int] = {}  # SHAPES' keys -> stages staged before the wait, where not _STAGED
MAX_ROWS = _XR
_NORM_N, _NORM_REGS = 4096, 96  # the add+RMSNorm a ring takes in (NORM): qwen3-8b's hidden; that partition's registers
# the round's row counts where q/k/v and gate/up take the add+RMSNorm before them in (NORM): each program norms
# the rows itself, so the norm kernel and its boundary leave the round (engine/dev/PERF.md runs 86-87)
PRENORM: set[int] = set()
_PROBE = 0  # run 88's timing probes of NORM (other bits): 1 without the proxy fence, 2 without the rows normed


BROKEN: list[str] = []  # why the ring failed in this process (then the Triton kernels take every product)


@functools.cache
def _hopper() -> bool:
    return HAVE_GLUON and torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def available() -> bool:
    """Gluon with Hopper's TMA and wgmma, a Hopper GPU, and no failure of the ring in this process."""
    return _hopper() and not BROKEN


if HAVE_GLUON:
    BN, BK, NS, P, XR = (gl.constexpr(v) for v in (_BN, _BK, _NS, _P, _XR))
    GDC = gl.constexpr("griddepcontrol.wait; griddepcontrol.launch_dependents; mov.u32 $0, 0;")
    NORM_BLOCK, NORM_REGS = gl.constexpr(_NORM_N), gl.constexpr(_NORM_REGS)

    @gluon.jit
    def _a64(x_s, i):
        """x's 64-row wgmma A view from slot i on (rows 8.. are the next slots: outputs never stored)."""
        return x_s.index(i)._reinterpret(gl.bfloat16, [64, 64], x_s.layout)

    @gluon.jit
    def _stage(wd, xd, w_s, x_s, ready, empty, c, row0, up0, k, W: gl.constexpr, X: gl.constexpr,
               GATED: gl.constexpr, NB: gl.constexpr, x0=0):
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
                tma.async_copy_global_to_shared(xd, [x0, k + 64 * q], ready.index(s), x_s.index(s * (BK // 64) + q))

    @gluon.jit
    def _loader(wd, xd, w_s, x_s, ready, empty, T, I, K, SPLIT: gl.constexpr, GATED: gl.constexpr,
                PDL: gl.constexpr, S: gl.constexpr, NB: gl.constexpr, xready=None, NORM: gl.constexpr = False):
        """The 1-warp partition: every TMA copy of this program's tiles pid, pid + grid, ...
        NORM: x is this program's own 8 rows of the normed rows, once the norm partition has written them."""
        pid, NP = gl.program_id(0), gl.num_programs(0)
        KT = K // BK
        x0 = pid * XR if NORM else 0
        if PDL or NORM:  # the first S stages' W before the wait (or the norm); their x after it
            for q in gl.static_range(S):
                _stage(wd, xd, w_s, x_s, ready, empty, q, pid * NB, I + pid * NB, q * BK, True, False, GATED, NB)
            if NORM:
                mbarrier.wait(xready, 0)
            else:
                warm = gl.full([32], 0, gl.int32, layout=gl.BlockedLayout([1], [32], [1], [0]))
                gl.inline_asm_elementwise(GDC, "=r,r", [warm], dtype=gl.int32, is_pure=False, pack=1)
            for q in gl.static_range(S):
                _stage(wd, xd, w_s, x_s, ready, empty, q, pid * NB, I + pid * NB, q * BK, False, True, GATED, NB, x0)
        c = 0
        for t in range(pid, T, NP):
            for j in range(KT):
                if (c >= S) | (not (PDL or NORM)):
                    _stage(wd, xd, w_s, x_s, ready, empty, c, t * NB, I + t * NB, j * BK, True, True, GATED, NB, x0)
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
             NB: gl.constexpr):
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

    @gluon.jit
    def _prenorm(xready, X, R, NW, XOut, Hs, M, stride_r, N, eps, PDL: gl.constexpr, MR: gl.constexpr,
                 BLOCK: gl.constexpr, PROBE: gl.constexpr = 0):
        """The 8-warp partition (NORM): once the kernel before has ended, x + r's MR rows (M of them real) and
        their norm, as kernels_fused._add_rmsnorm_kernel computes each row, into this program's 8 rows of Hs
        (program 0 also writes x + r); then the loader may copy them. W streams meanwhile: it never waits for
        the kernel before. A row's elements lie as the kernel's launches lay them out (8 warps, 8 elements a
        thread a step: 16-byte aligned rows), so its sum runs in the same order (tests/test_kernels_ring_norm.py),
        and every row's loads are in flight together."""
        e = gl.arange(0, 256, layout=gl.BlockedLayout([1], [32], [8], [0]))
        if PDL:
            gl.inline_asm_elementwise(GDC, "=r,r", [e], dtype=gl.int32, is_pure=False, pack=1)
        pid = gl.program_id(0)
        if PROBE < 2:  # (PROBE, run 88's timing probes only: 1 no fence, 2 no rows normed either)
            _norm_rows(X, R, NW, XOut, Hs, M, stride_r, N, eps, pid, MR, BLOCK, PROBE)
        gl.thread_barrier()
        mbarrier.arrive(xready)

    @gluon.jit
    def _norm_rows(X, R, NW, XOut, Hs, M, stride_r, N, eps, pid, MR: gl.constexpr, BLOCK: gl.constexpr,
                   PROBE: gl.constexpr):
        lay: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [1, 8], [1, 0])
        e = gl.arange(0, 256, layout=gl.BlockedLayout([1], [32], [8], [0]))
        rows = gl.arange(0, MR, layout=gl.SliceLayout(1, lay))[:, None]
        c = gl.arange(0, BLOCK, layout=gl.SliceLayout(0, lay))[None, :]
        m = (c < N) & (rows < M)
        x = gl.load(X + rows * N + c, mask=m, other=0.0)
        x = (x.to(gl.float32) + gl.load(R + rows * stride_r + c, mask=m, other=0.0).to(gl.float32)).to(gl.bfloat16)
        gl.store(XOut + rows * N + c, x, mask=m & (pid == 0))
        xf = x.to(gl.float32)
        inv = 1.0 / gl.sqrt(gl.sum(xf * xf, 1) / N + eps)
        y = (xf * inv[:, None]).to(gl.bfloat16).to(gl.float32) * gl.load(NW + c, mask=c < N, other=0.0).to(gl.float32)
        gl.store(Hs + (pid * XR).to(gl.int64) * N + rows * N + c, y.to(gl.bfloat16), mask=m)
        if PROBE == 0:  # the rows written through the generic proxy, read by the loader's TMA (the async proxy)
            gl.inline_asm_elementwise("fence.proxy.async.global; mov.u32 $0, 0;", "=r,r", [e], dtype=gl.int32,
                                      is_pure=False, pack=1)

    @gluon.jit
    def ring_kernel(wd, xd, Y, M, T, I, K, stride_y, SPLIT: gl.constexpr, GATED: gl.constexpr,
                    PDL: gl.constexpr, S: gl.constexpr, NB: gl.constexpr, X=None, R=None, NW=None, XOut=None,
                    Hs=None, stride_r=0, eps=0.0, NORM: gl.constexpr = False, MR: gl.constexpr = 8,
                    PROBE: gl.constexpr = 0):
        """T tiles of NB columns (GATED: NB of gate at rows t * NB, the same of up at I + t * NB).
        NORM: x is add+RMSNorm(X + R) by NW, which the program computes (MR rows, M of them real)."""
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
        if NORM:
            xready = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout()).index(0)
            mbarrier.init(xready, count=1)
            gl.warp_specialize([(_mma, (x_s, w_s, ready, empty, Y, M, T, K, stride_y, SPLIT, GATED, NB)),
                                (_loader, (wd, xd, w_s, x_s, ready, empty, T, I, K, SPLIT, GATED, PDL, S, NB, xready,
                                           NORM)),
                                (_prenorm, (xready, X, R, NW, XOut, Hs, M, stride_r, K, eps, PDL, MR, NORM_BLOCK,
                                            PROBE))],
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
# the same keys -> programs (each walks tiles pid, pid + programs, ..); absent: one a SM, at most one a tile.
# Fewer than the SMs leaves room for the norm or attention between rings and the next ring's early launch:
# q/k/v after a norm 19.7 -> 16.2 us, gate/up 55.4 -> 52.6; the round 4.325 -> 4.297 ms at 1 stream,
# 4.420 -> 4.362 at 8 (engine/dev/PERF.md run 36)
PROGRAMS: dict[tuple, int] = {(6144, 4096): 96, (24576, 4096, "gated"): 128}


def plan(n: int, k: int, rows: int, split: int, gated: bool) -> tuple[int, int] | None:
    """(tiles, columns a tile) where the ring takes the product, else None. The first STAGED stages
    are staged before the wait, so a program's first K range must have them."""
    nb = SHAPES.get((n, k, "gated") if gated else (n, k))
    if nb is None or rows > MAX_ROWS or split < 1 or k % (_BK * split) or (k // _BK // split) % _P:
        return None
    cols = n // 2 if gated else n
    if k // _BK // split < _staged(n, k, gated) or (gated and n % 2) or cols % nb:
        return None
    return cols // nb, nb


def _staged(n: int, k: int, gated: bool) -> int:
    return STAGED.get((n, k, "gated") if gated else (n, k), _STAGED)


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


def try_product(x: torch.Tensor, w: torch.Tensor, split: int = 1, gated: bool = False, pdl: bool = False,
                out: torch.Tensor | None = None) -> torch.Tensor | None:
    """product(), or None where it fails (a compile or launch error: the first is in a decode graph's
    warm-up, before capture): the reason goes to BROKEN and the log, and the caller runs the Triton kernel."""
    return _tried(product, x, w, split, gated, pdl, out)


def _tried(fn, *args):
    try:
        return fn(*args)
    except Exception as e:  # pragma: no cover - depends on the device's Triton
        import logging
        BROKEN.append(repr(e)[:500])
        logging.getLogger("tfengine").warning("TMA ring off for this process (%s): the Triton kernels take the products", BROKEN[-1])
        return None


def product(x: torch.Tensor, w: torch.Tensor, split: int = 1, gated: bool = False, pdl: bool = False,
            out: torch.Tensor | None = None) -> torch.Tensor:
    """x @ w^T in K ranges of `split` (gated: silu(x @ Wg^T) * (x @ Wu^T), w = [Wg; Wu]) -> [M, N or N/2].
    pdl: launched with programmatic dependent launch, W staged before the wait."""
    return _launch(x, x.shape[0], w, split, gated, pdl, out)


def norm_takes(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, norm_w: torch.Tensor, split: int,
               gated: bool = False) -> bool:
    """Whether product_norm takes the product of add_rmsnorm(x, r, norm_w) by w: PRENORM has the row count, the
    ring takes the product, the rows are _NORM_N wide, x, r and norm_w contiguous bf16, 16-byte aligned (else
    Triton compiles the norm kernel in another layout, another sum's order)."""
    return (r.shape[0] in PRENORM and takes(r, w, split, gated) and r.shape[1] == _NORM_N and x.shape == r.shape
            and x.is_contiguous() and r.is_contiguous() and x.dtype == norm_w.dtype == torch.bfloat16
            and norm_w.shape == (_NORM_N,) and norm_w.is_contiguous() and x.device == r.device == norm_w.device
            and x.data_ptr() % 16 == 0 and norm_w.data_ptr() % 16 == 0)


def try_product_norm(x, r, w, norm_w, eps: float, split: int = 1, gated: bool = False, pdl: bool = False,
                     x_out: torch.Tensor | None = None):
    """product_norm(), or None where it fails (as try_product)."""
    return _tried(product_norm, x, r, w, norm_w, eps, split, gated, pdl, x_out)


_rows: dict = {}  # (device, programs, K) -> the normed rows NORM's programs write, 8 a program, for their x copies


def product_norm(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, norm_w: torch.Tensor, eps: float,
                 split: int = 1, gated: bool = False, pdl: bool = False,
                 x_out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """kernels_fused.add_rmsnorm(x, r, norm_w, eps), then product() of the norm by w, in one launch and
    with the same bits: each program norms the rows itself (the 8 rows of x it copies are its own).
    Returns (x + r, into x_out if given, and the product)."""
    m, k = r.shape
    key = (r.device, _programs(w.shape[0], k, gated, r.device), k)
    if key not in _rows:  # allocated once, before a graph capture uses it (warm-up rounds)
        _rows[key] = torch.empty(key[1] * _XR, k, dtype=torch.bfloat16, device=r.device)
    xo = torch.empty_like(x) if x_out is None else x_out
    y = _launch(_rows[key], m, w, split, gated, pdl, None, X=x, R=r, NW=norm_w, XOut=xo, Hs=_rows[key],
                stride_r=r.stride(0), eps=eps, NORM=True, MR=1 << (m - 1).bit_length(), PROBE=_PROBE)
    return xo, y


def _programs(n: int, k: int, gated: bool, device) -> int:
    tiles = (n // 2 if gated else n) // SHAPES[(n, k, "gated") if gated else (n, k)]
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return min(tiles, sms, PROGRAMS.get((n, k, "gated") if gated else (n, k), sms))


def _launch(xs: torch.Tensor, m: int, w: torch.Tensor, split: int, gated: bool, pdl: bool, out, **norm):
    """The ring over m rows, its x copied from xs (norm: the normed rows' buffer, a program's 8 rows its own)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    n, k = w.shape
    tiles, nb = plan(n, k, m, split, gated)
    cols = n // 2 if gated else n
    y = torch.empty(m, cols, dtype=w.dtype, device=w.device) if out is None else out
    xd = TensorDescriptor.from_tensor(xs, [_XR, 64], layout())
    staged = _staged(n, k, gated) if pdl or norm else 0
    ring_kernel[(_programs(n, k, gated, w.device),)](
        _wdesc(w, nb), xd, y, m, tiles, cols, k, y.stride(0), SPLIT=split, GATED=gated, PDL=pdl, S=staged, NB=nb,
        num_warps=4, **norm, **({"launch_pdl": True} if pdl else {}))
    return y
