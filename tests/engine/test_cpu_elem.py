"""The C++ round's elementwise passes in C (engine/cpu/elem.c): the bits of the ATen ops they stand
for (RMSNorm with its mean of squares and the residual add before it; the q/k heads' norm and
rotation; the greedy argmax), on random rows of every magnitude, and the C++ round with them
equal to the Python round on head_dim 64."""
import ctypes

import pytest
import torch

import engine.cpu.decode_attention as ca
from engine.config import EngineConfig, KernelConfig
from engine.models.qwen3 import RMSNorm, rotate
from engine.runner.build import build_runner
from marks import bf16, needs_cpu_bf16  # noqa: F401


@pytest.fixture(scope="module")
def kernel(c_kernel):
    return c_kernel


def rows(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    scale = torch.logspace(-3, 3, shape[0], base=10.0).view(-1, *[1] * (len(shape) - 1))
    return (torch.randn(*shape, generator=g) * scale).to(dtype)


def c_call(fn, *args):
    conv = [ctypes.c_void_p(a.data_ptr()) if isinstance(a, torch.Tensor) else a for a in args]
    return fn(*conv)


def test_mean_of_squares_width_is_atens(kernel):
    """The C mean of squares (ATen's summation order) at the width the check picks equals ATen's
    `x.pow(2).mean(-1)` on other rows than the check's, and the other width does not (the test
    can tell orders apart)."""
    vw = kernel.sum_width((64, 512))
    if vw == 0:
        pytest.skip("ATen sums in another order here: the C++ round takes ATen's means")
    for n in (64, 128, 512, 1536):
        f = rows((32, n), torch.float32, 100 + n)
        got, other = torch.empty(32), torch.empty(32)
        assert kernel._mean_sq(f.data_ptr(), 32, n, vw, got.data_ptr()) == 0
        assert torch.equal(got, f.pow(2).mean(-1))
        kernel._mean_sq(f.data_ptr(), 32, n, 24 - vw, other.data_ptr())
        assert n == 64 or not torch.equal(other, got)


NORM_ARGS = [ctypes.c_void_p] * 6 + [ctypes.c_int64, ctypes.c_int64, ctypes.c_float, ctypes.c_int32, ctypes.c_int32]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [64, 512])
def test_norm_rows_is_the_residual_add_then_rmsnorm(kernel, dtype, n):
    x, y, w = rows((9, n), dtype, n), rows((9, n), dtype, n + 1).flip(0), rows((1, n), dtype, 1)[0] + 1
    norm = RMSNorm(n, 1e-6).to(dtype)
    norm.weight.data.copy_(w)
    ms = x.float().pow(2).mean(-1)
    out, total = torch.empty_like(x), torch.empty_like(x)
    fn = kernel.lib.tfe_norm_rows
    fn.argtypes = NORM_ARGS
    bf16, vw = int(dtype == torch.bfloat16), kernel.sum_width((n,))
    with torch.no_grad():
        assert c_call(fn, x, None, None, ms, w, out, 9, n, 1e-6, bf16, 0) == 0  # ATen's means
        assert torch.equal(out, norm(x))
        if vw:
            out.zero_()
            assert c_call(fn, x, None, None, None, w, out, 9, n, 1e-6, bf16, vw) == 0  # its own
            assert torch.equal(out, norm(x))
            assert c_call(fn, x, y, total, None, w, out, 9, n, 1e-6, bf16, vw) == 0  # x + y first
            assert torch.equal(total, x + y) and torch.equal(out, norm(x + y))
    assert c_call(fn, x, None, None, ms, w, out, 9, n - 8, 1e-6, 0, 0) == -1  # a length it does not take


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("d", [64, 128])
def test_heads_are_norm_then_rotate(kernel, dtype, d):
    r, nh, eps = 8, 12, 1e-6
    qkv, w = rows((r, nh * d + 3 * d), dtype, d), rows((nh, d), dtype, 2) + 1  # q/k heads, then v
    cos, sin = rows((r, d), dtype, 3).clamp(-1, 1), rows((r, d), dtype, 4).clamp(-1, 1)
    f = qkv[:, :nh * d].reshape(r, nh, d).float()
    ms = f.pow(2).mean(-1)
    want = rotate(w * (f * torch.rsqrt(ms[..., None] + eps)).to(dtype), cos, sin)  # PackedLinears.heads
    fn = kernel.lib.tfe_heads
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int64] + [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 3 + [
        ctypes.c_float, ctypes.c_int32, ctypes.c_int32]
    bf16 = int(dtype == torch.bfloat16)
    for m, vw in ((ms, 0), (None, kernel.sum_width((d,)))):
        if m is None and vw == 0:
            continue
        out = torch.empty(r, nh, d, dtype=dtype)
        assert c_call(fn, qkv, qkv.stride(0), m, w, cos, sin, out, r, nh, d, eps, bf16, vw) == 0
        assert torch.equal(out, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_is_atens_argmax(kernel, dtype):
    """ATen's index: ties go to the first, a NaN wins (the first NaN), -inf rows give 0, a tail
    past the last whole vector counts; padding rows (lane == spare) give 0."""
    x = rows((8, 1000), torch.float32, 9).to(dtype)
    x[1, 100] = x[1, 700] = 5e4  # a tie
    x[2, 7] = x[2, 3] = float("nan")
    x[3] = float("-inf")
    x[4, 999] = 6e4  # in the tail (1000 = 62 vectors of 16 + 8)
    x[5, 0] = 6e4
    lanes = torch.tensor([0, 1, 2, 3, 4, 5, 9, 9])
    out = torch.full((8,), -1, dtype=torch.long)
    fn = kernel.lib.tfe_greedy
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32,
                   ctypes.c_void_p]
    assert c_call(fn, x, 8, 1000, lanes, 9, int(dtype == torch.bfloat16), out) == 0
    want = x[:6].float().argmax(-1).tolist()
    assert out[:6].tolist() == want and want[1:] == [100, 3, 0, 999, 0] and out[6:].tolist() == [0, 0]


@pytest.mark.parametrize("dtype", ["float32", bf16()])
def test_cpp_round_with_them_is_the_python_round(kernel, dtype):
    from engine.config import Toolchain
    from engine.cpu.round import build, load
    try:
        load(build(Toolchain()))
    except RuntimeError as e:
        pytest.skip(f"the C++ round cannot be built here: {e}")
    r = build_runner(EngineConfig(model="cpu", dtype=dtype, parallel=4, max_model_len=160, prefill_rows=64, seed=5,
                                  kernels=KernelConfig(cpu_cpp=True)))
    assert r.cpu.round.ready and r.cpu.round.elem[:2] == (kernel.norm_address, kernel.heads_address)
    assert r.cpu.round.elem[3] == kernel.greedy_address
    for lane in range(3):
        r.prefill(lane, [(i * 31 + lane * 7 + 1) % 500 for i in range(20 + 40 * lane)])
    rows_, where = r.padded_round([0, 1, 2], [5, 6, 7], [20, 60, 100])
    with torch.inference_mode():
        before = r.kv.k.clone(), r.kv.v.clone()
        logits, ids = r.cpu.round.rows(rows_, r.spare, r.kv)
        r.kv.k.copy_(before[0])
        r.kv.v.copy_(before[1])
        ref = r._decode_body(torch.tensor(rows_), rows=list(zip(rows_[2], rows_[1])))
    assert torch.equal(logits[where], ref[where]) and ids[where].tolist() == ref[where].argmax(-1).tolist()
