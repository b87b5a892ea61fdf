"""The cut attention at absolute tiles (engine/cuda/cut_flash.py) under Triton's interpreter: a
prompt's rows get the same bits however it is cut, close to plain causal attention, and one row's
result does not move with the rows beside it or the cut's end."""
import pytest

from tests.cuts import cut_in_turn, resumed

pytest.importorskip("triton", reason="the Triton kernels: triton is not installed (the engine extra brings it on Linux x86_64 and aarch64)")

H, KVH, D = 4, 2, 16


def _inputs(n, seed=0):
    import torch
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(n, x, D, generator=g) for x in (H, KVH, KVH))


def _reference(q, k, v):
    import torch.nn.functional as F
    th = lambda x: x.transpose(0, 1)[None]
    n = q.shape[0]
    return F.scaled_dot_product_attention(th(q), th(k[:n]), th(v[:n]), is_causal=True,
                                          enable_gqa=True)[0].transpose(0, 1).reshape(n, H * D)


def _config():
    from engine.cuda.cut_flash import CutFlashConfig
    return CutFlashConfig(block_m=16, block_n=8, split=32, warps=4, stages=1)  # 3 splits at 90 rows


def _cuts(q, k, v, bounds, c):
    import torch
    from engine.cuda.cut_flash import cut_attention
    return torch.cat([cut_attention(q[s:e], k, v, s, c) for s, e in zip(bounds, bounds[1:])])


@pytest.mark.interpreted
def test_two_splits_of_a_prompt_give_the_same_bits():
    import torch
    q, k, v = _inputs(90)
    c = _config()
    a = _cuts(q, k, v, [0, 16, 32, 48, 64, 80, 90], c)  # on the tile grid
    b = _cuts(q, k, v, [0, 5, 37, 38, 71, 90], c)  # off it, across tile and split boundaries
    assert torch.equal(a, b), (a - b).abs().max()
    assert torch.allclose(a, _reference(q, k, v), atol=1e-5, rtol=1e-5), (a - _reference(q, k, v)).abs().max()


@pytest.mark.interpreted
def test_cut_at_start_0_and_deep_in_the_context():
    import torch
    from engine.cuda.cut_flash import cut_attention
    q, k, v = _inputs(90, seed=1)
    c = _config()
    ref = _reference(q, k, v)
    first = cut_attention(q[:12], k, v, 0, c)  # one split, normalized in place
    deep = cut_attention(q[70:83], k, v, 70, c)  # three splits, merged; keys past 83 weigh zero
    assert torch.allclose(first, ref[:12], atol=1e-5, rtol=1e-5)
    assert torch.allclose(deep, ref[70:83], atol=1e-5, rtol=1e-5)
    # the same rows inside a longer cut, a shorter cache, or with other rows beside them
    assert torch.equal(deep, cut_attention(q[64:90], k, v, 64, c)[6:19])
    assert torch.equal(deep, cut_attention(q[70:83], k[:83].clone(), v[:83].clone(), 70, c))
    q2 = q.clone()
    q2[64:70] += 5
    q2[83:90] -= 5
    assert torch.equal(deep, cut_attention(q2[64:90], k, v, 64, c)[6:19])
    # and a row follows its own keys: changing a key it sees changes it
    k2 = k.clone()
    k2[75] += 1
    moved = cut_attention(q[70:83], k2, v, 70, c)
    assert torch.equal(moved[:5], deep[:5]) and not torch.equal(moved[5:], deep[5:])


