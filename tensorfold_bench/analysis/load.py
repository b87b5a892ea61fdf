"""`tfbench load`'s figures, as pure functions of its compact per-request records (no I/O, no
clock), so a saved receipt gives them again.

A record (`Req`) keeps one request's times in seconds from its level's start: `scheduled` (when
the workload meant it to go: its offset, a closed loop's free slot, a later turn's previous
reply plus its think time), `released` (when --max-concurrency let it go: the wait is
queueing), `sent`, every token's gap (`gaps_us`: from the send to the first token, then
between tokens, 0 inside a chunk) and `ended`.

Per level, over the measured requests (warm-up and injected ones left out):
- TTFT (first token from the send), inter-token gaps (every gap, pooled), TPOT (per request:
  (last token - first token) / (tokens - 1)), end-to-end (reply's end - send), each p50, p90,
  p99 and max in ms; TTFT and end-to-end also from the scheduled send (coordinated omission: a
  late send or a queue at the client cannot hide the wait).
- Request and output-token throughput: completed requests and their tokens over the span
  (first send to last end).
- Goodput (DistServe): requests meeting every SLO bound (TTFT and end-to-end counted from the
  scheduled send) per second of the span; attainment = their share of the requests.
- Lateness: send - release, the client's own delay; a run whose p99 passes the self-check's
  bound is invalid.
- Interference (`--inject`): each injected prompt's window W = (its send, its first token].
  Background gaps that overlap a window against those that overlap none (longest pause, p99),
  the TTFT p99 of background requests sent inside a window against outside, and the injected
  prompts' own first token.
"""
from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field

import numpy as np

from tensorfold_bench.client.selfcheck import BOUNDS
from tensorfold_bench.errors import FlagError

PCTS = (50, 90, 99)
LABELS = {"ttft": "TTFT", "itl": "inter-token", "tpot": "TPOT", "e2e": "end-to-end",
          "ttft_sched": "TTFT from schedule", "e2e_sched": "end-to-end from schedule"}
SLO_KEYS = ("ttft", "tpot", "e2e")
LATE_P99_S = BOUNDS.late_s  # the self-check's bound on a send's lateness, here on the p99


# ---- the SLO -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Slo:
    """Bounds in seconds; None: not bounded."""

    ttft: float | None = None
    tpot: float | None = None
    e2e: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        return ", ".join(f"{k} {_ms(v)}" for k, v in asdict(self).items() if v is not None) or "none"

    @property
    def empty(self) -> bool:
        return all(v is None for v in asdict(self).values())


def _ms(s: float) -> str:
    return f"{s * 1000:g} ms" if s < 1 else f"{s:g} s"


def parse_slo(text: str | None) -> Slo:
    """`ttft=500ms,tpot=50ms,e2e=10s`: each bound needs its unit (ms or s)."""
    if not text:
        return Slo()
    out: dict[str, float] = {}
    for part in text.split(","):
        key, sep, val = part.strip().partition("=")
        key = key.strip().lower()
        if not sep or key not in SLO_KEYS:
            raise FlagError("--slo", f"{part.strip()!r}: expected KEY=VALUE with KEY one of {', '.join(SLO_KEYS)}")
        if key in out:
            raise FlagError("--slo", f"{key} is given twice")
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[-+]?[0-9]+)?)\s*(ms|s)\s*", val, re.IGNORECASE)
        if not m:
            raise FlagError("--slo", f"{key}={val.strip()}: a positive number with its unit, ms or s (e.g. {key}=500ms)")
        v = float(m.group(1)) * (0.001 if m.group(2).lower() == "ms" else 1.0)
        if not (v > 0 and math.isfinite(v)):
            raise FlagError("--slo", f"{key}={val.strip()}: must be positive")
        out[key] = v
    return Slo(**out)


# ---- one request's record ------------------------------------------------------------------

