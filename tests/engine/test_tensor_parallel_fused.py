"""The fused tensor-parallel sum + add + RMSNorm (engine/parallel/fused.py) under Triton's interpreter.

The kernel's barrier needs two GPUs (the device check tools/tp_check.py --sums fused); here
it is off (a separate jit helper, skipped by a constexpr) and the peer's buffer is a second local
tensor: the arithmetic, the two-buffer alternation, the routing and the model's use of it."""
import pytest

pytest.importorskip("triton", reason="the Triton kernels: triton is not installed (the engine extra brings it on Linux x86_64 and aarch64)")


@pytest.mark.interpreted
def test_fused_kernel_is_the_sum_then_add_rmsnorm_bitwise():
    import torch
    from engine.cuda.fused import add_rmsnorm
    from engine.parallel.fused import sum_add_rmsnorm
    g = torch.Generator().manual_seed(5)
    for dtype in (torch.float32, torch.bfloat16):
        rows, n = 6, 96  # n not a power of two: the masked tail
        x = (torch.randn(rows, n, generator=g) * 4).to(dtype)
        # partials of mixed magnitudes, so the order of the additions and the rounding of the sum show
        p0, p1 = ((torch.randn(rows, n, generator=g) * 10 ** torch.randint(-3, 3, (rows, n), generator=g)).to(dtype)
                  for _ in range(2))
        w = torch.randn(n, generator=g).to(dtype)
        # today's path: the all-reduce's p0 + p1 rounded once to the dtype, then add_rmsnorm. (The
        # interpreter rounds float32 -> bf16 its own way; add_rmsnorm's own x + r output, run by it,
        # is the sum rounded as the interpreter rounds, as it is on the device.)
        s = p0 + p1 if dtype == torch.float32 else add_rmsnorm(p0, p1, w, 1e-6)[0]
        want = add_rmsnorm(x, s, w, 1e-6)
        for own, peer in ((p0, p1), (p1, p0)):  # rank 0's view and rank 1's: the same bits
            got = sum_add_rmsnorm(x, own, peer, w, 1e-6)
            assert all(torch.equal(a, b) for a, b in zip(got, want)), (dtype, "not the sum then add_rmsnorm")
        # the checks can fail: the partials added one at a time into x, or the sum not rounded first
        one_by_one = add_rmsnorm(add_rmsnorm(x, p0, w, 1e-6)[0], p1, w, 1e-6)
        assert not torch.equal(one_by_one[0], want[0]), dtype
        if dtype == torch.bfloat16:
            unrounded = add_rmsnorm(x, p0.float() + p1.float(), w, 1e-6)
            assert not torch.equal(unrounded[0], want[0])


@pytest.mark.interpreted
def test_two_ranks_alternate_buffers_and_refuse_what_they_cannot_take():
    import torch, torch.nn.functional as F
    import engine.cuda.skinny as S
    from engine.cuda.fused import add_rmsnorm
    from engine.parallel.fused import FusedSums
    from engine.cuda.kernels import CudaKernels
    # the skinny kernel for any shape (its out= path too), through a runner's launch as the round calls it
    launch = CudaKernels("cpu", S.SkinnyTables(smem=S.H200_SMEM, default=S.SkinnyConfig(16, 32, 4, 1))).at()
    g = torch.Generator().manual_seed(7)
    rows, n, k = 3, 64, 32
    bufs = [[torch.zeros(rows * n * 2) for _ in range(2)] for _ in range(2)]  # [rank][buffer]
    ranks = [FusedSums(bufs[r], bufs[1 - r], r, max_rows=4) for r in range(2)]
    x, nw = torch.randn(rows, n, generator=g), torch.randn(n, generator=g)
    seen = []
    for step, mm in enumerate((F.linear, launch.linear, F.linear)):
        a = [torch.randn(rows, k, generator=g) for _ in range(2)]
        w = [torch.randn(n, k, generator=g) for _ in range(2)]
        assert all(f.write(mm, a[r], w[r]) for r, f in enumerate(ranks))  # each rank's product, then
        got = [f.add_norm(x, nw, 1e-6) for f in ranks]  # each rank's kernel (the barrier between, on a GPU)
        part = [mm(a[r], w[r]) for r in range(2)]  # what the product writes alone
        want = add_rmsnorm(x, part[0] + part[1], nw, 1e-6)
        for r in range(2):
            assert all(torch.equal(p, q) for p, q in zip(got[r], want)), (step, r)
            # the partial sat in buffer step % 2; the other still holds the sum before it
            assert torch.equal(bufs[r][step % 2][:rows * n].view(rows, n), part[r])
            if seen:
                assert torch.equal(bufs[r][(step - 1) % 2][:rows * n].view(rows, n), seen[-1][r])
        seen.append(part)
    f = ranks[0]
    big, wk = torch.randn(5, k), torch.randn(n, k)
    assert not f.write(F.linear, big, wk), "more rows than the flags"
    assert not FusedSums([torch.zeros(8)] * 2, [torch.zeros(8)] * 2, 0).write(F.linear, a[0], w[0]), "over the buffer"
    assert not f.write(lambda h, m: F.linear(h, m), a[0], w[0]), "an mm it cannot point at the buffer"
    assert not f.write(F.linear, a[0].double(), w[0].double()), "another dtype"
    assert f.k == 3 and torch.equal(bufs[0][1][:rows * n].view(rows, n), seen[-2][0]), "a refused product wrote"


@pytest.mark.interpreted
def test_the_fused_trunk_routes_both_sums_of_every_layer_through_it():
    import torch
    from engine.config import EngineConfig
    from engine.parallel.group import TensorParallel
    from engine.runner.cuda_runner import CudaRunner
    from engine.parallel.fused import FusedSums
    r = CudaRunner(EngineConfig(model="tiny", parallel=2, max_model_len=32, prefill_rows=16))
    m, toks = r.model, torch.tensor([(i * 13 + 1) % 256 for i in range(12)])
    with torch.inference_mode():
        plain = r.cut_logits(toks, 0, 0, fused=True)
        # rank 0 of two whose peer's partial sums are all zero: x + (p + 0) is x + p exactly
        own, peer = [torch.full((4096,), 7.0) for _ in range(2)], [torch.zeros(4096) for _ in range(2)]
        f = FusedSums(own, peer, 0)
        m.tp_fused = TensorParallel(0, 2, vocab=512, fused=f)
        fused = r.cut_logits(toks, 1, 0, fused=True)
    assert torch.equal(fused, plain), (fused - plain).abs().max()
    assert f.k == 2 * len(m.model.layers), f.k  # both sums of every layer went through it
    assert not torch.equal(own[0][:12 * 64], torch.full((12 * 64,), 7.0)) and not torch.equal(own[1][:12 * 64], torch.full((12 * 64,), 7.0))