@pytest.mark.interpreted
def test_strided_rows_as_the_trunk_hands_them():
    """q as a view of a fused qkv row (stride past H*d), k, v as views of a cache [L, lanes, ...]."""
    import torch
    from engine.cuda.cut_flash import cut_attention
    q, k, v = _inputs(40, seed=2)
    c = _config()
    qkv = torch.cat([q.reshape(40, -1), torch.zeros(40, 2 * KVH * D)], 1)
    cache = torch.zeros(2, 48, KVH, D)
    cache[1, :40] = k
    vcache = torch.zeros(2, 48, KVH, D)
    vcache[1, :40] = v
    qv = qkv[20:33, :H * D].view(13, H, D)
    assert qv.stride(0) == (H + 2 * KVH) * D
    got = cut_attention(qv, cache[1], vcache[1], 20, c)
    assert torch.equal(got, cut_attention(q[20:33].contiguous(), k, v, 20, c))


@pytest.mark.interpreted
def test_runner_with_cut_tiles_runs_every_cut_through_them(monkeypatch):
    """KernelConfig(cut_tiles=True): the fused trunk's cuts go through cut_flash (counted), stepped
    == whole == resumed from a cached prefix bit for bit, close to the plain trunk; off by default."""
    import torch
    from engine.config import EngineConfig, KernelConfig
    from engine.cuda import cut_flash
    from engine.runner.cuda_runner import CudaRunner
    from engine.runner.report import _prefill_attention_name
    assert CudaRunner(EngineConfig(model="tiny", parallel=2, max_model_len=48, prefill_rows=16)).kernels.cut_flash is None
    r = CudaRunner(EngineConfig(model="tiny", parallel=3, max_model_len=48, prefill_rows=16,
                                  kernels=KernelConfig(cut_tiles=True)))
    r.fused = True
    assert r.kernels.cut_flash == cut_flash.CutFlashConfig()
    calls = []
    real = cut_flash.cut_attention
    monkeypatch.setattr(cut_flash, "cut_attention", lambda *a, **k: calls.append(a[3]) or real(*a, **k))
    ids = torch.tensor([(i * 13 + 1) % 256 for i in range(40)])
    with torch.inference_mode():
        whole = cut_in_turn(r, ids, 0, [(0, 16), (16, 32), (32, 40)])
        layers = r.model_config.num_hidden_layers
        assert calls == [0] * layers + [16] * layers + [32] * layers
        plain = r.cut_logits(ids, 1, 0)
        assert (whole - plain).abs().max() < 1e-4
        assert torch.equal(resumed(r, ids), whole[16:])
    r.device = torch.device("cuda")  # what /v1/engine says (no GPU needed to describe it)
    assert _prefill_attention_name(r).startswith("tiles at absolute positions")


@pytest.mark.interpreted
def test_a_cut_given_on_the_device_keeps_the_bits_of_the_eager_call():
    """cut_attention_at (what a CUDA graph carries): the cut's start, rows and lane from a tensor,
    q padded past the cut's rows, the grid at a capacity; every row equals cut_attention's."""
    import torch
    from engine.cuda.cut_flash import cut_attention, cut_attention_at
    q, k, v = _inputs(90, seed=3)
    c = _config()
    kc, vc = torch.zeros(3, 96, KVH, D), torch.zeros(3, 96, KVH, D)
    kc[2, :90], vc[2, :90] = k, v
    kc[1, :90], vc[1, :90] = -k, v  # another lane's keys: must not be read
    for start, rows in [(0, 12), (70, 13), (37, 29), (64, 26)]:
        want = cut_attention(q[start:start + rows], k, v, start, c)
        padded = torch.cat([q[start:start + rows], torch.full((48 - rows, H, D), 7.0)])
        meta = torch.tensor([start, rows, 2], dtype=torch.int32)
        got = cut_attention_at(padded, kc, vc, meta, 96, c)
        assert torch.equal(got[:rows], want), (start, rows)


