"""Drafters for speculative decoding. A drafter proposes the next few tokens of a stream; the
target checks them in the same decode round, in rows the round would otherwise pad, and keeps
the longest run it agrees with. Verification is greedy and row-exact (see ModelRunner.padded_round),
so a drafted reply equals the plain reply token for token: drafts only change how many tokens
a round yields.
"""
from __future__ import annotations

from engine.config import ConfigError


class NgramDrafter:
    """Prompt lookup: propose the tokens that followed the latest earlier occurrence of the
    stream's last n tokens (n = 3, else 2) in its prompt and output. Costs no forward; pays off
    wherever a reply repeats its context (code edits, quoting, loops of a small model)."""

    name = "ngram"

    def __init__(self, k: int = 4, sizes: tuple[int, ...] = (3, 2)):
        self.k, self.sizes = k, sizes
        self._index: dict[int, tuple[int, list[dict]]] = {}  # seq id -> (rows indexed, per size)

    def propose(self, seq_id: int, prompt: list[int], output: list[int], k: int) -> list[int]:
        """Up to k tokens for the stream whose history is prompt + output (never concatenated:
        this runs every decode round, and a prompt can be tens of thousands of tokens)."""
        upto, tables = self._index.get(seq_id, (0, [{} for _ in self.sizes]))
        h = len(prompt) + len(output)
        span = lambda a, b: _span(prompt, output, a, b)
        for n, table in zip(self.sizes, tables):
            # key: an n-gram that has a follower; value: the follower's index (latest wins)
            for j in range(max(n, upto), h):
                table[tuple(span(j - n, j))] = j
        self._index[seq_id] = (h, tables)
        for n, table in zip(self.sizes, tables):
            j = table.get(tuple(span(h - n, h))) if h >= n else None
            if j is not None:
                return span(j, min(h, j + min(k, self.k)))
        return []

    def forget(self, seq_id: int) -> None:
        self._index.pop(seq_id, None)


def _span(prompt: list[int], output: list[int], a: int, b: int) -> list[int]:
    """(prompt + output)[a:b] without building prompt + output."""
    p = len(prompt)
    if b <= p:
        return prompt[a:b]
    if a >= p:
        return output[a - p:b - p]
    return prompt[a:] + output[:b - p]


DRAFTERS = {"ngram": NgramDrafter}


def make_drafter(name: str | None):
    if name is None:
        return None
    if name not in DRAFTERS:
        raise ConfigError(f"--drafter {name!r} is not known; choose one of: {', '.join(DRAFTERS)}")
    return DRAFTERS[name]()
