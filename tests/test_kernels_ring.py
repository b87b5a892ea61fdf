"""The decode products' TMA ring (engine/kernels_ring.py): which products it takes, that the round
hands them over with the Triton kernel's K ranges (its bits: the ring sums in the same order, checked
bitwise on the H200 by engine/dev/ring_probe.py and engine/dev/gpu_check.py), and, where this
Triton's Gluon is the one it is written for (3.6), its device code compiled for sm_90 on the CPU:
the weights staged before the grid-dependency wait, x only after it, no spills."""
import hashlib
import re

import pytest
import torch

pytest.importorskip("triton")

import engine.kernels as K  # noqa: E402
import engine.kernels_ring as R  # noqa: E402
import engine.kernels_skinny as S  # noqa: E402


def test_it_takes_the_measured_shapes_at_up_to_8_rows():
    assert R.plan(6144, 4096, 8, 1, False) == (192, 32)      # qwen3-8b q/k/v: 192 tiles of 32 columns
    assert R.plan(4096, 12288, 1, 2, False) == (128, 32)     # down in the split-K kernel's two K ranges
    assert R.plan(24576, 4096, 4, 1, True) == (768, 16)      # gated: 16 columns of gate and of up a tile
    assert R.plan(6144, 4096, 9, 1, False) is None           # a round of 16 rows: Triton's
    assert R.plan(151936, 4096, 8, 1, False) is None         # lm_head: measured no faster
    assert R.plan(5120, 8192, 4, 1, False) is None           # qwen3-32b's o: measured slower
    assert R.plan(4096, 12288, 8, 16, False) is None         # K ranges of 6 stages: 8 are staged before the wait


def test_not_on_a_machine_without_hopper():
    if not torch.cuda.is_available():
        assert not R.available()
        x, w = torch.zeros(8, 4096, dtype=torch.bfloat16), torch.zeros(6144, 4096, dtype=torch.bfloat16)
        assert not R.takes(x, w, 1)


def test_the_round_hands_products_over_with_the_triton_configs_k_ranges(monkeypatch):
    calls = []
    monkeypatch.setattr(R, "takes", lambda x, w, split, gated=False: True)
    monkeypatch.setattr(R, "product", lambda x, w, split=1, gated=False, pdl=False, out=None:
                        calls.append((tuple(w.shape), split, gated, pdl)) or torch.zeros(1))
    monkeypatch.setattr(K, "INTERPRET", False)
    x, x3 = torch.zeros(8, 4096, dtype=torch.bfloat16), torch.zeros(8, 12288, dtype=torch.bfloat16)
    qkv, down = torch.empty(6144, 4096, dtype=torch.bfloat16), torch.empty(4096, 12288, dtype=torch.bfloat16)
    gate_up = torch.empty(24576, 4096, dtype=torch.bfloat16)
    with S.launch_mode(pdl=3, ring=True):
        S.linear(x, qkv), S.linear(x3, down), S.gate_up_silu(x, gate_up)
    with S.launch_mode(ring=True):
        S.linear(x, qkv)
    assert calls == [((6144, 4096), 1, False, True), ((4096, 12288), S.config_for(4096, 12288, 8).split_k, False, True),
                     ((24576, 4096), 1, True, True), ((6144, 4096), 1, False, False)]
    assert calls[1][1] == 2
    assert not S.RING  # scoped to the launch mode


def _compile(split, gated, pdl, nb, norm=False):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    wl = R.layout()
    sig = {"wd": f"tensordesc<bf16[{nb}, 128],{wl!r}>", "xd": f"tensordesc<bf16[8, 64],{wl!r}>", "Y": "*bf16",
           "M": "i32", "T": "i32", "I": "i32", "K": "i32", "stride_y": "i32"}
    consts = {"SPLIT": split, "GATED": gated, "PDL": pdl, "S": 8 if pdl else 0, "NB": nb}
    if norm:
        sig |= {"X": "*bf16", "NW": "*bf16", "XOut": "*bf16", "H": "*bf16", "Cnt": "*i32", "eps": "fp32"}
        consts["NORM"] = True
    src = GluonASTSource(fn=R.ring_kernel, signature=sig, constexprs=consts)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})


