"""Statistics of a comparison: is `new` better, worse, or within the noise of `base`?

Runs go in an order such as base/new/new/base, so that a drift of the machine (thermal, a
neighbour's load, a cache warming up) hits both sides alike. The rule, for one figure:

1. Every run has one value (None for a run marked invalid: it is left out, not averaged in).
2. **Pairs.** Each run of the compared variant is paired with its *adjacent* base runs: the
   nearest valid base run before it and the nearest valid base run after it in the run order
   (one of them when it sits at an end). base/new/new/base gives four pairs:
   (n1, b1), (n1, b2), (n2, b1), (n2, b2).
3. **Ratios.** Each pair gives a log-ratio `log(new / base)` (when every value is positive;
   otherwise the difference divided by the base median's magnitude). A drift that moves both
   sides moves both members of a pair and cancels in its ratio; a linear drift across
   base/new/new/base gives pairs of opposite signs whose median is the true effect.
4. **Estimate and interval.** The estimate is the *median* log-ratio over pairs; its interval
   is a seeded percentile bootstrap (`scipy.stats.bootstrap`, 95 %, 9,999 resamples) of that
   median. With two new and two base runs the interval is close to the pairs' min..max; each
   run sits in at most half the pairs, so a single outlier run widens the interval towards
   "within noise" but can never manufacture a "better" or a "worse". With more runs (e.g.
   base/new/new/base three times) the median shrugs an outlier off and the interval narrows.
5. **Verdict**, with a margin `m` (default 2 %) in log terms, and knowing whether higher is
   better: "worse" when the whole interval lies beyond `m` on the worse side, "better" when it
   lies beyond `m` on the better side, otherwise "within noise". So a change must clear both
   the noise (the interval) and the margin. Fewer than two pairs give "n/a" (no noise
   estimate). An optional `slack`, in the figure's own unit, is a floor the medians'
   difference must also clear: for a time that depends on where an arrival lands inside a
   prompt cut (a short chat sent during a long prompt waits for the cut in progress: anything
   from nothing to a whole cut), a phase the run cannot control, not a change of the engine.

Reported beside the verdict, for the table: every run's value per variant, each variant's
median, base's span (min..max), new vs base in percent (of the medians), and the paired
estimate with its interval in percent.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from statistics import median
from typing import Sequence

import numpy as np
from scipy import stats as sps

WITHIN, BETTER, WORSE, NA = "within noise", "better", "worse", "n/a"
DEFAULT_MARGIN = 0.02
DEFAULT_CONFIDENCE = 0.95
DEFAULT_RESAMPLES = 9999


def by_variant(order: Sequence[str], values: Sequence[float | None]) -> dict[str, list[float]]:
    """Each variant's valid run values, in run order."""
    if len(order) != len(values):
        raise ValueError(f"{len(order)} runs in the order but {len(values)} values")
    out: dict[str, list[float]] = {}
    for name, v in zip(order, values):
        out.setdefault(name, [])
        if v is not None and not math.isnan(v):
            out[name].append(float(v))
    return out


def adjacent_pairs(order: Sequence[str], values: Sequence[float | None], variant: str,
                   base: str) -> list[tuple[int, int]]:
    """(variant run index, base run index) for each variant run and its nearest valid base run
    on each side in the run order."""
    ok = [v is not None and not math.isnan(v) for v in values]
    bases = [i for i, n in enumerate(order) if n == base and ok[i]]
    out = []
    for i, n in enumerate(order):
        if n != variant or not ok[i] or (variant == base):
            continue
        before = [j for j in bases if j < i]
        after = [j for j in bases if j > i]
        if before:
            out.append((i, before[-1]))
        if after:
            out.append((i, after[0]))
    return out


@dataclass
class Comparison:
    """One variant against base, for one figure."""

    variant: str
    base: str
    higher_is_better: bool
    median: float | None
    base_median: float | None
    pct: float | None  # median vs base median, in percent
    paired_pct: float | None  # the paired estimate, in percent
    interval_pct: tuple[float, float] | None
    pairs: int
    margin_pct: float
    verdict: str
    slack: float = 0.0  # the medians' difference had to clear this too (the figure's unit)

    def to_dict(self) -> dict:
        return asdict(self)


def _median_of(x, axis=-1):
    return np.median(x, axis=axis)


