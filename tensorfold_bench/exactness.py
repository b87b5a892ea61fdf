"""Token hashes and the exactness comparison.

Hash convention (TensorFold's): sha256 over the comma-joined decimal token ids of a reply
("12,7,900"), as hex. Servers report the first 12 hex characters (`token_sha`); we keep the
full hash and compare at 12 characters with a server's.

A (the decoding stream) is cancelled once B and C are done, so its length varies from run to
run. A's reply is therefore compared on a prefix: a run's A equals the reference when its ids
equal the reference's first len(A) ids (the plain reference's A is generated long enough to
cover the longest A); A's hash in the tables is over the first `a_prefix` ids, the shortest A
among the runs compared.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

SHORT = 12


def token_hash(ids: list[int]) -> str:
    return hashlib.sha256(",".join(str(int(i)) for i in ids).encode()).hexdigest()


def short(h: str | None) -> str | None:
    return h[:SHORT] if h else None


def known_ids(ids: list[int | None]) -> list[int] | None:
    """The ids, or None when any is unknown (a server that streams text only)."""
    return None if any(i is None for i in ids) else [int(i) for i in ids]


def server_sha_matches(ids: list[int | None], server_sha: str | None) -> bool | None:
    """Does the server's token_sha equal our hash of the ids we received? None if unknowable."""
    ks = known_ids(ids)
    if server_sha is None or ks is None:
        return None
    return token_hash(ks)[:len(server_sha)] == server_sha


@dataclass
class Comparison:
    stream: str
    equal: bool | None  # None: cannot tell (unknown ids, or missing reply)
    detail: str = ""


def compare_reply(name: str, ids: list[int | None], ref: list[int | None], prefix: bool,
                  server_sha: str | None = None, ref_sha: str | None = None) -> Comparison:
    """`prefix`: the reply may be shorter than the reference (a cancelled A) and is compared
    with the reference's prefix of its own length. Without ids, fall back to server hashes."""
    a, r = known_ids(ids), known_ids(ref)
    if a is None or r is None:
        if server_sha and ref_sha and not prefix:
            return Comparison(name, server_sha[:SHORT] == ref_sha[:SHORT], "by server token_sha")
        return Comparison(name, None, "no token ids")
    if not a:
        return Comparison(name, None, "empty reply")
    if prefix:
        if len(r) < len(a):
            n = len(r)
            return Comparison(name, a[:n] == r, f"on the reference's {n} tokens")
        return Comparison(name, a == r[:len(a)], f"on {len(a)} tokens")
    return Comparison(name, a == r, f"{len(a)} tokens")