@dataclass
class Req:
    """One request as the receipt keeps it (times in seconds from the level's start)."""

    id: str
    kind: str = "load"  # load or inject
    warmup: bool = False
    scheduled: float | None = None
    released: float | None = None
    sent: float | None = None
    gaps_us: list[int] = field(default_factory=list)
    ended: float | None = None
    error: str | None = None
    prompt_len: int = 0
    max_tokens: int = 0
    tokens: int = 0
    cached: int | None = None  # the server's cached prompt tokens; None: not reported
    sha: str | None = None  # the reply's 12-hex token hash; None: unknown (no ids) or no reply
    pkey: str | None = None  # 12-hex hash of the prompt sent (and its options): the plain reference's key
    session: str | None = None
    turn: int = 0

    def __post_init__(self):
        # times to the microsecond, as the receipt keeps them: figures read the same values in
        # memory as from the receipt
        for k in ("scheduled", "released", "sent", "ended"):
            if getattr(self, k) is not None:
                setattr(self, k, round(getattr(self, k), 6))

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def times(self) -> list[float]:
        """Each token's time (seconds from the level's start)."""
        if self.sent is None:
            return []
        out, t = [], self.sent
        for g in self.gaps_us:
            t += g / 1e6
            out.append(t)
        return out

    @property
    def ok(self) -> bool:
        return self.error is None and self.sent is not None and bool(self.gaps_us)

    @property
    def ttft(self) -> float | None:
        return self.gaps_us[0] / 1e6 if self.sent is not None and self.gaps_us else None

    @property
    def lead(self) -> float:
        """Scheduled to sent: queueing at the client and the send's lateness."""
        return (self.sent - self.scheduled) if self.sent is not None and self.scheduled is not None else 0.0

    @property
    def lateness(self) -> float | None:
        """Release to send: the client's own delay (None: not sent)."""
        if self.sent is None:
            return None
        ref = self.released if self.released is not None else self.scheduled
        return None if ref is None else self.sent - ref

    @property
    def tpot(self) -> float | None:
        if not self.ok or len(self.gaps_us) < 2:
            return None
        return sum(self.gaps_us[1:]) / 1e6 / (len(self.gaps_us) - 1)

    @property
    def e2e(self) -> float | None:
        if not self.ok:
            return None
        end = self.ended if self.ended is not None else self.times[-1]
        return end - self.sent


def measured(reqs: list[Req]) -> list[Req]:
    """The requests the figures count: the background load, warm-up left out."""
    return [r for r in reqs if r.kind == "load" and not r.warmup]


# ---- figures -------------------------------------------------------------------------------

def pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(values), q)) if values else None


def summary(values: list[float]) -> dict[str, float | None]:
    """p50, p90, p99 and max, in ms."""
    ms = [v * 1000 for v in values]
    return {**{f"p{q}": pct(ms, q) for q in PCTS}, "max": max(ms) if ms else None}


def meets(r: Req, slo: Slo) -> bool:
    """Every bound held (TTFT and end-to-end from the scheduled send); a failed request never does."""
    if not r.ok or r.tokens < r.max_tokens:
        return False
    # a one-token reply has no TPOT: nothing to hold against that bound
    checks = ((slo.ttft, r.ttft + r.lead), (slo.tpot, r.tpot if r.tpot is not None else 0.0),
              (slo.e2e, (r.e2e or 0.0) + r.lead))
    return all(bound is None or v <= bound for bound, v in checks)


def latencies(reqs: list[Req]) -> dict[str, list[float]]:
    ok = [r for r in reqs if r.ok]
    return {"ttft": [r.ttft for r in ok], "itl": [g / 1e6 for r in ok for g in r.gaps_us[1:]],
            "tpot": [r.tpot for r in ok if r.tpot is not None], "e2e": [r.e2e for r in ok],
            "ttft_sched": [r.ttft + r.lead for r in ok], "e2e_sched": [r.e2e + r.lead for r in ok]}


def span(reqs: list[Req]) -> float | None:
    """First send to the last reply's end."""
    sends = [r.sent for r in reqs if r.sent is not None]
    ends = [r.ended for r in reqs if r.ended is not None]
    if not sends or not ends or max(ends) <= min(sends):
        return None
    return max(ends) - min(sends)


def level_figures(reqs: list[Req], slo: Slo, late_bound: float = LATE_P99_S) -> dict:
    """One level's figures over its measured requests (see the module docstring)."""
    m = measured(reqs)
    ok = [r for r in m if r.ok]
    lat = latencies(m)
    wall = span(m)
    late = [x for x in (r.lateness for r in m) if x is not None]
    good = sum(meets(r, slo) for r in m)
    cached = [r.cached for r in m if r.ok and r.cached is not None]
    queued = [max(r.released - r.scheduled, 0.0) for r in m if r.released is not None and r.scheduled is not None]
    f = {"requests": len(m), "completed": len(ok), "failed": len(m) - len(ok),
         "span_s": wall, "req_s": len(ok) / wall if wall else None,
         "out_tok_s": sum(r.tokens for r in ok) / wall if wall else None,
         "goodput": (good / wall if wall else None) if not slo.empty else None,
         "slo_met": good if not slo.empty else None,
         "attainment_pct": (100 * good / len(m) if m else None) if not slo.empty else None,
         "latency": {k: summary(v) for k, v in lat.items()},
         "late_ms": summary(late), "queued_ms": summary(queued) if any(queued) else None,
         "cached_tokens": sum(cached) if cached else None,
         "cache_hits": sum(1 for c in cached if c > 0) if cached else None,
         "interference": interference(reqs)}
    reasons = [f"{r.id} failed: {r.error}" for r in m if r.error][:5]
    if len(m) - len(ok) > 5:
        reasons.append(f"... {len(m) - len(ok) - 5} more failed")
    lp99 = pct(late, 99)
    if lp99 is not None and lp99 > late_bound:
        reasons.append(f"send lateness p99 {lp99 * 1000:.0f} ms (bound {late_bound * 1000:g} ms): "
                       "the client did not keep the schedule")
    f["invalid"] = reasons
    return f


