"""The add+RMSNorm a decode product takes in (engine/kernels_ring.py NORM, product_norm; the model leaves
the norm pending through kernels_fused.PendingNorm): where the ring takes it (one row), its MMA warps norm the
row themselves into their x slots, so the norm kernel and its boundary leave the round. Its bits must be
add_rmsnorm's (other row counts, the 64-row rounds and the prompts keep the kernel): the norm's reduction is
checked op for op against the kernel's PTX, compiled for sm_90 on the CPU; on the H200,
engine/dev/prenorm_bits.py compares the outputs bitwise. Without Hopper, the pending norm runs the kernel."""
import hashlib
import re

import pytest
import torch

pytest.importorskip("triton")

import engine.kernels_fused as KF  # noqa: E402
import engine.kernels_ring as R  # noqa: E402
import engine.kernels_skinny as S  # noqa: E402

_INS = re.compile(r"^\s*(?:@%p\d+\s+)?([a-z][\w.]*)\s+(.*?);")


def _h(*parts) -> str:
    return hashlib.sha1(repr(parts).encode()).hexdigest()[:16]


def norm_digests(ptx: str, E: int = 16) -> list[str]:
    """Each div.full.f32 result (the norm's sum / N, then 1 / sqrt) as an expression over a thread's
    elements of x + r (x0, x1, ... in the order the adds make them), commutative operands sorted,
    values through shared memory followed from the last store: equal digests, the same arithmetic
    in the same order (what elements a thread holds is the layout's: checked beside it). A thread holds E
    elements of a row (4096 / 256), the rows one after another: x0..x15 name each row's."""
    val, k, last, out = {}, 0, "?", []

    def g(r):
        return val.get(r.strip(), "?")
    for ln in ptx.splitlines():
        m = _INS.match(ln)
        if not m:
            continue
        op, args = m.groups()
        a = [x.strip() for x in args.split(",")]
        if op == "mov.b32" and args.startswith("{"):  # a bf16 pair unpacked
            lo, hi, src = re.match(r"\{\s*(%\w+),\s*(%\w+)\s*\},\s*(%\w+)", args).groups()
            if isinstance(val.get(src), tuple):
                val[lo], val[hi] = val[src]
        elif op in ("add.bf16x2", "add.bf16"):  # x + r, rounded: the row's elements
            val[a[0]] = (f"x{k % E}", f"x{(k + 1) % E}") if op.endswith("x2") else f"x{k % E}"
            k += 2 if op.endswith("x2") else 1
        elif op in ("mul.f32", "add.f32"):
            val[a[0]] = _h(op, *sorted([g(a[1]), g(a[2])]))
        elif op == "fma.rn.f32":
            val[a[0]] = _h(op, *sorted([g(a[1]), g(a[2])]), g(a[3]))
        elif op.startswith("shfl.sync.bfly"):
            val[a[0]] = _h("shfl", g(a[1]), a[2])
        elif op.startswith("st.shared"):
            last = g(args.split("]")[1].strip(" ,"))
        elif op.startswith("ld.shared"):
            val[a[0]] = _h("smem", last)
        elif op.startswith(("sqrt", "cvt.rn.f32", "cvt.f32.bf16")):
            val[a[0]] = _h(op, g(a[1]))
        elif op == "div.full.f32":
            val[a[0]] = _h(op, g(a[1]), g(a[2]))
            out.append(val[a[0]])
    return out


def _norm_kernel(num_warps: int):
    """kernels_fused's add+RMSNorm as its launches compile it (16-byte aligned rows, N a multiple of 16)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    sig = {"X": "*bf16", "R": "*bf16", "W": "*bf16", "XOut": "*bf16", "Y": "*bf16", "N": "i32", "eps": "fp32"}
    src = ASTSource(fn=KF._add_rmsnorm_kernel, signature=sig, constexprs={"HAS_R": True, "BLOCK": 4096, "PDL_": 3},
                    attrs={(i,): [["tt.divisibility", 16]] for i in range(6)})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})


def _ring(gated: bool = False, pdl: bool = True):
    """The ring with NORM as product_norm launches it (pointers, strides and K divisible by 16)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    wl, nb = R.layout(), 16 if gated else 32
    sig = {"wd": f"tensordesc<bf16[{nb}, 128],{wl!r}>", "xd": f"tensordesc<bf16[8, 64],{wl!r}>", "Y": "*bf16",
           "M": "i32", "T": "i32", "I": "i32", "K": "i32", "stride_y": "i32", "X": "*bf16", "R": "*bf16",
           "NW": "*bf16", "XOut": "*bf16", "eps": "fp32"}
    names = R.ring_kernel.arg_names  # attrs go by the kernel's argument positions
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in ("Y", "K", "X", "R", "NW", "XOut")}
    src = GluonASTSource(fn=R.ring_kernel, signature=sig, attrs=attrs, constexprs={
        "SPLIT": 1, "GATED": gated, "PDL": pdl, "S": 0, "NB": nb, "NORM": True})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})


def _blocked(ttgir: str) -> set[str]:
    return set(re.findall(r"#ttg\.blocked<\{[^}]*\}>", ttgir))


gluon = pytest.mark.skipif(not R.HAVE_GLUON, reason="the ring is written for triton 3.6's Gluon (the H200's)")


