"""tfengine's command line: errors name the flag in one line; the commit it reports."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import fresh

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("args,flag", [
    (["--prefill-mode", "chunky"], "--prefill-mode"),
    (["--dtype", "float8"], "--dtype"),
    (["--parallel", "0"], "--parallel"),
    (["--model", "no-such-model"], "--model"),
    (["--drafter", "eagle"], "--drafter"),  # not a known drafter
    (["--parallel", "many"], "--parallel"),
])
def test_bad_flag_is_one_line_naming_the_flag(args, flag):
    r = subprocess.run([sys.executable, "-m", "engine", "serve", *args, "--port", "1"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert flag in r.stderr and "Traceback" not in r.stderr


def serve_without_torch():
    """`tfengine serve` where torch cannot be imported (run by fresh.run: the pytest process has torch loaded)."""
    sys.meta_path.insert(0, fresh.NoTorch())
    from engine.cli import main
    sys.argv = ["tfengine", "serve", "--model", "tiny", "--port", "1"]
    main()


def print_engine_commit():
    """The commit the engine imported here reports (run by fresh.run in a copy of the engine)."""
    from engine.cli import engine_commit
    print(engine_commit())


def test_serve_without_torch_is_one_line_naming_the_extra():
    """`pip install tfbench` (the harness alone) still installs the tfengine script: serving must
    say what to install, not end in a traceback. A first import finder refusing torch makes it
    as absent here as there."""
    r = fresh.run(serve_without_torch, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert r.stderr.strip() == 'error: tfengine needs torch, which is not installed here: pip install "tfbench[engine]"'


def test_engine_commit_from_git_env_or_none(tmp_path, monkeypatch):
    from engine.cli import engine_commit
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    assert engine_commit().split("+")[0] == sha
    copy = tmp_path / "copy"
    shutil.copytree(ROOT / "engine", copy / "engine")  # a copy without git history
    out = fresh.run(print_engine_commit, cwd=copy, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(copy)}).stdout.strip()
    assert out == "None"
    monkeypatch.setenv("TFENGINE_COMMIT", "abc123")
    assert engine_commit() == "abc123"


def test_cut_rows_default_by_device():
    """A GPU cut is a few large products (a small one spends its time outside them), so cuda
    defaults to 1,024-row cuts; the CPU keeps 256; the flag always wins."""
    from engine.cli import cut_rows
    assert (cut_rows("cuda", None), cut_rows("cuda:1", None), cut_rows("cpu", None)) == (1024, 1024, 256)
    assert cut_rows("cuda", 512) == 512
    r = subprocess.run([sys.executable, "-m", "engine", "serve", "--model", "tiny", "--check"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "256-row cuts" in r.stdout


def test_bf16_on_a_cpu_without_packed_bf16_is_refused_in_one_line():
    """Where oneDNN cannot pack bf16 weights (AVX2), --dtype bfloat16 on the CPU is refused before
    anything loads, naming the flag; elsewhere it is accepted."""
    from engine.cpu.packed import packs_bf16
    r = subprocess.run([sys.executable, "-m", "engine", "serve", "--model", "tiny", "--dtype", "bfloat16", "--check"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    if packs_bf16():
        assert r.returncode == 0 and "bfloat16" in r.stdout
    else:
        assert r.returncode == 2 and "--dtype bfloat16" in r.stderr and "Traceback" not in r.stderr


def test_mixed_low_tiles_on_the_cpu_is_refused_naming_the_flag():
    r = subprocess.run([sys.executable, "-m", "engine", "serve", "--model", "tiny", "--prefill-mode", "mixed",
                        "--mixed-low-tiles", "--check"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--mixed-low-tiles" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "engine", "serve", "--model", "tiny", "--prefill-mode", "mixed",
                        "--check"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
