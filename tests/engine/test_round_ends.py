"""The decode round's first and last kernels (engine/cuda/fused.py), by Triton's interpreter on
the CPU: the embedding gathered inside the first norm gives add_rmsnorm's bits on the embedding's
rows, and argmax_rows gives torch.argmax's ids (the first maximum; a NaN counts as the largest),
whatever chunk holds them."""
import pytest

pytest.importorskip("triton", reason="the Triton kernels: triton is not installed (the engine extra brings it on Linux x86_64 and aarch64)")


@pytest.mark.interpreted
def test_embedding_gathered_in_the_first_norm_is_bitwise_the_two_kernels():
    import torch
    from engine.cuda.fused import add_rmsnorm, embed_rmsnorm
    g = torch.Generator().manual_seed(3)
    for dtype in (torch.float32, torch.bfloat16):
        table = torch.randn(50, 96, generator=g).to(dtype)  # 96: a row not a power of two
        w = torch.randn(96, generator=g).to(dtype)
        ids = torch.tensor([7, 0, 49, 7, 13])
        x, y = embed_rmsnorm(table, ids, w, 1e-6)
        x2, y2 = add_rmsnorm(torch.nn.functional.embedding(ids, table), None, w, 1e-6)
        assert torch.equal(x, x2) and torch.equal(y, y2), (y - y2).abs().max()
        assert x.data_ptr() != table.data_ptr() and torch.equal(x, table[ids])


@pytest.mark.interpreted
def test_argmax_rows_are_torch_argmax(monkeypatch):
    import torch
    import engine.cuda.fused as F
    monkeypatch.setattr(F, "ARGMAX_CHUNK", 32)  # several chunks a row, one partly filled (100 = 3 x 32 + 4)
    g = torch.Generator().manual_seed(9)
    x = torch.randn(7, 100, generator=g)
    x[1, 40] = x[1, 90] = x[1].max() + 1     # a tie across chunks: the first
    x[2, 33] = x[2, 34] = x[2].max() + 1     # a tie inside a chunk: the first
    x[3, 70] = float("nan"); x[3, 10] = 99.  # a NaN beats the largest
    x[4, 80] = x[4, 20] = float("nan")       # the first NaN
    x[5] = float("-inf")                     # all -inf: index 0
    x[6, 99] = 1e9                           # the last element, in the partial chunk
    for dtype in (torch.float32, torch.bfloat16):
        xs = x.to(dtype)
        want = torch.argmax(xs, -1)
        assert torch.equal(F.argmax_rows(xs), want), (F.argmax_rows(xs), want)
        out = torch.empty(7, dtype=torch.long)
        assert F.argmax_rows(xs, out) is out and torch.equal(out, want)  # again: the counts were reset
        assert all(int(s[2].abs().sum()) == 0 for s in F._argmax_scratch.values())