@pytest.mark.interpreted
def test_k_and_v_through_descriptors_give_the_bits_of_the_pointer_loads():
    """tma: K and V through tensor descriptors of the [lanes * L, KVH * d] cache: each lane's rows,
    keys past the cut read as they lie (another sequence's, here large) and still weighing zero."""
    import torch
    from dataclasses import replace
    from engine.cuda.cut_flash import cut_attention, cut_attention_at
    q, k, v = _inputs(90, seed=5)
    c = _config()
    t = replace(c, tma=True)
    kc, vc = torch.full((3, 96, KVH, D), 1e4), torch.full((3, 96, KVH, D), -1e4)
    kc[1, :90], vc[1, :90] = k, v
    for start, rows in [(0, 12), (70, 13), (37, 29), (64, 26)]:
        want = cut_attention(q[start:start + rows], k, v, start, c)
        assert torch.equal(cut_attention(q[start:start + rows], k, v, start, t), want), (start, rows)
        meta = torch.tensor([start, rows, 1], dtype=torch.int32)
        got = cut_attention_at(q[start:start + 48], kc, vc, meta, 96, t)
        assert torch.equal(got[:rows], want), (start, rows)
    with pytest.raises(ValueError, match="contiguous"):
        cut_attention_at(q[:16], kc.transpose(2, 3).contiguous().transpose(2, 3), vc, meta, 96, t)


def test_the_runner_loads_k_and_v_by_descriptors_from_hopper_on(monkeypatch):
    import torch
    from engine.cuda.cut_flash import CutFlashConfig, for_device
    for cap, tma in [((9, 0), True), ((10, 0), True), ((8, 9), False)]:
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, cap=cap: cap)
        assert for_device(torch.device("cuda", 0)) == CutFlashConfig(tma=tma), cap
    assert for_device(torch.device("cpu")) == CutFlashConfig()


@pytest.mark.interpreted
def test_a_query_tile_lower_than_a_key_block_stays_causal_and_cut_free():
    """block_m < block_n (twice the programs for a small cut): the block that holds the tile's first
    position is masked however the tile sits in it, so no row sees a key past its own position."""
    import torch
    from engine.cuda.cut_flash import CutFlashConfig
    q, k, v = _inputs(90, seed=4)
    c = CutFlashConfig(block_m=8, block_n=16, split=32, warps=4, stages=1)
    a = _cuts(q, k, v, [0, 8, 24, 40, 56, 72, 90], c)
    b = _cuts(q, k, v, [0, 5, 37, 38, 71, 90], c)
    assert torch.equal(a, b), (a - b).abs().max()
    assert torch.allclose(a, _reference(q, k, v), atol=1e-5, rtol=1e-5), (a - _reference(q, k, v)).abs().max()
    with pytest.raises(ValueError):
        CutFlashConfig(block_m=48, block_n=32)


@pytest.mark.interpreted
def test_plan_tiles_takes_the_fastest_config_with_the_same_bits(monkeypatch):
    import torch
    from dataclasses import replace
    from engine.cuda import cut_flash
    from engine.cuda.cut_flash import plan_tiles
    base = _config()
    same = replace(base, warps=8)  # the interpreter runs every warp count the same way: equal bits
    other = replace(base, block_n=16)  # another walk of the keys: other bits
    broken = replace(base, warps=16)  # a shape the device cannot run: no candidate, not a failed start
    real = cut_flash.cut_attention_at

    def at(q, k, v, meta, max_len, c):
        if c == broken:
            raise RuntimeError("out of resource: shared memory")
        return real(q, k, v, meta, max_len, c)
    monkeypatch.setattr(cut_flash, "cut_attention_at", at)
    costs = {base: 3.0, same: 2.0, other: 1.0, broken: 0.5}
    timed = []

    def time_ms(c, run):
        if c not in timed:  # the timed call runs (once: the interpreter is slow)
            run()
        timed.append(c)
        return costs[c]
    args = (16, 96, H, KVH, D, torch.device("cpu"), torch.float32)
    assert plan_tiles(base, [broken, other, same], *args, time_ms=time_ms) == same
    assert set(timed) == {base, same}
    costs[same] = 4.0
    assert plan_tiles(base, [same], *args, time_ms=time_ms) == base
    assert plan_tiles(base, [same], *args) == base  # nothing to time on the CPU
