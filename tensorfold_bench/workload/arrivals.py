"""When open-loop requests go out: seeded arrival offsets (seconds from the run's start).

The gaps are drawn with mean 1 and divided by the rate, so every rate of one seed replays the
same pattern of gaps, only faster or slower: the rates of a sweep differ in rate alone, not in
their luck of the draw. The first request goes out at 0 (as in vLLM's benchmark)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tensorfold_bench.workload.ids import rng

ARRIVALS = ("poisson", "gamma", "constant")
_CHUNK = 1024  # gaps drawn at a time; a Generator's draws do not depend on how they are chunked


@dataclass(frozen=True)
class Arrivals:
    """An arrival process. gamma: shape = burstiness, mean gap 1/rate (vLLM's --burstiness):
    below 1 burstier than Poisson, above 1 steadier; 1 is Poisson. constant: every 1/rate."""

    kind: str = "poisson"
    burstiness: float = 1.0

    def unit_gaps(self, g: np.random.Generator, n: int) -> np.ndarray:
        """n gaps of mean 1."""
        if self.kind == "constant":
            return np.ones(n)
        if self.kind == "poisson":
            return g.standard_exponential(n)
        return g.gamma(self.burstiness, 1.0 / self.burstiness, n)

    def offsets(self, rate: float, *, seed: int, requests: int | None = None,
                duration: float | None = None) -> list[float]:
        """Send offsets at `rate` requests/s: the first at 0, then one per gap, stopping after
        `requests` offsets or before the first offset at or past `duration` seconds (whichever
        comes first; at least one of them must be given)."""
        if requests is None and duration is None:
            raise ValueError("offsets need requests or duration")
        g = rng(seed, f"arrivals:{self.kind}:{self.burstiness!r}")
        out: list[float] = []
        t = 0.0
        while True:
            for gap in self.unit_gaps(g, _CHUNK):
                if (requests is not None and len(out) >= requests) or (duration is not None and t >= duration):
                    return out
                out.append(t)
                t += float(gap) / rate

    def describe(self) -> str:
        return f"gamma arrivals (burstiness {self.burstiness:g})" if self.kind == "gamma" else f"{self.kind} arrivals"
