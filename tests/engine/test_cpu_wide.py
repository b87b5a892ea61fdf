"""The decode round's products over bf16-stored weights (engine/cpu/wide.c) on CPUs without bf16
arithmetic: a row's bits are its own (alone, among others, at any row count, place or column
split), the same whatever the ISA the library was compiled for, and the engine picks the kernel
by the CPU it finds and says so in /v1/engine."""
import ctypes
import shutil
import subprocess
from types import SimpleNamespace

import pytest
import torch

from engine.config import EngineConfig, KernelConfig, Toolchain
from engine.cpu.decode_attention import SOURCE, kernel
from engine.cpu.wide import WideKernel, wide_fits, wide_wanted
from engine.runner.build import build_runner
from engine.scheduler.backend import cuts

WIDE = WideKernel(kernel(Toolchain()).lib) if kernel(Toolchain()) is not None else None
needs_wide = pytest.mark.skipif(WIDE is None, reason="no C compiler: the wide kernel is not built here")
needs_avx2 = pytest.mark.skipif(torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"),
                                reason="this CPU has no AVX2")
# the cpu preset's shapes (q/k/v, o, gate/up, down, lm_head) and an odd column count
SHAPES = [(1024, 512), (512, 512), (3072, 512), (512, 1536), (37, 64)]


