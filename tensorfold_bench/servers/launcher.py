"""Fresh servers: one process group per run, tied to tfbench's life, checked to be the one measured.

`launch(...)` is a context manager yielding a `Server` (its base URL, port, log, command line).
Two kinds of server:

- tfengine (no `command`): `sys.executable -m engine serve --host H --port 0 --port-file F
  --nonce X <flags>`, cwd and PYTHONPATH set to the engine's source root (this repository, or a
  worktree for a git-ref variant). The engine binds a port the kernel picks and writes it to F
  once it serves, so no other process can take the port in between; before the first request
  `/v1/engine` must echo the nonce X. Sources older than the port file (a git-ref variant from
  before it) are launched the foreign way below. Tests substitute `python -m engine` with
  `TFBENCH_SERVER_CMD` (a shell-style command line) or `engine_cmd`; `serve ...` still follows.
- any server (`command`, an argv list or a string, `{host}` and `{port}` filled in, `flags`
  appended): a free port is chosen for it, and once it answers health (default `/health`, then
  `/v1/models`) the listening socket on that port must belong to the launched process group
  (Linux /proc; ports.py), so a foreign server already on the port is never measured.

Every server runs under the lifeline supervisor (lifeline.py) in its own session: when tfbench
ends, however it ends, the whole group is stopped. A server that exits before it is healthy, or
is not healthy within `start_timeout`, raises ServerError quoting its log's tail.
"""
from __future__ import annotations

import contextlib
import importlib.util
import os
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

import httpx

from tensorfold_bench.errors import BenchError, ServerError
from tensorfold_bench.servers import lifeline
from tensorfold_bench.servers.lifeline import GRACE_S, members
from tensorfold_bench.servers.ports import port_owner

REPO_ROOT = Path(__file__).resolve().parents[2]
HEALTH_TIMEOUT_S = 300.0
DEFAULT_HEALTH = ("/health", "/v1/models")
TAIL_LINES = 20
# The supervisor is this harness's own lifeline.py, run by its absolute path in isolated mode
# (-I: no PYTHONPATH, no current directory on sys.path). It needs only the standard library, and
# it runs in the server's directory, where `-m tensorfold_bench.servers.lifeline` would find whatever
# tensorfold_bench that directory (a git-ref worktree, a model folder) holds, or none at all.
LIFELINE = str(Path(lifeline.__file__).resolve())
# What `python -m engine serve` imports beyond the harness's own dependencies (the `engine` extra).
ENGINE_MODULES = ("torch", "aiohttp", "safetensors", "tokenizers", "jinja2")


def flag_value(args: list[str], flag: str) -> str | None:
    """The value engine flags give `flag` ('--f v' or '--f=v'; the last wins, as argparse takes it), or None."""
    out = None
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            out = args[i + 1]
        elif a.startswith(flag + "="):
            out = a.split("=", 1)[1]
    return out


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def log_tail(path: Path, lines: int = TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    tail = text.rstrip().splitlines()[-lines:]
    return "\n".join(tail) if tail else "(empty log)"


def group_alive(pgid: int) -> bool:
    """Is any live (not zombie) process left in the group?"""
    if Path("/proc").is_dir():
        return bool(members(pgid))
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def fill(command: str | Sequence[str], host: str, port: int) -> list[str]:
    """A server command as argv, `{host}` and `{port}` filled in (a string is split shell-style)."""
    argv = shlex.split(command) if isinstance(command, str) else [str(a) for a in command]
    return [a.replace("{host}", host).replace("{port}", str(port)) for a in argv]


def speaks_port_file(root: Path) -> bool:
    """Does the engine at `root` take --port-file/--nonce? (A git-ref variant may predate them.)"""
    try:
        return "port_file" in (root / "engine" / "cli.py").read_text(errors="replace")
    except OSError:
        return False


@dataclass
class Server:
    url: str
    proc: subprocess.Popen  # the lifeline supervisor: leader of the server's process group
    log: Path
    argv: list[str]  # the server's command line as launched
    port: int | None = None
    nonce: str | None = None  # tfengine's echo of it proves identity
    checked: list[str] = field(default_factory=list)  # how identity was proven (for the receipt)
    lifeline: int | None = None  # our end of the lifeline pipe

    @property
    def pgid(self) -> int:
        return self.proc.pid  # a new session: the leader's pid is the group id

    @property
    def command_line(self) -> str:
        return shlex.join(self.argv)

    def stop(self, grace_s: float = GRACE_S) -> None:
        """Close the lifeline (the supervisor stops the group), then SIGKILL whatever is left."""
        if self.lifeline is not None:
            with contextlib.suppress(OSError):
                os.close(self.lifeline)
            self.lifeline = None
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=grace_s + 2.0)
        deadline = time.monotonic() + grace_s
        # descendants by parentage only while the leader lives: its pid may be reused after
        while (left := members(self.pgid, self.pgid if self.proc.poll() is None else None)) \
                and time.monotonic() < deadline:
            for pid in left:  # the supervisor was killed or hung: finish its job
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pgid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=grace_s)


