"""cuBLAS at checked row counts for short cuts filled together (engine/cuda/batch.py
adopt_buckets / bucketed / Buckets.padded_rows; ModelRunner.prefill_many pads a forward once). On the CPU
the same code runs with torch's CPU matmul: the start-up check either adopts counts (then a cut
filled beside others must equal the cut alone, bit for bit) or refuses them (then the tiles stay)."""
import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton", reason="the Triton kernels: triton is not installed (the engine extra brings it on Linux x86_64 and aarch64)")

import engine.cuda.batch as B


def test_bucketed_pads_and_chunks_at_the_given_counts():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(24, 32, generator=g)
    seen = []
    orig = F.linear
    try:
        F.linear = lambda x, w_: seen.append(x.shape[0]) or orig(x, w_)
        for m, want in ((5, [8]), (8, [8]), (9, [16]), (16, [16]), (17, [16, 8]), (40, [16, 16, 8])):
            seen.clear()
            x = torch.randn(m, 32, generator=g)
            y = B.bucketed(x, w, (8, 16))
            assert seen == want, (m, seen)
            assert y.shape == (m, 24) and torch.allclose(y, x @ w.T, atol=1e-5)
    finally:
        F.linear = orig


def test_padded_rows_follows_the_adopted_counts():
    assert B.NO_BUCKETS.padded_rows(200) == 200  # nothing adopted: no padding
    b = B.Buckets({(8, 4): (128, 256, 384)})
    assert [b.padded_rows(m) for m in (1, 128, 129, 384, 385, 800)] == [128, 128, 256, 384, 768, 1152]


def test_adopt_needs_every_shape_and_the_largest_count():
    g = torch.Generator().manual_seed(1)
    ws = [torch.randn(16, 32, generator=g), torch.randn(24, 32, generator=g)]
    orig = B.bucket_check
    try:
        B.bucket_check = lambda w, c: c if w.shape[0] == 16 else c[1:]
        got = B.adopt_buckets(ws, (8, 16, 32))
        assert got.rows == (16, 32) and dict(got.table) == {(16, 32): (16, 32), (24, 32): (16, 32)}
        B.bucket_check = lambda w, c: c[:-1]  # the largest count fails: chunks of it would not be exact
        got = B.adopt_buckets(ws, (8, 16, 32))
        assert got == B.NO_BUCKETS and got.rows == () and dict(got.table) == {}
    finally:
        B.bucket_check = orig


def test_bucket_check_catches_a_row_order_that_depends_on_the_count():
    w = torch.randn(8, 64)

    def split_k_below_16(x, w_):  # a library that splits K when few rows: another sum order
        if x.shape[0] >= 16:
            return x @ w_.T
        return x[:, :32] @ w_[:, :32].T + x[:, 32:] @ w_[:, 32:].T
    orig = F.linear
    try:
        F.linear = split_k_below_16
        ok = B.bucket_check(w, (8, 16, 32), shifts=(0, 3))
    finally:
        F.linear = orig
    assert ok[-2:] == (16, 32) and 8 not in ok


@pytest.mark.interpreted
def test_cuts_together_equal_alone_through_adopted_counts(monkeypatch):
    """The forward's padding (spare-lane rows up to a checked count, chunks of the largest) keeps
    a cut's bits: with a matmul that is row-invariant (as the check found cuBLAS at its counts on
    the H200), cuts filled together equal each cut alone."""
    import torch
    import torch.nn.functional as F
    import engine.cuda.batch as B
    from engine.config import EngineConfig
    from engine.runner.cuda_runner import CudaRunner
    monkeypatch.setattr(F, "linear", lambda x, w: (x[:, None, :] * w[None, :, :]).sum(-1))  # each row alone
    r = CudaRunner(EngineConfig(model="tiny", parallel=4, max_model_len=48, prefill_rows=16))
    r.fused = r.batch_cuts = True
    layer = r.model.model.layers[0]
    r.kernels.batch = B.adopt_buckets([layer.self_attn.wqkv, layer.self_attn.o_proj.weight, layer.mlp.w_gate_up,
                                       layer.mlp.down_proj.weight], (8, 16, 32))
    assert r.kernels.batch.rows == (8, 16, 32), r.kernels.batch
    calls = []
    orig = B.bucketed
    monkeypatch.setattr(B, "bucketed", lambda x, w, b: calls.append(x.shape[0]) or orig(x, w, b))
    a, b, c = ([(i * 13 + 1) % 256 for i in range(12)], [(i * 5 + 3) % 256 for i in range(7)],
               [(i * 7 + 2) % 256 for i in range(20)])
    alone = [r.prefill_step(0, a, 0, 12), r.prefill_step(1, b, 0, 7), r.prefill_step(2, c, 0, 16)]
    assert calls and set(calls) <= {8, 16, 32}, calls  # every product at a checked count
    kv_alone = r.kv.k[:, :3].clone(), r.kv.v[:, :3].clone()
    r.kv.k.zero_(); r.kv.v.zero_()
    calls.clear()
    together = r.prefill_many([(2, c, 0, 16), (0, a, 0, 12), (1, b, 0, 7)])  # 35 rows -> 64: 2 chunks of 32
    assert together == [None, alone[0], alone[1]], (together, alone)
    assert set(calls) == {64}, calls
    for lane, n in ((0, 12), (1, 7), (2, 16)):
        assert torch.equal(r.kv.k[:, lane, :n], kv_alone[0][:, lane, :n])
        assert torch.equal(r.kv.v[:, lane, :n], kv_alone[1][:, lane, :n])
