"""The decode round's Triton matmuls (engine/cuda/skinny.py), run by Triton's interpreter on
the CPU: they agree with torch, a row's bits never depend on the other rows or their count,
shapes without a config go to torch, and the engine's tokens with them equal its tokens without."""
import pytest

pytest.importorskip("triton", reason="the Triton kernels: triton is not installed (the engine extra brings it on Linux x86_64 and aarch64)")


@pytest.mark.interpreted
def test_skinny_matches_torch_and_is_row_invariant():
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
    # shapes without a config (no default, nothing in the tables) and shapes it does not take go to torch
    t = S.SkinnyTables(smem=S.H200_SMEM)
    assert not S.supports(x, w, tables=t) and torch.equal(S.linear(x, w, tables=t), F.linear(x, w))
    t = S.SkinnyTables({(48, 96): c}, smem=S.H200_SMEM)
    assert S.supports(x, w, tables=t) and torch.equal(S.linear(x, w, tables=t), y)
    t = S.SkinnyTables({(48, 96): None}, smem=S.H200_SMEM)  # measured no faster than cuBLAS
    assert not S.supports(x, w, tables=t)
    t = S.SkinnyTables(smem=S.H200_SMEM, default=c)
    assert not S.supports(torch.randn(65, 96), w, tables=t) and not S.supports(torch.randn(4, 80), torch.randn(8, 80), tables=t)
    x65 = torch.randn(65, 96, generator=g)
    assert torch.equal(S.linear(x65, w, tables=t), F.linear(x65, w))
    # on the CPU (no device tables were measured on) every product goes to torch
    assert S.tables_for(torch.device("cpu")) == S.SkinnyTables() and torch.equal(S.linear(x, w), F.linear(x, w))
    with pytest.raises(ValueError) as e:
        S.skinny(torch.randn(65, 96), w, tables=t)
    assert "unsupported" in str(e.value)


@pytest.mark.interpreted
def test_engine_tokens_equal_with_skinny_matmuls(monkeypatch):
    """The whole decode round with the skinny matmuls (fused trunk, interpreter, float32): the
    same greedy tokens as the plain trunk, and a stream's tokens alone equal its tokens beside
    another stream."""
    import torch
    import engine.cuda.skinny as S
    from engine.config import EngineConfig
    from engine.runner.cuda_runner import CudaRunner
    r = CudaRunner(EngineConfig(model="tiny", parallel=2, max_model_len=40, prefill_rows=16))
    r.kernels.skinny = S.SkinnyTables(smem=S.H200_SMEM, default=S.SkinnyConfig(block_n=16, block_k=32))
    toks = [(i * 13 + 1) % 256 for i in range(12)]
    other = [(i * 5 + 3) % 256 for i in range(7)]
    plain = r.generate(toks, 6, lane=0)
    r.fused, r.skinny = True, True
    calls = []
    orig = S._launch
    monkeypatch.setattr(S, "_launch", lambda *a, **k: calls.append(1) or orig(*a, **k))
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


@pytest.mark.interpreted
def test_skinny_split_k_and_64_rows():
    """Rounds of up to 64 lanes pad to 32 or 64 rows; a config may cut K into fixed ranges whose
    partials the last-arriving program sums in range order. Both agree with torch, a row's bits do
    not depend on the other rows, repeated launches give the same bits, the arrival counters are
    back at 0 after each launch, and a (N, K, rows) config wins over the (N, K) one."""
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
    with pytest.raises(ValueError):
        S.skinny(torch.randn(4, 192), w, config=S.SkinnyConfig(16, 128, split_k=2))  # 192 % 256 != 0
    t = S.SkinnyTables({(40, 192): S.SkinnyConfig(16, 32), (40, 192, 64): S.SkinnyConfig(32, 64, split_k=3)})
    assert S.config_for(40, 192, 8, t).split_k == 1 and S.config_for(40, 192, 33, t).split_k == 3


