"""The decode round's small kernels folded into their neighbours (engine/cuda/decode_attention.py), run by Triton's interpreter on the CPU: each folded form gives the same bits as the
kernels it replaces, so a fold never moves a token. The interpreter computes in numpy, so a change
of the folded form's arithmetic order (a split merged out of order, a rounding moved) shows here."""
from types import SimpleNamespace

import pytest

pytest.importorskip("triton", reason="the Triton kernels: triton is not installed (the engine extra brings it on Linux x86_64 and aarch64)")
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from engine.cuda.qkfold import warp_sumsq  # noqa: E402


def small_splits(monkeypatch):
    """engine.cuda.decode_attention with splits of 32 rows in blocks of 16 (several splits a lane at tiny lengths)."""
    import engine.cuda.decode_attention as K
    monkeypatch.setattr(K, "SPLIT", 32)
    monkeypatch.setattr(K, "BLOCK", 16)
    return K


def cache(seed: int, layers: int):
    """A random float32 KV cache `kv` (5 lanes of 96 rows, 2 KV heads of 16), q of 3 query heads a KV
    head (GROUP 3, padded to 16) for 5 rows, and the rows' lanes: (kv, q, lanes)."""
    import torch
    g = torch.Generator().manual_seed(seed)
    lanes_n, max_len, kvh, d = 4, 96, 2, 16
    kv = SimpleNamespace(k=torch.randn(layers, lanes_n + 1, max_len, kvh, d, generator=g),
                         v=torch.randn(layers, lanes_n + 1, max_len, kvh, d, generator=g))
    q = torch.randn(5, 6, d, generator=g)
    return kv, q, torch.tensor([0, 1, 2, 3, 4])


@pytest.mark.interpreted
def test_combine_folded_into_split_attention_is_bitwise_the_two_kernels(monkeypatch):
    """The last split program of a (row, KV head) to arrive merges the splits in order 0, 1, 2..:
    bitwise the separate combine kernel, for rows of 1, 2 and 3 splits (it reads every partial back
    from memory, so which split arrives last does not matter; the interpreter runs them in grid
    order); repeated launches give the same bits and leave every arrival counter at 0 (graph replays)."""
    import torch
    from engine.models.qwen3 import decode_attention_loop
    K = small_splits(monkeypatch)
    kv, q, lanes = cache(5, layers=2)
    pos = torch.tensor([0, 31, 32, 70, 95])  # 1, 1, 2, 3 and 3 splits of 32
    two = K.decode_attention(kv, 1, q, lanes, pos, fold=False)
    one = K.decode_attention(kv, 1, q, lanes, pos, fold=True)
    assert torch.equal(one, two), (one - two).abs().max()
    assert torch.equal(K.decode_attention(kv, 1, q, lanes, pos, fold=True), one)
    assert all(int(s[2].abs().sum()) == 0 for s in K._scratch.values())
    # against the reference too (not bitwise): every head of every row written
    ref = decode_attention_loop(kv, 1, q, lanes, pos)
    assert (one - ref).abs().max() < 1e-5
    # bf16, as on the device
    qb, kv.k, kv.v = q.bfloat16(), kv.k.bfloat16(), kv.v.bfloat16()
    assert torch.equal(K.decode_attention(kv, 0, qb, lanes, pos, fold=True),
                       K.decode_attention(kv, 0, qb, lanes, pos, fold=False))


@triton.jit
def _warp_sumsq_rows(X, Y):
    r, c = tl.arange(0, 16), tl.arange(0, 64)
    tl.store(Y + r, warp_sumsq(tl.load(X + r[:, None] * 64 + c[None, :]), 16))


@pytest.mark.interpreted
def test_qk_fold_sums_squares_in_the_one_warp_order():
    """kernels_qkfold.warp_sumsq adds a head's squares as the one-warp standalone kernel does on the
    device (lane l holds 2l, 2l+1: fma(x0, x0, x1 * x1), then the butterfly l + l^16, ^8, ^4, ^2, ^1):
    bitwise a torch model of that order, and not of another (lanes holding l and l + 32)."""
    import torch

    def model(x, strided):
        a, b = (x[:, :32], x[:, 32:]) if strided else (x[:, 0::2], x[:, 1::2])
        t = (a.double() * a.double() + (b * b).double()).float()  # one rounding: a*a is exact in float64
        for w in (16, 8, 4, 2, 1):
            t = t[:, :w] + t[:, w:2 * w]
        return t[:, 0]

    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(4)) * torch.logspace(-3, 3, 16)[:, None]
    y = torch.empty(16)
    _warp_sumsq_rows[(1,)](x, y)
    assert torch.equal(y, model(x, False))
    assert not torch.equal(y, model(x, True))  # the order shows in the bits