def test_the_norm_after_o_and_down_folds_into_their_ring_at_one_rank(monkeypatch):
    import engine.kernels_fused as KF
    folded, unfolded, reduced = [], [], []
    monkeypatch.setattr(R, "norm_takes", lambda x, a, w, nw, split: True)
    monkeypatch.setattr(R, "product_norm", lambda x, a, w, nw, eps, split=1, pdl=False:
                        folded.append((tuple(w.shape), split, pdl)) or ("x + y", "h"))
    monkeypatch.setattr(KF, "add_rmsnorm", lambda x, y, nw, eps: unfolded.append(tuple(y.shape)) or ("x", "h"))
    monkeypatch.setattr(S, "linear", lambda a, w: torch.zeros(a.shape[0], w.shape[0]))
    monkeypatch.setattr(K, "INTERPRET", False)
    x, nw = torch.zeros(8, 4096, dtype=torch.bfloat16), torch.ones(4096, dtype=torch.bfloat16)
    a, a3 = torch.zeros(8, 4096, dtype=torch.bfloat16), torch.zeros(8, 12288, dtype=torch.bfloat16)
    o, down = torch.empty(4096, 4096, dtype=torch.bfloat16), torch.empty(4096, 12288, dtype=torch.bfloat16)
    with S.launch_mode(pdl=3, ring=True):
        assert S.add_norm(x, S.linear, a, o, nw, 1e-6) == ("x + y", "h")
        S.add_norm(x, S.linear, a3, down, nw, 1e-6)
        # summed across ranks, or another product than the round's: the product, then the norm kernel
        S.add_norm(x, S.linear, a, o, nw, 1e-6, reduce=lambda y: reduced.append(1) or y)
        S.add_norm(x, lambda a, w: torch.zeros(a.shape[0], w.shape[0]), a, o, nw, 1e-6)
    S.add_norm(x, S.linear, a, o, nw, 1e-6)  # ring off
    monkeypatch.setattr(R, "norm_takes", lambda x, a, w, nw, split: False)
    with S.launch_mode(pdl=3, ring=True):
        S.add_norm(x, S.linear, a, o, nw, 1e-6)
    assert folded == [((4096, 4096), 1, True), ((4096, 12288), S.config_for(4096, 12288, 8).split_k, True)]
    assert unfolded == [(8, 4096)] * 4 and reduced == [1]
    assert R.FOLD_NORM is False  # off unless measured faster: 0.08 ms a round slower (engine/dev/PERF.md run 35)


def test_the_fold_takes_only_what_the_norm_kernel_would_run_in_the_same_layout():
    if R.available():
        pytest.skip("checked on the CPU")
    x, a, w = torch.zeros(8, 4096, dtype=torch.bfloat16), torch.zeros(8, 4096, dtype=torch.bfloat16), \
        torch.zeros(4096, 4096, dtype=torch.bfloat16)
    assert not R.norm_takes(x, a, w, torch.ones(4096, dtype=torch.bfloat16), 1)  # no Hopper here


def ln_order(line: str) -> list[str]:
    return [w.strip() for w in line.split(";") if "griddepcontrol" in w]


@pytest.mark.skipif(not R.HAVE_GLUON, reason="the ring is written for triton 3.6's Gluon (the H200's)")
@pytest.mark.parametrize("split,gated,pdl", [(1, False, True), (2, False, True), (1, True, True), (1, False, False)])
def test_device_code_stages_weights_before_the_wait_and_x_after(split, gated, pdl):
    k = _compile(split, gated, pdl, 16 if gated else 32)
    ptx = k.asm["ptx"]
    assert "wgmma.mma_async" in ptx
    if not pdl:
        assert "griddepcontrol" not in ptx
        return
    lines = [ln for ln in ptx.splitlines() if "cp.async.bulk.tensor" in ln or "griddepcontrol" in ln]
    wait = next(i for i, ln in enumerate(lines) if "griddepcontrol.wait" in ln)
    assert ln_order(lines[wait]) == ["griddepcontrol.wait", "griddepcontrol.launch_dependents"]
    # 8 stages of W before it, a [NB, 128] box copied as two of 64 columns (gated: gate's and up's),
    # then the 8 stages' x (two boxes of 64 columns each)
    assert wait == 8 * 2 * (2 if gated else 1)
    assert all("cp.async.bulk.tensor" in ln for ln in lines[wait + 1:wait + 1 + 16])
    assert sum("griddepcontrol" in ln for ln in lines) == 1
    assert k.metadata.shared <= 227 * 1024


