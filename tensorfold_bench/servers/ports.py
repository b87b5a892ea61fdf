"""Who listens on a port: the check that the server tfbench measures is the one it launched.

Linux only (/proc): the listening sockets on a TCP port (/proc/net/tcp and tcp6, state 0A)
give socket inodes; /proc/PID/fd links ("socket:[INODE]") give the processes holding them.
A port is ours when every listener on it is held by a process of the launched group (or a
descendant of its leader). Elsewhere the check reports "unknown" and callers rely on the nonce.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from tensorfold_bench.servers.lifeline import members

LISTEN = "0A"


def listening_inodes(port: int) -> set[int]:
    """Inodes of sockets listening on `port` (any address, IPv4 or IPv6)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) > 9 and f[3] == LISTEN and int(f[1].rsplit(":", 1)[1], 16) == port:
                found.add(int(f[9]))
    return found


def socket_inodes(pid: int) -> set[int]:
    out = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for fd in fds:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            out.add(int(link[8:-1]))
    return out


def holders(inodes: set[int]) -> dict[int, int]:
    """inode -> a pid holding it, for the inodes this user can see."""
    out: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and len(out) < len(inodes):
            for ino in socket_inodes(int(d.name)) & inodes:
                out.setdefault(ino, int(d.name))
    return out


def cmdline(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()[:200] or "?"


@dataclass
class Ownership:
    ours: bool | None  # None: cannot tell on this system
    detail: str


def port_owner(port: int, pgid: int) -> Ownership:
    """Is every listener on `port` a process of group `pgid` (or a descendant of its leader)?"""
    if not Path("/proc/net/tcp").exists():
        return Ownership(None, "no /proc/net/tcp: listener not checked")
    inodes = listening_inodes(port)
    if not inodes:
        return Ownership(False, f"nothing listens on port {port}")
    group = set(members(pgid, pgid))
    mine = set()
    for pid in group:
        mine |= socket_inodes(pid) & inodes
    foreign = inodes - mine
    if not foreign:
        return Ownership(True, f"port {port} is held by pid {', '.join(map(str, sorted(group)))} (the launched group)")
    who = holders(foreign)
    named = [f"pid {pid} ({cmdline(pid)})" for pid in sorted(set(who.values()))]
    if len(who) < len(foreign):
        named.append("a process this user cannot see")
    return Ownership(False, f"port {port} is also served by {', '.join(named)}, which tfbench did not launch")
