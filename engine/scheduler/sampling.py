"""A request's sampling parameters and the random draw that keeps sampled replies exact.

A sampled token depends only on the request's seed, its position and its own logits: the draw
for the token at absolute position `pos` (its index in prompt + completion) is `uniform(seed,
pos)`, a counter-based hash (SplitMix64 over the pair), not a shared random stream. So a seeded
sampled reply keeps its ids across schedules (alone or beside others, stepped or whole, any
share, prompt cache, drafts) exactly as a greedy one does. No torch here: the lane host and the
server import this; the tensor side is engine/runner/sampler.py.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

_M64 = (1 << 64) - 1


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0   # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0             # 0 = off
    seed: int | None = None    # the server fills a drawn seed when the client gave none
    logprobs: int | None = None  # None = no logprobs; k >= 0 = chosen token's logprob + top-k

    def __post_init__(self):
        if not (isinstance(self.temperature, (int, float)) and 0 <= self.temperature < math.inf):
            raise ValueError(f"temperature must be a finite number >= 0, not {self.temperature!r}")
        if not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1], not {self.top_p!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0, not {self.top_k!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise ValueError(f"seed must be an integer, not {self.seed!r}")
        if self.logprobs is not None and (isinstance(self.logprobs, bool) or not isinstance(self.logprobs, int)
                                          or self.logprobs < 0):
            raise ValueError(f"logprobs must be an integer >= 0, not {self.logprobs!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def plain(self) -> bool:
        """Greedy with no logprobs: the backend's plain path, unchanged."""
        return self.greedy and self.logprobs is None


GREEDY = SamplingParams()


@dataclass
class TokenLogprob:
    """A reply token's log-probability under the model (log_softmax of its raw logits, fp32, before
    temperature, top-k and top-p), and the `logprobs` most likely tokens with theirs, most likely
    first (ties: lower id first)."""
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def uniform(seed: int, pos: int) -> float:
    """The draw for the token at position `pos` of a reply seeded `seed`: in [0, 1), 53 bits."""
    return (_splitmix64(_splitmix64(seed & _M64) ^ (pos & _M64)) >> 11) * 2.0 ** -53
