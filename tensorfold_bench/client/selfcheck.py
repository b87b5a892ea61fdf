"""The client's self-check, carried by every receipt: was the client what got measured?

While a run plays, `Watch` wakes every `tick_s` and keeps how late each wake-up was (the event
loop's lag: a token that arrived then waited that long before it was stamped), and the CPU the
harness process used. Each request's send lateness against its schedule, and the streams open
at once, come from the scenario. A run whose loop lag p99 or latest send passes its bound was
limited by the client, so it is marked invalid with the reason, as a late send always was.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from tensorfold_bench.client.stream import clock


@dataclass(frozen=True)
class Bounds:
    """Past these, the client was the bottleneck and the run is invalid."""

    # the loop's wake-up lag while streams are open, p99 over the run: a healthy client on a
    # 2-core host loaded three times over by other work measured up to 6 ms; a starved one, tens
    lag_p99_s: float = 0.02
    late_s: float = 0.25  # any send later than this against its schedule

    def to_dict(self) -> dict:
        return {"lag_p99_ms": self.lag_p99_s * 1000, "late_ms": self.late_s * 1000}


BOUNDS = Bounds()


class Watch:
    """Measures the running event loop's lag and the process's CPU between start and stop. Lag
    counts only ticks that began and ended with `busy()` true (streams open): work between
    bursts, such as decoding the last one, delays no token."""

    def __init__(self, busy: Callable[[], bool] = lambda: True, tick_s: float = 0.005):
        self.busy, self.tick_s = busy, tick_s
        self.lags: list[float] = []
        self._task: asyncio.Task | None = None
        self.cpu_s = self.wall_s = 0.0

    async def _tick(self) -> None:
        while True:
            due, was = clock() + self.tick_s, self.busy()
            await asyncio.sleep(self.tick_s)
            if was and self.busy():
                self.lags.append(max(clock() - due, 0.0))

    async def __aenter__(self) -> "Watch":
        self._cpu0, self._wall0 = time.process_time(), clock()
        self._task = asyncio.create_task(self._tick())
        return self

    async def __aexit__(self, *exc) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        self.cpu_s += time.process_time() - self._cpu0
        self.wall_s += clock() - self._wall0


def summary(watch: Watch, lateness: list[float | None], peaks: dict[int, int] | None = None,
            server_peaks: dict[int, int | None] | None = None, open_peak: int | None = None,
            bounds: Bounds = BOUNDS, server_split: dict[int, tuple[int, int]] | None = None) -> dict:
    """The receipt's `client` field: loop lag p99/max (ms), CPU seconds and share of the wall
    time, send lateness p99/max (ms), per level the streams open at once (the client's count,
    the fewest over its batches, and where the server says, the server's; a level with fewer is
    invalid; `server_split`: at a level queued behind fewer lanes, the server's running and
    waiting streams at that count) or, for a script without levels, the most streams open at once
    (`open_peak`), and the reasons the run is invalid (none: valid)."""
    lags = np.asarray(watch.lags or [0.0]) * 1000
    late = np.asarray([x for x in lateness if x is not None] or [0.0]) * 1000
    d = {"loop_lag_p99_ms": round(float(np.percentile(lags, 99)), 3), "loop_lag_max_ms": round(float(lags.max()), 3),
         "cpu_s": round(watch.cpu_s, 3), "cpu_share": round(watch.cpu_s / watch.wall_s, 3) if watch.wall_s else None,
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
    d["invalid"] = reasons(d, bounds)
    return d


def reasons(d: dict, bounds: Bounds = BOUNDS) -> list[str]:
    """Why the client was the bottleneck (empty: it was not)."""
    out = []
    if d["loop_lag_p99_ms"] > bounds.lag_p99_s * 1000:
        out.append(f"the client's event loop lagged {d['loop_lag_p99_ms']:.1f} ms at p99 "
                   f"(bound {bounds.lag_p99_s * 1000:g} ms)")
    if d["late_max_ms"] > bounds.late_s * 1000:
        out.append(f"a request was sent {d['late_max_ms']:.0f} ms late (bound {bounds.late_s * 1000:g} ms)")
    for level, peak in (d.get("peak_open") or {}).items():
        if peak < int(level):
            out.append(f"at {level} streams the client had at most {peak} open at once")
    return out


def line(d: dict) -> str:
    """One line for a receipt's Markdown."""
    parts = [f"event-loop lag p99 {d['loop_lag_p99_ms']:.2f} ms (max {d['loop_lag_max_ms']:.1f})",
             f"CPU {d['cpu_s']:.2f} s"
             + (f" ({100 * d['cpu_share']:.0f} % of the wall time)" if d.get("cpu_share") else ""),
             f"send lateness p99 {d['late_p99_ms']:.1f} ms (max {d['late_max_ms']:.1f})"]
    if d.get("peak_open"):
        srv, split = d.get("server_open") or {}, d.get("server_split") or {}
        parts.append("open at once " + ", ".join(
            f"{v}/{k}" + (f" (server {srv[k]}" + (f": {split[k][0]} running, {split[k][1]} waiting" if k in split else "")
                          + ")" if srv.get(k) is not None else "") for k, v in d["peak_open"].items()))
    if d.get("open_peak") is not None:
        parts.append(f"at most {d['open_peak']} streams open at once")
    verdict = "valid" if not d["invalid"] else "INVALID: " + "; ".join(d["invalid"])
    return "; ".join(parts) + f". {verdict}."


def bottleneck(check: dict | None) -> list[str]:
    """Why a run's client was the bottleneck, from its self-check: every reason but a late send,
    which the scenarios' figures already give as their own."""
    return [why for why in (check or {}).get("invalid") or [] if not why.startswith("a request was sent")]
