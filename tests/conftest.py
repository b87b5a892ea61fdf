import os
import pathlib
import subprocess
import sys

import pytest


@pytest.fixture
def interpret():
    """Run a code string in a fresh interpreter with TRITON_INTERPRET=1 (Triton kernels on the
    CPU; the variable must be set before triton is imported); it must print "ok"."""
    def run(code: str) -> None:
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240,
                             env={**os.environ, "TRITON_INTERPRET": "1"},
                             cwd=str(pathlib.Path(__file__).resolve().parents[1]))
        assert res.returncode == 0 and "ok" in res.stdout, res.stderr[-3000:]
    return run
