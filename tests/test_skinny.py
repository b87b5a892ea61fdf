"""The decode round's Triton matmuls (engine/kernels_skinny.py), run by Triton's interpreter on
the CPU: they agree with torch, a row's bits never depend on the other rows or their count,
shapes without a config go to torch, and the engine's tokens with them equal its tokens without."""
import pytest

pytest.importorskip("triton")


def test_skinny_matches_torch_and_is_row_invariant(interpret):
    interpret(r'''
import torch, torch.nn.functional as F
import engine.kernels_skinny as S
c = S.SkinnyConfig(block_n=16, block_k=32)
g = torch.Generator().manual_seed(0)
w = torch.randn(48, 96, generator=g)
x = torch.randn(16, 96, generator=g)
y = S.skinny(x, w, config=c)
assert y.shape == (16, 48) and (y - x @ w.T).abs().max() < 1e-4
# a row's bits: alone, among 8 rows of anything, at any row count
one = S.skinny(x[:1], w, config=c)
other = torch.randn(8, 96, generator=g); other[0] = x[0]
assert torch.equal(one[0], S.skinny(other, w, config=c)[0])
assert torch.equal(y[:3], S.skinny(x[:3], w, config=c))
# N not a multiple of BLOCK_N: the last program's columns are masked
w2 = torch.randn(40, 96, generator=g)
assert (S.skinny(x[:5], w2, config=c) - x[:5] @ w2.T).abs().max() < 1e-4
# shapes without a config (DEFAULT None, nothing in CONFIGS) and shapes it does not take go to torch
assert not S.supports(x, w) and torch.equal(S.linear(x, w), F.linear(x, w))
S.CONFIGS[(48, 96)] = c
assert S.supports(x, w) and torch.equal(S.linear(x, w), y)
S.CONFIGS[(48, 96)] = None  # measured no faster than cuBLAS
assert not S.supports(x, w)
S.DEFAULT = c
assert not S.supports(torch.randn(65, 96), w) and not S.supports(torch.randn(4, 80), torch.randn(8, 80))
x65 = torch.randn(65, 96, generator=g)
assert torch.equal(S.linear(x65, w), F.linear(x65, w))
try:
    S.skinny(torch.randn(65, 96), w)
    raise SystemExit("no error for 65 rows")
except ValueError as e:
    assert "unsupported" in str(e)
print("ok")
''')


def test_engine_tokens_equal_with_skinny_matmuls(interpret):
    """The whole decode round with the skinny matmuls (fused trunk, interpreter, float32): the
    same greedy tokens as the plain trunk, and a stream's tokens alone equal its tokens beside
    another stream."""
    interpret(r'''
import torch
import engine.kernels_skinny as S
from engine.config import EngineConfig
from engine.runner import build_runner
S.DEFAULT = S.SkinnyConfig(block_n=16, block_k=32)
r = build_runner(EngineConfig(model="tiny", parallel=2, max_model_len=40, prefill_rows=16))
toks = [(i * 13 + 1) % 256 for i in range(12)]
other = [(i * 5 + 3) % 256 for i in range(7)]
plain = r.generate(toks, 6, lane=0)
r.fused, r.skinny = True, True
calls = []
orig = S._launch
S._launch = lambda *a, **k: calls.append(1) or orig(*a, **k)
assert r.generate(toks, 6, lane=1) == plain
assert calls, "the skinny kernel never ran"
first = r.prefill(0, other)
t0, t1 = r.prefill(1, toks), first
outs = []
pos = [len(toks), len(other)]
for _ in range(5):
    outs.append(t0)
    t0, t1 = r.decode([1, 0], [t0, t1], pos)
    pos = [p + 1 for p in pos]
assert outs == plain[:5], (outs, plain)
print("ok")
''')


def test_skinny_split_k_and_64_rows(interpret):
    """Rounds of up to 64 lanes pad to 32 or 64 rows; a config may cut K into fixed ranges whose
    partials the last-arriving program sums in range order. Both agree with torch, a row's bits do
    not depend on the other rows, repeated launches give the same bits, the arrival counters are
    back at 0 after each launch, and a (N, K, rows) config wins over the (N, K) one."""
    interpret(r'''
import torch
import engine.kernels_skinny as S
g = torch.Generator().manual_seed(1)
w = torch.randn(40, 192, generator=g)
for rows in (8, 40, 64):
    x = torch.randn(rows, 192, generator=g)
    for c in (S.SkinnyConfig(16, 32), S.SkinnyConfig(16, 32, split_k=2), S.SkinnyConfig(32, 32, split_k=3)):
        y = S.skinny(x, w, config=c)
        assert (y - x @ w.T).abs().max() < 1e-4, (rows, c)
        assert torch.equal(y, S.skinny(x, w, config=c))
        other = torch.randn(rows, 192, generator=g); other[rows // 2] = x[rows // 2]
        assert torch.equal(S.skinny(other, w, config=c)[rows // 2], y[rows // 2])
assert S._scratch and all(int(cnt.abs().sum()) == 0 for _, cnt in S._scratch.values())
try:
    S.skinny(torch.randn(4, 192), w, config=S.SkinnyConfig(16, 128, split_k=2))  # 192 % 256 != 0
    raise SystemExit("no error for K not a multiple of block_k * split_k")
except ValueError:
    pass
S.CONFIGS[(40, 192)] = S.SkinnyConfig(16, 32)
S.CONFIGS[(40, 192, 64)] = S.SkinnyConfig(32, 64, split_k=3)
assert S.config_for(40, 192, 8).split_k == 1 and S.config_for(40, 192, 33).split_k == 3
print("ok")
''')


def test_gated_gate_up_equals_two_kernels(interpret):
    """The gate/up product with silu*up folded in (one kernel) rounds as the two-kernel path does:
    bitwise equal to silu_mul of the plain product with the same config, row-invariant, and a
    shape without a gated config takes the two kernels."""
    interpret(r'''
import torch, torch.nn.functional as F
import engine.kernels_skinny as S
from engine.kernels_fused import silu_mul
g = torch.Generator().manual_seed(2)
w = torch.randn(96, 64, generator=g)
for rows, c in ((5, S.SkinnyConfig(16, 32)), (40, S.SkinnyConfig(32, 16))):
    x = torch.randn(rows, 64, generator=g)
    a = S.gate_up_silu(x, w, config=c)
    assert a.shape == (rows, 48) and torch.equal(a, silu_mul(S.skinny(x, w, config=c)))
    other = torch.randn(rows, 64, generator=g); other[1] = x[1]
    assert torch.equal(S.gate_up_silu(other, w, config=c)[1], a[1])
x = torch.randn(3, 64, generator=g)
assert torch.equal(S.gate_up_silu(x, w), silu_mul(F.linear(x, w)))
print("ok")
''')
