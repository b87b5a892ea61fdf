"""The CPU fast path (engine/cpu/packed.py): prepacked matmuls and span-grouped decode attention
keep every exactness property of the reference path, in float32 and in bfloat16."""
import pytest
import torch
import torch.nn.functional as F

import engine.cpu.packed as ck
from engine.scheduler.backend import cuts
from engine.config import ConfigError, EngineConfig, KernelConfig, Toolchain
from engine.models.qwen3 import decode_attention_loop
from engine.runner.build import build_runner
from marks import bf16, needs_cpu_bf16  # noqa: F401

R = 16


@pytest.fixture(scope="module", params=["float32", "float32 mkl", bf16()])
def runner(request):
    # "float32 mkl": float32 weights through MKL (KernelConfig.cpu_wide=False), the path the wide
    # kernel replaced on AVX2 and what a float32 run on an AVX-512 CPU without bf16 may still take
    dtype, _, mkl = request.param.partition(" ")
    return build_runner(EngineConfig(model="tiny", dtype=dtype, parallel=6, max_model_len=320,
                                     prefill_rows=R, seed=3, kernels=KernelConfig(cpu_wide=False if mkl else None)))


def prompt(n, salt=0):
    return [(i * 29 + salt * 13 + 3) % 256 for i in range(n)]


def round_logits(r, lanes, tokens, positions):
    rows, where = r.padded_round(lanes, tokens, positions)
    with torch.inference_mode():
        logits = r._decode_body(torch.tensor(rows), rows=list(zip(rows[2], rows[1])))
    return logits, where


def test_fast_path_is_on_by_default(runner):
    from engine.cpu.decode_attention import BMM, C_KERNEL, kernel
    d = runner.describe()
    # the C kernel wherever it builds; TFENGINE_NO_CC=1 (or no compiler) must give the bmm path
    assert runner.cpu.packed is not None and d["decode_attention"] == (C_KERNEL if kernel(Toolchain()) is not None else BMM)
    if runner.dtype == torch.bfloat16:
        assert d["cpu_matmuls"] == "oneDNN, prepacked"
    elif runner.cpu.wide_weights and kernel(Toolchain()) is not None:
        assert d["cpu_matmuls"].startswith("bf16 weights widened to float32 in C (avx2+fma")
    else:
        assert d["cpu_matmuls"] == "MKL, prepacked"


def test_row_bits_do_not_depend_on_neighbours(runner):
    """The same row (lane 2, position 70) alone, among rows of other spans and lanes (so groups
    and lane ranges differ), and beside a drafter-style second entry of its own lane."""
    r = runner
    for lane in range(6):
        r.prefill(lane, prompt(40 + 30 * lane, lane))
    alone, w1 = round_logits(r, [2], [65], [70])
    crowd, w2 = round_logits(r, [0, 2, 3, 5], [3, 65, 99, 200], [10, 70, 71, 250])
    sparse, w3 = round_logits(r, [5, 2], [1, 65], [65, 70])
    drafted, w4 = round_logits(r, [2, 2, 4], [65, 66, 9], [70, 71, 150])
    row = alone[w1[0]]
    for logits, where in ((crowd, w2[1]), (sparse, w3[1]), (drafted, w4[0])):
        assert torch.equal(logits[where], row)


def test_bucket_attention_matches_one_sdpa_a_row(runner):
    r = runner
    for lane in range(6):
        r.prefill(lane, prompt(20 + 45 * lane, lane + 7))
    lanes, pos = [0, 1, 3, 4, 5], [19, 64, 63, 200, 244]
    rows, _ = r.padded_round(lanes, [1] * 5, pos)
    h, d = r.model_config.num_attention_heads, r.model_config.head_dim
    q = torch.randn(r.parallel, h, d, generator=torch.Generator().manual_seed(0)).to(r.dtype)
    lt, pt = torch.tensor(rows[2]), torch.tensor(rows[1])
    plan = ck.BucketPlan(list(zip(rows[2], rows[1])), r.spare, r.max_model_len, r.device)
    fast = ck.decode_attention_buckets(r.kv, 1, q, plan).float()
    ref = decode_attention_loop(r.kv, 1, q.float(), lt, pt, spare=r.spare) if r.dtype == torch.float32 else \
        _ref_f32(r, q, lt, pt)
    tol = 1e-5 if r.dtype == torch.float32 else 1e-2
    torch.testing.assert_close(fast, ref, rtol=tol, atol=tol)
    assert torch.count_nonzero(fast[2]) == 0  # lane 2 did not decode: its row is padding


