"""The decode round's Triton matmuls (engine/cuda/skinny.py), run by Triton's interpreter on
the CPU: they agree with torch, a row's bits never depend on the other rows or their count,
shapes without a config go to torch, and the engine's tokens with them equal its tokens without."""
import pytest

pytest.importorskip("triton", reason="the Triton kernels: triton is not installed (the engine extra brings it on Linux x86_64 and aarch64)")


def test_skinny_matches_torch_and_is_row_invariant(interpret):
    interpret(r'''
import torch, torch.nn.functional as F
import engine.cuda.skinny as S
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
import engine.cuda.skinny as S
from engine.config import EngineConfig
from engine.runner.model_runner import build_runner
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
import engine.cuda.skinny as S
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
import engine.cuda.skinny as S
from engine.cuda.fused import silu_mul
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


def test_bench_shapes_are_one_ranks_weights():
    """bench_skinny --tensor-parallel N times the matrices a rank holds: the tiny model's rank-0
    shard (engine/parallel/weights.py, fused as the engine fuses it) has exactly bench_skinny's shapes at
    N = 1 and 2; qwen3-32b's at N = 2 are the halved shapes, and CONFIGS / GATED name each of them."""
    import engine.cuda.skinny as S
    from tools.bench_skinny import shapes
    from engine.models.presets import resolve_model
    from engine.parallel.weights import load_shard
    for world in (1, 2):
        m = load_shard(resolve_model("tiny")[0], "dummy", None, "cpu", "float32", 0, 0, world)
        m.fuse()
        a, mlp = m.model.layers[0].self_attn, m.model.layers[0].mlp
        held = {"qkv": a.wqkv, "o": a.o_proj.weight, "gate_up": mlp.w_gate_up, "silu+down": mlp.down_proj.weight,
                "lm_head": m.lm_head.weight}
        assert {k: (n, kk) for k, (n, kk, _, _) in shapes("tiny", world).items()} == \
               {k: tuple(w.shape) for k, w in held.items()}, world
    s = shapes("qwen3-32b", 2)
    assert [v[:2] for v in s.values()] == [(5120, 5120), (5120, 4096), (25600, 5120), (5120, 12800), (75968, 5120)]
    assert all((n, k, 16) in S.CONFIGS for n, k, _, _ in s.values())
    assert (25600, 5120, 16) in S.GATED and (51200, 5120, 16) in S.GATED


def test_set_entries_adds_to_the_shipped_tables_and_restores_them():
    """tp_check --skinny's tables: bench_skinny's entries on top of the shipped ones (a None entry:
    cuBLAS), and with no entries exactly the shipped tables again."""
    import engine.cuda.skinny as S
    shipped = (dict(S.CONFIGS), dict(S.GATED))
    c = {"block_n": 16, "block_k": 32, "num_warps": 4, "num_stages": 4, "split_k": 2}
    S.set_entries([[48, 96, 16, c, 1.0, 2.0], [4096, 4096, 16, None, 13.0, 12.0]], [[96, 64, 16, c, 1.0, 2.0]])
    try:
        assert S.config_for(48, 96, 4) == S.SkinnyConfig(16, 32, split_k=2) and S.config_for(48, 96, 20) is None
        assert S.config_for(4096, 4096, 8) is None  # the (N, K) entry is shadowed by the 16-row one
        assert S.GATED[(96, 64, 16)] == S.SkinnyConfig(16, 32, split_k=2)
    finally:
        S.set_entries()
    assert (S.CONFIGS, S.GATED) == shipped
