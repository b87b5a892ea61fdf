"""The CUDA mixed forward (CudaRunner._mixed_fused) under Triton's interpreter, on the tiny preset:
a prompt's cuts off the grid, each beside a decode round, leave the KV rows and the first token a
whole prefill gives (cut_flash's tiles, the cuts' row-invariant product), and the round's rows the
ids a plain round gives. And the flags: mixed on cuda only with --cut-attention tiles."""
import pytest
import torch

from engine.config import ConfigError, EngineConfig, KernelConfig

A = [(i * 37 + 11) % 500 for i in range(9)]
B = [(i * 29 + 3) % 500 for i in range(40)]  # grid cuts of 16: [0, 16), [16, 32), [32, 40)


def _cuda_path(r):
    """A CPU runner switched onto the CUDA forwards (as test_prefill_many does), cut_flash at tiles
    small enough that B's rows cross tiles, blocks and splits. The prompt cuts' product one row at a
    time: under the interpreter the tiles' dots are numpy's, whose row bits move with the row's place
    in a tile (on the GPU they do not; cuBLAS's checked counts stand in there)."""
    import torch.nn.functional as F
    from engine.cuda.cut_flash import CutFlashConfig
    r.fused = r.skinny = r.batch_cuts = True
    r.kernels.cut_flash = CutFlashConfig(block_m=16, block_n=8, split=32, warps=4, stages=1)
    r.kernels.matmul = lambda x, w: torch.stack([F.linear(row, w) for row in x])
    return r


@pytest.mark.interpreted
def test_cuts_off_the_grid_beside_rounds_keep_every_rows_bits():
    from engine.runner.cuda_runner import CudaRunner
    r = _cuda_path(CudaRunner(EngineConfig(model="tiny", parallel=4, max_model_len=64, prefill_rows=16,
                                             seed=3, kernels=KernelConfig(cpu_fast=False, cut_tiles=True))))
    first_a = r.prefill(2, A)
    first_b = r.prefill(1, B)  # the reference: whole, on the grid
    ref_k, ref_v = r.kv.k[:, 1, :len(B)].clone(), r.kv.v[:, 1, :len(B)].clone()
    ids = r.decode([2], [first_a], [len(A)])  # a plain round of A
    r.kv.k[:, 1].zero_(); r.kv.v[:, 1].zero_()
    got = []
    for s, e in ((0, 11), (11, 30), (30, 32), (32, 40)):  # off the grid, then its last grid cut
        (tok,), new = r.mixed([(1, B, s, e)], [2], [first_a], [len(A)])  # the same row each time
        assert new == ids, (s, e)
        got.append(tok)
    assert got == [None, None, None, first_b]
    assert torch.equal(r.kv.k[:, 1, :len(B)], ref_k) and torch.equal(r.kv.v[:, 1, :len(B)], ref_v)
    with pytest.raises(ValueError):
        r.mixed([(2, B, 0, 16)], [2], [first_a], [len(A)])  # a lane both decoding and filling


