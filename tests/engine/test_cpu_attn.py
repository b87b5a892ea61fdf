"""The C decode attention (engine/cpu/decode_attention.c, engine/cpu/decode_attention.py): close to float64 attention,
a row's bits its own (alone, beside other lanes, in any row, among other spans), and the
batched-matmul path when no kernel can be had."""
import math

import pytest
import torch

import engine.cpu.decode_attention as ca
from engine.config import EngineConfig, KernelConfig, Toolchain
from engine.runner.build import build_runner
from marks import bf16, needs_cpu_bf16  # noqa: F401

SPARE = 8


@pytest.fixture(scope="module")
def kernel(c_kernel):
    return c_kernel


def caches(dtype, seed=0, lanes=9, length=517):
    g = torch.Generator().manual_seed(seed)
    k = (torch.randn(lanes, length, 4, 64, generator=g) * 2).to(dtype)
    v = torch.randn(lanes, length, 4, 64, generator=g).to(dtype)
    q = torch.randn(8, 12, 64, generator=g).to(dtype)[:, :8]  # strided, as the round's q is
    return k, v, q


def reference(kc, vc, q, lanes, pos):
    """float64 attention of each row over its lane's keys [0, pos], GQA by KV head."""
    rows, h, d = q.shape
    rep = h // kc.shape[2]
    out = torch.zeros(rows, h * d, dtype=torch.float64)
    for r in range(rows):
        if lanes[r] == SPARE:
            continue
        k, v = kc[lanes[r], :pos[r] + 1].double(), vc[lanes[r], :pos[r] + 1].double()
        for j in range(h):
            p = (k[:, j // rep] @ q[r, j].double() / math.sqrt(d)).softmax(0)
            out[r, j * d:(j + 1) * d] = p @ v[:, j // rep]
    return out


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 1.5e-2)])
def test_close_to_float64_attention(kernel, dtype, tol):
    kc, vc, q = caches(dtype)
    lanes = torch.tensor([0, 3, SPARE, 5, 1, SPARE, 2, 7])
    pos = torch.tensor([0, 70, 0, 319, 63, 5, 64, 516])  # one key, span edges, the cache's last
    out = kernel(kc, vc, q, lanes, pos, SPARE)
    assert out.dtype == dtype and out.shape == (8, 512)
    torch.testing.assert_close(out.double(), reference(kc, vc, q, lanes.tolist(), pos.tolist()), rtol=tol, atol=tol)
    assert torch.count_nonzero(out[2]) == 0 and torch.count_nonzero(out[5]) == 0  # padding rows


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_rows_bits_are_its_own(kernel, dtype):
    """Lane 3 at position 200: alone, beside lanes of other spans, in another row of the round,
    and beside its own lane at a later position (a drafter's row) — the same bits each time."""
    kc, vc, q = caches(dtype, seed=1)
    one = q[0:1]

    def row(lanes, pos, at):
        qs = torch.randn(len(lanes), 8, 64).to(dtype)
        qs[at] = one[0]
        return kernel(kc, vc, qs, torch.tensor(lanes), torch.tensor(pos), SPARE)[at]

    alone = row([3], [200], 0)
    assert torch.equal(row([0, 3, 5, 7], [10, 200, 450, 63], 1), alone)
    assert torch.equal(row([SPARE, 1, 2, 3], [0, 300, 64, 200], 3), alone)
    assert torch.equal(row([3, 3, 4], [200, 201, 17], 0), alone)
    assert not torch.equal(row([3], [201], 0), alone)  # (the test can tell rows apart)


@needs_cpu_bf16
def test_runner_says_c_kernel_and_both_rounds_call_it(kernel):
    r = build_runner(EngineConfig(model="tiny", dtype="bfloat16", parallel=2, max_model_len=128, prefill_rows=16))
    assert r.cpu.attention.address == kernel.address and r.describe()["decode_attention"] == "c kernel"
    if r.cpu.round is not None:
        assert r.cpu.round.attn == kernel.address


def test_no_cc_env_chooses_bmm():
    """TFENGINE_NO_CC=1, read once by the CLI (Toolchain.from_env), turns the C kernels off."""
    tc = Toolchain.from_env({"TFENGINE_NO_CC": "1"})
    assert not tc.c_kernels and Toolchain.from_env({"TFENGINE_NO_CC": "0"}).c_kernels
    assert ca.kernel(tc) is None


def test_no_compiler_is_a_clear_reason(tmp_path):
    tc = Toolchain.from_env({"TFENGINE_CACHE": str(tmp_path), "CC": "no-such-compiler-here"})
    with pytest.raises(RuntimeError, match="no C compiler"):
        ca.build(tc)
    assert ca.kernel(tc) is None  # and the runner takes the bmm path


@pytest.mark.parametrize("dtype", ["float32", bf16()])
def test_fallback_to_bmm_keeps_decoding(monkeypatch, dtype):
    """Without the kernel the runner attends through the batched matmuls and says so; the
    replies are those of a runner with the kernel up to the rounding (same tokens here)."""
    r = build_runner(EngineConfig(model="tiny", dtype=dtype, parallel=2, max_model_len=128, prefill_rows=16,
                                  kernels=KernelConfig(toolchain=Toolchain(c_kernels=False))))
    assert r.cpu.attention is None and r.describe()["decode_attention"].startswith("bmm")
    assert r.cpu.round is None or r.cpu.round.attn == 0
    assert len(r.generate([5, 6, 7, 8], 6)) == 6


@pytest.mark.skipif("avx512f" not in __import__("engine.cpu.isa", fromlist=["cpu_flags"]).cpu_flags(),
                    reason="this CPU has no AVX-512: only its own build can run here")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_avx2_build_gives_the_avx512_builds_bits(kernel, tmp_path, dtype):
    """Without AVX-512 the kernel runs its loops in halves of 8 floats (registers, not the stack);
    every sum keeps its order, so an AVX2 machine's tokens are an AVX-512 machine's."""
    import shutil
    import subprocess
    cc = shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    so = tmp_path / "avx2.so"
    flags = [f for f in ca.FLAGS if f != "-mno-avx512f"]
    r = subprocess.run([cc, *flags, "-mno-avx512f", "-o", str(so), *map(str, ca.SOURCES)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    avx2, native = ca.AttentionKernel(so), kernel
    g = torch.Generator().manual_seed(3)
    for heads, kv_heads, d in ((8, 4, 64), (8, 8, 16), (16, 4, 32), (8, 1, 128), (32, 4, 128)):
        kc = torch.randn(3, 300, kv_heads, d, generator=g).to(dtype)
        vc = torch.randn(3, 300, kv_heads, d, generator=g).to(dtype)
        q = torch.randn(4, heads, d, generator=g).to(dtype)
        lanes, pos = torch.tensor([0, 1, 2, 1]), torch.tensor([0, 17, 299, 160])
        assert torch.equal(avx2(kc, vc, q, lanes, pos, 9), native(kc, vc, q, lanes, pos, 9)), (heads, kv_heads, d)
