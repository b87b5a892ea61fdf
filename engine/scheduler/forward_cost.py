"""A cost model of one forward, learned from the forwards the lane host timed (no torch).

A mixed forward carries `n` rows of a prompt cut that starts at `ctx` (keys already in the lane)
and one row for every runnable decoding stream. Its time is modelled as

    t = base + u * n + k * n * (ctx + n / 2)

`base`: a forward of the decode rows alone (the weights streamed once, the decoders' attention);
`u`: a cut row's products; `k`: a cut row's attention per key it reads (a row at ctx + j reads
ctx + j keys, so the cut's rows read n (ctx + n / 2) keys in all). `base` is an average of timed
decode-only rounds; (u, k) a least-squares fit, through the origin, of the recent mixed forwards'
time above `base`. So as the prompt's context grows the same budget buys fewer rows.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

WINDOW = 16  # mixed forwards the fit remembers: the cost moves with the context, so only recent ones
EMA = 0.25  # weight of a new decode-only round in `base`


@dataclass
class ForwardCost:
    budget_s: float  # the most a mixed forward should take
    granule: int = 16  # cuts are multiples of this many rows (the last of a prompt excepted)
    most: int = 1024  # the largest cut a forward carries
    base: float | None = None
    samples: deque = field(default_factory=lambda: deque(maxlen=WINDOW))  # (n, keys, seconds above base)

    @property
    def knows_base(self) -> bool:
        return self.base is not None

    def add_round(self, seconds: float) -> None:
        """A timed forward of the decode rows alone."""
        self.base = seconds if self.base is None else (1 - EMA) * self.base + EMA * seconds

    def add_mixed(self, n: int, ctx: int, seconds: float) -> None:
        """A timed forward that carried `n` cut rows starting at `ctx` beside the decode rows."""
        if n > 0 and self.base is not None:
            self.samples.append((n, n * (ctx + n / 2), max(0.0, seconds - self.base)))

    def coefficients(self) -> tuple[float, float] | None:
        """(u, k) from the recent samples, or None before the first. One sample (or samples that do
        not tell rows from keys apart) charges everything to the rows."""
        if not self.samples:
            return None
        sxx = sum(n * n for n, _, _ in self.samples)
        sxk = sum(n * kk for n, kk, _ in self.samples)
        skk = sum(kk * kk for _, kk, _ in self.samples)
        sxy = sum(n * y for n, _, y in self.samples)
        sky = sum(kk * y for _, kk, y in self.samples)
        det = sxx * skk - sxk * sxk
        if det > 1e-9 * sxx * skk:
            u = (sxy * skk - sky * sxk) / det
            k = (sky * sxx - sxy * sxk) / det
            if u >= 0 and k >= 0:
                return u, k
            if k < 0 or u < 0:  # a noisy fit: fall back to the one-term fit that stays positive
                return (sxy / sxx, 0.0) if k < 0 else (0.0, sky / skk)
        return sxy / sxx, 0.0

    def predict(self, n: int, ctx: int) -> float | None:
        c = self.coefficients()
        if c is None or self.base is None:
            return None
        u, k = c
        return self.base + u * n + k * n * (ctx + n / 2)

    def rows(self, ctx: int, left: int) -> int:
        """The cut to carry now: the most rows whose predicted forward fits the budget, in multiples
        of `granule`, at least one granule (the prompt always moves), at most `most` and `left`.
        Before any mixed forward was timed: one granule (a probe)."""
        g = self.granule
        c = self.coefficients()
        if c is None or self.base is None:
            return min(left, g)
        u, k = c
        room = self.budget_s - self.base
        if room <= 0:
            n = 0.0
        elif k <= 0:
            n = room / u if u > 0 else math.inf
        else:  # (k / 2) n^2 + (u + k ctx) n - room = 0
            b = u + k * ctx
            n = (-b + math.sqrt(b * b + 2 * k * room)) / k
        n = min(float(self.most), n)
        return min(left, max(g, int(n) // g * g))