def start(argv: list[str], log: Path, env: dict[str, str], cwd: Path | None) -> tuple[subprocess.Popen, int]:
    """Run argv under the lifeline supervisor in a new session, output to `log`."""
    r, w = os.pipe()  # both non-inheritable: only the supervisor gets r, by pass_fds
    log.parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(log, "wb") as logf:
            logf.write(("$ " + shlex.join(argv) + "\n").encode())
            logf.flush()
            proc = subprocess.Popen([sys.executable, "-I", LIFELINE, str(r), "--", *argv],
                                    cwd=cwd, env=env, stdout=logf, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True, pass_fds=(r,))
    except BaseException:
        os.close(w)
        raise
    finally:
        os.close(r)
    return proc, w


def wait_healthy(server: Server, paths: Sequence[str], timeout: float, port_file: Path | None = None) -> None:
    """Poll until one of `paths` answers 200 (after the port file names the port, if any)."""
    deadline = time.monotonic() + timeout
    origin = server.url  # no port yet when the port file is to name it
    while True:
        if server.proc.poll() is not None:
            code = server.proc.returncode
            raise ServerError(f"server exited with code {code} before it answered {paths[0]}",
                              str(server.log), log_tail(server.log))
        if server.port is None and port_file is not None:
            with contextlib.suppress(OSError, ValueError):
                server.port = int(port_file.read_text().strip())
                server.url = f"{origin}:{server.port}"
        if server.port is not None:
            for path in paths:
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(server.url + path, timeout=2.0).status_code == 200:
                        return
        if time.monotonic() > deadline:
            raise ServerError(f"server not healthy after {timeout:.0f} s (asked {', '.join(paths)})",
                              str(server.log), log_tail(server.log))
        time.sleep(0.1)


def check_identity(server: Server) -> None:
    """The server answering on the port is the one launched: nonce echo and/or socket owner."""
    if server.nonce is not None:
        try:
            got = httpx.get(server.url + "/v1/engine", timeout=10.0).json().get("nonce")
        except (httpx.HTTPError, ValueError, AttributeError):
            got = None
        if got != server.nonce:
            raise ServerError(f"the server on port {server.port} is not the one launched: GET /v1/engine "
                              f"echoed nonce {got!r}, expected {server.nonce!r}", str(server.log), log_tail(server.log))
        server.checked.append("nonce echoed by /v1/engine")
    own = port_owner(server.port, server.pgid)
    if own.ours is False:
        raise ServerError(f"the server on port {server.port} is not the one launched: {own.detail}",
                          str(server.log), log_tail(server.log))
    server.checked.append(own.detail)


def engine_program(engine_cmd: Sequence[str] | None) -> list[str] | None:
    """The stand-in for `python -m engine` (engine_cmd, else TFBENCH_SERVER_CMD), or None."""
    env_cmd = os.environ.get("TFBENCH_SERVER_CMD")
    return list(engine_cmd) if engine_cmd else shlex.split(env_cmd) if env_cmd else None


def absolute_path_list(value: str, cwd: str | Path | None = None) -> str:
    """A PYTHONPATH with its relative entries made absolute against `cwd` (default: ours). An
    empty entry means the current directory, so it becomes `cwd` too."""
    base = Path(cwd or os.getcwd())
    return os.pathsep.join(str(base / p) if not os.path.isabs(p) else p for p in value.split(os.pathsep))


def server_env(env: dict[str, str] | None, root: Path | None = None) -> dict[str, str]:
    """tfbench's environment plus `env`; with an engine `root`, that source first on PYTHONPATH.

    The server runs in another directory (its source root), where a relative PYTHONPATH entry
    such as the README's `PYTHONPATH=.` would name something else: entries are made absolute
    against tfbench's own directory first, so they mean for the server what they meant here."""
    penv = dict(os.environ)
    penv.update({k: str(v) for k, v in (env or {}).items()})
    penv.setdefault("PYTHONUNBUFFERED", "1")
    if penv.get("PYTHONPATH"):
        penv["PYTHONPATH"] = absolute_path_list(penv["PYTHONPATH"])
    if root is not None:
        penv["PYTHONPATH"] = str(root) + (os.pathsep + penv["PYTHONPATH"] if penv.get("PYTHONPATH") else "")
    return penv


