"""The decode graph's launch experiments (engine/kernels.py PDL, engine/kernels_skinny.py PREFETCH,
KernelConfig.pdl / l2_prefetch; off by default, engine/dev/PERF.md runs 12-13): which matrix each
product prefetches, how much, how the work is shared among programs, and that a launch mode is
scoped to the capture it wraps. The PTX side (griddepcontrol, cp.async.bulk.prefetch) needs sm_90;
the interpreter runs the kernels with both off, which tests/test_skinny.py checks bit for bit."""
import pytest
import torch

pytest.importorskip("triton")

import engine.kernels as K  # noqa: E402
import engine.kernels_skinny as S  # noqa: E402
from engine.config import EngineConfig, KernelConfig  # noqa: E402
from engine.presets import resolve_model  # noqa: E402


def test_next_matrix_follows_the_round_order():
    from engine.runner import build_runner
    r = build_runner(EngineConfig(model="tiny", parallel=2, max_model_len=32))
    m = r.model
    nxt = m.next_matrix()
    l0, l1 = m.model.layers[0], m.model.layers[1]
    assert nxt[l0.self_attn.wqkv.data_ptr()] is l0.self_attn.o_proj.weight
    assert nxt[l0.self_attn.o_proj.weight.data_ptr()] is l0.mlp.w_gate_up
    assert nxt[l0.mlp.w_gate_up.data_ptr()] is l0.mlp.down_proj.weight
    assert nxt[l0.mlp.down_proj.weight.data_ptr()] is l1.self_attn.wqkv
    last = m.model.layers[-1].mlp.down_proj.weight
    assert nxt[last.data_ptr()] is m.lm_head.weight and m.lm_head.weight.data_ptr() not in nxt


def test_prefetch_plan_names_every_matrix_a_round_multiplies():
    cfg = resolve_model("qwen3-8b")[0]
    plan = S.prefetch_plan(cfg, window_bytes=16 << 20)
    assert plan == {(4096, 4096): 1 << 40, (6144, 4096): 16 << 20, (24576, 4096): 16 << 20,
                    (4096, 12288): 8 << 20, (151936, 4096): 16 << 20}


def test_prefetch_shares_whole_chunks_among_programs():
    w = torch.zeros(64, 256, dtype=torch.bfloat16)      # the product's own weight
    nxt = torch.zeros(512, 256, dtype=torch.bfloat16)   # 256 KiB: 64 chunks of 4 KiB
    c = S.SkinnyConfig(16, 128, num_warps=4)
    assert S._prefetch(nxt, 4, c, w) == ((w, 1), {})    # PREFETCH empty: off
    S.PREFETCH[(512, 256)] = 1 << 40                    # more than the matrix: all of it
    try:
        (ptr, chunks), kw = S._prefetch(nxt, 4, c, w)
        assert ptr is nxt and chunks == 64
        assert kw == {"PF_ITERS": 1, "LANES": 128, "CHUNK": 2048, "EVICT": "evict_first"}
        S.PREFETCH[(512, 256)] = 100 << 10             # 100 KiB: 25 whole chunks, never past the end
        assert S._prefetch(nxt, 4, c, w)[0][1] == 25
        big = torch.zeros(2048, 1024, dtype=torch.bfloat16)
        assert S._prefetch(big, 3, c, w) == ((w, 1), {})  # a shape the plan does not name: off
        S.PREFETCH[(2048, 1024)] = 4 << 20             # 1,024 chunks over 3 programs x 128 threads: 3 steps
        (_, chunks), kw = S._prefetch(big, 3, c, w)
        assert chunks == 1024 and kw["PF_ITERS"] == 3
    finally:
        S.PREFETCH.clear()


def test_launch_mode_is_scoped_and_off_by_default():
    assert KernelConfig().pdl == 0 and KernelConfig().l2_prefetch is False
    assert K.PDL == 0 and S.PREFETCH == {} and K.launch_opts() == {}
    with S.launch_mode(pdl=2, prefetch={(1, 2): 3}):
        assert K.PDL == 2 and S.PREFETCH == {(1, 2): 3}
        assert K.launch_opts() == ({} if K.INTERPRET else {"launch_pdl": True})
        assert K.pdl_on() == (0 if K.INTERPRET else 2)
    assert K.PDL == 0 and S.PREFETCH == {} and K.launch_opts() == {}


def test_interpreter_never_launches_with_pdl(interpret):
    interpret(r'''
import torch
import engine.kernels as K
import engine.kernels_skinny as S
assert K.INTERPRET
with S.launch_mode(pdl=2, prefetch={(40, 64): 1 << 20}):
    assert K.launch_opts() == {} and K.pdl_on() == 0
    w, x = torch.randn(40, 64), torch.randn(3, 64)
    c = S.SkinnyConfig(16, 32)
    assert S._prefetch(w, 3, c, w) == ((w, 1), {})
    assert torch.equal(S.skinny(x, w, config=c), S._launch(x, w, c, nxt=w))
print("ok")
''')
