"""The decode graph's launch knob (engine/cuda/launch.py LaunchMode.pdl, KernelConfig.pdl; by default 3 at one
rank on Hopper): a launch mode is an argument, plain unless given, the interpreter
never launches with PDL, and in the device code (PTX for sm_90, compiled on the CPU) the
grid-dependency wait comes before every load, so no program reads what the kernel before it
writes until that kernel is done (Triton's pipeliner may hoist loads above a wait placed inside a
loop: triton-lang/triton issue 11905; ours sits before the loop)."""
import pytest
import torch

triton = pytest.importorskip("triton", reason="the Triton kernels: triton is not installed (the engine extra brings it on Linux x86_64 and aarch64)")

import engine.cuda.decode_attention as K  # noqa: E402
import engine.cuda.skinny as S  # noqa: E402
from engine.config import KernelConfig  # noqa: E402
from engine.cuda.launch import PLAIN, LaunchMode  # noqa: E402


def test_default_mode_is_3_at_one_rank_on_hopper_only():
    k = KernelConfig()
    assert k.pdl_for(1, (9, 0)) == 3 and k.pdl_for(1, (10, 0)) == 3
    assert k.pdl_for(2, (9, 0)) == 0 and k.pdl_for(1, (8, 9)) == 0  # tensor parallel; no griddepcontrol before sm_90
    assert KernelConfig(pdl=2).pdl_for(1, (9, 0)) == 2 and KernelConfig(pdl=0).pdl_for(1, (9, 0)) == 0


def test_launch_mode_is_scoped_and_off_outside_it():
    assert PLAIN.pdl == 0 and PLAIN.opts() == {}
    m = LaunchMode(pdl=2)
    assert m.opts() == ({} if K.INTERPRET else {"launch_pdl": True})
    assert m.pdl_on() == (0 if K.INTERPRET else 2)
    assert LaunchMode(pdl=2, interpret=False).opts() == {"launch_pdl": True}
    assert LaunchMode(pdl=2, interpret=True).opts() == {} and LaunchMode(pdl=2, interpret=True).pdl_on() == 0
    assert PLAIN.opts() == {} and not PLAIN.fold_combine and not PLAIN.prefetch_on()


@pytest.mark.interpreted
def test_interpreter_never_launches_with_pdl():
    import torch
    import engine.cuda.decode_attention as K
    import engine.cuda.skinny as S
    assert K.INTERPRET
    g = torch.Generator().manual_seed(3)
    w, wg, x = torch.randn(40, 128, generator=g), torch.randn(64, 128, generator=g), torch.randn(8, 128, generator=g)
    c = S.SkinnyConfig(16, 32, split_k=2)
    ref, gref = S.skinny(x, w, config=c), S.gate_up_silu(x, wg, config=S.SkinnyConfig(16, 32))
    from engine.cuda.launch import LaunchMode
    m = LaunchMode(pdl=2)
    assert m.opts() == {} and m.pdl_on() == 0
    assert torch.equal(S.skinny(x, w, config=c, mode=m), ref)
    assert torch.equal(S.gate_up_silu(x, wg, config=S.SkinnyConfig(16, 32), mode=m), gref)


_ORDER = ("griddepcontrol.wait", "griddepcontrol.launch_dependents", "ld.global", "cp.async", "st.global", "prefetch")


