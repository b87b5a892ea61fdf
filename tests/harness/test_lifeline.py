"""Servers never outlive tfbench: SIGTERM, SIGHUP or SIGKILL of a tfbench-like parent leaves no
server process (nor its children, even one that left the group) and nothing on the port."""
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import fresh
from tensorfold_bench.servers.lifeline import members
from tensorfold_bench.servers.ports import listening_inodes

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc")


def command_server(port):
    """A `command:` server with children of its own, as vLLM has: one stays in the group, one
    calls setsid() (it is still the server's descendant, so the subreaper finds it). Run by fresh."""
    nap = [sys.executable, "-c", "import time; time.sleep(600)"]
    subprocess.Popen(nap)
    subprocess.Popen(nap, start_new_session=True)
    from foreignserver import main
    main(["serve", "--port", port])


def tfbench_parent(kind, log):
    """tfbench as far as the launcher goes: launch, report, then wait to be killed. Run by fresh."""
    import fakeserver
    from tensorfold_bench.servers.launcher import launch
    log = Path(log)
    if kind == "command":
        ctx = launch(log=log, command=fresh.command(command_server, "{port}"))
    elif kind == "stand-in":
        ctx = launch([], log, engine_cmd=fakeserver.CMD)
    else:
        ctx = launch(["--model", "tiny"], log, start_timeout=120)
    with ctx as srv:
        # let the server's children start: the command's two, tfengine's long-body parser (and the
        # resource tracker its spawn starts), which the server starts in the background as it starts
        want, deadline = (4 if kind in ("command", "tfengine") else 2), time.monotonic() + 30
        while len(members(srv.pgid, srv.pgid)) < want and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)
        print(json.dumps({"port": srv.port, "pids": members(srv.pgid, srv.pgid)}), flush=True)
        time.sleep(600)


def alive(pids):
    out = []
    for pid in pids:
        try:
            state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            out.append(pid)
    return out


@pytest.mark.parametrize("kind, sig", [("command", signal.SIGTERM), ("command", signal.SIGKILL),
                                       ("command", signal.SIGHUP), ("stand-in", signal.SIGKILL),
                                       ("tfengine", signal.SIGKILL)],
                         ids=lambda v: v.name if isinstance(v, signal.Signals) else v)
def test_killing_tfbench_stops_the_server_group(tmp_path, kind, sig):
    p = subprocess.Popen(fresh.command(tfbench_parent, kind, tmp_path / "s.log"), stdout=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()
        assert line, (tmp_path / "s.log").read_text() if (tmp_path / "s.log").exists() else "no log"
        facts = json.loads(line)
        # supervisor, server (+ its two children); tfengine may be building its C++ round beside them
        # on a cold cache (the build's process goes down with the group too)
        want = 4 if kind in ("command", "tfengine") else 2
        assert (len(facts["pids"]) >= want if kind == "tfengine" else len(facts["pids"]) == want)
        assert listening_inodes(facts["port"])
        p.send_signal(sig)
        p.wait(timeout=10)
        deadline = time.monotonic() + 10
        while (alive(facts["pids"]) or listening_inodes(facts["port"])) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(facts["pids"]), f"left running: {alive(facts['pids'])}"
        assert not listening_inodes(facts["port"])
        assert "lifeline closed" in (tmp_path / "s.log").read_text()
    finally:
        if p.poll() is None:
            p.kill()
