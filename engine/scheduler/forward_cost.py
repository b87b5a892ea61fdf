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
    # the last sample at each cut size, kept past the window: a budget that settles on one size
    # still tells the fixed cost from the rows' by the others
    latest: dict = field(default_factory=dict)
    _fit: tuple | None = field(default=None, repr=False)  # coefficients() of the current samples

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
            self.samples.append(sample := (1.0, n, n * (ctx + n / 2), max(0.0, seconds - self.base)))
            self.latest[n] = sample
            self._fit = None

    def _fitted(self) -> list[tuple]:
        """The window's samples and the last of each size it no longer holds."""
        held = {s[1] for s in self.samples}
        return [*self.samples, *(v for n, v in self.latest.items() if n not in held)]

    def coefficients(self) -> tuple[float, float, float] | None:
        """(a, u, k) from the recent samples, or None before the first: the non-negative fit with
        the least squared error (every subset of the terms solved exactly; the first of TERMS among
        those within rounding of the least)."""
        if not self.samples:
            return None
        if self._fit is None:  # once a sample, not once a size asked about: the host asks every forward
            self._fit = self._solve()
        return self._fit

    def _solve(self) -> tuple[float, float, float]:
        # the normal equations of the three terms, each subset of them solved exactly (3x3 at most:
        # plain Python, microseconds, on the host's path between forwards)
        samples = self._fitted()
        sc = [max(abs(s[i]) for s in samples) or 1.0 for i in range(3)]  # columns of one scale
        rows = [[s[i] / sc[i] for i in range(3)] for s in samples]
        ys = [s[3] for s in samples]
        gram = [[sum(r[i] * r[j] for r in rows) for j in range(3)] for i in range(3)]
        xty = [sum(r[i] * y for r, y in zip(rows, ys)) for i in range(3)]
        yty = sum(y * y for y in ys)
        fits = []
        for terms in TERMS:
            c = solve([[gram[i][j] for j in terms] for i in terms], [xty[i] for i in terms])
            if c is None or min(c) < 0:
                continue
            full = [0.0, 0.0, 0.0]
            for t, v in zip(terms, c):
                full[t] = v
            err = yty - 2 * sum(full[i] * xty[i] for i in range(3)) + sum(
                full[i] * gram[i][j] * full[j] for i in range(3) for j in range(3))
            fits.append((err, full))
        if not fits:
            return 0.0, 0.0, 0.0
        least = min(f for f, _ in fits)
        tol = 1e-9 * yty + 1e-18
        a, u, k = next(c for f, c in fits if f <= least + tol)
        return a / sc[0], u / sc[1], k / sc[2]

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
        and `left`. Before any mixed forward was timed: the smallest (a probe); with sizes, while
        only one was timed and it fit: the next one up (a second probe, so that the fit can tell
        the forward's fixed cost from its rows'); never more than one size past the largest timed."""
        g = self.granule
        small = self.sizes[0] if self.sizes else g
        c = self.coefficients()
        if c is None or self.base is None:
            return min(left, small)
        if self.sizes:
            # a size past the largest timed one only a step at a time: the fit extrapolates up there (two
            # probes at a prompt's start cannot see the attention's term), and on qwen3-32b it sent a
            # 1,024-row cut into a 64 ms budget: 122 ms, A's longest pause
            top = max(self.latest, default=0)
            step = next((s for s in self.sizes if s > top), top)
            fit = [s for s in self.sizes if s <= min(self.most, step) and self.predict(s, ctx) <= self.budget_s]
            if len(self.latest) == 1 and fit:  # one size timed: rows and fixed cost are one number yet
                seen = next(iter(self.latest))
                up = [s for s in self.sizes if seen < s <= self.most]
                if seen in fit and up:
                    return min(left, up[0])  # try the next size once
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


def solve(m: list[list[float]], v: list[float]) -> list[float] | None:
    """m c = v by Gaussian elimination with partial pivoting; None where m is singular (terms the
    samples cannot tell apart: one cut size for the rows and the intercept). The simulator's cost
    fits (engine/scheduler/costs.py) solve with it too."""
    n = len(v)
    a = [row[:] + [v[i]] for i, row in enumerate(m)]
    scale = max(abs(x) for row in m for x in row) or 1.0
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(a[r][col]))
        if abs(a[piv][col]) <= 1e-12 * scale:
            return None
        a[col], a[piv] = a[piv], a[col]
        for r in range(col + 1, n):
            f = a[r][col] / a[col][col]
            for c in range(col, n + 1):
                a[r][c] -= f * a[col][c]
    out = [0.0] * n
    for r in range(n - 1, -1, -1):
        out[r] = (a[r][n] - sum(a[r][c] * out[c] for c in range(r + 1, n))) / a[r][r]
    return out