def _ptx_order(fn, sig: dict, consts: dict, keys: tuple = _ORDER, **opts) -> list[str]:
    """The kernel compiled for sm_90 (no GPU needed): its instructions among `keys` (by default the PDL and
    memory ones) in program order."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    ptx = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts), target=GPUTarget("cuda", 90, 32),
                         options=opts).asm["ptx"]
    # instructions only: a .file / .loc line names engine/cuda/prefetch.py
    code = (line for line in ptx.splitlines() if not line.lstrip().startswith((".file", ".loc", "//")))
    return [k for line in code for k in keys if k in line]


@pytest.mark.parametrize("pdl", [0, 1, 2])
def test_the_wait_comes_before_every_load(pdl):
    ptr = {n: "*bf16" for n in ("X", "W", "Y")}
    ints = ("M", "N", "K", "stride_xm", "stride_wn", "stride_ym")
    consts = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 128, "K_STEPS": 0, "PDL_": pdl}
    skinny = _ptx_order(S._skinny_kernel, {**ptr, "Part": "*fp32", "Count": "*i32", **{n: "i32" for n in ints}},
                        {**consts, "SPLIT_K": 2}, num_warps=4, num_stages=4)
    gated = _ptx_order(S._gated_kernel, {**ptr, **{("I" if n == "N" else n): "i32" for n in ints}},
                       consts, num_warps=4, num_stages=4)
    for order in (skinny, gated):
        assert {"ld.global", "cp.async"} & set(order)
        if pdl == 0:
            assert not {"griddepcontrol.wait", "griddepcontrol.launch_dependents"} & set(order)
            continue
        assert order[0] == "griddepcontrol.wait" and order.count("griddepcontrol.wait") == 1
        assert order.count("griddepcontrol.launch_dependents") == (1 if pdl == 2 else 0)
        if pdl == 2:
            assert order[1] == "griddepcontrol.launch_dependents"


@pytest.mark.parametrize("pdl", [2, 3])
@pytest.mark.parametrize("prefetch", [False, True])
def test_a_small_kernel_at_3_lets_the_next_launch_before_its_wait(pdl, prefetch):
    """At 3 the norm lets the product after it launch (and stage its weights) before the norm waits for
    the product before; it still waits before every load, so no read moves ahead of a write. With
    the prefetch on its weight and residual row are asked into L2 before the wait: prefetches, not loads."""
    sig = {"X": "*bf16", "R": "*bf16", "W": "*bf16", "XOut": "*bf16", "Y": "*bf16", "N": "i32", "eps": "fp32"}
    from engine.cuda.fused import _add_rmsnorm_kernel
    order = _ptx_order(_add_rmsnorm_kernel, sig, {"HAS_R": True, "BLOCK": 4096, "PDL_": pdl, "PREFETCH_": prefetch,
                                                  "Ids": None, "GATHER": False, "WFIRST_": True},
                       num_warps=8)
    before = order[:order.index("griddepcontrol.wait")]
    assert before == (["griddepcontrol.launch_dependents"] if pdl == 3 else []) + ["prefetch"] * (2 * prefetch)
    assert order[len(before) + 1:len(before) + 2] == (["griddepcontrol.launch_dependents"] if pdl == 2 else ["ld.global"])
    assert "ld.global" in order and order.count("griddepcontrol.wait") == 1


def test_the_products_never_launch_the_next_before_their_wait(monkeypatch):
    """Under mode 3 the Triton products act as 2 (a product's programs resident and waiting would hold
    the SMs the product before needs: measured +0.12 ms a round on the H200)."""
    seen = []

    class Grab:
        def __getitem__(self, grid):
            return lambda *a, **kw: seen.append(kw["PDL_"])
    monkeypatch.setattr(S, "_skinny_kernel", Grab())
    monkeypatch.setattr(S, "_gated_kernel", Grab())
    x, w = torch.zeros(8, 256, dtype=torch.bfloat16), torch.zeros(64, 256, dtype=torch.bfloat16)
    m = LaunchMode(pdl=3, interpret=False)
    assert m.pdl_on() == 3
    S.skinny(x, w, config=S.SkinnyConfig(32, 128), mode=m, tables=S.H200)
    S.gate_up_silu(x, w, config=S.SkinnyConfig(32, 128), mode=m, tables=S.H200)
    assert seen == [2, 2]


@pytest.mark.parametrize("qkn", [False, True])
@pytest.mark.parametrize("prefetch", [-1, 0, 64])
def test_split_attention_compiles_its_walk_with_the_wait_first(qkn, prefetch):
    """The split attention as the decode graph launches it (PDL 3, folded combine, the capped grid's
    run-time walk over its items) compiles for sm_90, and its PDL order holds: the next kernel may
    launch first, but no load comes before the wait but the positions and lanes (written before the
    round's first kernel), which place the first item's L2 prefetches (PREFETCH_): no store before it."""
    ptrs = ("Q", "K", "V", "Lanes", "Pos", "Opart", "Lse", "Out", "Count")
    sig = {**{n: "*bf16" for n in ("Q", "K", "V", "Out")}, "Lanes": "*i64", "Pos": "*i64", "Opart": "*fp32",
           "Lse": "*fp32", "Count": "*i32",
           **{n: "i32" for n in ("stride_qr", "stride_qh", "stride_kb", "stride_kt", "stride_kh", "stride_or",
                                 "stride_oh", "stride_os", "stride_lr", "stride_lh", "stride_out")},
           "scale": "fp32", "P": "i32", "KVH": "i32"}
    consts = {"GROUP": 4, "GROUP_PAD": 16, "D": 128, "SPLIT_": 256, "BLOCK_": 64, "DYNAMIC": True, "NSPLIT": 129,
              "FOLD": True, "PDL_": 3, "P_PAD": 8, "ITEMS": 1, "QKN": qkn, "H": 32 if qkn else 0,
              "PREFETCH_": prefetch, "Clock": None, "CLOCK_": False, "LOADS_FIRST_": True}
    if qkn:
        sig.update({"QKV": "*bf16", "stride_qkv": "i32", "WQ": "*bf16", "WK": "*bf16", "Cos": "*bf16", "Sin": "*bf16",
                    "eps": "fp32"})
    else:
        consts.update({n: None for n in ("QKV", "WQ", "WK", "Cos", "Sin")})
        consts.update({"stride_qkv": 0, "eps": 0.0})
    assert set(ptrs) <= set(sig)
    order = _ptx_order(K._split_kernel, sig, consts, num_warps=4)
    before = order[:order.index("griddepcontrol.wait")]
    assert before[0] == "griddepcontrol.launch_dependents" and order.count("griddepcontrol.wait") == 1
    if prefetch < 0:
        assert before == ["griddepcontrol.launch_dependents"]
    else:  # the row's position and lane; K and V (64 rows of 2 lines: 1 a thread each), the 4 tables
        loads = (prefetch > 0 or qkn) + (prefetch > 0)
        assert before[1:] == ["ld.global"] * loads + ["prefetch"] * (2 * (prefetch > 0) + 4 * qkn)
    assert "ld.global" in order[len(before):]


@pytest.mark.parametrize("first", [True, False])
def test_the_round_path_kernels_ask_their_loads_before_their_sums(first):
    """engine/cuda/decode_attention.py LOADS_FIRST: the add+RMSNorm asks for its weight beside x, not after the row's sum,
    and the split kernel's q/k norm and rotation ask for the norms' weights, the rotation's tables and V
    before the q/k sums, so each is one trip to L2 on the round's path. Off, as before: loads after."""
    from engine.cuda.fused import _add_rmsnorm_kernel
    sig = {"X": "*bf16", "R": "*bf16", "W": "*bf16", "XOut": "*bf16", "Y": "*bf16", "N": "i32", "eps": "fp32"}
    norm = _ptx_order(_add_rmsnorm_kernel, sig, {"HAS_R": True, "BLOCK": 4096, "PDL_": 3, "PREFETCH_": False,
                                                 "Ids": None, "GATHER": False, "WFIRST_": first},
                      ("ld.global", "shfl"), num_warps=8)
    assert ("ld.global" in norm[norm.index("shfl"):]) is not first
    sig, consts = _folded_split(8, 129)
    split = _ptx_order(K._split_kernel, sig, {**consts, "LOADS_FIRST_": first}, ("ld.global", "st.global", "sqrt"),
                       num_warps=4)
    qk = split[split.index("sqrt"):]  # from the q/k norm's root: K's and V's rows written, q stored, q read back
    ahead = qk[:qk.index("ld.global")]
    assert (ahead.count("st.global") >= 5) is first and (ahead.count("st.global") == 0) is not first


def test_the_round_ends_wait_before_their_loads():
    """The first norm with the embedding gathered in it, and the chunked argmax, as the decode graph
    launches them (PDL 3): compiled for sm_90, no load before the wait."""
    from engine.cuda.fused import _add_rmsnorm_kernel, _argmax_kernel
    sig = {"X": "*bf16", "R": "*bf16", "W": "*bf16", "XOut": "*bf16", "Y": "*bf16", "N": "i32", "eps": "fp32",
           "Ids": "*i64"}
    norm = _ptx_order(_add_rmsnorm_kernel, sig, {"HAS_R": False, "BLOCK": 4096, "PDL_": 3, "GATHER": True,
                                                 "PREFETCH_": False, "WFIRST_": True}, num_warps=8)
    sig = {"X": "*bf16", "Out": "*i64", "Val": "*fp32", "Idx": "*i32", "Count": "*i32", "N": "i32", "stride_x": "i32",
           "CHUNKS": "i32"}
    top = _ptx_order(_argmax_kernel, sig, {"CHUNK": 4096, "CHUNKS_PAD": 64, "PDL_": 3}, num_warps=4)
    for order in (norm, top):
        assert order[:2] == ["griddepcontrol.launch_dependents", "griddepcontrol.wait"]
        assert "ld.global" in order and "st.global" in order


def test_the_dev_clocks_compile_only_where_asked_and_read_after_the_wait():
    """engine/cuda/clock.py's stamps (the in-kernel clocks of the split attention, for profiling): absent from the
    kernel the engine launches; with CLOCK_, six cycle reads, three timer reads and the SM's id, all but
    the entry's (a cycle read, a timer read, the SM) after the PDL wait."""
    sig = {**{n: "*bf16" for n in ("Q", "K", "V", "Out")}, "Lanes": "*i64", "Pos": "*i64", "Opart": "*fp32",
           "Lse": "*fp32", "Count": "*i32",
           **{n: "i32" for n in ("stride_qr", "stride_qh", "stride_kb", "stride_kt", "stride_kh", "stride_or",
                                 "stride_oh", "stride_os", "stride_lr", "stride_lh", "stride_out")},
           "scale": "fp32", "P": "i32", "KVH": "i32", "Clock": "*i64"}
    consts = {"GROUP": 4, "GROUP_PAD": 16, "D": 128, "SPLIT_": 256, "BLOCK_": 64, "DYNAMIC": True, "NSPLIT": 129,
              "FOLD": True, "PDL_": 3, "P_PAD": 8, "ITEMS": 1, "QKN": False, "H": 0, "PREFETCH_": -1,
              "QKV": None, "WQ": None, "WK": None, "Cos": None, "Sin": None, "stride_qkv": 0, "eps": 0.0,
              "LOADS_FIRST_": True}

    def reads(clock):
        s = dict(sig) if clock else {k: v for k, v in sig.items() if k != "Clock"}
        c = {**consts, "CLOCK_": clock} if clock else {**consts, "Clock": None, "CLOCK_": False}
        return _ptx_order(K._split_kernel, s, c, ("griddepcontrol.wait", "%clock64", "%globaltimer", "%smid"),
                          num_warps=4)
    assert reads(False) == ["griddepcontrol.wait"]
    got = reads(True)
    assert got.count("%clock64") == 6 and got.count("%globaltimer") == 3 and got.count("%smid") == 1
    assert got[:4] == ["%clock64", "%globaltimer", "%smid", "griddepcontrol.wait"]


def _folded_split(p_pad: int, nsplit: int) -> tuple[dict, dict]:
    """The split kernel's signature and constexprs as the decode graph launches it with the q/k fold."""
    sig = {**{n: "*bf16" for n in ("Q", "K", "V", "Out", "QKV", "WQ", "WK", "Cos", "Sin")}, "Lanes": "*i64",
           "Pos": "*i64", "Opart": "*fp32", "Lse": "*fp32", "Count": "*i32",
           **{n: "i32" for n in ("stride_qr", "stride_qh", "stride_kb", "stride_kt", "stride_kh", "stride_or",
                                 "stride_oh", "stride_os", "stride_lr", "stride_lh", "stride_out", "stride_qkv")},
           "scale": "fp32", "P": "i32", "KVH": "i32", "eps": "fp32"}
    consts = {"GROUP": 4, "GROUP_PAD": 16, "D": 128, "SPLIT_": 256, "BLOCK_": 64, "DYNAMIC": True, "NSPLIT": nsplit,
              "FOLD": True, "PDL_": 3, "P_PAD": p_pad, "ITEMS": 1, "QKN": True, "H": 32, "PREFETCH_": -1,
              "Clock": None, "CLOCK_": False, "LOADS_FIRST_": True}
    return sig, consts


def test_two_pipeline_stages_let_an_sm_hold_four_split_programs():
    """engine/cuda/decode_attention.py STAGES {64: 2}: compiled for sm_90 as launched (pointers and strides divisible
    by 16), the split kernel's pipelined key walk takes more than a quarter of an SM's 228 KB of shared
    memory at Triton's default 3 stages, so an SM holds three programs (a 64-row round's 512 items then
    run in two waves), and under a quarter at 2 stages."""
    import inspect
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    sig, consts = _folded_split(64, 17)
    names = list(inspect.signature(K._split_kernel.fn).parameters)
    aligned = [n for n, t in sig.items() if t.startswith("*") or n.startswith("stride_")]
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in aligned}

    def shared(stages):
        k = triton.compile(ASTSource(fn=K._split_kernel, signature=sig, constexprs=consts, attrs=attrs),
                           target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_stages": stages})
        return k.metadata.shared + 1024  # and the 1 KB the driver keeps a program
    sm = 228 * 1024
    assert sm // shared(3) == 3
    assert sm // shared(K.STAGES[64]) >= 4
