"""Short prompt cuts filled together in one forward (CudaRunner.prefill_many),
run by Triton's interpreter on the CPU: the row-invariant matmul gives a row the same bits
whatever the rows beside it, and a cut filled beside others equals the same cut filled alone,
bit for bit (first token and KV rows)."""
import pytest

pytest.importorskip("triton", reason="the Triton kernels: triton is not installed (the engine extra brings it on Linux x86_64 and aarch64)")


@pytest.mark.interpreted
def test_batch_matmul_rows_do_not_depend_on_the_batch(monkeypatch):
    import torch
    import engine.cuda.batch as B
    monkeypatch.setattr(B, "DEFAULT", B.TileConfig(16, 16, 16))
    g = torch.Generator().manual_seed(0)
    w = torch.randn(40, 64, generator=g)
    x = torch.randn(37, 64, generator=g)
    y = B.matmul(x, w)
    assert (y - x @ w.T).abs().max() < 1e-4
    for sl in (slice(0, 1), slice(5, 9), slice(20, 37), slice(3, 36)):  # other M, other tile rows
        assert torch.equal(B.matmul(x[sl].contiguous(), w), y[sl]), sl
    other = torch.randn(50, 64, generator=g); other[44] = x[2]
    assert torch.equal(B.matmul(other, w)[44], y[2])
    with pytest.raises(ValueError):
        B.matmul(torch.randn(3, 60), torch.randn(8, 60))


@pytest.mark.interpreted
def test_cuts_together_equal_cuts_alone():
    import torch
    from engine.config import EngineConfig
    from engine.runner.cuda_runner import CudaRunner
    r = CudaRunner(EngineConfig(model="tiny", parallel=4, max_model_len=48, prefill_rows=16))
    plain_a = r.generate([(i * 13 + 1) % 256 for i in range(12)], 3, lane=0)
    r.fused = r.batch_cuts = True
    a, b, c = ([(i * 13 + 1) % 256 for i in range(12)], [(i * 5 + 3) % 256 for i in range(7)],
               [(i * 7 + 2) % 256 for i in range(20)])
    alone = [r.prefill_step(0, a, 0, 12), r.prefill_step(1, b, 0, 7), r.prefill_step(2, c, 0, 16)]
    kv_alone = r.kv.k[:, :3].clone(), r.kv.v[:, :3].clone()
    r.kv.k.zero_(); r.kv.v.zero_()
    together = r.prefill_many([(2, c, 0, 16), (0, a, 0, 12), (1, b, 0, 7)])
    assert together == [alone[2], alone[0], alone[1]] and together[0] is None
    for lane, n in ((0, 12), (1, 7), (2, 16)):
        assert torch.equal(r.kv.k[:, lane, :n], kv_alone[0][:, lane, :n])
        assert torch.equal(r.kv.v[:, lane, :n], kv_alone[1][:, lane, :n])
    # the second cut of c (start 16) beside a new prompt in lane 3
    c2 = r.prefill_many([(2, c, 16, 20), (3, b, 0, 7)])
    assert c2[1] == alone[1]
    assert c2[0] == r.prefill(2, c)  # cut by cut, each alone
    # tokens: the row-invariant path agrees with the plain trunk on a stream's reply (float32)
    assert r.generate(a, 3, lane=0) == plain_a
    with pytest.raises(ValueError):
        r.prefill_many([(0, a, 0, 12), (0, b, 0, 7)])