@pytest.mark.interpreted
def test_gated_gate_up_equals_two_kernels():
    """The gate/up product with silu*up folded in (one kernel) rounds as the two-kernel path does:
    bitwise equal to silu_mul of the plain product with the same config, row-invariant, and a
    shape without a gated config takes the two kernels."""
    import torch, torch.nn.functional as F
    import engine.cuda.skinny as S
    from engine.cuda.fused import silu_mul
    g = torch.Generator().manual_seed(2)
    w = torch.randn(96, 64, generator=g)
    for rows, c in ((5, S.SkinnyConfig(16, 32)), (40, S.SkinnyConfig(32, 16))):
        x = torch.randn(rows, 64, generator=g)
        a = S.gate_up_silu(x, w, config=c, tables=S.H200)
        assert a.shape == (rows, 48) and torch.equal(a, silu_mul(S.skinny(x, w, config=c, tables=S.H200)))
        other = torch.randn(rows, 64, generator=g); other[1] = x[1]
        assert torch.equal(S.gate_up_silu(other, w, config=c, tables=S.H200)[1], a[1])
    x = torch.randn(3, 64, generator=g)
    assert torch.equal(S.gate_up_silu(x, w, tables=S.H200), silu_mul(F.linear(x, w)))


def test_bench_shapes_are_one_ranks_weights():
    """bench_skinny --tensor-parallel N times the matrices a rank holds: the tiny model's rank-0
    shard (engine/parallel/weights.py, fused as the engine fuses it) has exactly bench_skinny's shapes at
    N = 1 and 2; qwen3-32b's at N = 2 are the halved shapes, and the H200's tables name each of them."""
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
    assert all((n, k, 16) in S.H200.configs for n, k, _, _ in s.values())
    assert (25600, 5120, 16) in S.H200.gated and (51200, 5120, 16) in S.H200.gated


def test_set_entries_adds_to_the_shipped_tables_and_restores_them():
    """tp_check --skinny's tables: bench_skinny's entries on top of the shipped ones (a None entry:
    cuBLAS), and with no entries exactly the shipped tables again; the shipped ones never change."""
    import engine.cuda.skinny as S
    shipped = (dict(S.H200.configs), dict(S.H200.gated))
    c = {"block_n": 16, "block_k": 32, "num_warps": 4, "num_stages": 4, "split_k": 2}
    t = S.H200.with_entries([[48, 96, 16, c, 1.0, 2.0], [4096, 4096, 16, None, 13.0, 12.0]], [[96, 64, 16, c, 1.0, 2.0]])
    assert S.config_for(48, 96, 4, t) == S.SkinnyConfig(16, 32, split_k=2) and S.config_for(48, 96, 20, t) is None
    assert S.config_for(4096, 4096, 8, t) is None  # the (N, K) entry is shadowed by the 16-row one
    assert t.gated[(96, 64, 16)] == S.SkinnyConfig(16, 32, split_k=2)
    assert S.config_for(48, 96, 4, S.H200) is None and (dict(S.H200.configs), dict(S.H200.gated)) == shipped
    assert S.H200.with_entries() == S.H200 and t.smem == S.H200.smem


def test_tables_are_the_devices_they_were_measured_on(monkeypatch):
    """The H200's tables only on an H200 (compute capability 9.0 and its name); another GPU gets
    none (cuBLAS for every product) and its own shared-memory limit; the CPU none."""
    from types import SimpleNamespace as NS
    import torch
    import engine.cuda.skinny as S
    props = {"h200": NS(major=9, minor=0, name="NVIDIA H200", shared_memory_per_block_optin=232_448),
             "h100": NS(major=9, minor=0, name="NVIDIA H100 80GB HBM3", shared_memory_per_block_optin=232_448),
             "a100": NS(major=8, minor=0, name="NVIDIA A100-SXM4-80GB", shared_memory_per_block_optin=166_912)}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    got = {}
    for name, p in props.items():
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d, p=p: p)
        got[name] = S.tables_for.__wrapped__(torch.device("cuda", 0))
    assert got["h200"] is S.H200
    assert got["h100"] == S.SkinnyTables(smem=232_448) and got["a100"] == S.SkinnyTables(smem=166_912)
    assert S.tables_for.__wrapped__(torch.device("cpu")) == S.SkinnyTables()
    assert S.route(4096, 4096, 8, got["a100"]) == ("cublas", 8) and S.route(4096, 4096, 8, S.H200)[0] == "skinny"