_INS = re.compile(r"^\s*(?:@%p\d+\s+)?([a-z][\w.]*)\s+(.*?);")


def _h(*parts) -> str:
    return hashlib.sha1(repr(parts).encode()).hexdigest()[:16]


def norm_digests(ptx: str) -> list[str]:
    """Each div.full.f32 result (the norm's sum / N, then 1 / sqrt) as an expression over a thread's
    elements of x + y (x0, x1, ... in the order the adds make them), commutative operands sorted,
    values through shared memory followed from the last store: equal digests, the same arithmetic
    in the same order (what elements a thread holds is the layout's: checked beside it)."""
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
        elif op in ("add.bf16x2", "add.bf16"):  # x + y, rounded: the row's elements
            val[a[0]] = (f"x{k}", f"x{k + 1}") if op.endswith("x2") else f"x{k}"
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

    from engine.kernels_fused import _add_rmsnorm_kernel
    sig = {"X": "*bf16", "R": "*bf16", "W": "*bf16", "XOut": "*bf16", "Y": "*bf16", "N": "i32", "eps": "fp32"}
    src = ASTSource(fn=_add_rmsnorm_kernel, signature=sig, constexprs={"HAS_R": True, "BLOCK": 4096, "PDL_": 3},
                    attrs={(i,): [["tt.divisibility", 16]] for i in range(6)})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})


def _blocked(ttgir: str) -> set[str]:
    return set(re.findall(r"#ttg\.blocked<\{[^}]*\}>", ttgir))


@pytest.mark.skipif(not R.HAVE_GLUON, reason="the ring is written for triton 3.6's Gluon (the H200's)")
@pytest.mark.parametrize("split", [1, 2])
def test_the_folded_norm_sums_a_row_as_the_norm_kernel_does(split):
    """The same layout (which elements a thread holds) and the same reduction, op for op, as the 8-warp
    kernel at hidden 4096; the kernel at 4 warps (another tree) is told apart."""
    ring, norm = _compile(split, False, True, 32, norm=True), _norm_kernel(8)
    (lay,) = _blocked(norm.asm["ttgir"])
    assert "sizePerThread = [8], threadsPerWarp = [32], warpsPerCTA = [8]" in lay and lay in _blocked(ring.asm["ttgir"])
    want = norm_digests(norm.asm["ptx"])
    assert len(want) == 2 and norm_digests(ring.asm["ptx"])[-2:] == want
    assert norm_digests(_norm_kernel(4).asm["ptx"]) != want


@pytest.mark.skipif(not R.HAVE_GLUON, reason="the ring is written for triton 3.6's Gluon (the H200's)")
def test_device_code_of_the_fold_stages_weights_first_and_orders_the_rows_after_every_tile():
    k = _compile(2, False, True, 32, norm=True)
    ptx = k.asm["ptx"]
    lines = [ln for ln in ptx.splitlines() if "cp.async.bulk.tensor" in ln or "griddepcontrol" in ln]
    assert next(i for i, ln in enumerate(lines) if "griddepcontrol.wait" in ln) == 16  # W's 8 stages first
    # each program counted in with a release (acq_rel, gpu scope); in a row's program one thread spins on
    # the count with acquire loads
    assert "atom.global.gpu.acq_rel.add" in ptx and ptx.count("ld.acquire.gpu.global.b32") == 1
    assert k.metadata.shared <= 227 * 1024