def qk_inputs(lanes_n: int, max_len: int, p: int, seed: int, cache_seed: int):
    """The q/k fold's inputs: `cache()` a fresh random KV cache of `lanes_n` lanes (+ the spare), the
    same at every call; a q/k/v product `qkv` of `p` rows (6 q heads, 2 KV heads of 128), the q/k norm
    weights, RoPE tables, and the generator `g` that drew them, to draw more."""
    import torch
    g = torch.Generator().manual_seed(seed)
    kvh, d, h = 2, 128, 6

    def cache():
        c = torch.Generator().manual_seed(cache_seed)
        k, v = (torch.randn(1, lanes_n + 1, max_len, kvh, d, generator=c) for _ in range(2))
        return SimpleNamespace(k=k, v=v)

    qkv = torch.randn(p, (h + 2 * kvh) * d, generator=g) * 3
    wq, wk = torch.randn(d, generator=g), torch.randn(d, generator=g)
    cos, sin = torch.randn(max_len, d, generator=g), torch.randn(max_len, d, generator=g)
    return SimpleNamespace(g=g, lanes_n=lanes_n, max_len=max_len, kvh=kvh, d=d, h=h, p=p, cache=cache,
                           qkv=qkv, wq=wq, wk=wk, cos=cos, sin=sin)


@pytest.mark.interpreted
def test_qk_fold_in_split_attention_matches_the_standalone_kernel(monkeypatch):
    """The q/k norm + RoPE + cache write done by the split kernel (decode_attention's qk): the same
    attention output and K rows as qk_norm_rope_write then decode_attention up to the sum's order
    (the interpreter sums the standalone kernel's squares in numpy's order; on the device the two
    are bitwise equal, tools/PERF.md runs 19-20), V rows bitwise, no other cache row touched."""
    import torch
    from engine.cuda.fused import qk_norm_rope_write
    K = small_splits(monkeypatch)
    i = qk_inputs(lanes_n=3, max_len=96, p=4, seed=3, cache_seed=1)
    lanes, pos = torch.tensor([0, 1, 2, 3]), torch.tensor([5, 40, 95, 0])  # 1, 2 and 3 splits of 32
    a, b = i.cache(), i.cache()
    written = qk_norm_rope_write(i.qkv, i.wq, i.wk, i.cos, i.sin, a.k[0], a.v[0], lanes, pos, i.h, i.kvh, i.d, 1e-6)
    ref = K.decode_attention(a, 0, written, lanes, pos)
    out = K.decode_attention(b, 0, i.qkv, lanes, pos, qk=(i.wq, i.wk, i.cos, i.sin, i.h, 1e-6))
    assert (out - ref).abs().max() < 1e-5 and torch.equal(a.v, b.v)
    assert (a.k - b.k).abs().max() < 1e-5
    untouched = torch.ones(i.lanes_n + 1, i.max_len, dtype=torch.bool)
    untouched[lanes, pos] = False
    assert torch.equal(a.k[0][untouched], b.k[0][untouched])
    assert K.qk_fold_takes(32, 8, 128) and K.qk_fold_takes(64, 8, 128)
    assert not K.qk_fold_takes(32, 8, 64) and not K.qk_fold_takes(32, 2, 128)  # 16 q heads a KV head: no spare row


@pytest.mark.interpreted
def test_decode_round_with_the_qk_fold(monkeypatch):
    """The model's fused decode round with the q/k fold on (LaunchMode.fold_qk_norm, head_dim
    128): the same logits as with it off up to the interpreter's sum order, and the same K/V
    cache rows written (layer 0's V bitwise: it depends on the embedding and the q/k/v product only;
    layer 1's input carries layer 0's attention, whose sum order the fold may change)."""
    import torch
    import engine.cuda.fused as F
    from engine.config import ModelConfig
    from engine.cuda.forward import FusedOps
    from engine.cuda.kernels import CudaKernels
    from engine.cuda.launch import LaunchMode
    from engine.models.qwen3 import ForwardPlan, Qwen3ForCausalLM
    from engine.runner.kv_cache import KVCache
    small_splits(monkeypatch)
    cfg = ModelConfig(vocab_size=64, hidden_size=128, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=128)
    torch.manual_seed(0)
    m = Qwen3ForCausalLM(cfg)
    for p in m.parameters():
        torch.nn.init.normal_(p, std=0.2)
    m.fuse(); m.setup_rope(80)
    calls, orig = [], F.qk_norm_rope_write
    monkeypatch.setattr(F, "qk_norm_rope_write", lambda *a, **k: calls.append(1) or orig(*a, **k))
    out = {}
    for fold in (False, True):
        kv = KVCache(cfg, 3, 80, torch.float32, "cpu")
        torch.manual_seed(1)
        kv.k.normal_(); kv.v.normal_()
        launch = CudaKernels("cpu").at(LaunchMode(fold_qk_norm=fold))
        plan = ForwardPlan.round(torch.tensor([3, 7, 9]), torch.tensor([4, 40, 0]), torch.tensor([0, 1, 3]))
        ops = FusedOps(m, kv, plan, launch, fold=launch.mode.fold_qk_norm and launch.qk_fold_takes(4, 2, 128))
        logits = torch.nn.functional.linear(m(plan, ops), m.lm_head.weight)
        out[fold] = (logits, kv.k.clone(), kv.v.clone())
        assert len(calls) == 2, (fold, calls)  # the standalone kernel ran for the two layers of the unfolded round only
    (l0, k0, v0), (l1, k1, v1) = out[False], out[True]
    assert (l0 - l1).abs().max() < 1e-4 and torch.equal(v0[0], v1[0]) and (v0 - v1).abs().max() < 1e-5
    assert (k0 - k1).abs().max() < 1e-5