def paired_ratios(order: Sequence[str], values: Sequence[float | None], variant: str,
                  base: str) -> tuple[list[float], bool]:
    """The pairs' log-ratios (or base-scaled differences when a value is not positive) and
    whether they are log-ratios."""
    pairs = adjacent_pairs(order, values, variant, base)
    if not pairs:
        return [], True
    used = [values[i] for p in pairs for i in p]
    if all(v > 0 for v in used):
        return [math.log(values[i] / values[j]) for i, j in pairs], True
    scale = abs(median(by_variant(order, values)[base]))
    if scale == 0:
        scale = max(abs(v) for v in used) or 1.0
    return [(values[i] - values[j]) / scale for i, j in pairs], False


def compare(order: Sequence[str], values: Sequence[float | None], variant: str, base: str, *,
            higher_is_better: bool = True, margin: float = DEFAULT_MARGIN,
            confidence: float = DEFAULT_CONFIDENCE, resamples: int = DEFAULT_RESAMPLES,
            seed: int = 0, slack: float = 0.0) -> Comparison:
    """The module docstring's rule for `variant` against `base`."""
    runs = by_variant(order, values)
    mine, theirs = runs.get(variant, []), runs.get(base, [])
    med = median(mine) if mine else None
    bmed = median(theirs) if theirs else None
    pct = (med / bmed - 1) * 100 if med is not None and bmed not in (None, 0) else None
    r, logs = paired_ratios(order, values, variant, base)
    to_pct = (lambda x: (math.exp(x) - 1) * 100) if logs else (lambda x: x * 100)
    m = math.log1p(margin) if logs else margin
    if len(r) < 2:
        return Comparison(variant, base, higher_is_better, med, bmed, pct,
                          to_pct(r[0]) if r else None, None, len(r), margin * 100, NA)
    est = float(np.median(r))
    if max(r) - min(r) < 1e-12:
        lo = hi = est
    else:
        res = sps.bootstrap((np.asarray(r),), _median_of, n_resamples=resamples,
                            confidence_level=confidence, method="percentile", vectorized=True,
                            rng=np.random.default_rng(seed))
        lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
    sign = 1 if higher_is_better else -1
    good_lo, good_hi = sorted((sign * lo, sign * hi))  # in "better is positive" terms
    if good_hi < -m:
        verdict = WORSE
    elif good_lo > m:
        verdict = BETTER
    else:
        verdict = WITHIN
    if slack and med is not None and bmed is not None and abs(med - bmed) <= slack:
        verdict = WITHIN
    return Comparison(variant, base, higher_is_better, med, bmed, pct, to_pct(est),
                      (to_pct(lo), to_pct(hi)), len(r), margin * 100, verdict, slack)


@dataclass
class FigureStats:
    """A figure across every variant: the statistics columns of a receipt's table."""

    figure: str
    higher_is_better: bool
    order: list[str]
    values: list[float | None]
    base: str
    runs: dict[str, list[float]] = field(default_factory=dict)
    medians: dict[str, float | None] = field(default_factory=dict)
    base_span: tuple[float, float] | None = None
    comparisons: dict[str, Comparison] = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["comparisons"] = {k: c.to_dict() for k, c in self.comparisons.items()}
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "FigureStats":
        d = dict(d)
        comps = {k: Comparison(**{**c, "interval_pct": tuple(c["interval_pct"])
                                  if c.get("interval_pct") else None})
                 for k, c in d.pop("comparisons", {}).items()}
        span = d.pop("base_span", None)
        return cls(**d, base_span=tuple(span) if span else None, comparisons=comps)


def figure_stats(figure: str, order: Sequence[str], values: Sequence[float | None], base: str, *,
                 higher_is_better: bool = True, margin: float = DEFAULT_MARGIN,
                 seed: int = 0, slack: float = 0.0) -> FigureStats:
    """Every variant in `order` against `base` for one figure."""
    runs = by_variant(order, values)
    fs = FigureStats(figure, higher_is_better, list(order), [None if v is None else float(v)
                                                              for v in values], base, runs)
    fs.medians = {k: (median(v) if v else None) for k, v in runs.items()}
    if runs.get(base):
        fs.base_span = (min(runs[base]), max(runs[base]))
    for name in runs:
        if name != base:
            fs.comparisons[name] = compare(order, values, name, base,
                                           higher_is_better=higher_is_better, margin=margin,
                                           seed=seed, slack=slack)
    return fs


def fmt_pct(x: float | None) -> str:
    return "–" if x is None else f"{x:+.1f}%"


def describe(c: Comparison) -> str:
    """One cell: `-4.9% [-5.6, -4.1] worse`."""
    if c.interval_pct is None:
        return f"{fmt_pct(c.pct)} {c.verdict}"
    lo, hi = c.interval_pct
    return f"{fmt_pct(c.pct)} [{lo:+.1f}, {hi:+.1f}] {c.verdict}"
