"""`tfbench calibrate`: the client's own error, against a server whose every send time is known.

It starts tensorfold_bench.calibrate.synthetic (a process of its own) with an exact schedule and plays a
sweep's burst at each level: every stream sends at once and reads `tokens` tokens. The server
logs each token's send time on CLOCK_MONOTONIC, the client stamps each arrival on the same
clock, so token by token the client's error is its arrival minus the send. Per level and client
it gives the first token and the inter-token p50/p99/max as the client measured them against
the truth (the server's own sends), the stall as measured, the server's own lateness against its
schedule (it must not be the bottleneck) and the streams open at once on both sides.

The first token's truth runs from the server's read of the request to its first send, and the
client's from its own send stamp to the arrival: the time a request takes to reach the server
(connecting, writing N requests from one loop) is the client's error, and is counted as one. The
spread of the burst's sends (client stamps) and of the server's reads is in the table: a level of
N "starting together" is N requests written within that spread. Every client kind is measured:
`wire` (every scenario's bursts and loads) and `live` (the script player: long-prompt and every
script) by default.

A level is within bounds when its inter-token p99 is within 1 ms of the truth and its first
token p50 within 5 ms.
"""
from __future__ import annotations

import asyncio
import os
from dataclasses import asdict, dataclass, field

import httpx
import numpy as np

from tensorfold_bench.calibrate import synthetic
from tensorfold_bench.client import selfcheck, workers
from tensorfold_bench.client.stream import CLIENT_KINDS, StreamClient, StreamRecord
from tensorfold_bench.errors import FlagError
from tensorfold_bench.scenarios import capacity
from tensorfold_bench.scenarios.sweep import burst_requests, parse_levels, play_burst
from tensorfold_bench.workload.ids import prompt_ids

ITL_BOUND_MS = 1.0
FIRST_BOUND_MS = 5.0
PROMPT_TOKENS = 16


@dataclass(frozen=True)
class CalibrateSettings:
    levels: tuple[int, ...] = (1, 8, 64, 256)
    tokens: int = 200
    schedule: synthetic.Schedule = field(default_factory=synthetic.Schedule)
    clients: tuple[str, ...] = ("wire", "live")  # each "kind" or "httpx:LIMIT" (httpx with a connection cap)
    procs: int = 1  # worker processes for the wire client, each with its own loop (tensorfold_bench.client.workers)
    server_workers: int = 1  # synthetic server processes on one port (its --workers): one loop sends every token otherwise

    def __post_init__(self):
        if self.tokens < 2:
            raise FlagError("--tokens", f"must be at least 2 (a gap needs two tokens), not {self.tokens}")
        for c in self.clients:
            kind, _, limit = c.partition(":")
            if kind not in CLIENT_KINDS or (limit and (kind != "httpx" or not limit.isdigit())):
                raise FlagError("--client", f"{c!r}: each client is one of {', '.join(CLIENT_KINDS)} "
                                            "(httpx:N: httpx with at most N connections)")
        if self.procs < 1:
            raise FlagError("--procs", f"must be at least 1, not {self.procs}")
        if self.server_workers < 1:
            raise FlagError("--server-workers", f"must be at least 1, not {self.server_workers}")


def parse_settings(levels: str, tokens: int, first_ms: float, every_ms: float, stall_every: int, stall_ms: float,
                   clients: str, procs: int = 1) -> CalibrateSettings:
    try:
        sc = synthetic.Schedule(first_ms, every_ms, stall_every, stall_ms)
    except ValueError as e:
        raise FlagError("--first-ms/--every-ms/--stall-ms", str(e)) from None
    return CalibrateSettings(parse_levels(levels), tokens, sc, tuple(c.strip() for c in clients.split(",") if c.strip()),
                             procs)


def make_client(spec: str) -> StreamClient:
    kind, _, limit = spec.partition(":")
    return StreamClient(kind, int(limit) if limit else None)


def _ms(xs) -> np.ndarray:
    return np.asarray(xs, dtype=float) * 1000


