import os
import pathlib
import signal
import subprocess
import sys

import pytest

# A test run started in the background (`nohup`, or `cmd &` in a shell without job control) hands
# every child SIGHUP or SIGINT ignored, and an ignored signal stays ignored across exec: the tests
# that stop tfbench or a server with a signal would wait in vain (a SIGHUP'd parent never dies, a
# SIGINT'd tfbench finishes every run and exits 0). The children get the default dispositions.
if signal.getsignal(signal.SIGHUP) == signal.SIG_IGN:
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


ROOT = pathlib.Path(__file__).resolve().parents[1]
# Triton's interpreter computes tl.dot with numpy, whose OpenBLAS picks its sgemm kernel by CPU.
# The FMA kernels (Haswell and later: every AVX2 machine) round a row by where it falls in the
# block, which a GPU's tensor-core tile does not, so the row-invariance checks would test OpenBLAS,
# not the kernel. Sandy Bridge's kernel (AVX, no FMA) keeps each row's sums in one order.
# Whatever the machine set: some set OPENBLAS_CORETYPE=Haswell (an explicit core type skips
# OpenBLAS's detection, which misreads some virtual CPUs), and with it these checks failed on an
# AVX-512 EPYC; an explicit Sandybridge skips the detection just as well.
INTERPRET_ENV = {"TRITON_INTERPRET": "1", "OPENBLAS_CORETYPE": "Sandybridge"}


def pytest_configure(config):
    config.addinivalue_line("markers", "interpreted: runs under Triton's interpreter (TRITON_INTERPRET=1), "
                                       "in a pytest process of its own unless the session already is one")


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """A test marked `interpreted` runs in a child pytest with TRITON_INTERPRET=1, unless this session
    already has it (then here). Why a child: triton reads the variable once, at import, and then
    decorates every @triton.jit kernel as an interpreted function, which triton.compile cannot compile
    (no cache_key); the tests that compile the kernels' sm_90 PTX on the CPU (test_launch_modes.py,
    test_kernels_ring.py) need the compiled path in the same session, so one process cannot serve
    both. The test itself is an ordinary function: `TRITON_INTERPRET=1 pytest -m interpreted` runs
    them all in one process (each patches what it changes with monkeypatch)."""
    if pyfuncitem.get_closest_marker("interpreted") is None or os.environ.get("TRITON_INTERPRET") == "1":
        return None
    pytest.importorskip("triton", reason="the Triton kernels: triton is not installed (the engine extra brings it on Linux x86_64 and aarch64)")
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", pyfuncitem.nodeid],
                         capture_output=True, text=True, timeout=600, cwd=str(ROOT),
                         env={**os.environ, **INTERPRET_ENV})
    assert res.returncode == 0, (res.stdout[-4000:] + res.stderr[-2000:])
    return True


@pytest.fixture(scope="module")
def c_kernel():
    """The CPU round's C library (engine/cpu/decode_attention.py: the decode attention, engine/cpu/elem.c);
    skipped where it cannot be had (no compiler, TFENGINE_NO_CC=1): the fallback paths run."""
    import engine.cpu.decode_attention as ca
    from engine.config import Toolchain
    k = ca.kernel(Toolchain())
    if k is None:
        pytest.skip("no C kernel here (no compiler, or TFENGINE_NO_CC=1)")
    return k


@pytest.fixture
def no_tokenizers(monkeypatch):
    """The `tokenizers` package as if not installed: importing it raises ImportError."""
    import builtins
    real = builtins.__import__

    def blocked(name, *a, **k):
        if name == "tokenizers":
            raise ImportError(name)
        return real(name, *a, **k)
    monkeypatch.setattr(builtins, "__import__", blocked)
