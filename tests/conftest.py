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


@pytest.fixture
def interpret():
    """Run a code string in a fresh interpreter with TRITON_INTERPRET=1 (Triton kernels on the
    CPU; the variable must be set before triton is imported); it must print "ok"."""
    pytest.importorskip("triton", reason="the Triton kernels: triton is not installed (the engine extra brings it on Linux x86_64 and aarch64)")
    def run(code: str) -> None:
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240,
                             env={**os.environ, "TRITON_INTERPRET": "1"},
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