@pytest.mark.interpreted
def test_the_graphs_body_at_fixed_sizes_keeps_every_rows_bits(monkeypatch):
    """What a mixed graph replays (engine/runner/mixed_graph.py), run eagerly: the cut padded to its
    size (its padding in the spare lane), its start, rows and lane read from the device, the
    products planned per shape, the cut attention in the tiles planned per capacity from a base of
    other fields (K and V through descriptors, where the whole prefill loads them by pointer). The
    same KV rows and first token as a whole prefill, the same ids as a plain round; a cut past the
    largest size runs the eager mixed forward."""
    from dataclasses import replace
    from engine.cuda import cut_flash
    from engine.runner import mixed_graph
    from engine.runner.cuda_runner import CudaRunner
    planned, used = [], []
    # the plan's answer at 8 rows: a config of the same bits (the interpreter runs any warp count alike)
    monkeypatch.setattr(cut_flash, "plan_tiles", lambda base, cands, n, *a, **k: planned.append((n, cands))
                        or (cands[0] if n == 8 else base))
    real_at = cut_flash.cut_attention_at
    monkeypatch.setattr(cut_flash, "cut_attention_at", lambda q, k, v, meta, ml, c: used.append((q.shape[0], c.warps, c.tma))
                        or real_at(q, k, v, meta, ml, c))
    r = _cuda_path(CudaRunner(EngineConfig(model="tiny", parallel=4, max_model_len=64, prefill_rows=16,
                                             seed=3, kernels=KernelConfig(cpu_fast=False, cut_tiles=True))))
    first_a = r.prefill(2, A)
    first_b = r.prefill(1, B)
    ref_k, ref_v = r.kv.k[:, 1, :len(B)].clone(), r.kv.v[:, 1, :len(B)].clone()
    ids = r.decode([2], [first_a], [len(A)])
    r.kv.k[:, 1].zero_(); r.kv.v[:, 1].zero_()
    g = r.mixed_graphs = mixed_graph.MixedGraphs(r, tiles=({"warps": 2},), base_fields={"tma": True})
    g.sizes = (8, 16)
    g.shapes = {(n, p): g.shape(n, p) for n in g.sizes for p in r.buckets}
    base = replace(r.kernels.cut_flash, tma=True)
    assert planned == [(8, [replace(base, warps=2)]), (16, [replace(base, warps=2)])]  # once a capacity
    assert (f"the cut attention in {base.block_m}-row tiles (2 warps, K and V by TMA) at 8, "
            f"{base.block_m}-row tiles ({base.warps} warps, K and V by TMA) at 16 ") in g.describe()
    replays = []
    real = g.run
    g.run = lambda s, *a: replays.append(s.rows) or real(s, *a)
    got = []
    for s, e in ((0, 11), (11, 30), (30, 32), (32, 40)):  # 11 rows in 16, 19 eagerly, 2 and 8 in 8
        (tok,), new = r.mixed([(1, B, s, e)], [2], [first_a], [len(A)])
        assert new == ids, (s, e)
        got.append(tok)
    assert replays == [16, 8, 8]
    assert {u for u in used if u[0] in (8, 16)} == {(16, base.warps, True), (8, 2, True)}
    assert got == [None, None, None, first_b]
    assert torch.equal(r.kv.k[:, 1, :len(B)], ref_k) and torch.equal(r.kv.v[:, 1, :len(B)], ref_v)
    assert mixed_graph.sizes_for(1024, 40960) == mixed_graph.SIZES
    assert mixed_graph.sizes_for(600, 40960) == (128, 256, 384, 512, 600)
    # the sizes and the host's granule in whole tiles of the cut attention
    from engine.cuda.cut_flash import CutFlashConfig
    from engine.runner.cuda_runner import MIXED_GRANULE
    assert MIXED_GRANULE == CutFlashConfig().block_m and all(s % MIXED_GRANULE == 0 for s in mixed_graph.SIZES)


@pytest.mark.interpreted
@pytest.mark.parametrize("hold_down,chunks", [(True, ()), (False, ()), (True, (2,))])
def test_padded_launches_keep_every_rows_bits(monkeypatch, hold_down, chunks):
    """Where one launch over both kinds of rows needs padding (here a library that sums K another way
    between 9 and 23 rows, as cuBLAS splits K at some counts), the graph's body pads each product's
    input to the checked count, except down's with hold_down: silu * up is written into the head of
    down's padded buffer; or, with chunks and a batched product that keeps the bits at every count, it
    runs each weight in chunks, unpadded. The cut's KV rows and first token stay a whole prefill's, the
    round's ids a plain round's, every way."""
    import torch.nn.functional as F
    from engine.runner import mixed_graph
    from engine.runner.cuda_runner import CudaRunner
    real, padded = F.linear, []

    def library(x, w, b=None):  # row by row (row-invariant), another last bit at 9-23 rows
        if x.dim() != 2:
            return real(x, w, b)
        y = torch.stack([real(row, w, b) for row in x]) if x.shape[0] else real(x, w, b)
        return torch.nextafter(y, torch.full_like(y, float("inf"))) if 8 < x.shape[0] < 24 else y
    monkeypatch.setattr(F, "linear", library)
    # the batched product row by row through the unmoved kernel: the same bits at every count
    monkeypatch.setattr(torch, "bmm", lambda a, b: torch.stack([torch.stack([real(row, b[i].T) for row in a[i]])
                                                                 for i in range(a.shape[0])]))
    real_pad = mixed_graph.pad
    monkeypatch.setattr(mixed_graph, "pad", lambda x, m: padded.append((x.shape[1], m)) or real_pad(x, m)
                        if m != x.shape[0] else x)
    r = _cuda_path(CudaRunner(EngineConfig(model="tiny", parallel=4, max_model_len=64, prefill_rows=16,
                                             seed=3, kernels=KernelConfig(cpu_fast=False, cut_tiles=True))))
    r.skinny = False  # the round's products through the library too, at its own (unmoved) 4 rows
    first_a = r.prefill(2, A)
    first_b = r.prefill(1, B)
    ref_k, ref_v = r.kv.k[:, 1, :len(B)].clone(), r.kv.v[:, 1, :len(B)].clone()
    ids = r.decode([2], [first_a], [len(A)])
    r.kv.k[:, 1].zero_(); r.kv.v[:, 1].zero_()
    g = r.mixed_graphs = mixed_graph.MixedGraphs(r, hold_down=hold_down, chunks=chunks)
    g.sizes = (8, 16)
    g.shapes = {(n, p): g.shape(n, p) for n in g.sizes for p in r.buckets}
    if chunks:
        assert all(v == mixed_graph.Product(True, s.rows + s.round_rows, 2) for s in g.shapes.values()
                   for v in s.plan.values()), [s.plan for s in g.shapes.values()]
        assert "in chunks of N 2 at" in g.describe()
    else:
        assert all(v == mixed_graph.Product(True, 24) for s in g.shapes.values() for v in s.plan.values())
    padded.clear()
    got = []
    for s, e in ((0, 8), (8, 24), (24, 32), (32, 40)):
        (tok,), new = r.mixed([(1, B, s, e)], [2], [first_a], [len(A)])
        assert new == ids, (s, e)
        got.append(tok)
    assert got == [None, None, None, first_b]
    assert torch.equal(r.kv.k[:, 1, :len(B)], ref_k) and torch.equal(r.kv.v[:, 1, :len(B)], ref_v)
    down_k = r.model.model.layers[0].mlp.down_proj.weight.shape[1]
    if chunks:
        assert not padded, padded
    else:
        assert padded and (down_k in {k for k, _ in padded}) == (not hold_down), padded