@gluon
@pytest.mark.parametrize("gated", [False, True])
def test_the_mma_warps_sum_the_row_as_the_norm_kernel_does(gated):
    """The row laid out as the kernel's launches lay out theirs (NORM_WARPS = 4 at hidden 4096: 8 elements a
    thread a step, 32 threads, 4 warps) and its sum the kernel's, op for op; the kernel at 8 warps (another
    tree) is told apart, so the digest would see a layout that changed."""
    assert KF.NORM_WARPS == 4
    ring, norm = _ring(gated), _norm_kernel(4)
    (lay,) = _blocked(norm.asm["ttgir"])
    assert "sizePerThread = [8], threadsPerWarp = [32], warpsPerCTA = [4], order = [0]" in lay
    assert any("sizePerThread = [1, 8], threadsPerWarp = [1, 32], warpsPerCTA = [1, 4], order = [1, 0]" in b
               for b in _blocked(ring.asm["ttgir"]))
    want = norm_digests(norm.asm["ptx"], E=32)
    assert len(want) == 2 and norm_digests(ring.asm["ptx"], E=32)[:2] == want  # (gated: the silu's divisions after)
    assert norm_digests(_norm_kernel(8).asm["ptx"], E=16) != want


@gluon
@pytest.mark.parametrize("gated", [False, True])
def test_device_code_streams_weights_unwaited_and_multiplies_after_the_row_is_normed(gated):
    """The loader copies W alone and never waits for the kernel before; the MMA warps pass the one
    grid-dependency wait, load the row, write x's slots, fence them for wgmma, then multiply; all in the
    shared memory a program may have."""
    k = _ring(gated)
    ptx = k.asm["ptx"]
    lines = ptx.splitlines()
    (gdc,) = [i for i, ln in enumerate(lines) if "griddepcontrol" in ln]
    assert "griddepcontrol.wait" in lines[gdc] and "launch_dependents" in lines[gdc]
    assert not any("ld.global" in ln for ln in lines[:gdc])
    at = gdc
    for key in ("ld.global", "st.shared", "fence.proxy.async.shared", "wgmma.mma_async"):  # in this order
        at = next(i for i in range(at, len(lines)) if key in lines[i])
    assert not any("wgmma.mma_async" in ln for ln in lines[:at])
    copies = [ln for ln in lines if "cp.async.bulk.tensor" in ln]
    assert len(copies) == (2 if gated else 1) * 2  # W's boxes (gated: gate's and up's), no x box
    # a group of P stages (2 chunks of K each, 4 k16 steps a chunk) in the loop, and the last group after it
    assert ptx.count("wgmma.mma_async") == (2 if gated else 1) * 2 * R._P * 2 * 4
    assert k.metadata.shared <= 227 * 1024


def _pending(rows=2, n=64):
    g = torch.Generator().manual_seed(0)
    x, r = (torch.randn(rows, n, generator=g).to(torch.bfloat16) for _ in range(2))
    return KF.PendingNorm(x, r, torch.rand(n, generator=g).to(torch.bfloat16) + 0.5, 1e-6)


def test_a_product_the_ring_takes_gets_the_pending_norm_with_its_split_and_residual(monkeypatch):
    """Where the ring takes a pending norm in, the round hands it the norm's inputs and the residual's buffer;
    nothing else runs (no norm kernel)."""
    calls = []
    monkeypatch.setattr(R, "norm_takes", lambda x, r, w, nw, split, gated=False: True)
    monkeypatch.setattr(R, "try_product_norm", lambda x, r, w, nw, eps, gated, pdl, x_out:
                        calls.append((tuple(w.shape), gated, pdl, x_out)) or (x_out, torch.ones(1)))
    monkeypatch.setattr(KF, "add_rmsnorm", lambda *a, **k: pytest.fail("the norm kernel ran"))
    p = _pending(1, 4096)
    qkv, gate_up = torch.empty(6144, 4096, dtype=torch.bfloat16), torch.empty(24576, 4096, dtype=torch.bfloat16)
    with S.launch_mode(pdl=3, ring=True):
        assert torch.equal(S.linear(p, qkv), torch.ones(1)) and torch.equal(S.gate_up_silu(p, gate_up), torch.ones(1))
    assert calls == [((6144, 4096), False, True, p.x_out), ((24576, 4096), True, True, p.x_out)]


def test_a_pending_norm_the_ring_does_not_take_runs_the_norm_kernel_once(monkeypatch):
    """Elsewhere (no Hopper, a row count PRENORM lacks, 64 rows) the product reads add_rmsnorm's output."""
    seen, ran = [], []
    monkeypatch.setattr(KF, "add_rmsnorm", lambda x, r, w, eps, x_out=None: ran.append(1) or (x_out, torch.ones_like(x)))
    monkeypatch.setattr(S, "supports", lambda x, w, c: True)
    monkeypatch.setattr(S, "_launch", lambda x, w, c, out=None: seen.append(x) or x @ w.T)
    p = _pending()
    h = p.normed()
    assert ran == [1] and p.normed() is h and len(ran) == 1
    w = torch.randn(16, 64).to(torch.bfloat16)
    assert torch.equal(S.linear(p, w), h @ w.T) and seen[-1] is h


def test_the_pending_norm_computes_what_add_rmsnorm_does(interpret):
    interpret(r'''
import torch
import engine.kernels_fused as KF
g = torch.Generator().manual_seed(1)
x, r = (torch.randn(3, 256, generator=g) for _ in range(2))
w = torch.rand(256, generator=g) + 0.5
p = KF.PendingNorm(x, r, w, 1e-6)
xo, h = KF.add_rmsnorm(x, r, w, 1e-6)
assert torch.equal(p.normed(), h) and torch.equal(p.x_out, xo) and p.shape == x.shape
print("ok")
''')
