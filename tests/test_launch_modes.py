"""The decode graph's launch knobs (engine/kernels.py PDL, engine/kernels_skinny.py PRELOAD,
KernelConfig.pdl / preload; engine/dev/PERF.md runs 12-16): how much of its own weights a skinny
program asks L2 for before its grid-dependency wait, that a launch mode is scoped to the capture it
wraps, and the device code's order (PTX for sm_90, compiled on the CPU): prefetches, wait, loads.
The interpreter runs the kernels with both off."""
import pytest
import torch

triton = pytest.importorskip("triton")

import engine.kernels as K  # noqa: E402
import engine.kernels_skinny as S  # noqa: E402
from engine.config import KernelConfig  # noqa: E402


def test_prefetch_lines_follow_the_bytes_asked():
    w, w32 = torch.zeros(8, 8, dtype=torch.bfloat16), torch.zeros(1, dtype=torch.float32)
    qkv, o = S.SkinnyConfig(64, 256), S.SkinnyConfig(32, 128)
    assert S.PRELOAD == 0 and S.prefetch_lines(qkv, w, 4096) == {}  # off by default
    with S.launch_mode(preload=32 << 10):
        assert S.prefetch_lines(qkv, w, 4096) == {"PF_LINES": 4, "LINE": 64}  # 64 rows x 4 lines x 128 B
        assert S.prefetch_lines(o, w, 4096) == {"PF_LINES": 8, "LINE": 64}
        assert S.prefetch_lines(o, w, 256) == {"PF_LINES": 4, "LINE": 64}  # never past the K range
        assert S.prefetch_lines(o, w, 32) == {}                              # less than a line a row
        assert S.prefetch_lines(o, w, 4096, tiles=2) == {"PF_LINES": 4, "LINE": 64}  # gate and up rows
        assert S.prefetch_lines(o, w32, 4096) == {"PF_LINES": 8, "LINE": 32}  # fp32: 32 elements a line
    with S.launch_mode(preload=96 << 10):
        assert S.prefetch_lines(qkv, w, 4096)["PF_LINES"] == 8  # 12 lines a row: down to a power of two
    with S.launch_mode(preload=1):
        assert S.prefetch_lines(qkv, w, 4096)["PF_LINES"] == 1  # at least a line a row


def test_launch_mode_is_scoped_and_off_by_default():
    assert KernelConfig().pdl == 0 and KernelConfig().preload == 0
    assert K.PDL == 0 and S.PRELOAD == 0 and K.launch_opts() == {}
    with S.launch_mode(pdl=2, preload=4096):
        assert K.PDL == 2 and S.PRELOAD == 4096
        assert K.launch_opts() == ({} if K.INTERPRET else {"launch_pdl": True})
        assert K.pdl_on() == (0 if K.INTERPRET else 2)
    assert K.PDL == 0 and S.PRELOAD == 0 and K.launch_opts() == {}


def test_interpreter_runs_without_pdl_or_prefetch(interpret):
    """Under the interpreter a launch mode changes nothing (no PDL, no inline-asm prefetch): the
    products' bits are those outside it."""
    interpret(r'''
import torch
import engine.kernels as K
import engine.kernels_skinny as S
g = torch.Generator().manual_seed(3)
w, wg, x = torch.randn(40, 128, generator=g), torch.randn(64, 128, generator=g), torch.randn(8, 128, generator=g)
c = S.SkinnyConfig(16, 32, split_k=2)
ref, gref = S.skinny(x, w, config=c), S.gate_up_silu(x, wg, config=S.SkinnyConfig(16, 32))
with S.launch_mode(pdl=2, preload=1 << 20):
    assert K.launch_opts() == {} and K.pdl_on() == 0 and S.prefetch_lines(c, w, 64) == {}
    assert torch.equal(S.skinny(x, w, config=c), ref)
    assert torch.equal(S.gate_up_silu(x, wg, config=S.SkinnyConfig(16, 32)), gref)
print("ok")
''')


def _ptx_order(fn, sig: dict, consts: dict, **opts) -> list[str]:
    """The kernel compiled for sm_90 (no GPU needed): its memory instructions in program order."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    ptx = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts), target=GPUTarget("cuda", 90, 32),
                         options=opts).asm["ptx"]
    keys = ("prefetch.global.L2", "griddepcontrol.wait", "griddepcontrol.launch_dependents", "ld.global", "cp.async")
    return [k for line in ptx.splitlines() for k in keys if k in line]


@pytest.mark.parametrize("pdl", [2, 3])
def test_weight_prefetch_comes_before_the_wait_and_every_load_after(pdl):
    """The device code's order (PTX for sm_90, compiled here): each program's weight prefetches,
    then the grid-dependency wait, then every load; PDL 2 lets the next kernel launch after the
    wait, 3 before anything."""
    ptr = {n: "*bf16" for n in ("X", "W", "Y")}
    ints = ("M", "N", "K", "stride_xm", "stride_wn", "stride_ym")
    consts = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 128, "K_STEPS": 0, "PF_LINES": 8, "LINE": 64, "PDL_": pdl}
    sk = _ptx_order(S._skinny_kernel, {**ptr, "Part": "*fp32", "Count": "*i32", **{n: "i32" for n in ints}},
                    {**consts, "SPLIT_K": 2}, num_warps=4, num_stages=4)
    gated = _ptx_order(S._gated_kernel, {**ptr, **{n.replace("N", "I") if n == "N" else n: "i32" for n in ints}},
                       consts, num_warps=4, num_stages=4)
    for order in (sk, gated):
        wait = order.index("griddepcontrol.wait")
        assert order.count("griddepcontrol.wait") == 1 and order.count("griddepcontrol.launch_dependents") == 1
        assert set(order[:wait]) <= {"prefetch.global.L2", "griddepcontrol.launch_dependents"}
        assert order[:wait].count("prefetch.global.L2") >= 1 and "prefetch.global.L2" not in order[wait:]
        assert "ld.global" in order[wait:] or "cp.async" in order[wait:]
        launch = order.index("griddepcontrol.launch_dependents")
        assert (launch == 0) if pdl == 3 else (launch == wait + 1)