def level_errors(recs: list[StreamRecord], prompts: list[list[int]], log: dict, level: int) -> dict:
    """The client's figures against the server's log for one burst (ms)."""
    by_key = {s["key"]: s for s in log["streams"]}
    first_m, first_t, gaps_m, gaps_t, delay, stall_m, stall_t = [], [], [], [], [], [], []
    for rec, prompt in zip(recs, prompts):
        s = by_key.get(synthetic.key_of(prompt))
        if s is None or rec.error or len(rec.token_times) != len(s["sends"]) or rec.sent is None:
            raise RuntimeError(f"stream {rec.name}: {rec.error or 'its tokens do not match the server log'}")
        got, sent = np.asarray(rec.token_times), np.asarray(s["sends"])
        first_m.append(got[0] - rec.sent)
        first_t.append(sent[0] - s["read"])  # the server's own: from reading the request
        gaps_m += np.diff(got).tolist()
        gaps_t += np.diff(sent).tolist()
        delay += (got - sent).tolist()
        if s["stalled"]:
            j = s["stall_at"]
            stall_m.append(got[j] - got[j - 1])
            stall_t.append(sent[j] - sent[j - 1])
    gm, gt = _ms(gaps_m), _ms(gaps_t)
    late = _ms([t - d for s in log["streams"] for t, d in zip(s["sends"], s["due"])])
    out = {"level": level,
           "first_p50": float(np.median(_ms(first_m))), "first_truth_p50": float(np.median(_ms(first_t))),
           "itl_p50": float(np.percentile(gm, 50)), "itl_truth_p50": float(np.percentile(gt, 50)),
           "itl_p99": float(np.percentile(gm, 99)), "itl_truth_p99": float(np.percentile(gt, 99)),
           "itl_max": float(gm.max()), "itl_truth_max": float(gt.max()),
           "delay_p50": float(np.percentile(_ms(delay), 50)), "delay_p99": float(np.percentile(_ms(delay), 99)),
           "delay_max": float(_ms(delay).max()),
           "stall": float(np.max(_ms(stall_m))) if stall_m else None,
           "stall_truth": float(np.max(_ms(stall_t))) if stall_t else None,
           "stall_err_max": float(np.max(np.abs(_ms(stall_m) - _ms(stall_t)))) if stall_m else None,
           "server_late_p99": float(np.percentile(late, 99)), "server_late_max": float(late.max()),
           "server_peak_open": log["peak_open"],
           "send_spread": float(_ms([max(r.sent for r in recs) - min(r.sent for r in recs)])[0]),
           "read_spread": float(_ms([max(s["read"] for s in log["streams"]) - min(s["read"] for s in log["streams"])])[0])}
    out["within"] = (abs(out["itl_p99"] - out["itl_truth_p99"]) <= ITL_BOUND_MS
                     and abs(out["first_p50"] - out["first_truth_p50"]) <= FIRST_BOUND_MS)
    return out


async def play_client(url: str, spec: str, settings: CalibrateSettings, progress,
                      pool: workers.Workers | None = None) -> list[dict]:
    """One client at every level of `settings` against the synthetic server at `url`: a row each."""
    rows = []
    async with make_client(spec) as client:
        for level in settings.levels:
            prompts = [prompt_ids(level, f"calibrate:{i}", PROMPT_TOKENS, synthetic.VOCAB) for i in range(level)]
            await asyncio.to_thread(httpx.post, url + "/v1/synthetic/reset")
            if pool is not None:
                recs, watch = await pool.burst(url, burst_requests(prompts, settings.tokens), synthetic.MODEL, 600)
                peak = workers.peak_open(recs)
            else:
                async with selfcheck.Watch.over(client.open) as watch:
                    burst = await play_burst(client, url, prompts, settings.tokens, synthetic.MODEL, timeout_s=600)
                recs, peak = burst.records, burst.peak_open
            log = (await asyncio.to_thread(httpx.get, url + "/v1/synthetic", timeout=60)).json()
            row = level_errors(recs, prompts, log, level)
            check = selfcheck.summary(watch, [r.sent - r.scheduled for r in recs], {level: peak})
            row.update(client=spec + (f" x{pool.procs}" if pool else ""), peak_open=peak,
                       loop_lag_p99=check["loop_lag_p99_ms"], cpu_share=check["cpu_share"],
                       late_max=check["late_max_ms"], invalid=check["invalid"])
            rows.append(row)
            progress(f"{row['client']}: {level} streams: inter-token p99 {row['itl_p99']:.2f} ms "
                     f"(truth {row['itl_truth_p99']:.2f})")
    return rows


