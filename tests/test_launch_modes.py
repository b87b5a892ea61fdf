"""The decode graph's launch knobs (engine/kernels.py PDL, engine/kernels_skinny.py PRELOAD,
KernelConfig.pdl / preload; engine/dev/PERF.md runs 12-13 and round 4): how many K steps a skinny
program loads before its grid-dependency wait, that a launch mode is scoped to the capture it
wraps, and that peeling those first steps off the K loop leaves every bit where it was. The PTX side
(griddepcontrol) needs sm_90; the interpreter runs the kernels with PDL off and the peel on."""
import pytest
import torch

pytest.importorskip("triton")

import engine.kernels as K  # noqa: E402
import engine.kernels_skinny as S  # noqa: E402
from engine.config import KernelConfig  # noqa: E402


def test_preload_steps_follow_the_bytes_asked():
    w = torch.zeros(8, 8, dtype=torch.bfloat16)
    qkv, o = S.SkinnyConfig(64, 256), S.SkinnyConfig(32, 128)  # weight tiles of 32 KiB and 8 KiB
    assert S.PRELOAD == 0 and S.preload_steps(qkv, w, 16) == 0  # off by default
    with S.launch_mode(preload=32 << 10):
        assert S.preload_steps(qkv, w, 16) == 1
        assert S.preload_steps(o, w, 32) == 4
        assert S.preload_steps(o, w, 3) == 3                      # never past the program's K steps
        assert S.preload_steps(qkv, w, 16, tiles=2) == 1          # at least one step when asked
    with S.launch_mode(preload=1 << 20):
        assert S.preload_steps(o, w, 32) == S.PRE_MAX == 4        # capped: the kernel names four tiles
        assert S.preload_steps(o, w, 32, tiles=2) == 2            # the gated kernel: two pairs
    with S.launch_mode(preload=8 << 10):
        assert S.preload_steps(o, torch.zeros(1, dtype=torch.float32), 32) == 1  # element size counts


def test_launch_mode_is_scoped_and_off_by_default():
    assert KernelConfig().pdl == 0 and KernelConfig().preload == 0
    assert K.PDL == 0 and S.PRELOAD == 0 and K.launch_opts() == {}
    with S.launch_mode(pdl=3, preload=4096):
        assert K.PDL == 3 and S.PRELOAD == 4096
        assert K.launch_opts() == ({} if K.INTERPRET else {"launch_pdl": True})
        assert K.pdl_on() == (0 if K.INTERPRET else 3)
    assert K.PDL == 0 and S.PRELOAD == 0 and K.launch_opts() == {}


def test_preloaded_steps_leave_every_bit_in_place(interpret):
    """Skinny (one K range, split K, 8 / 40 rows, all steps or some peeled) and gated products with
    PRELOAD set give bitwise the outputs they give without it; PDL is never on in the interpreter."""
    interpret(r'''
import torch
import engine.kernels as K
import engine.kernels_skinny as S
assert K.INTERPRET
g = torch.Generator().manual_seed(3)
w = torch.randn(40, 128, generator=g)
wg = torch.randn(64, 128, generator=g)
cases = [S.SkinnyConfig(16, 32), S.SkinnyConfig(16, 32, split_k=2), S.SkinnyConfig(32, 64, split_k=2)]
for rows in (8, 40):
    x = torch.randn(rows, 128, generator=g)
    ref = {c: S.skinny(x, w, config=c) for c in cases}
    gref = S.gate_up_silu(x, wg, config=S.SkinnyConfig(16, 32))
    for pre in (1, 4 << 10, 1 << 20):  # 1 step, 2 (8 KiB of 16x32 fp32 tiles: 4 KiB each), all
        with S.launch_mode(pdl=3, preload=pre):
            assert K.launch_opts() == {} and K.pdl_on() == 0
            for c in cases:
                steps = 128 // (c.block_k * c.split_k)
                assert S.preload_steps(c, w, steps) == min(steps, 4, max(1, pre // (c.block_n * c.block_k * 4)))
                assert torch.equal(S.skinny(x, w, config=c), ref[c]), (rows, pre, c)
            assert torch.equal(S.gate_up_silu(x, wg, config=S.SkinnyConfig(16, 32)), gref), (rows, pre)
    assert (ref[cases[0]] - x @ w.T).abs().max() < 1e-4
assert all(int(cnt.abs().sum()) == 0 for _, cnt in S._scratch.values())
print("ok")
''')
