"""A prompt cut's attention on the CUDA path (engine/cuda/prefill.py: the prefix and the
diagonal halves, merged by a Triton kernel), run by Triton's interpreter on the CPU: it equals
causal attention over the lane's rows, and a prompt's cuts give the same bits whether it is
filled whole, stepped or resumed from a prompt cache."""
import pytest

from tests.cuts import cut_in_turn, resumed

pytest.importorskip("triton", reason="the Triton kernels: triton is not installed (the engine extra brings it on Linux x86_64 and aarch64)")


@pytest.mark.interpreted
def test_cut_attention_matches_causal_attention():
    import torch, torch.nn.functional as F
    from engine.cuda.prefill import cut_attention
    g = torch.Generator().manual_seed(0)
    H, KVH, d, n = 4, 2, 16, 70
    q, k, v = torch.randn(n, H, d, generator=g), torch.randn(n, KVH, d, generator=g), torch.randn(n, KVH, d, generator=g)
    th = lambda x: x.transpose(0, 1)[None]
    ref = F.scaled_dot_product_attention(th(q), th(k), th(v), is_causal=True, enable_gqa=True)[0].transpose(0, 1).reshape(n, H * d)
    for grid in ([(0, 70)], [(0, 32), (32, 64), (64, 70)], [(0, 1), (1, 70)], [(0, 69), (69, 70)]):
        out = torch.cat([cut_attention(q[s:e].contiguous(), k[:e], v[:e], s) for s, e in grid])
        assert (out - ref).abs().max() < 1e-5, (grid, (out - ref).abs().max())
    # a misaligned diagonal (top-left on the whole range) would differ by far more than rounding
    wrong = F.scaled_dot_product_attention(th(q[32:]), th(k), th(v), is_causal=True, enable_gqa=True)
    assert (wrong[0].transpose(0, 1).reshape(-1, H * d) - ref[32:]).abs().max() > 1e-2


@pytest.mark.interpreted
def test_cuts_equal_across_schedules():
    """The fused trunk with the cut attention (float32, interpreter): stepped == whole ==
    resumed from a cached prefix, bit for bit (logits and KV rows), and close to the plain trunk."""
    import torch
    from engine.config import EngineConfig
    from engine.runner.cuda_runner import CudaRunner
    r = CudaRunner(EngineConfig(model="tiny", parallel=3, max_model_len=48, prefill_rows=16))
    r.fused = True
    toks = [(i * 13 + 1) % 256 for i in range(40)]
    ids = torch.tensor(toks)
    with torch.inference_mode():
        whole = cut_in_turn(r, ids, 0, [(0, 16), (16, 32), (32, 40)])
        plain = r.cut_logits(ids, 1, 0)
        assert (whole - plain).abs().max() < 1e-4
        # resumed: lane 2 gets lane 0's first 16 rows (a cached prefix), then runs the later cuts
        assert torch.equal(resumed(r, ids), whole[16:])
        assert torch.equal(r.kv.k[:, 2, :40], r.kv.k[:, 0, :40]) and torch.equal(r.kv.v[:, 2, :40], r.kv.v[:, 0, :40])
    # the runner's own schedules: whole (prefill) and stepped (prefill_step per cut) in other lanes
    first = r.prefill(1, toks)
    stepped = [r.prefill_step(2, toks, s, e) for s, e in [(0, 16), (16, 32), (32, 40)]]
    assert stepped[:2] == [None, None] and stepped[2] == first == int(whole[-1].argmax())
    assert torch.equal(r.kv.k[:, 1, :40], r.kv.k[:, 2, :40])


def test_kv_cache_size_and_clear_error(monkeypatch):
    """The CUDA runner refuses a KV cache that cannot fit beside the weights with an error that
    names the flags and the length that would fit (free memory faked: no GPU here)."""
    import torch
    from engine.config import ConfigError, EngineConfig
    from engine.runner.kv_cache import KVCache
    from engine.models.presets import PRESETS
    from engine.runner.cuda_runner import KV_HEADROOM, CudaRunner
    r = CudaRunner(EngineConfig(model="tiny", parallel=3, max_model_len=48, prefill_rows=16))
    assert KVCache.bytes_for(r.model_config, 3, 48, torch.float32) == r.kv.nbytes()
    # qwen3-8b, 64 lanes of 4,096 rows in bf16: 65 x 4096 x 147,456 bytes = 39.3 GB
    assert KVCache.bytes_for(PRESETS["qwen3-8b"], 64, 4096, torch.bfloat16) == 65 * 4096 * 147_456
    need = KVCache.bytes_for(r.model_config, 3, 48, torch.float32)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda dev=None: (need + KV_HEADROOM, 1 << 40))
    r._check_kv_fits(r.model_config)  # fits exactly
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda dev=None: (need // 2 + KV_HEADROOM, 1 << 40))
    with pytest.raises(ConfigError, match=r"--parallel 3 with --max-model-len 48.*--max-model-len 24 fits"):
        r._check_kv_fits(r.model_config)


def test_cut_backend_rule_and_cut_thread():
    """cuDNN only for power-of-two cuts of >= CUDNN_MIN_ROWS rows (a bounded set of shapes, built
    ahead); the CUDA runner's prompt cuts run in a thread of their own and give the same tokens
    as cuts run in the caller's thread (exercised here on the CPU)."""
    from concurrent.futures import ThreadPoolExecutor
    import engine.cuda.prefill as KP
    from engine.config import EngineConfig
    from engine.runner.cuda_runner import CudaRunner
    assert KP.backend_for(4096) == KP.CutBackend().name == "cudnn" and KP.backend_for(1024) == "cudnn"
    assert {KP.backend_for(n) for n in (1, 512, 1000, 3328, 4095, 6144)} == {"flash"}
    gone = KP.CutBackend("flash")  # a runner whose build refused cuDNN attention: flash for every cut
    assert gone.for_rows(4096) == "flash" and KP.backend_for(4096) == "cudnn"
    r = CudaRunner(EngineConfig(model="tiny", parallel=2, max_model_len=48, prefill_rows=16))
    toks = [(i * 11 + 2) % 256 for i in range(37)]
    here = r.generate(toks, 4, lane=0)
    r._cut_thread = ThreadPoolExecutor(1)
    assert r.generate(toks, 4, lane=1) == here
    assert r._warm_cuts() == 0  # nothing to build on the CPU
    r._cut_thread.shutdown()


@pytest.mark.interpreted
def test_float32_half_by_plain_math_equals_the_flash_half():
    """Flash and cuDNN take no float32, so a float32 CUDA runner's halves are plain matmuls
    (engine.cuda.prefill._half_math): the same output and log-sum-exp as the flash half."""
    import torch
    from engine.cuda.prefill import _expand, _half_math
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 4, 9, 16, generator=g)
    for causal, s in ((True, 9), (False, 23)):
        k, v = torch.randn(1, 2, s, 16, generator=g), torch.randn(1, 2, s, 16, generator=g)
        ke, ve = _expand(k, 4), _expand(v, 4)
        o_ref, l_ref = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, ke, ve, 0.0, causal)[:2]
        o, l = _half_math(q, ke, ve, causal)
        assert (o - o_ref).abs().max() < 1e-5 and (l - l_ref).abs().max() < 1e-5, causal