def run(settings: CalibrateSettings, progress=lambda text: None) -> dict:
    """Start the synthetic server, play every client at every level; the table's data."""
    with synthetic_server(settings.schedule, settings.server_workers) as srv:
        rows = []
        for spec in settings.clients:
            if settings.procs > 1 and spec == "wire":
                with workers.Workers(settings.procs) as pool:
                    rows += asyncio.run(play_client(srv.url, spec, settings, progress, pool))
            else:
                rows += asyncio.run(play_client(srv.url, spec, settings, progress))
    return {"settings": {**asdict(settings), "levels": list(settings.levels)}, "load": os.getloadavg(),
            "cpus": os.cpu_count(), "rows": rows}


def synthetic_server(sc: synthetic.Schedule, workers: int = 1):
    """The synthetic server on `sc`'s schedule, in `workers` processes of its own, stopped on exit."""
    return capacity.synthetic_server(sc.first_ms, sc.every_ms, sc.stall_every, sc.stall_ms, workers)


def _n(v, d=1) -> str:
    return "–" if v is None else f"{v:.{d}f}"


def table(data: dict) -> str:
    """The error table, Markdown: measured (truth) per figure, client's error per token."""
    sc = data["settings"]["schedule"]
    lines = [f"Synthetic server: first token {sc['first_ms']:g} ms after the request is read, then one every "
             f"{sc['every_ms']:g} ms, {data['settings']['tokens']} tokens; every {sc['stall_every']}th stream stalls "
             f"{sc['stall_ms']:g} ms once. {data['cpus']} CPUs, load average "
             + " / ".join(f"{x:.2f}" for x in data["load"]) + ".", "",
             "| client | streams | open (client / server) | sends / reads spread ms | first token p50 ms | "
             "inter-token p50 ms | p99 ms | max ms | stall ms | arrival - send p50 / p99 / max ms | "
             "server late p99 ms | loop lag p99 ms | client CPU | within |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in data["rows"]:
        def pair(k, d=1):
            return f"{_n(r[k], d)} ({_n(r[k.replace('_', '_truth_', 1)], d)})"
        lines.append(
            f"| {r['client']} | {r['level']} | {r['peak_open']} / {r['server_peak_open']} | "
            f"{_n(r.get('send_spread'), 2)} / {_n(r.get('read_spread'), 2)} | {pair('first_p50')} | "
            f"{pair('itl_p50', 2)} | {pair('itl_p99', 2)} | {pair('itl_max')} | "
            f"{_n(r['stall'])} ({_n(r['stall_truth'])}) | "
            f"{_n(r['delay_p50'], 2)} / {_n(r['delay_p99'], 2)} / {_n(r['delay_max'])} | {_n(r['server_late_p99'], 2)} | "
            f"{_n(r['loop_lag_p99'], 2)} | {_n(100 * (r['cpu_share'] or 0), 0)} % | {'yes' if r['within'] else 'no'} |")
    lines += ["", "Each cell: as the client measured it (the truth: the server's own send times; the first "
              "token's from the server's read of the request, so the request's way to the server is the client's "
              "error). Spread: the burst's first to last send (client) and read (server). "
              f"Within: inter-token p99 within {ITL_BOUND_MS:g} ms of the truth and first token p50 within "
              f"{FIRST_BOUND_MS:g} ms.", ""]
    for spec in dict.fromkeys(r["client"] for r in data["rows"]):
        ok = [r["level"] for r in data["rows"] if r["client"] == spec and r["within"]]
        lines.append(f"- {spec}: the highest level measured within bounds: {max(ok) if ok else 'none'}.")
    return "\n".join(lines) + "\n"
