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


# Triton's interpreter computes tl.dot with numpy, whose OpenBLAS picks its sgemm kernel by CPU.
# The FMA kernels (Haswell and later: every AVX2 machine) round a row by where it falls in the
# block, which a GPU's tensor-core tile does not, so the row-invariance checks would test OpenBLAS,
# not the kernel. Sandy Bridge's kernel (AVX, no FMA) keeps each row's sums in one order.
# Only where nothing set the core type already (some machines set it to avoid broken kernels).
INTERPRET_ENV = {"TRITON_INTERPRET": "1", "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE", "Sandybridge")}


@pytest.fixture
def interpret():
    """Run a code string in a fresh interpreter with TRITON_INTERPRET=1 (Triton kernels on the
    CPU; the variable must be set before triton is imported); it must print "ok"."""
    def run(code: str) -> None:
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240,
                             env={**os.environ, **INTERPRET_ENV},
                             cwd=str(pathlib.Path(__file__).resolve().parents[1]))
        assert res.returncode == 0 and "ok" in res.stdout, res.stderr[-3000:]
    return run


@pytest.fixture(scope="module")
def c_kernel():
    """The CPU round's C library (engine/cpu/decode_attention.py: the decode attention, engine/cpu/elem.c);
    skipped where it cannot be had (no compiler, TFENGINE_NO_CC=1): the fallback paths run."""
    import engine.cpu.decode_attention as ca
    k = ca.kernel()
    if k is None:
        pytest.skip("no C kernel here (no compiler, or TFENGINE_NO_CC=1)")
    return k
