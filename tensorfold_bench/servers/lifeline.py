"""The lifeline: a small supervisor that makes a launched server die with tfbench.

    python -m tensorfold_bench.servers.lifeline FD -- SERVER ARGV...

tfbench starts this in a new session (so it leads a fresh process group) and keeps the write
end of a pipe whose read end is FD. The supervisor runs the server as its child in that group
and watches FD: the kernel closes tfbench's end however tfbench ends (exit, SIGTERM, SIGHUP,
SIGKILL), so EOF on FD means "tfbench is gone": the supervisor stops the whole group (SIGTERM,
a grace period, then SIGKILL) and exits. tfbench's own orderly stop is the same path: close the
write end and wait.

Why a supervisor rather than a parent-death signal alone: PR_SET_PDEATHSIG fires when the
*thread* that forked the child exits (not the process), reaches only the direct child, and a
server such as vLLM spawns workers of its own. The supervisor is a subreaper (orphaned
descendants are re-parented to it, so a worker that calls setsid() is still found) and gives
its direct child PR_SET_PDEATHSIG=SIGKILL, so even a SIGKILL of the supervisor takes the server
with it. When the server exits on its own, stragglers of the group are stopped and the
supervisor exits with the server's code.

Standard library only, imported by nothing heavy: it starts in tens of milliseconds.
"""
from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
GRACE_S = 3.0


def _prctl(option: int, arg: int) -> None:
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(option, arg, 0, 0, 0)


def _die_with_parent() -> None:  # runs in the child between fork and exec
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def members(pgid: int, root: int | None = None) -> list[int]:
    """Live pids in process group `pgid`, plus descendants of `root` that left it (Linux /proc;
    elsewhere an empty list, and callers fall back to killpg)."""
    found, parents = set(), {}
    proc = Path("/proc")
    if not proc.is_dir():
        return []
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] == "Z":
            continue  # a zombie holds nothing; its parent reaps it
        pid, ppid, pgrp = int(d.name), int(fields[1]), int(fields[2])
        parents[pid] = ppid
        if pgrp == pgid:
            found.add(pid)
    if root is not None:
        for pid in parents:
            p, seen = parents.get(pid), 0
            while p and seen < 64:
                if p == root:
                    found.add(pid)
                    break
                p, seen = parents.get(p), seen + 1
    return sorted(found)


def signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def stop_all(pgid: int, me: int, child: subprocess.Popen | None, grace_s: float) -> None:
    """SIGTERM every member but the supervisor, wait up to grace_s, then SIGKILL what is left."""
    if not Path("/proc").is_dir():  # no /proc to list the group: signal it whole (us too)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
            time.sleep(grace_s)
            os.killpg(pgid, signal.SIGKILL)
        return
    signal_all([p for p in members(pgid, me) if p != me], signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if child is not None:
            child.poll()
        _reap()
        if not [p for p in members(pgid, me) if p != me]:
            return
        time.sleep(0.05)
    signal_all([p for p in members(pgid, me) if p != me], signal.SIGKILL)
    if child is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=grace_s)
    _reap()


def _reap() -> None:
    """Collect re-parented orphans (we are their subreaper) so they do not linger as zombies."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def supervise(fd: int, argv: list[str], grace_s: float = GRACE_S) -> int:
    me = os.getpid()
    pgid = os.getpgid(0)
    stop_r, stop_w = os.pipe()
    os.set_blocking(stop_w, False)

    def on_signal(signum, _frame):  # our own group-wide SIGTERM reaches us too: just note it
        with contextlib.suppress(OSError):
            os.write(stop_w, b"x")

    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, on_signal)
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    try:
        child = subprocess.Popen(argv, preexec_fn=_die_with_parent, stdin=subprocess.DEVNULL)
    except OSError as e:
        print(f"lifeline: cannot start {argv[0]!r}: {e}", flush=True)
        return 127
    why = ""
    while True:
        ready, _, _ = select.select([fd, stop_r], [], [], 0.2)
        if child.poll() is not None:
            stop_all(pgid, me, None, min(grace_s, 1.0))
            return child.returncode if child.returncode >= 0 else 128 - child.returncode
        if fd in ready:
            with contextlib.suppress(OSError):
                if os.read(fd, 1) == b"":
                    why = "lifeline closed (tfbench stopped the server, or ended)"
        if stop_r in ready:
            why = why or "stop signal"
        if why:
            print(f"lifeline: {why}: stopping the server's process group", flush=True)
            stop_all(pgid, me, child, grace_s)
            return 0


def main(args: list[str]) -> int:
    if len(args) < 3 or args[1] != "--":
        print("usage: python -m tensorfold_bench.servers.lifeline FD -- ARGV...", file=sys.stderr)
        return 2
    grace = float(os.environ.get("TFBENCH_STOP_GRACE_S", GRACE_S))
    return supervise(int(args[0]), args[2:], grace)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