def weights(n, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    return WideKernel.pack(torch.randn(n, k, generator=g) * 0.05), torch.randn(16, k, generator=g)


@needs_wide
@pytest.mark.parametrize("n,k", SHAPES)
def test_a_row_alone_and_among_others_at_every_count_and_place(n, k):
    w, x = weights(n, k)
    alone = [WIDE(x[r:r + 1], w)[0] for r in range(16)]
    for m in (2, 3, 4, 5, 7, 8, 9, 16):  # every block path: 4 rows, pairs, a single row left
        for first in sorted({0, min(3, 16 - m), 16 - m}):
            out = WIDE(x[first:first + m], w)
            for i in range(m):
                assert torch.equal(out[i], alone[first + i]), (m, first, i)
    # the listed rows of a padded round: the others zero, the listed ones their bits alone
    live = torch.tensor([0, 3, 6])
    out = WIDE(x[:8], w, live)
    assert all(torch.equal(out[r], alone[r]) for r in live.tolist())
    assert not out[[1, 2, 4, 5, 7]].any()


@needs_wide
def test_a_column_split_does_not_change_a_bit():
    """The C++ round splits columns over its threads: any split gives the same bits."""
    n, k = 3072, 512
    w, x = weights(n, k, 1)
    whole = WIDE(x[:5], w)
    y = torch.empty(5, n)
    rows = torch.arange(5)
    for j0, j1 in ((0, 7), (7, 1030), (1030, 1031), (1031, n)):
        assert WIDE.fn(x.data_ptr(), k, rows.data_ptr(), 5, w.data_ptr(), n, k, y.data_ptr(), n, j0, j1) == 0
    assert torch.equal(y, whole)


@needs_wide
def test_float32_sums_of_the_bf16_weights():
    w, x = weights(512, 1536, 2)
    ref = x.double() @ w.double().t()
    assert (WIDE(x, w).double() - ref).abs().max().item() < 1e-4
    assert WIDE.fn(x.data_ptr(), 1536, torch.arange(1).data_ptr(), 1, w.data_ptr(), 512, 1530,
                   torch.empty(1, 512).data_ptr(), 512, 0, 512) == -1  # a width not a multiple of 16


def other_build(tmp_path, flags):
    cc = shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    so = tmp_path / "wide.so"
    r = subprocess.run([cc, "-O2", "-ffp-contract=off", "-shared", "-fPIC", *flags, "-o", str(so),
                        str(SOURCE.with_name("wide.c"))], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return WideKernel(ctypes.CDLL(str(so)))


@needs_wide
def test_the_scalar_build_gives_the_avx2_builds_bits(tmp_path):
    """Built for no vector ISA at all (fmaf a lane), the kernel's bits equal this library's: a
    row's order is written in the source, not picked by the vector width."""
    scalar = other_build(tmp_path, [])
    assert scalar.isa == "scalar fmaf"
    for n, k in SHAPES:
        w, x = weights(n, k, 3)
        assert torch.equal(scalar(x[:5], w), WIDE(x[:5], w)), (n, k)


@needs_wide
def test_the_avx512_build_compiles_and_names_itself(tmp_path):
    """An AVX-512 machine's build (what -march=native gives there) compiles here; it runs only
    where the CPU has AVX-512."""
    lib = tmp_path / "wide512.o"
    r = subprocess.run(["cc", "-O2", "-ffp-contract=off", "-mavx512f", "-mavx2", "-mfma", "-c", "-o", str(lib),
                        str(SOURCE.with_name("wide.c"))], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    if torch.backends.cpu.get_cpu_capability() != "AVX512":
        pytest.skip("this CPU has no AVX-512: the AVX-512 build compiles but cannot run here")
    k = other_build(tmp_path, ["-mavx512f", "-mavx2", "-mfma"])
    assert k.isa.startswith("avx2+fma (on an avx512")
    w, x = weights(512, 512, 4)
    assert torch.equal(k(x[:5], w), WIDE(x[:5], w))


@pytest.mark.parametrize("native,cap,fits", [(False, "AVX2", True), (False, "AVX512", True), (True, "AVX512", False),
                                             (False, "DEFAULT", False), (True, "AVX2", False)])
def test_the_choice_follows_the_cpu(native, cap, fits):
    """bf16-native CPUs (AMX, avx512_bf16) keep oneDNN's bf16 products; AVX2 or AVX-512 without
    bf16 take the wide kernel; below AVX2, float32 weights through MKL."""
    assert wide_fits(native, cap) is fits


def test_the_knob_and_the_dtype_decide_before_the_cpu():
    assert not wide_wanted("cpu", "float32", False)
    assert not wide_wanted("cpu", "bfloat16", None) and not wide_wanted("cuda", "float32", True)
    assert wide_wanted("cpu", "float32", True)


@pytest.fixture(scope="module")
def tiny():
    """float32 with the wide kernel asked for: the AVX2 class's path, on any CPU with AVX2 (an
    AVX-512 machine's default is bf16 through oneDNN)."""
    return build_runner(EngineConfig(model="tiny", dtype="float32", parallel=6, max_model_len=320, prefill_rows=16,
                                     seed=3, kernels=KernelConfig(cpu_cpp=True, cpu_wide=True)))


@needs_wide
@needs_avx2
def test_engine_reports_the_wide_kernel_and_its_isa(tiny):
    d = tiny.describe()
    assert d["dtype"] == "float32" and d["cpu_weights"] == "bfloat16 values, float32 compute"
    assert d["cpu_matmuls"] == f"bf16 weights widened to float32 in C ({WIDE.isa}); prompt cuts MKL"
    assert "avx2+fma" in d["cpu_matmuls"]
    layer = tiny.model.model.layers[0]
    assert torch.equal(layer.mlp.w_gate_up, layer.mlp.w_gate_up.bfloat16().float())  # the values bf16 holds


@needs_wide
@needs_avx2
def test_stepped_equals_whole_and_alone_equals_beside_others(tiny):
    """End to end on the tiny preset through the C++ round and the wide kernel."""
    r = tiny
    assert r.cpu.round.ready
    toks = [(i * 29 + 3) % 256 for i in range(3 * 16 + 5)]
    stepped = [r.prefill_step(1, toks, s, e) for s, e in cuts(0, len(toks), 16)]
    assert stepped[-1] == r.prefill(0, toks)
    prompts = [[(i * 7 + 1) % 200 for i in range(9)], toks, [(i * 5 + 2) % 200 for i in range(70)]]
    together = r.generate_together(prompts, [4, 0, 2], 24)
    assert together == [r.generate(p, 24, lane=5) for p in prompts]


@needs_wide
def test_a_width_the_kernel_cannot_take_keeps_mkl():
    """A matrix whose width is not whole 16-lane chunks (a tensor-parallel shard can be) sends the
    round's products to MKL, over the same values, rather than failing at the first round."""
    from engine.cpu.packed import PackedLinears

    # the attributes PackedLinears reads
    m = SimpleNamespace(model=SimpleNamespace(layers=[]), lm_head=torch.nn.Linear(40, 96, bias=False))
    assert PackedLinears(m, WIDE).wide is None
    m.lm_head = torch.nn.Linear(48, 96, bias=False)
    assert PackedLinears(m, WIDE).wide is WIDE
