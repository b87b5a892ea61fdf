"""Pure functions from raw stream records to figures. No I/O, no clock.

Long-prompt figures (DESIGN.md, "Scenarios"), with W = (B send, B first token]:
- B first token: B's first token time - B's send time; C likewise from C's send.
- A's longest pause: the largest gap t[i+1] - t[i] between consecutive A tokens such that the
  gap overlaps W: t[i] < B first token and t[i+1] > B send. A gap that spans B's send (or B's
  first token) counts whole. A gap that ends exactly at B's send, or starts exactly at B's first
  token, does not. Tokens of one chunk share a time, so their gaps are 0.
- A during B: A tokens with B send < t <= B first token, divided by the length of W.
- A before: the window (s, B send] of the same length, where s = max(B send - |W|, A's first
  token): A tokens inside it divided by its length (A's first token itself is its start and
  is not counted).
"""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field

from tensorfold_bench.client import StreamRecord

LATE_LIMIT_S = 0.25  # a send later than this against its script time makes the run invalid


@dataclass
class LongPromptFigures:
    b_first_token: float | None
    c_first_token: float | None
    a_longest_pause: float | None
    a_rate_during: float | None  # A tok/s while B fills
    a_rate_before: float | None  # A tok/s in the equal window before B's send
    a_tokens_during: int
    window: float | None  # |W| in seconds
    lateness: dict[str, float | None]  # per stream: send - script time
    valid: bool
    invalid_reasons: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "LongPromptFigures":
        return cls(**d)


def first_token_latency(rec: StreamRecord) -> float | None:
    if rec.sent is None or not rec.token_times:
        return None
    return rec.token_times[0] - rec.sent


def longest_pause(times: list[float], lo: float, hi: float) -> float | None:
    """Largest gap between consecutive times that overlaps the window (lo, hi); None if no gap
    does (fewer than two tokens, or every gap outside the window)."""
    best = None
    for a, b in zip(times, times[1:]):
        if a < hi and b > lo:
            g = b - a
            best = g if best is None or g > best else best
    return best


def count_in(times: list[float], lo: float, hi: float) -> int:
    """Tokens with lo < t <= hi."""
    return sum(1 for t in times if lo < t <= hi)


def rate_before(times: list[float], b_send: float, length: float) -> float | None:
    if not times or length <= 0:
        return None
    start = max(b_send - length, times[0])
    if start >= b_send:
        return None
    return count_in(times, start, b_send) / (b_send - start)


def lateness(rec: StreamRecord) -> float | None:
    if rec.scheduled is None or rec.sent is None:
        return None
    return rec.sent - rec.scheduled


def long_prompt_figures(a: StreamRecord, b: StreamRecord, c: StreamRecord,
                        late_limit: float = LATE_LIMIT_S) -> LongPromptFigures:
    reasons: list[str] = []
    for rec in (a, b, c):
        if rec.error:
            reasons.append(f"{rec.name} failed: {rec.error}")
    late = {r.name: lateness(r) for r in (a, b, c)}
    for name, v in late.items():
        if v is not None and v > late_limit:
            reasons.append(f"{name} was sent {v:.3f} s late (limit {late_limit} s)")
    b_ft, c_ft = first_token_latency(b), first_token_latency(c)
    if b_ft is None:
        reasons.append("B got no token")
    if c_ft is None:
        reasons.append("C got no token")
    cached = ((b.usage or {}).get("prompt_tokens_details") or {}).get("cached_tokens")
    if cached:
        reasons.append(f"B's prompt hit the prompt cache ({cached} tokens): not cold")

    pause = during = before = None
    n_during, window = 0, None
    times = a.token_times
    if b_ft is not None and b.sent is not None:
        lo, hi = b.sent, b.token_times[0]
        window = hi - lo
        if not times or times[0] >= lo:
            reasons.append("A had no token before B's send: B did not overlap A's decoding")
        a_end = a.ended if a.ended is not None else (times[-1] if times else None)
        a_done_early = (not a.cancelled) and (a_end is not None and a_end < hi)
        if a_done_early or not times or times[-1] < lo:
            reasons.append("A stopped decoding before B's first token: B did not overlap A's decoding")
        pause = longest_pause(times, lo, hi)
        if pause is None and times and times[0] < lo:
            pause = window  # A's last token came before the window and none after it
        n_during = count_in(times, lo, hi)
        during = n_during / window if window > 0 else None
        before = rate_before(times, lo, window)
    return LongPromptFigures(b_ft, c_ft, pause, during, before, n_during, window, late,
                             valid=not reasons, invalid_reasons=reasons)


def median(values: list[float | None]) -> float | None:
    vs = [v for v in values if v is not None]
    return statistics.median(vs) if vs else None


FIGURES = ("b_first_token", "c_first_token", "a_longest_pause", "a_rate_during", "a_rate_before")


def medians(figs: list[LongPromptFigures]) -> dict[str, float | None]:
    """Median of each figure over the valid runs only."""
    ok = [f for f in figs if f.valid]
    return {k: median([getattr(f, k) for f in ok]) for k in FIGURES}
