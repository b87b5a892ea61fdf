"""A cost model of one forward, learned from the forwards the lane host timed (no torch).

A mixed forward carries `n` rows of a prompt cut that starts at `ctx` (keys already in the lane)
and one row for every runnable decoding stream. Its time is modelled as

    t = base + a + u * n + k * n * (ctx + n / 2)

`base`: a forward of the decode rows alone (the weights streamed once, the decoders' attention);
`a`: what a mixed forward costs beyond a round whatever its cut (its launches, the cut attention's
fixed work); `u`: a cut row's products; `k`: a cut row's attention per key it reads (a row at
ctx + j reads ctx + j keys, so the cut's rows read n (ctx + n / 2) keys in all). `base` is an
average of timed decode-only rounds; (a, u, k) a non-negative least-squares fit of the recent
mixed forwards' time above `base`. So as the prompt's context grows the same budget buys fewer
rows. Where the backend runs cuts at fixed sizes (`sizes`: CUDA graphs), a cut costs its size's
forward and the budget picks a size.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

WINDOW = 16  # mixed forwards the fit remembers: the cost moves with the context, so only recent ones
EMA = 0.25  # weight of a new decode-only round in `base`


# the terms tried in turn where several fit the samples equally (one mixed forward, or all at one
# cut size, cannot tell a row's cost from the intercept): rows first, as the probe is one granule
TERMS = ((1,), (1, 2), (0, 1), (0, 1, 2), (2,), (0, 2), (0,))


@dataclass
class ForwardCost:
    budget_s: float  # the most a mixed forward should take
    granule: int = 16  # cuts are multiples of this many rows (the last of a prompt excepted)
    most: int = 1024  # the largest cut a forward carries
    sizes: tuple[int, ...] | None = None  # the cut sizes forwards run at (None: any multiple of granule)
    base: float | None = None
    samples: deque = field(default_factory=lambda: deque(maxlen=WINDOW))  # (1, n, keys, seconds above base)

    @property
    def knows_base(self) -> bool:
        return self.base is not None

    def charged(self, n: int) -> int:
        """The rows a cut of n costs: its size's where forwards run at sizes."""
        if not self.sizes:
            return n
        return next((s for s in self.sizes if s >= n), n)

    def add_round(self, seconds: float) -> None:
        """A timed forward of the decode rows alone."""
        self.base = seconds if self.base is None else (1 - EMA) * self.base + EMA * seconds

    def add_mixed(self, n: int, ctx: int, seconds: float) -> None:
        """A timed forward that carried `n` cut rows starting at `ctx` beside the decode rows."""
        if n > 0 and self.base is not None:
            n = self.charged(n)
            self.samples.append((1.0, n, n * (ctx + n / 2), max(0.0, seconds - self.base)))

    def coefficients(self) -> tuple[float, float, float] | None:
        """(a, u, k) from the recent samples, or None before the first: the non-negative fit with
        the least squared error (every subset of the terms solved exactly; the first of TERMS among
        those within rounding of the least)."""
        if not self.samples:
            return None
        x = np.array([s[:3] for s in self.samples])
        y = np.array([s[3] for s in self.samples])
        fits = []
        for terms in TERMS:
            cols = x[:, terms]
            c, *_ = np.linalg.lstsq(cols, y, rcond=None)
            if np.all(c >= 0):
                full = np.zeros(3)
                full[list(terms)] = c
                fits.append((float(np.sum((x @ full - y) ** 2)), full))
        if not fits:
            return 0.0, 0.0, 0.0
        least = min(f for f, _ in fits)
        tol = 1e-9 * float(np.sum(y ** 2)) + 1e-18
        a, u, k = next(c for f, c in fits if f <= least + tol)
        return float(a), float(u), float(k)

    def predict(self, n: int, ctx: int) -> float | None:
        c = self.coefficients()
        if c is None or self.base is None:
            return None
        a, u, k = c
        n = self.charged(n)
        return self.base + a + u * n + k * n * (ctx + n / 2)

    def rows(self, ctx: int, left: int) -> int:
        """The cut to carry now: the most rows whose predicted forward fits the budget (a size, or
        a multiple of `granule`), at least the smallest (the prompt always moves), at most `most`
        and `left`. Before any mixed forward was timed: the smallest (a probe)."""
        g = self.granule
        small = self.sizes[0] if self.sizes else g
        c = self.coefficients()
        if c is None or self.base is None:
            return min(left, small)
        if self.sizes:
            fit = [s for s in self.sizes if s <= self.most and self.predict(s, ctx) <= self.budget_s]
            return min(left, fit[-1] if fit else small)
        a, u, k = c
        room = self.budget_s - self.base - a
        if room <= 0:
            n = 0.0
        elif k <= 0:
            n = room / u if u > 0 else math.inf
        else:  # (k / 2) n^2 + (u + k ctx) n - room = 0
            b = u + k * ctx
            n = (-b + math.sqrt(b * b + 2 * k * room)) / k
        n = min(float(self.most), n)
        return min(left, max(g, int(n) // g * g))
