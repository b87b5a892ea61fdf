"""The C++ round's elementwise passes in C (engine/cpu_elem.c): the bits of the ATen ops they stand
for (RMSNorm after its mean of squares; the q/k heads' norm and rotation), on random rows of
every magnitude, and the C++ round with them equal to the Python round on head_dim 64."""
import ctypes

import pytest
import torch

import engine.cpu_attn as ca
from engine.config import EngineConfig, KernelConfig
from engine.model import RMSNorm, rotate
from engine.runner import build_runner


@pytest.fixture(scope="module")
def kernel():
    k = ca.kernel()
    if k is None:
        pytest.skip("no C compiler here: the ATen ops run")
    return k


def rows(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    scale = torch.logspace(-3, 3, shape[0], base=10.0).view(-1, *[1] * (len(shape) - 1))
    return (torch.randn(*shape, generator=g) * scale).to(dtype)


def c_call(fn, *args):
    conv = [ctypes.c_void_p(a.data_ptr()) if isinstance(a, torch.Tensor) else a for a in args]
    return fn(*conv)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [64, 512])
def test_norm_rows_is_rmsnorm(kernel, dtype, n):
    x, w = rows((9, n), dtype, n), rows((1, n), dtype, 1)[0] + 1
    norm = RMSNorm(n, 1e-6).to(dtype)
    norm.weight.data.copy_(w)
    f = x.float()
    ms = f.pow(2).mean(-1)
    out = torch.empty_like(x)
    fn = kernel.lib.tfe_norm_rows
    fn.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64, ctypes.c_int64, ctypes.c_float, ctypes.c_int32]
    assert c_call(fn, f, ms, w, out, 9, n, 1e-6, int(dtype == torch.bfloat16)) == 0
    with torch.no_grad():
        assert torch.equal(out, norm(x))
    assert c_call(fn, f, ms, w, out, 9, n - 8, 1e-6, 0) == -1  # a length it does not take


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("d", [64, 128])
def test_heads_are_norm_then_rotate(kernel, dtype, d):
    r, nh, eps = 8, 12, 1e-6
    qk, w = rows((r, nh, d), dtype, d), rows((nh, d), dtype, 2) + 1
    cos, sin = rows((r, d), dtype, 3).clamp(-1, 1), rows((r, d), dtype, 4).clamp(-1, 1)
    f = qk.float()
    ms = f.pow(2).mean(-1)
    want = rotate(w * (f * torch.rsqrt(ms[..., None] + eps)).to(dtype), cos, sin)  # PackedLinears.heads
    out = torch.empty_like(qk)
    fn = kernel.lib.tfe_heads
    fn.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int64] * 3 + [ctypes.c_float, ctypes.c_int32]
    assert c_call(fn, f, ms, w, cos, sin, out, r, nh, d, eps, int(dtype == torch.bfloat16)) == 0
    assert torch.equal(out, want)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cpp_round_with_them_is_the_python_round(kernel, dtype):
    from engine.cpu_round import build, load
    try:
        load(build())
    except RuntimeError as e:
        pytest.skip(f"the C++ round cannot be built here: {e}")
    r = build_runner(EngineConfig(model="cpu", dtype=dtype, parallel=4, max_model_len=160, prefill_rows=64, seed=5,
                                  kernels=KernelConfig(cpu_cpp=True)))
    assert r.cpu_round.ready and r.cpu_round.elem == (kernel.norm_address, kernel.heads_address)
    for lane in range(3):
        r.prefill(lane, [(i * 31 + lane * 7 + 1) % 500 for i in range(20 + 40 * lane)])
    rows_, where = r._padded([0, 1, 2], [5, 6, 7], [20, 60, 100])
    with torch.inference_mode():
        before = r.kv.k.clone(), r.kv.v.clone()
        logits, _ = r.cpu_round.rows(rows_, r.spare, r.kv)
        r.kv.k.copy_(before[0])
        r.kv.v.copy_(before[1])
        ref = r._decode_body(torch.tensor(rows_), rows=list(zip(rows_[2], rows_[1])))
    assert torch.equal(logits[where], ref[where])
