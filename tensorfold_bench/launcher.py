"""Fresh engine servers: one process group per run, health-waited, killed whole on the way out.

`launch(...)` is a context manager yielding the server's base URL. It starts
`sys.executable -m engine serve --host 127.0.0.1 --port P <flags>` with cwd and PYTHONPATH set
to the engine's source root (this repository, or a worktree for a git-ref variant), in its own
session (process group), its output to a log file. It waits for GET /health and fails at once,
with the log's tail, if the process exits first. On exit, error or Ctrl-C it sends SIGTERM to
the group, then SIGKILL to whatever is left.

Tests substitute the server command with `TFBENCH_SERVER_CMD` (a shell-style command line that
replaces `python -m engine`; `serve --host ... --port ... <flags>` still follow) or the
`command` argument.
"""
from __future__ import annotations

import contextlib
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import httpx

from tensorfold_bench.errors import ServerError

REPO_ROOT = Path(__file__).resolve().parent.parent
HEALTH_TIMEOUT_S = 300.0
TAIL_LINES = 20


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_command(flags: list[str], port: int, command: list[str] | None = None) -> list[str]:
    if command is None:
        env_cmd = os.environ.get("TFBENCH_SERVER_CMD")
        command = shlex.split(env_cmd) if env_cmd else [sys.executable, "-m", "engine"]
    return [*command, "serve", "--host", "127.0.0.1", "--port", str(port), *flags]


def log_tail(path: Path, lines: int = TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    tail = text.rstrip().splitlines()[-lines:]
    return "\n".join(tail) if tail else "(empty log)"


def stop_group(proc: subprocess.Popen, grace_s: float = 5.0) -> None:
    """SIGTERM the process group, wait up to grace_s, then SIGKILL it."""
    try:
        pgid = os.getpgid(proc.pid)
    except ProcessLookupError:
        pgid = None
    if pgid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    if pgid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace_s)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def wait_healthy(proc: subprocess.Popen, url: str, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise ServerError(f"engine server exited with code {proc.returncode} before /health answered",
                              str(log), log_tail(log))
        try:
            r = httpx.get(url + "/health", timeout=2.0)
            if r.status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise ServerError(f"engine server not healthy after {timeout:.0f} s", str(log), log_tail(log))
        time.sleep(0.1)


@contextlib.contextmanager
def launch(flags: list[str], log: Path, *, env: dict[str, str] | None = None, root: Path | None = None,
           command: list[str] | None = None, health_timeout: float = HEALTH_TIMEOUT_S) -> Iterator["Server"]:
    root = Path(root or REPO_ROOT)
    port = free_port()
    argv = server_command(flags, port, command)
    penv = dict(os.environ)
    penv.update(env or {})
    penv["PYTHONPATH"] = str(root) + (os.pathsep + penv["PYTHONPATH"] if penv.get("PYTHONPATH") else "")
    penv.setdefault("PYTHONUNBUFFERED", "1")
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as logf:
        logf.write(("$ " + shlex.join(argv) + "\n").encode())
        logf.flush()
        proc = subprocess.Popen(argv, cwd=root, env=penv, stdout=logf, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    server = Server(f"http://127.0.0.1:{port}", proc, log, argv)
    try:
        wait_healthy(proc, server.url, log, health_timeout)
        yield server
    finally:
        stop_group(proc)


class Server:
    def __init__(self, url: str, proc: subprocess.Popen, log: Path, argv: list[str]):
        self.url, self.proc, self.log, self.argv = url, proc, log, argv

    @property
    def pgid(self) -> int:
        return self.proc.pid  # start_new_session: the leader's pid is the group id


@contextlib.contextmanager
def existing(url: str) -> Iterator[str]:
    """`--url`: a server someone else runs; nothing is launched or stopped."""
    yield url.rstrip("/")