def test_folds_are_on_in_the_decode_graph_only():
    """The folds are the decode graph's (KernelConfig on by default; the runner's capture turns them
    on at one rank), while eager calls run the plain kernels: the mode the graph passes down."""
    from types import SimpleNamespace as NS
    from engine.config import EngineConfig, KernelConfig
    from engine.cuda.launch import PLAIN
    from engine.runner.decode_graph import DecodeGraphs
    assert KernelConfig().fold_combine and KernelConfig().fold_qk_norm
    assert not PLAIN.fold_combine and not PLAIN.fold_qk_norm
    g = DecodeGraphs(NS(round_rows=8, cfg=EngineConfig(device="cuda"), skinny=True))
    g.fold_combine, g.qk_fold = True, True  # what capture() sets from folds()
    assert g.mode_at(8).fold_combine and g.mode_at(8).fold_qk_norm
    g.qk_fold = False
    assert g.mode_at(8).fold_combine and not g.mode_at(8).fold_qk_norm


def test_runner_folds_and_draft_rounds():
    """The runner's graph takes the folds at one rank; the q/k fold only without a drafter and on a
    shape it takes, and a round with several rows of one lane (draft rows read the rows before them,
    written in the same round) runs eagerly, unfolded, when the graph has it."""
    from dataclasses import replace
    from types import SimpleNamespace as NS
    from engine.runner import decode_graph
    from engine.config import EngineConfig, KernelConfig
    from engine.runner.cuda_runner import CudaRunner
    attn = NS(n_heads=32, n_kv=8, head_dim=128)
    model = NS(model=NS(layers=[NS(self_attn=attn)]))
    cfg = EngineConfig(device="cuda")
    r = NS(cfg=cfg, fused=True, model=model)
    assert decode_graph.folds(r) == (True, True)
    assert decode_graph.folds(NS(cfg=replace(cfg, drafter="ngram"), fused=True, model=model)) == (True, False)
    assert decode_graph.folds(NS(cfg=replace(cfg, drafter="ngram", drafts=False), fused=True, model=model)) == (True, True)
    assert decode_graph.folds(NS(cfg=replace(cfg, tensor_parallel=2), fused=True, model=model)) == (False, False)
    assert decode_graph.folds(NS(cfg=cfg, fused=False, model=model)) == (False, False)
    off = replace(cfg, kernels=KernelConfig(fold_combine=False, fold_qk_norm=False))
    assert decode_graph.folds(NS(cfg=off, fused=True, model=model)) == (False, False)
    attn.head_dim = 64  # not a shape the q/k fold takes
    assert decode_graph.folds(r) == (True, False)
    g = NS(graph=object(), graphs=NS(qk_fold=True))
    assert CudaRunner._graph_takes(g, [0, 1, 2]) and not CudaRunner._graph_takes(g, [0, 1, 1])
    g.graphs.qk_fold = False
    assert CudaRunner._graph_takes(g, [0, 1, 1])
    assert not CudaRunner._graph_takes(NS(graph=None, graphs=NS(qk_fold=False)), [0])


@pytest.mark.interpreted
def test_split_programs_walking_several_items_give_the_same_bits(monkeypatch):
    """The split kernel's grid is capped (engine.cuda.decode_attention.GRID_PER_SM): a program walks the items
    pid, pid + G, ... (split slowest). Fewer programs than items, an odd count among them, give
    bitwise the one-item-a-program outputs, folded combine or not, q/k fold or not, and every
    arrival counter back at 0."""
    import torch
    K = small_splits(monkeypatch)
    i = qk_inputs(lanes_n=4, max_len=128, p=5, seed=7, cache_seed=2)
    q = torch.randn(i.p, i.h, i.d, generator=i.g)
    lanes, pos = torch.tensor([0, 1, 2, 3, 4]), torch.tensor([5, 40, 127, 0, 64])  # 1, 2, 4, 1, 3 splits
    kv = i.cache()
    items = i.p * i.kvh * (i.max_len // K.SPLIT)
    for fold in (False, True):
        ref = K.decode_attention(kv, 0, q, lanes, pos, fold=fold, programs=items)
        for n in (1, 3, 7, items // 2):
            assert torch.equal(K.decode_attention(kv, 0, q, lanes, pos, fold=fold, programs=n), ref), (fold, n)
    a, b = i.cache(), i.cache()
    qk = (i.wq, i.wk, i.cos, i.sin, i.h, 1e-6)
    ref = K.decode_attention(a, 0, i.qkv, lanes, pos, qk=qk, programs=items)
    out = K.decode_attention(b, 0, i.qkv, lanes, pos, qk=qk, programs=3)
    assert torch.equal(out, ref) and torch.equal(a.k, b.k) and torch.equal(a.v, b.v)
    assert all(int(s[2].abs().sum()) == 0 for s in K._scratch.values())
