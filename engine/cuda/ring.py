"""Decode products on Hopper through a TMA ring (Gluon): y [M, N] = x [M, K] @ W [N, K]^T, M <= 8.

Why: a decode round is 144 weight products of a few rows, and engine/cuda/skinny.py's Triton
kernels stream each at 70-88 % of copy bandwidth, losing ~4.5-5 us at every product's start and end
(qwen3-8b on the H200). Here each program is warp-specialized: one loader warp keeps a
ring of 16 shared-memory stages (W [32, 128] and x's 8 rows a stage, one mbarrier each) full with TMA
copies, walking all of its tiles back to back, and the 4 MMA warps run wgmma straight from shared
memory (x's 8-row slots viewed as wgmma's 64-row A: the other 56 rows' outputs are never stored).
That ring streams at 98.6 % of copy on the H200. With programmatic dependent launch the loader asks
for its first S stages of W before `griddepcontrol.wait`, so a product's weights stream while the
kernel before it ends (the weights never depend on it); only x waits.

Bits: an output element is its row times its column summed over K in k16 steps, in order, in one
float32 chain a K range (then the ranges summed in order), as engine/cuda/skinny.py's kernel does
with the same config's split_k, and the gated form rounds as its gated kernel does. Whether the
tensor cores' wgmma and mma.sync round the same is the device's to say (tools/ring_probe.py).

Not interpretable (Gluon); tests/engine/test_kernels_ring.py compiles it for sm_90 on the CPU and checks the
PTX (staged copies before the wait, x after it, wgmma, no spills), and the host-side choices.
"""
from __future__ import annotations

import functools
import logging
from types import MappingProxyType
from typing import Mapping

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
_STAGED = 8  # stages of W asked for before the wait (half the ring; the whole ring measured slower)
STAGED: Mapping[tuple, int] = MappingProxyType({})  # SHAPES' keys -> stages staged before the wait, where not _STAGED
MAX_ROWS = _XR
log = logging.getLogger("tfengine")


@functools.cache
def supported() -> bool:
    """Gluon with Hopper's TMA and wgmma, and a Hopper GPU."""
    return HAVE_GLUON and torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


class Ring:
    """The ring as one runner uses it: `broken` says why it failed there (a compile or launch
    error), after which the Triton kernels take every product of that runner."""

    def __init__(self):
        self.broken: list[str] = []

    def available(self) -> bool:
        """supported(), and no failure of the ring in this runner."""
        return supported() and not self.broken

    def try_product(self, x: torch.Tensor, w: torch.Tensor, split: int = 1, gated: bool = False,
                    pdl: bool = False, out: torch.Tensor | None = None) -> torch.Tensor | None:
        """product(), or None where it fails (a compile or launch error: the first is in a decode graph's
        warm-up, before capture): the reason goes to `broken` and the log, and the caller runs the Triton
        kernel."""
        try:
            return product(x, w, split, gated, pdl, out)
        except Exception as e:  # pragma: no cover - depends on the device's Triton
            self.broken.append(repr(e)[:500])
            log.warning("TMA ring off for this runner (%s): the Triton kernels take the products", self.broken[-1])
            return None


if HAVE_GLUON:
    BN, BK, NS, P, XR = (gl.constexpr(v) for v in (_BN, _BK, _NS, _P, _XR))
    GDC = gl.constexpr("griddepcontrol.wait; griddepcontrol.launch_dependents; mov.u32 $0, 0;")

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
    def ring_kernel(wd, xd, Y, M, T, I, K, stride_y, SPLIT: gl.constexpr, GATED: gl.constexpr,
                    PDL: gl.constexpr, S: gl.constexpr, NB: gl.constexpr):
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
        gl.warp_specialize([(_mma, (x_s, w_s, ready, empty, Y, M, T, K, stride_y, SPLIT, GATED, NB)),
                            (_loader, (wd, xd, w_s, x_s, ready, empty, T, I, K, SPLIT, GATED, PDL, S, NB))],
                           [1], [48])



def layout():
    return gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)


# (N, K) or (2I, K, "gated") -> columns a tile, for the weight shapes where the ring measured faster
# than engine/cuda/skinny.py in qwen3-8b's round on the H200; others stay Triton's.
SHAPES: Mapping[tuple, int] = MappingProxyType({
    (6144, 4096): 32,            # qwen3-8b q/k/v
    (4096, 4096): 32,            # o
    (24576, 4096, "gated"): 16,  # gate/up, 16 columns of each
    (4096, 12288): 32,           # down
})  # lm_head (151936, 4096) ran 287.5 us a launch against Triton's 286.2; q/k/v in 16 columns 15.8 us against 15.1
# the same keys -> programs (each walks tiles pid, pid + programs, ..); absent: one a SM, at most one a tile.
# Fewer than the SMs leaves room for the norm or attention between rings and the next ring's early launch:
# q/k/v after a norm 19.7 -> 16.2 us, gate/up 55.4 -> 52.6; the round 4.325 -> 4.297 ms at 1 stream,
# 4.420 -> 4.362 at 8 (qwen3-8b, H200)
PROGRAMS: Mapping[tuple, int] = MappingProxyType({(6144, 4096): 96, (24576, 4096, "gated"): 128})


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
    """Whether product() takes these operands (whether the ring works here: Ring.available)."""
    return (x.is_cuda and x.dtype == w.dtype == torch.bfloat16 and x.dim() == 2
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
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count
    grid = min(tiles, sms, PROGRAMS.get((n, k, "gated") if gated else (n, k), sms))
    ring_kernel[(grid,)](_wdesc(w, nb), xd, y, m, tiles, cols, k, y.stride(0), SPLIT=split, GATED=gated,
                        PDL=pdl, S=_staged(n, k, gated) if pdl else 0, NB=nb, num_warps=4, **({"launch_pdl": True} if pdl else {}))
    return y
