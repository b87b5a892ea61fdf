"""The decode round's sums across two GPUs fused into the add + RMSNorm after them.

After a row-parallel product (o, down) each rank holds a partial sum p_r; the round needs
x + (p0 + p1) and its RMSNorm. The plain path is three steps: the product writes y, the one-shot
all-reduce (engine/parallel/symm.py) copies y into symmetric memory, meets the peer and writes p0 + p1,
then add_rmsnorm reads that and x. Here the product writes its partial straight into this rank's
symmetric buffer (`write`) and ONE kernel (`add_norm`) meets the peer at a flag, reads both
partials (the peer's over NVLink), sums them and does add_rmsnorm's arithmetic.

Exactness: the sum is p_own + p_peer rounded once to the dtype (a + b == b + a: the same bits on
both ranks, and the same as NCCL's sum and the one-shot kernel's), then exactly add_rmsnorm's
steps on it. So a row's bits do not depend on which path its sum took (by size, by mm).

The barrier (`_peer_barrier`, a jit helper of its own so the interpreter can skip it): program r
of each rank raises its flag in the PEER's signal pad (compare-and-swap 0 -> 1, release, system
scope) and then takes the peer's flag down in its own (compare-and-swap 1 -> 0, acquire). Every
flag is back at 0 when the barrier ends, so a CUDA graph replays it as often as it likes. One
thread a program does it; the block's barrier before the loads orders the rest behind it.

Why one barrier a sum and two buffers are enough. Sums alternate between buffers 0 and 1 (sum k
uses k % 2; every forward has an even number of sums, so both ranks agree on the parity). Rank A
overwrites its buffer k % 2 only in sum k + 2's product, which its stream runs after A's sum
k + 1 kernel has ended, i.e. after each of its programs met the peer's program of the same row in
sum k + 1. B's programs of sum k + 1 start only after B's product k + 1, which starts only after
B's sum k kernel has ended (stream order; with PDL every kernel waits for the one before it before
touching memory), and that kernel is the only reader of A's buffer k % 2 for sum k. So B has read
what it needs before A writes there again. Symmetric for B. With ONE buffer, A's product k + 1
could overwrite p_A while B's sum-k programs are still reading it (nothing orders them).

Runs under TRITON_INTERPRET=1 without the barrier (tests/engine/test_tensor_parallel_fused.py).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from engine.cuda.kernels import Launch
from engine.cuda.launch import PLAIN, LaunchMode, pdl_enter
from engine.cuda.skinny import linear

# Bytes of one partial-sum buffer (two a rank): a decode round at --parallel 64 of qwen3-32b is
# 64 x 5,120 x 2 B = 640 KiB. Larger products (prompt cuts) take the sum-then-norm path.
SLOT_BYTES = 1 << 20
PAD_FLAGS = 256  # flags of the signal pad used: two a row (one from each rank), so rows <= 128

# Thread 0 of the program: flag up at the peer (0 -> 1, release, sys), then own flag down
# (1 -> 0, acquire, sys); both spin until the swap succeeds. Every thread runs the asm (a scalar);
# all but thread 0 skip it. A peer absent for BARRIER_S (dead, or stuck) traps: the kernel fails
# with an error instead of hanging the rank (a first call's JIT compile on one rank takes seconds).
BARRIER_S = 30


def _spin(name: str, addr: str, old: int, new: int, then: str) -> str:
    """PTX: compare-and-swap [addr] old -> new until it swaps, then branch to `then`; trap once
    BARRIER_S have passed since %t0."""
    sem = "release" if new else "acquire"
    return f"""tfb_{name}${{:uid}}:
atom.{sem}.sys.global.cas.b32 %o, [{addr}], {old}, {new};
setp.eq.u32 %p, %o, {old};
@%p bra tfb_{then}${{:uid}};
mov.u64 %t1, %globaltimer;
sub.u64 %t1, %t1, %t0;
setp.gt.u64 %p, %t1, {BARRIER_S * 10**9};
@%p trap;
bra tfb_{name}${{:uid}};
"""


_BARRIER_ASM = tl.constexpr("""{
.reg .u32 %t, %o;
.reg .u64 %t0, %t1;
.reg .pred %p;
mov.u32 %t, %tid.x;
setp.ne.u32 %p, %t, 0;
@%p bra tfb_done${:uid};
mov.u64 %t0, %globaltimer;
""" + _spin("put", "$1", 0, 1, "wait") + _spin("wait", "$2", 1, 0, "done") + """tfb_done${:uid}:
mov.u32 $0, 0;
}""")


@triton.jit
def _peer_barrier(OwnPad, PeerPad, row, RANK: tl.constexpr):
    """Program `row` of this rank meets program `row` of the peer (flags row*2 + rank)."""
    tl.inline_asm_elementwise(_BARRIER_ASM, "=r,l,l", [PeerPad + row * 2 + RANK, OwnPad + row * 2 + (1 - RANK)],
                              dtype=tl.int32, is_pure=False, pack=1)
    tl.debug_barrier()


@triton.jit
def _sum_add_rmsnorm_kernel(X, Own, Peer, W, XOut, Y, N, eps, OwnPad, PeerPad, RANK: tl.constexpr,
                            BARRIER: tl.constexpr, BLOCK: tl.constexpr, PDL_: tl.constexpr = 0):
    pdl_enter(PDL_)
    row = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BLOCK)
    m = c < N
    # this rank's own data first (written by kernels before this one), while the peer catches up
    x = tl.load(X + row * N + c, mask=m, other=0.0).to(tl.float32)
    own = tl.load(Own + row * N + c, mask=m, other=0.0).to(tl.float32)
    w = tl.load(W + c, mask=m, other=0.0).to(tl.float32)
    if BARRIER:
        _peer_barrier(OwnPad, PeerPad, row, RANK)
    peer = tl.load(Peer + row * N + c, mask=m, other=0.0, cache_modifier=".cv").to(tl.float32)
    s = (own + peer).to(XOut.dtype.element_ty)  # the all-reduce's one rounding
    # add_rmsnorm (engine/cuda/fused.py), step for step
    xn = (x + s.to(tl.float32)).to(XOut.dtype.element_ty)
    tl.store(XOut + row * N + c, xn, mask=m)
    xf = xn.to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(xf * xf, 0) / N + eps)
    y = (xf * inv).to(Y.dtype.element_ty).to(tl.float32) * w
    tl.store(Y + row * N + c, y.to(Y.dtype.element_ty), mask=m)


def sum_add_rmsnorm(x: torch.Tensor, own: torch.Tensor, peer: torch.Tensor, w: torch.Tensor, eps: float,
                    pads: tuple[torch.Tensor, torch.Tensor] | None = None, rank: int = 0,
                    mode: LaunchMode = PLAIN):
    """(x + (own + peer), its RMSNorm * w): add_rmsnorm(x, own + peer, w, eps)'s bits. `pads`
    (this rank's signal pad, the peer's): meet the peer first; None: no barrier (peer already here)."""
    rows, n = x.shape
    xo, y = torch.empty_like(x), torch.empty_like(x)
    own_pad, peer_pad = pads if pads is not None else (own, own)
    _sum_add_rmsnorm_kernel[(rows,)](x, own, peer, w, xo, y, n, eps, own_pad, peer_pad, RANK=rank,
                                     BARRIER=pads is not None, BLOCK=triton.next_power_of_2(n), PDL_=mode.pdl_on(),
                                     num_warps=8 if n >= 2048 else 4, **mode.opts())
    return xo, y


class FusedSums:
    """A rank's two partial-sum buffers and the peer's, and the flags to meet it by.

    own / peer: two flat tensors each (the peer's mapped over NVLink); pads: (own, peer) signal
    pads (int32), None: no barrier (tests with the peer simulated in one process)."""

    def __init__(self, own: list[torch.Tensor], peer: list[torch.Tensor], rank: int, pads=None,
                 max_rows: int = PAD_FLAGS // 2):
        self.own, self.peer, self.rank, self.pads, self.max_rows = own, peer, rank, pads, max_rows
        self.dtype = own[0].dtype
        self.k = 0  # sums so far: this one uses buffer k % 2
        self._rows_n: tuple[int, int] | None = None

    def write(self, mm, a: torch.Tensor, w: torch.Tensor) -> bool:
        """mm(a, w) (this rank's partial sum) into the next buffer; False where it does not take
        it (too big, another dtype, an mm it cannot point at the buffer): nothing written. mm: F.linear,
        engine.cuda.skinny.linear or a Launch's linear (engine/cuda/kernels.py)."""
        rows, n = a.shape[0], w.shape[0]
        launched = getattr(mm, "__func__", None) is Launch.linear
        if (a.dim() != 2 or a.dtype != self.dtype or w.dtype != self.dtype or rows > self.max_rows
                or rows * n > self.own[0].numel() or not (launched or mm in (linear, F.linear))):
            return False
        out = self.own[self.k % 2][:rows * n].view(rows, n)
        if launched or mm is linear:
            mm(a, w, out=out)
        else:  # F.linear's own call for 2-D operands (at::matmul -> mm): the same cuBLAS product
            torch.mm(a, w.t(), out=out)
        self._rows_n = (rows, n)
        return True

    def add_norm(self, x: torch.Tensor, w: torch.Tensor, eps: float, mode: LaunchMode = PLAIN):
        """After `write`: (x + the two ranks' sum, its RMSNorm * w), launched per `mode`."""
        (rows, n), b = self._rows_n, self.k % 2
        self.k += 1
        self._rows_n = None
        own = self.own[b][:rows * n].view(rows, n)
        peer = self.peer[b][:rows * n].view(rows, n)
        return sum_add_rmsnorm(x, own, peer, w, eps, self.pads, self.rank, mode)


def fused_sums(group, device: torch.device, dtype: torch.dtype, world: int, hidden: int) -> FusedSums | None:
    """A FusedSums where every rank could make one (CUDA, two ranks, bf16/fp32) and run its kernel
    once on both buffers at the model's width (compiled here, not in the first round); else None
    and the sums go the plain way. Collective: every rank calls it at the same point."""
    import torch.distributed as dist
    from engine.parallel.symm import made_everywhere

    if device.type != "cuda" or world != 2 or dtype not in (torch.bfloat16, torch.float32):
        return None
    group = group or dist.group.WORLD
    return made_everywhere(lambda: _make(group, device, dtype, hidden), group, device,
                           "fused sum + norm", "each sum, then add_rmsnorm")


def _make(group, device: torch.device, dtype: torch.dtype, hidden: int) -> FusedSums:
    import torch.distributed._symmetric_memory as symm_mem
    from engine.parallel.symm import enable_group
    name = group.group_name
    enable_group(name)
    n = SLOT_BYTES // dtype.itemsize
    buf = symm_mem.empty(2 * n, dtype=dtype, device=device)
    h = symm_mem.rendezvous(buf, name)
    rank, peer = h.rank, 1 - h.rank
    theirs = h.get_buffer(peer, (2 * n,), dtype, 0)
    pads = (h.get_signal_pad(rank, (PAD_FLAGS,), torch.int32), h.get_signal_pad(peer, (PAD_FLAGS,), torch.int32))
    pads[0].zero_()  # (fresh pads are zero; no flag may be up before the first sum)
    torch.cuda.synchronize(device)
    sums = FusedSums([buf[:n], buf[n:]], [theirs[:n], theirs[n:]], rank, pads)
    sums.handle = h  # keeps the mapping alive
    x, w = torch.zeros(1, hidden, dtype=dtype, device=device), torch.ones(hidden, dtype=dtype, device=device)
    for b in range(2):  # both ranks: the same launches, so a launch error here is everyone's
        sum_add_rmsnorm(x, sums.own[b][:hidden].view(1, hidden), sums.peer[b][:hidden].view(1, hidden), w, 1e-6,
                        pads, rank)
    torch.cuda.synchronize(device)
    return sums