def installed(module: str) -> bool:
    """Can `module` be imported here? Asked without importing it (torch alone takes seconds)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a finder refused it, or sys.modules holds it as None
        return False


def need_engine() -> None:
    """tfengine is to be launched with this interpreter: a one-line BenchError when the engine's
    own dependencies are missing (a harness-only `pip install tfbench`)."""
    missing = [m for m in ENGINE_MODULES if not installed(m)]
    if missing:
        raise BenchError(f"launching tfengine needs the engine, and {', '.join(missing)} "
                         f"{'is' if len(missing) == 1 else 'are'} not installed here: "
                         'pip install "tfbench[engine]" (or point tfbench at a running server with --url)')


def check_engine_flags(flags: Sequence[str], *, root: Path | None = None, env: dict[str, str] | None = None,
                       engine_cmd: Sequence[str] | None = None, timeout: float = 120.0) -> str | None:
    """Ask the engine to validate `flags` without serving (`serve --check`): its "ok: ..." line,
    or a one-line BenchError with the engine's own message. None when the engine at `root`
    predates --check (nothing to ask)."""
    root = Path(root or REPO_ROOT)
    program = engine_program(engine_cmd)
    if program is None:
        need_engine()
        if not speaks_port_file(root):
            return None
    argv = [*(program or [sys.executable, "-m", "engine"]), "serve", *flags, "--check"]
    try:
        p = subprocess.run(argv, cwd=root, env=server_env(env, root), capture_output=True, text=True,
                           timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise BenchError(f"engine flags {shlex.join(flags)}: `serve --check` gave no answer in {timeout:.0f} s") from None
    lines = [ln.strip() for ln in (p.stdout + "\n" + p.stderr).splitlines() if ln.strip()]
    if p.returncode != 0:
        why = lines[-1] if lines else f"exit code {p.returncode}"
        raise BenchError(f"engine flags {shlex.join(flags)}: {why.removeprefix('error: ')}")
    return lines[-1] if lines else "ok"


@contextlib.contextmanager
def launch(flags: Sequence[str] = (), log: Path | None = None, *, env: dict[str, str] | None = None,
           root: Path | None = None, command: str | Sequence[str] | None = None,
           engine_cmd: Sequence[str] | None = None, health: str | Sequence[str] | None = None,
           start_timeout: float | None = None,
           host: str = "127.0.0.1", port: int | None = None) -> Iterator[Server]:
    """Launch a server, wait until it is healthy and proven to be ours, yield it, stop its group.

    `command`: any server (see the module docstring), `flags` appended; without it, tfengine
    with `flags`. A string command must say `{port}` (or pass `port=`); an argv list without it
    is taken as the engine program (`engine_cmd`): a command given as argv without a port is
    the engine's own program line, whose port tfbench passes.
    `health`: path(s) tried in turn, each poll (default /health then /v1/models; tfengine
    /health); `start_timeout`: how long it may take to get healthy."""
    if log is None:
        raise TypeError("launch() needs a log path")
    log = Path(log).absolute()  # the server runs in its source root (a worktree's, for a git ref)
    timeout = start_timeout or HEALTH_TIMEOUT_S
    root = Path(root or REPO_ROOT)
    if command is not None and port is None and "{port}" not in " ".join(
            [command] if isinstance(command, str) else map(str, command)):
        if isinstance(command, str):
            raise ValueError(f"command {command!r} has no {{port}}: tfbench must tell the server its port")
        command, engine_cmd = None, list(command)
    nonce = port_file = None
    if command is not None:
        port = port or free_port(host)
        argv, cwd, penv = fill(command, host, port) + list(flags), None, server_env(env)
        paths = (health,) if isinstance(health, str) else tuple(health or DEFAULT_HEALTH)
    else:
        program = engine_program(engine_cmd)
        if program is None:
            need_engine()
        extra: list[str] = []
        if port is None and (program is not None or speaks_port_file(root)):
            nonce, port_file = secrets.token_hex(8), log.with_name(log.name + ".port")
            port_file.unlink(missing_ok=True)
            extra = ["--port-file", str(port_file), "--nonce", nonce]
        else:
            port = port or free_port(host)
        program = program or [sys.executable, "-m", "engine"]
        argv = [*program, "serve", "--host", host, "--port", str(port or 0), *extra, *flags]
        cwd, penv = root, server_env(env, root)
        paths = (health,) if isinstance(health, str) else tuple(health or ("/health",))
    proc, w = start(argv, log, penv, cwd)
    origin = "http://" + (f"[{host}]" if ":" in host else host)
    server = Server(origin + (f":{port}" if port else ""), proc, log, argv, port, nonce, lifeline=w)
    try:
        wait_healthy(server, paths, timeout, port_file)
        check_identity(server)
        yield server
    finally:
        server.stop()
        if port_file is not None:
            port_file.unlink(missing_ok=True)


def check_reachable(url: str, timeout: float = 5.0) -> str:
    """`--url`: the base URL, or a one-line BenchError when nothing answers there."""
    base = url.rstrip("/")
    if not base.startswith(("http://", "https://")):
        raise BenchError(f"--url {url!r}: not an http:// or https:// URL")
    try:
        with httpx.Client(timeout=timeout) as c:
            for path in DEFAULT_HEALTH:
                if c.get(base + path).status_code < 500:
                    return base
    except httpx.HTTPError as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise BenchError(f"--url {base}: cannot reach the server ({reason})") from None
    raise BenchError(f"--url {base}: the server answers, but neither {' nor '.join(DEFAULT_HEALTH)} succeeds")


@contextlib.contextmanager
def existing(url: str) -> Iterator[str]:
    """`--url`: a server someone else runs; it must answer, and nothing is launched or stopped."""
    yield check_reachable(url)
