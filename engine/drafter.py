"""Drafters for speculative decoding. A drafter proposes the next few tokens of a stream; the
target checks them in the same decode round, in rows the round would otherwise pad, and keeps
the longest run it agrees with. Verification is greedy and row-exact (see ModelRunner._padded),
so a drafted reply equals the plain reply token for token: drafts only change how many tokens
a round yields.
"""
from __future__ import annotations

from .config import ConfigError


class NgramDrafter:
    """Prompt lookup: propose the tokens that followed the latest earlier occurrence of the
    stream's last n tokens (n = 3, else 2) in its prompt and output. Costs no forward; pays off
    wherever a reply repeats its context (code edits, quoting, loops of a small model)."""

    name = "ngram"

    def __init__(self, k: int = 4, sizes: tuple[int, ...] = (3, 2)):
        self.k, self.sizes = k, sizes
        self._index: dict[int, tuple[int, list[dict]]] = {}  # seq id -> (rows indexed, per size)

    def propose(self, seq_id: int, history: list[int], k: int) -> list[int]:
        upto, tables = self._index.get(seq_id, (0, [{} for _ in self.sizes]))
        h = len(history)
        for n, table in zip(self.sizes, tables):
            # key: an n-gram that has a follower; value: the follower's index (latest wins)
            for j in range(max(n, upto), h):
                table[tuple(history[j - n:j])] = j
        self._index[seq_id] = (h, tables)
        for n, table in zip(self.sizes, tables):
            j = table.get(tuple(history[h - n:])) if h >= n else None
            if j is not None:
                return history[j:j + min(k, self.k)]
        return []

    def forget(self, seq_id: int) -> None:
        self._index.pop(seq_id, None)


DRAFTERS = {"ngram": NgramDrafter}


def make_drafter(name: str | None):
    if name is None:
        return None
    if name not in DRAFTERS:
        raise ConfigError(f"--drafter {name!r} is not known; choose one of: {', '.join(DRAFTERS)}")
    return DRAFTERS[name]()