def test_mixed_on_cuda_wants_the_tiles():
    from engine.cli import check_config, cut_attention_knob, mixed_refused
    base = dict(model="tiny", device="cuda", dtype="bfloat16", prefill_mode="mixed")
    with pytest.raises(ConfigError, match="--cut-attention tiles"):
        check_config(EngineConfig(**base))  # refused before the device is looked for
    assert mixed_refused(EngineConfig(**base, kernels=KernelConfig(cut_tiles=True))) is None
    assert "one rank" in mixed_refused(EngineConfig(**base, tensor_parallel=2, kernels=KernelConfig(cut_tiles=True)))
    assert mixed_refused(EngineConfig(model="tiny", prefill_mode="mixed")) is None  # the CPU's own
    assert cut_attention_knob("cuda", "tiles") and not cut_attention_knob("cuda", "cudnn")
    for device, name in (("cuda", "flash"), ("cpu", "tiles")):
        with pytest.raises(ConfigError):
            cut_attention_knob(device, name)


def test_the_plan_pads_one_launch_to_a_count_that_keeps_both_kinds_bits(monkeypatch):
    """plan_products, against a library that sums K another way below 24 rows (as cuBLAS splits K at
    few rows): one launch over a cut's 4 rows and a round's 2 must be padded to 24 rows, where both
    kinds keep the bits of their own kernels (one chain of K each); where the round's kernel sums in
    another order of its own, no launch over both can give it them, and the kinds run apart."""
    import torch.nn.functional as F
    from types import SimpleNamespace
    from engine.runner import mixed_graph as MG

    real = F.linear

    def chain(x, w):
        return real(x, w)

    def library(x, w):  # another sum order at few rows: the last bit moves
        y = real(x, w)
        return y if x.shape[0] >= 24 else torch.nextafter(y, torch.full_like(y, float("inf")))
    monkeypatch.setattr(F, "linear", library)
    # integer-valued rows and weights: every chain of K is exact, so only the library's order moves a bit
    w = torch.randint(-3, 4, (8, 64)).float()
    monkeypatch.setattr(torch, "randn", lambda *s, generator=None, device=None: torch.randint(-3, 4, s, generator=generator).float())
    launch = SimpleNamespace(linear=chain, gate_up_silu=lambda x, w: chain(x, w), silu_mul=lambda y: y)
    plan = MG.plan_products({"down": [w]}, 4, 2, chain, launch, skinny=True, chunks=())
    assert plan[(8, 64)] == MG.Product(True, 24)
    x = torch.randint(-3, 4, (6, 64)).float()
    mm, _ = MG.products(plan, 4, chain, launch, skinny=True)
    got = mm(x, w)
    assert got.shape == (6, 8) and torch.equal(got, chain(x, w))
    # the weight in chunks: bmm sums each column's K in one chain at any count, so 6 rows keep the bits
    split = MG.plan_products({"down": [w]}, 4, 2, chain, launch, skinny=True)
    assert split[(8, 64)] == MG.Product(True, 6, 2)
    mm, _ = MG.products(split, 4, chain, launch, skinny=True)
    assert torch.equal(mm(x, w), chain(x, w))
    odd = SimpleNamespace(linear=lambda x, w: torch.nextafter(chain(x, w), torch.full((1,), -float("inf"))),
                          gate_up_silu=None, silu_mul=lambda y: y)
    apart = MG.plan_products({"down": [w]}, 4, 2, chain, odd, skinny=True)
    assert apart[(8, 64)] == MG.Product(False, 24)  # the cut's rows alone padded to 24
    mm, _ = MG.products(apart, 4, chain, odd, skinny=True)
    got = mm(x, w)
    assert torch.equal(got[:4], chain(x[:4], w)) and torch.equal(got[4:], odd.linear(x[4:], w))