def _ref_f32(r, q, lanes, positions):
    """float32 attention on the bf16 cache, one row at a time."""
    h, d = q.shape[1], q.shape[2]
    out = torch.zeros(q.shape[0], h * d)
    for row, (lane, pos) in enumerate(zip(lanes.tolist(), positions.tolist())):
        if lane == r.spare:
            continue
        k = r.kv.k[1, lane, :pos + 1].float().transpose(0, 1)[None]
        v = r.kv.v[1, lane, :pos + 1].float().transpose(0, 1)[None]
        out[row] = F.scaled_dot_product_attention(q[row].float()[None, :, None], k, v, enable_gqa=True).reshape(-1)
    return out


def test_stepped_whole_alone_together(runner):
    r = runner
    toks = prompt(3 * R + 5, 4)
    stepped = [r.prefill_step(1, toks, s, e) for s, e in cuts(0, len(toks), R)]
    assert stepped[-1] == r.prefill(0, toks)
    prompts = [prompt(9, 5), toks, prompt(70, 6)]
    together = r.generate_together(prompts, [4, 0, 2], 10)
    assert together == [r.generate(p, 10, lane=5) for p in prompts]


def test_fast_path_agrees_with_reference_ops():
    """Same weights, fast path against plain torch ops: the same function (float32, tight)."""
    fast = build_runner(EngineConfig(model="tiny", parallel=4, max_model_len=128, prefill_rows=R, seed=5))
    ref = build_runner(EngineConfig(model="tiny", parallel=4, max_model_len=128, prefill_rows=R, seed=5,
                                    kernels=KernelConfig(cpu_fast=False)))
    assert ref.cpu.packed is None and fast.cpu.packed is not None
    toks = prompt(2 * R + 3, 8)
    with torch.inference_mode():
        a = fast._forward_cut(torch.tensor(toks[:R]), 0, 0)
        b = ref.cut_logits(torch.tensor(toks[:R]), 0, 0)[-1]
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    fast.prefill(1, toks), ref.prefill(1, toks)
    la, _ = round_logits(fast, [1], [7], [len(toks)])
    lb, _ = round_logits(ref, [1], [7], [len(toks)])
    torch.testing.assert_close(la[1], lb[1], rtol=1e-4, atol=1e-5)


def test_packed_linear_matches_f_linear():
    w = torch.randn(96, 64) * 0.1
    x = torch.randn(8, 64)

    class M:  # the attributes PackedLinears reads
        pass
    m = M()
    m.model = M()
    m.model.layers = []
    m.lm_head = torch.nn.Linear(64, 96, bias=False)
    m.lm_head.weight.data = w
    for dtype, tol in ((torch.float32, 1e-5), *([(torch.bfloat16, 2e-2)] if ck.packs_bf16() else [])):
        m.lm_head.weight.data = w.to(dtype)
        p = ck.PackedLinears(m)
        torch.testing.assert_close(p.mm(x.to(dtype), "lm_head").float(), F.linear(x, w), rtol=tol, atol=tol)
        torch.testing.assert_close(p.mm(x[:3].to(dtype), "lm_head").float(), F.linear(x[:3], w), rtol=tol, atol=tol)


def test_cpu_dtype_choice(monkeypatch):
    monkeypatch.setattr(ck, "cpu_bf16_native", lambda: False)
    assert ck.cpu_dtype()[0] == "float32"
    monkeypatch.setattr(ck, "cpu_bf16_native", lambda: True)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    assert ck.cpu_dtype() == ("bfloat16", "bfloat16: the CPU has avx512_bf16")
    assert ck.cpu_threads() >= 1


def test_cli_cpu_defaults(monkeypatch):
    from engine.cli import device_defaults
    before = torch.get_num_threads()
    try:
        monkeypatch.setattr(ck, "cpu_bf16_native", lambda: False)
        dtype, parallel, said = device_defaults("cpu", None, None, 1)
        assert (dtype, parallel) == ("float32", 8) and "neither AMX nor avx512_bf16" in said
        assert torch.get_num_threads() == 1
        assert device_defaults("cpu", "bfloat16", 3, None)[:2] == ("bfloat16", 3)
        assert device_defaults("cuda", None, None, None) == ("bfloat16", 4, "")
        with pytest.raises(ConfigError, match="--threads"):
            device_defaults("cpu", None, None, 0)
        with pytest.raises(ConfigError, match="--threads"):
            device_defaults("cuda", None, None, 2)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("dtype", [bf16(), "float32"])
def test_replies_do_not_depend_on_the_lane_count(dtype):
    """A decode round multiplies fixed tiles of rows (ROW_TILE), so the plain reference's one
    lane gives the same ids as a server of 8 or 11 lanes. On the cpu preset in bf16 a round of
    the lane count's rows parted from one lane's at token 28 of 64."""
    p = [(i * 29 + 3) % 256 for i in range(300)]
    outs = [build_runner(EngineConfig(model="cpu", dtype=dtype, parallel=par, max_model_len=400,
                                      prefill_rows=256)).generate(p, 64) for par in (1, 8, 11)]
    assert outs[0] == outs[1] == outs[2]
