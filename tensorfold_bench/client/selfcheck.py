"""The client's self-check, carried by every receipt: was the client what got measured?

While a run plays, `Watch` wakes every `tick_s` and keeps how late each wake-up was (the event
loop's lag: a token that arrived then waited that long before it was stamped), and the CPU the
harness process used. Each request's send lateness against its schedule, and the streams open
at once, come from the scenario. A run whose loop lag p99 or latest send passes its bound was
limited by the client, so it is marked invalid with the reason, as a late send always was.

Absolute bounds are loose next to a fast server, so the check is also held against what the run
measures: the sends' lateness p99 past a tenth of the median figure the run reports, the loop's
lag p99 past a tenth of its tail figure (`judge`, e.g. TTFT p50 and p99: a client 2 ms late
cannot time a 5 ms first token); an open loop's sends whose gaps left the schedule's
distribution (`arrival_fit`: the arrivals the server saw were not the process asked for); and
an event loop busy nearly all the time streams were open, hardly ever waiting for I/O
(saturated: whatever it stamps waited for it). Each receipt then says the highest level the
client held on this host (`held`).
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
from scipy import stats

from tensorfold_bench.client import timer
from tensorfold_bench.client.stream import OpenStreams, clock


@dataclass(frozen=True)
class Bounds:
    """Past these, the client was the bottleneck and the run is invalid."""

    # the loop's wake-up lag while streams are open, p99 over the run: a healthy client on a
    # 2-core host loaded three times over by other work measured up to 6 ms; a starved one, tens
    lag_p99_s: float = 0.02
    late_s: float = 0.25  # any send later than this against its schedule
    share: float = 0.1  # send lateness p99 against the run's median figure, loop lag p99 against its tail
    # the client's event loop busy (not waiting for I/O) this share of the time streams were open:
    # saturated, every read waited for it (a loop starved of CPU by other work counts too)
    busy: float = 0.9
    # an open loop's send gaps against its scheduled gaps: the two-sample Kolmogorov-Smirnov
    # distance (2,000 Poisson sends at 1,000/s each up to 0.3 ms late at random: 0.014; sends
    # bunched into 50 ms windows: over 0.5)
    ks: float = 0.1
    cv: float = 0.15  # constant arrivals: the send gaps' coefficient of variation (0 when kept)

    def to_dict(self) -> dict:
        return {"lag_p99_ms": self.lag_p99_s * 1000, "late_ms": self.late_s * 1000, "share": self.share,
                "busy": self.busy, "ks": self.ks, "cv": self.cv}


BOUNDS = Bounds()


class Watch:
    """Measures the running event loop's lag, the share of its time it was busy (not waiting in
    its selector for I/O) and the process's CPU between start and stop. Lag and the busy share
    count only ticks that began and ended with `busy()` true (streams open) and saw no quiet moment
    between (`quiet()` unchanged, see `over`): work between bursts, such as decoding the last one
    or collecting garbage before the next, delays no token."""

    def __init__(self, busy: Callable[[], bool] = lambda: True, tick_s: float = 0.005,
                 quiet: Callable[[], int] = lambda: 0):
        self.busy, self.tick_s, self.quiet = busy, tick_s, quiet
        self.procs = 1  # processes whose CPU `cpu_s` sums (tensorfold_bench.client.workers)
        self.lags: list[float] = []
        self._task: asyncio.Task | None = None
        self._waits: timer.Waits | None = None
        self.cpu_s = self.wall_s = 0.0
        # while streams are open: the wall time, and the event loop's part of it spent waiting for
        # I/O (None: not measured); the rest it was busy
        self.open_s, self.open_idle_s = 0.0, 0.0
        # seconds to spare when this loop was ready for a start every process shares (its requests
        # prepared, its connections open), the least over processes; None: no shared start
        self.spare_s: float | None = None

    def spare(self, s: float | None) -> None:
        """Keep the least time to spare (`s`; None: not measured)."""
        if s is not None:
            self.spare_s = s if self.spare_s is None else min(self.spare_s, s)

    async def start_at(self, t: float) -> None:
        """Sleep to a start `t` every process shares, keeping how long this loop had to spare
        (negative: it was ready after the start, so its first sends were late by that much)."""
        self.spare(t - clock())
        await timer.sleep_until(t)

    def add(self, other: "Watch") -> None:
        """Another loop's samples and CPU (a burst played by worker processes) into this one's."""
        self.lags += other.lags
        self.cpu_s += other.cpu_s
        self.open_s += other.open_s
        if self.open_idle_s is not None and other.open_idle_s is not None:
            self.open_idle_s += other.open_idle_s
        self.procs = max(self.procs, other.procs)
        self.spare(other.spare_s)

    def share(self) -> dict:
        """What a worker process sends back of its Watch (its loop and callbacks stay there)."""
        return {"lags": self.lags, "cpu_s": self.cpu_s, "wall_s": self.wall_s, "open_s": self.open_s,
                "open_idle_s": self.open_idle_s, "spare_s": self.spare_s}

    @classmethod
    def of_shares(cls, shares: list[dict]) -> "Watch":
        """One Watch over worker processes' `share()`s, all started together: their lag samples,
        CPU and open time summed, the longest wall time, the least time to spare."""
        watch = cls()
        watch.procs = len(shares)
        for d in shares:
            watch.lags += d["lags"]
            watch.cpu_s += d["cpu_s"]
            watch.wall_s = max(watch.wall_s, d["wall_s"])
            watch.open_s += d["open_s"]
            watch.open_idle_s += d["open_idle_s"] or 0.0
            watch.spare(d["spare_s"])
        return watch

    @classmethod
    def over(cls, streams: OpenStreams) -> "Watch":
        """Busy while `streams` has any open. A wake-up during which they all ended and the next
        burst's opened is not counted: back-to-back bursts leave less than a tick between them,
        and the pause there (a full garbage collection before the next burst, hundreds of ms on a
        loaded host) stamped no token, since none was open."""
        return cls(lambda: streams.now > 0, quiet=lambda: streams.quiet)

    @property
    def _idle(self) -> float:
        """Seconds the loop has waited for I/O (timer.Waits), 0 where it cannot be timed."""
        return self._waits.waited_s if self._waits is not None else 0.0

    async def _tick(self) -> None:
        t, idle = clock(), self._idle
        while True:
            due, was, quiet = clock() + self.tick_s, self.busy(), self.quiet()
            await timer.sleep_until(due)  # the loop's own timers would add up to 1 ms of their rounding
            now = clock()
            if was and self.busy() and self.quiet() == quiet:
                self.lags.append(max(now - due, 0.0))
                self.open_s += now - t
                self.open_idle_s += self._idle - idle
            t, idle = now, self._idle

    async def __aenter__(self) -> "Watch":
        self._cpu0, self._wall0 = time.process_time(), clock()
        self._waits = timer.waits(asyncio.get_running_loop())
        self._task = asyncio.create_task(self._tick())
        return self

    async def __aexit__(self, *exc) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        if self._waits is None:
            self.open_idle_s = None
        self.cpu_s += time.process_time() - self._cpu0
        self.wall_s += clock() - self._wall0


MIN_GAPS = 20  # fewer send gaps than this say nothing about a distribution


def arrival_fit(scheduled: list[float], sent: list[float]) -> dict | None:
    """How far an open loop's sends left their schedule: the gaps between consecutive sends
    against the gaps between consecutive scheduled times (the seeded draw of the process asked
    for, or a trace's own), as the two-sample Kolmogorov-Smirnov distance, and the gaps'
    coefficient of variation (1 for Poisson). A constant schedule (every gap equal) is judged by
    the sends' CV alone. None with too few sends to say."""
    sch, snt = np.diff(np.sort(np.asarray(scheduled, float))), np.diff(np.sort(np.asarray(sent, float)))
    if len(snt) < MIN_GAPS or len(sch) < MIN_GAPS or sch.mean() <= 0:
        return None
    cv = lambda g: float(g.std() / g.mean()) if g.mean() > 0 else None  # noqa: E731
    constant = float(sch.std()) <= 1e-9 * float(sch.mean())
    ks = None if constant else float(stats.ks_2samp(snt, sch).statistic)
    return {"gaps": int(len(snt)), "ks": None if ks is None else round(ks, 4), "cv": round(cv(snt), 4),
            "cv_scheduled": round(cv(sch), 4), "constant": constant}


def summary(watch: Watch, lateness: list[float | None], peaks: dict[int, int] | None = None,
            server_peaks: dict[int, int | None] | None = None, open_peak: int | None = None,
            bounds: Bounds | None = None, server_split: dict[int, tuple[int, int]] | None = None,
            arrivals: dict | None = None, level: dict | None = None, spread: dict[int, float] | None = None) -> dict:
    """The receipt's `client` field: loop lag p99/max (ms), CPU seconds and share of the wall
    time, send lateness p99/max (ms), per level the streams open at once (the client's count,
    the fewest over its batches, and where the server says, the server's; a level with fewer is
    invalid; `server_split`: at a level queued behind fewer lanes, the server's running and
    waiting streams at that count) or, for a script without levels, the most streams open at once
    (`open_peak`); per level the widest spread of a burst's sends (`spread`, ms: how together its
    streams started); an open loop's `arrival_fit`; the `level` ({label, value}) when the check is
    one level's; and the reasons the run is invalid (none: valid)."""
    bounds = bounds or BOUNDS
    lags = np.asarray(watch.lags or [0.0]) * 1000
    late = np.asarray([x for x in lateness if x is not None] or [0.0]) * 1000
    d = {"loop_lag_p99_ms": round(float(np.percentile(lags, 99)), 3), "loop_lag_max_ms": round(float(lags.max()), 3),
         "cpu_s": round(watch.cpu_s, 3),
         "cpu_share": round(watch.cpu_s / watch.wall_s / watch.procs, 3) if watch.wall_s else None,
         "procs": watch.procs,
         "loop_busy": (round(min(max(1 - watch.open_idle_s / watch.open_s, 0.0), 1.0), 3)
                       if watch.open_s > 0 and watch.open_idle_s is not None else None),
         "late_p99_ms": round(float(np.percentile(late, 99)), 3), "late_max_ms": round(float(late.max()), 3),
         "bounds": bounds.to_dict()}
    if peaks is not None:
        d["peak_open"] = {str(k): v for k, v in peaks.items()}
    if server_peaks:
        d["server_open"] = {str(k): v for k, v in server_peaks.items()}
    if server_split:
        d["server_split"] = {str(k): list(v) for k, v in server_split.items()}
    if open_peak is not None:
        d["open_peak"] = open_peak
    if watch.spare_s is not None:
        d["start_spare_ms"] = round(watch.spare_s * 1000, 3)
    if spread:
        d["send_spread_ms"] = {str(k): v for k, v in spread.items()}
    if arrivals is not None:
        d["arrivals"] = arrivals
    if level is not None:
        d["level"] = level
    d["invalid"] = reasons(d, bounds)
    return d


def judge(d: dict, reported: dict[str, float | None], bounds: Bounds | None = None) -> dict:
    """The check held against the figures the run reports (name -> ms, e.g. {"TTFT p50": 5.3}),
    once they are known: kept in the check, its reasons given again."""
    d["reported"] = {k: round(float(v), 3) for k, v in reported.items() if v is not None and v > 0}
    d["invalid"] = reasons(d, bounds)
    return d


def reasons(d: dict, bounds: Bounds | None = None) -> list[str]:
    """Why the client was the bottleneck (empty: it was not); bounds the check does not carry are
    `bounds`' (by default the module's BOUNDS, read when called)."""
    bounds = bounds or BOUNDS
    out = []
    if d["loop_lag_p99_ms"] > bounds.lag_p99_s * 1000:
        out.append(f"the client's event loop lagged {d['loop_lag_p99_ms']:.1f} ms at p99 "
                   f"(bound {bounds.lag_p99_s * 1000:g} ms)")
    if d["late_max_ms"] > bounds.late_s * 1000:
        out.append(f"a request was sent {d['late_max_ms']:.0f} ms late (bound {bounds.late_s * 1000:g} ms)")
    spare = d.get("start_spare_ms")
    if spare is not None and spare < 0:
        out.append(f"a client process was ready {-spare:.1f} ms after the start its processes share (its "
                   "requests prepared and connections opened too late): its first sends were late")
    for level, peak in (d.get("peak_open") or {}).items():
        if peak < int(level):
            out.append(f"at {level} streams the client had at most {peak} open at once")
    b = d.get("bounds") or {}
    share = b.get("share", bounds.share)
    rep = d.get("reported") or {}
    # a late send shifts every request's start (held against the median figure); a late wake-up
    # stamps the tokens that came then (held against the tail figure, where lag p99 lands)
    for what, key, tail in (("event loop lagged", "loop_lag_p99_ms", "p99"), ("sends were late by", "late_p99_ms", "p50")):
        named = {k: v for k, v in rep.items() if k.endswith(tail)} or rep
        if named:
            name, ms = min(named.items(), key=lambda kv: kv[1])
            if d[key] > share * ms:
                out.append(f"the client's {what} {d[key]:.2f} ms at p99, more than {share:g} of the {name} it "
                           f"reports ({ms:.2f} ms)")
    busy, bound = d.get("loop_busy"), b.get("busy", bounds.busy)
    if busy is not None and busy > bound:
        out.append(f"the client's event loop was busy {100 * busy:.0f} % of the time streams were open (bound "
                   f"{100 * bound:g} %): saturated")
    fit = d.get("arrivals")
    if fit:
        if fit["constant"] and fit["cv"] > b.get("cv", bounds.cv):
            out.append(f"the sends' gaps varied (CV {fit['cv']:.2f}, bound {b.get('cv', bounds.cv):g}) where the "
                       "schedule's are constant: the server did not see the arrivals asked for")
        elif fit["ks"] is not None and fit["ks"] > b.get("ks", bounds.ks):
            out.append(f"the sends' gaps left the schedule's distribution (Kolmogorov-Smirnov distance "
                       f"{fit['ks']:.3f}, bound {b.get('ks', bounds.ks):g}; CV {fit['cv']:.2f} against "
                       f"{fit['cv_scheduled']:.2f} scheduled): the server did not see the arrivals asked for")
    return out


def line(d: dict) -> str:
    """One line for a receipt's Markdown."""
    parts = [f"event-loop lag p99 {d['loop_lag_p99_ms']:.2f} ms (max {d['loop_lag_max_ms']:.1f})",
             f"CPU {d['cpu_s']:.2f} s"
             + (f" ({100 * d['cpu_share']:.0f} % of the wall time" + (f" per process, {d['procs']} processes"
                                                                      if (d.get("procs") or 1) > 1 else "") + ")"
                if d.get("cpu_share") else "")
             + (f", event loop busy {100 * d['loop_busy']:.0f} %" if d.get("loop_busy") is not None else ""),
             f"send lateness p99 {d['late_p99_ms']:.1f} ms (max {d['late_max_ms']:.1f})"]
    if d.get("workers"):
        parts.append(d["workers"]["why"])
    if d.get("start_spare_ms") is not None:
        parts.append(f"processes ready {d['start_spare_ms']:.0f} ms before their shared start (the least)")
    fit = d.get("arrivals")
    if fit:
        parts.append(f"send gaps CV {fit['cv']:.2f} (scheduled {fit['cv_scheduled']:.2f})"
                     + (f", KS distance to the schedule {fit['ks']:.3f}" if fit.get("ks") is not None else ""))
    if d.get("peak_open"):
        srv, split = d.get("server_open") or {}, d.get("server_split") or {}
        parts.append("open at once " + ", ".join(
            f"{v}/{k}" + (f" (server {srv[k]}" + (f": {split[k][0]} running, {split[k][1]} waiting" if k in split else "")
                          + ")" if srv.get(k) is not None else "") for k, v in d["peak_open"].items()))
    if d.get("open_peak") is not None:
        parts.append(f"at most {d['open_peak']} streams open at once")
    if d.get("send_spread_ms"):
        parts.append("a burst's sends spread over " + ", ".join(f"{v:.1f} ms at {k}" for k, v in d["send_spread_ms"].items()))
    verdict = "valid" if not d["invalid"] else "INVALID: " + "; ".join(d["invalid"])
    return "; ".join(parts) + f". {verdict}."


def bottleneck(check: dict | None) -> list[str]:
    """Why a run's client was the bottleneck, from its self-check: every reason but a late send,
    which the scenarios' figures already give as their own."""
    return [why for why in (check or {}).get("invalid") or [] if not why.startswith("a request was sent")]


def _levels(d: dict) -> list[tuple[str, float, bool]]:
    """(label, value, held) of every level one check speaks for."""
    bad = d.get("invalid") or []
    if d.get("level"):
        return [(d["level"]["label"], float(d["level"]["value"]), not bad)]
    if d.get("peak_open"):
        # a run-wide reason (lag, CPU) holds at every level; a level short of streams at its own
        whole = [w for w in bad if "open at once" not in w]
        return [(f"{k} streams", float(k), not whole and v >= int(k)) for k, v in d["peak_open"].items()]
    if d.get("open_peak"):
        return [(f"{d['open_peak']} streams open at once", float(d["open_peak"]), not bad)]
    return []


def held(checks: list[dict | None]) -> str | None:
    """The highest level the client held on this host (every run's check at it valid), and the
    lowest at which some run's was not; None when no check names a level."""
    runs: dict[float, tuple[str, int, int]] = {}  # value -> (label, valid runs, invalid runs)
    for c in checks:
        for label, value, fine in _levels(c or {}):
            _, ok, bad = runs.get(value, (label, 0, 0))
            runs[value] = (label, ok + fine, bad + (not fine))
    if not runs:
        return None
    kept = [v for v, (_, ok, bad) in runs.items() if not bad]
    text = (f"The client held {runs[max(kept)][0]} on this host (every run valid at it)" if kept
            else "The client held none of the levels measured here in every run")
    lost = [v for v, (_, ok, bad) in runs.items() if bad]
    if lost:
        label, ok, bad = runs[min(lost)]
        text += f"; at {label}, {bad} of {ok + bad} runs {'was' if bad == 1 else 'were'} client-limited"
    return text + "."
