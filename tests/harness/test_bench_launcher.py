"""The launcher: a server that dies at start fails fast with its log; the group is gone after;
the server measured is the one launched; any server can be launched by command."""
import os
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tensorfold_bench.errors import BenchError, ServerError
from tensorfold_bench.servers.launcher import check_reachable, existing, free_port, group_alive, launch

import fakeserver
import foreignserver
import fresh

FOREIGN = [*foreignserver.CMD, "serve", "--port", "{port}"]


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
    cmd = fakeserver.CMD
    with launch([], tmp_path / "ok.log", engine_cmd=cmd) as srv:
        pgid = srv.pgid
        assert group_alive(pgid)
    assert not group_alive(pgid)
    with pytest.raises(RuntimeError):
        with launch([], tmp_path / "err.log", command=cmd) as srv:  # the old meaning of command=
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

    env = dict(os.environ, TFBENCH_SERVER_CMD=shlex.join(fakeserver.CMD))
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


@pytest.fixture
def foreign_on_a_port(tmp_path):
    """A server tfbench did not launch, already listening on a port."""
    port = free_port()
    p = subprocess.Popen([*foreignserver.CMD, "serve", "--port", str(port)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.1)
    yield port, p.pid
    p.kill()
    p.wait()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc")
def test_a_foreign_server_on_the_chosen_port_is_never_measured(tmp_path, foreign_on_a_port):
    port, pid = foreign_on_a_port
    # a launched command that never binds: health is answered, by the foreign server
    nap = [sys.executable, "-c", "import time; time.sleep(60)"]
    with pytest.raises(ServerError) as e:
        with launch(log=tmp_path / "nap.log", command=nap, port=port, start_timeout=30):
            pytest.fail("measured a server tfbench did not launch")
    assert "not the one launched" in str(e.value) and f"pid {pid}" in str(e.value)


def port_file_liar(port, *argv):
    """A tfengine that reports `port` (another server's) as its own, then sleeps. Run by fresh."""
    Path(argv[argv.index("--port-file") + 1]).write_text(port)
    time.sleep(60)


def test_a_tfengine_whose_port_points_elsewhere_fails_the_nonce(tmp_path, foreign_on_a_port):
    port, _ = foreign_on_a_port
    with pytest.raises(ServerError) as e:
        with launch([], tmp_path / "liar.log", engine_cmd=fresh.command(port_file_liar, port), start_timeout=30):
            pytest.fail("measured a server tfbench did not launch")
    assert "nonce" in str(e.value) and "not the one launched" in str(e.value)


def test_tfengine_stand_in_binds_port_0_and_echoes_the_nonce(tmp_path):
    with launch([], tmp_path / "f.log", engine_cmd=fakeserver.CMD) as srv:
        assert "--port" in srv.argv and srv.argv[srv.argv.index("--port") + 1] == "0"
        assert srv.port and srv.url.endswith(f":{srv.port}")
        assert httpx.get(srv.url + "/v1/engine").json()["nonce"] == srv.nonce
        assert srv.checked[0] == "nonce echoed by /v1/engine"


def test_launch_any_command_string_with_host_port_env_and_health_fallback(tmp_path):
    cmd = (f"{shlex.join(foreignserver.CMD)} serve --host {{host}} --port {{port}} --no-health "
           "--model $NAME")  # not a shell: $NAME stays as written
    with launch(log=tmp_path / "c.log", command=cmd, env={"TFB_TEST_VAR": "x"}) as srv:
        models = httpx.get(srv.url + "/v1/models").json()
        assert models["data"][0]["id"] == "$NAME"
        assert httpx.get(srv.url + "/health").status_code == 404  # healthy by /v1/models
        assert srv.command_line.endswith("--no-health --model '$NAME'") and f"--port {srv.port}" in srv.command_line
        env = Path(f"/proc/{srv.proc.pid}/environ").read_bytes().split(b"\0")
        assert b"TFB_TEST_VAR=x" in env
        pgid = srv.pgid
    assert not group_alive(pgid)
    assert (tmp_path / "c.log").read_text().startswith("$ ")


def test_a_command_that_exits_at_once_quotes_its_last_line(tmp_path):
    cmd = [sys.executable, "-c", "import sys; print('starting'); sys.exit('no such model: {port}')"]
    with pytest.raises(ServerError) as e:
        with launch(log=tmp_path / "x.log", command=cmd):
            pass
    assert "exited with code 1" in str(e.value) and e.value.last_line.startswith("no such model: ")


def test_a_command_that_never_answers_health_quotes_its_last_line(tmp_path):
    cmd = [sys.executable, "-c", "import time; print('warming up on {port}', flush=True); time.sleep(60)"]
    with pytest.raises(ServerError) as e:
        with launch(log=tmp_path / "h.log", command=cmd, start_timeout=1.5) as srv:
            pass
    assert "not healthy after 2 s" in str(e.value) and e.value.last_line.startswith("warming up on ")


def test_an_unreachable_url_is_one_line():
    port = free_port()
    with pytest.raises(BenchError) as e:
        check_reachable(f"http://127.0.0.1:{port}")
    assert str(e.value).startswith(f"--url http://127.0.0.1:{port}: cannot reach") and "\n" not in str(e.value)
    with pytest.raises(BenchError, match="not an http"):
        with existing("127.0.0.1:8000"):
            pass


def test_engine_flags_are_checked_without_serving(tmp_path):
    from tensorfold_bench.servers.launcher import check_engine_flags

    # the CPU's default dtype is bfloat16 where it has AMX or avx512_bf16, else float32
    assert check_engine_flags(["--model", "tiny", "--prefill-mode", "whole"]) in (
        "ok: tiny on cpu, float32, 256-row cuts", "ok: tiny on cpu, bfloat16, 256-row cuts")
    for flags, said in ((["--model", "nosuch"], "--model 'nosuch' is neither a preset"),
                        (["--dtype", "float8"], "--dtype must be float32 or bfloat16"),
                        (["--bogus"], "No such option: --bogus")):
        with pytest.raises(BenchError) as e:
            check_engine_flags(flags)
        assert said in str(e.value) and "\n" not in str(e.value), str(e.value)
    fake = fakeserver.CMD
    assert check_engine_flags(["--model", "m"], engine_cmd=fake) == "ok: m (fake)"
    old = tmp_path / "old"  # a source from before --check: nothing to ask
    (old / "engine").mkdir(parents=True)
    assert check_engine_flags(["--bogus"], root=old) is None


def test_a_string_command_must_say_where_to_listen(tmp_path):
    with pytest.raises(ValueError, match="has no {port}"):
        with launch(log=tmp_path / "p.log", command="vllm serve some/model"):
            pass


REPO = Path(__file__).resolve().parents[2]


def launch_from_here(there):
    """tfbench launching `server_here` with `there` as the server's root. Run by fresh."""
    with launch([], Path("s.log"), root=Path(there), engine_cmd=[sys.executable, "-m", "server_here"],
                start_timeout=60) as srv:
        print("served", srv.port)


def test_a_relative_pythonpath_means_tfbenchs_directory_to_the_server(tmp_path):
    """The README's `PYTHONPATH=.`, with tfbench in one directory and the server launched in
    another (its source root, as a git-ref variant's worktree is): the server must find what `.`
    named for tfbench, here the only copy of the server module."""
    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir()
    there.mkdir()
    (here / "server_here.py").write_text(fakeserver.IMPORT + "fakeserver.main(sys.argv[1:])\n")
    # `.` first, as the README has it; this repository after it, so that the harness under test
    # is this checkout's whatever else is installed
    env = {k: v for k, v in os.environ.items() if k != "TFBENCH_SERVER_CMD"}
    env["PYTHONPATH"] = "." + os.pathsep + str(REPO)
    p = fresh.run(launch_from_here, there, cwd=here, env=env, timeout=120)
    log = (here / "s.log").read_text() if (here / "s.log").exists() else "(no log)"
    assert p.returncode == 0 and "served" in p.stdout, p.stderr[-2000:] + log
    assert "No module named" not in log


def tfbench_without_torch(out):
    """`tfbench run long-prompt` on the engine where torch cannot be imported. Run by fresh."""
    sys.meta_path.insert(0, fresh.NoTorch())
    from tensorfold_bench.cli.commands import main
    sys.argv = ["tfbench", "run", "long-prompt", "--model", "tiny", "--out", out]
    main()


def test_launching_tfengine_without_the_engine_says_how_to_install_it(tmp_path):
    """A harness-only install (`pip install tfbench`, no torch) asked to launch tfengine: one line
    naming the extra, no traceback, exit 2 as for any bad setting. The interpreter here has torch:
    a first import finder that refuses it makes it as absent as in an environment without it."""
    env = {k: v for k, v in os.environ.items() if k != "TFBENCH_SERVER_CMD"}
    p = fresh.run(tfbench_without_torch, tmp_path, cwd=REPO, env=env, timeout=120)
    errors = [ln for ln in (p.stdout + p.stderr).splitlines() if "error" in ln]
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert len(errors) == 1 and errors[0].startswith("error: launching tfengine needs the engine"), errors
    assert 'torch is not installed here: pip install "tfbench[engine]"' in errors[0], errors


def sleep_in_exec_under(pkg):
    """`python -m PKG sleep-in-exec`, a command that interrupts itself inside an exec() of source
    text, as a dataclass's generated methods are. Run by fresh under -m."""
    import importlib
    import runpy
    import signal
    import threading
    app = importlib.import_module(f"{pkg}.cli").app

    @app.command("sleep-in-exec")
    def sleep_in_exec():
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()
        exec("while True: pass")

    sys.argv = ["prog", "sleep-in-exec"]
    runpy.run_module(pkg, run_name="__main__")


@pytest.mark.parametrize("pkg", ["tensorfold_bench", "engine"])
def test_ctrl_c_inside_exec_still_exits_130_under_dash_m(pkg):
    """`python -m` exits by the signal (-2) rather than the code main chose when the interrupt
    escaped an exec() of source text first; the package's __main__ clears that."""
    import signal

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(fresh.__file__).parent), str(REPO)]))
    p = subprocess.run(fresh.command(sleep_in_exec_under, pkg, dash_m=True), env=env, capture_output=True,
                       text=True, timeout=120, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert p.returncode == 130, p.stderr
    assert "Traceback" not in p.stderr