def windows(reqs: list[Req]) -> list[tuple[float, float]]:
    """(send, first token] of every injected prompt that got its first token."""
    return [(r.sent, r.times[0]) for r in reqs if r.kind == "inject" and r.ok]


def _overlaps(a: float, b: float, wins: list[tuple[float, float]]) -> bool:
    return any(a < hi and b > lo for lo, hi in wins)


def interference(reqs: list[Req]) -> dict | None:
    """The background's gaps and first tokens inside the injected prompts' fill windows against
    outside them; the injected prompts' own first token. None without injected prompts."""
    inj = [r for r in reqs if r.kind == "inject"]
    if not inj:
        return None
    wins = windows(reqs)
    bg = [r for r in reqs if r.kind == "load" and not r.warmup and r.ok]
    inside, outside = [], []
    for r in bg:
        t = r.times
        for a, b in zip(t, t[1:]):
            (inside if _overlaps(a, b, wins) else outside).append(b - a)
    sent_in = [r.ttft for r in bg if any(lo < r.sent <= hi for lo, hi in wins)]
    sent_out = [r.ttft for r in bg if not any(lo < r.sent <= hi for lo, hi in wins)]
    ms = lambda xs, q: None if not xs else (max(xs) if q == "max" else pct(xs, q)) * 1000  # noqa: E731
    return {"injected": len(inj), "filled": len(wins),
            "window_s": sum(hi - lo for lo, hi in wins),
            "inject_ttft_ms": [round(r.ttft * 1000, 3) if r.ttft is not None else None for r in inj],
            "inject_ttft_p50_ms": ms([r.ttft for r in inj if r.ttft is not None], 50),
            "pause_in_ms": ms(inside, "max"), "pause_out_ms": ms(outside, "max"),
            "itl_p99_in_ms": ms(inside, 99), "itl_p99_out_ms": ms(outside, 99),
            "gaps_in": len(inside), "gaps_out": len(outside),
            "ttft_p99_in_ms": ms(sent_in, 99), "ttft_p99_out_ms": ms(sent_out, 99),
            "sent_in": len(sent_in), "sent_out": len(sent_out)}


# ---- a run's flat figures (what statistics and predictions name) ---------------------------

def flat(level: str, f: dict) -> dict[str, float | None]:
    """A level's headline figures under flat names `FIGURE@LEVEL` (statistics, predictions)."""
    lat = f["latency"]
    out = {f"goodput@{level}": f["goodput"], f"attainment@{level}": f["attainment_pct"],
           f"req_s@{level}": f["req_s"], f"out_tok_s@{level}": f["out_tok_s"],
           f"ttft_p50@{level}": lat["ttft"]["p50"], f"ttft_p99@{level}": lat["ttft"]["p99"],
           f"tpot_p50@{level}": lat["tpot"]["p50"], f"tpot_p99@{level}": lat["tpot"]["p99"],
           f"itl_p99@{level}": lat["itl"]["p99"], f"e2e_p50@{level}": lat["e2e"]["p50"],
           f"e2e_p99@{level}": lat["e2e"]["p99"], f"ttft_sched_p99@{level}": lat["ttft_sched"]["p99"]}
    inj = f.get("interference")
    if inj:
        out.update({f"pause_in@{level}": inj["pause_in_ms"], f"itl_p99_in@{level}": inj["itl_p99_in_ms"],
                    f"ttft_p99_in@{level}": inj["ttft_p99_in_ms"], f"inject_ttft@{level}": inj["inject_ttft_p50_ms"]})
    return out


JUDGED = ("goodput", "out_tok_s", "ttft_p99", "tpot_p99", "e2e_p99")  # the verdict rows a receipt shows per level


def family(name: str) -> str:
    return name.split("@", 1)[0]


FAMILIES = ("goodput", "attainment", "req_s", "out_tok_s", "ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99",
            "itl_p99", "e2e_p50", "e2e_p99", "ttft_sched_p99", "pause_in", "itl_p99_in", "ttft_p99_in", "inject_ttft")


def predictable(levels: list[str]) -> set[str]:
    """The names a load prediction may use: every flat figure at every level."""
    return {f"{k}@{lv}" for k in FAMILIES for lv in levels}
