"""The launcher: a server that dies at start fails fast with its log; the group is gone after."""
import os
import sys
import time
from pathlib import Path

import pytest

from tensorfold_bench.errors import ServerError
from tensorfold_bench.launcher import group_alive, launch


def test_server_exiting_at_start_fails_fast_with_log_tail(tmp_path):
    cmd = [sys.executable, "-c", "import sys; print('loading model'); print('boom: no such preset', file=sys.stderr); sys.exit(3)"]
    t = time.monotonic()
    with pytest.raises(ServerError) as e:
        with launch(["--model", "nope"], tmp_path / "run.log", command=cmd):
            pass
    assert time.monotonic() - t < 10
    msg = str(e.value)
    assert "exited with code 3" in msg and "boom: no such preset" in msg and str(tmp_path / "run.log") in msg


def test_server_command_from_env(tmp_path, monkeypatch):
    monkeypatch.setenv("TFBENCH_SERVER_CMD", f"{sys.executable} -c 'import sys; print(sys.argv[1:]); sys.exit(1)'")
    with pytest.raises(ServerError) as e:
        with launch(["--prefill-mode", "whole"], tmp_path / "x.log"):
            pass
    assert "--prefill-mode" in str(e.value) and "serve" in str(e.value)


def test_fake_server_group_killed_on_exit_and_error(tmp_path):
    cmd = [sys.executable, "-m", "tensorfold_bench.fakeserver"]
    with launch([], tmp_path / "ok.log", command=cmd) as srv:
        pgid = srv.pgid
        assert group_alive(pgid)
    assert not group_alive(pgid)
    with pytest.raises(RuntimeError):
        with launch([], tmp_path / "err.log", command=cmd) as srv:
            pgid = srv.pgid
            raise RuntimeError("client failed")
    assert not group_alive(pgid)
    assert "serve" in (tmp_path / "ok.log").read_text().splitlines()[0]


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:  # gone since it was listed (a short-lived git, say)
        return ""


def children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(d.name))
    return out


@pytest.mark.skipif(not Path("/proc").exists(), reason="needs /proc")
def test_ctrl_c_mid_run_stops_the_server_group(tmp_path):
    import signal
    import subprocess

    env = dict(os.environ, TFBENCH_SERVER_CMD=f"{sys.executable} -m tensorfold_bench.fakeserver")
    p = subprocess.Popen([sys.executable, "-m", "tensorfold_bench", "run", "long-prompt", "--model", "tiny",
                          "--b-at", "30", "--b-tokens", "600", "--out", str(tmp_path)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         # a terminal's Ctrl-C: a shell's background job (`make test &`) inherits
                         # SIGINT ignored, and Python then never sees the signal
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 30
    server = []
    while time.monotonic() < deadline and not server:
        time.sleep(0.2)
        server = [c for c in children(p.pid) if "fakeserver" in cmdline(c)]
    assert server, "no server started"
    time.sleep(1.0)  # inside the scenario: A is streaming, B not yet sent
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 130, err
    assert "Traceback" not in err
    assert not group_alive(server[0])
