"""The client's open loop held against the synthetic server's own log: at each rate and number
of client processes (a number, or auto: `tfbench load`'s rule), what the server received (its
reads: rate, the gaps' CV and Kolmogorov-Smirnov distance to the exponential), the first token as
measured against the truth (the server's first send minus its read), the send lateness and the
self-check's verdict.

    python -m tools.open_loop_probe --rates 1000,2000,4000 --procs 1,2,auto [--duration 6]
        [--first-ms 5 --every-ms 2] [--input-len 32 --output-len 16] [--server-workers N] [--out FILE]
        [--sends DIR]

`--server-workers N` (1): the synthetic server as N processes on one port (its `--workers`), its
log merged, so that its reads are not bunched by one loop reading every request.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import time

import httpx
import numpy as np
from scipy import stats

from tensorfold_bench.analysis import load as load_figures
from tensorfold_bench.calibrate import synthetic
from tensorfold_bench.client import player, selfcheck, workers
from tensorfold_bench.scenarios import capacity, load
from tensorfold_bench.workload import spec as spec_mod
from tools.results import write_results


FIRST_S = 0.25


def latest_by_bin(at: np.ndarray, late: np.ndarray, width: float = 0.025, span: float = 0.5) -> list[float | None]:
    """The latest send (ms) of each `width` of the schedule's first `span` s (None: no send in
    it): one stall shows as a bin or two, a backlog as a run of growing ones."""
    bins = [(at >= b) & (at < b + width) for b in np.arange(0.0, span, width)]
    return [round(float(late[m].max()), 2) if m.any() else None for m in bins]


def one(url: str, rate: float, procs: int | str, a, sends: str | None = None) -> dict:
    """One open loop at `rate` over `procs` processes (or "auto"); `a`: duration, input_len and
    output_len; `sends`: a folder to keep every send's offset and lateness in. The server's log
    (`url`: the synthetic server) is reset first."""
    spec = spec_mod.from_flags(rates=[rate], duration=a.duration, input_len=str(a.input_len),
                               output_len=str(a.output_len), seed=0)
    (level,) = spec.levels
    wl = spec.build(level, synthetic.VOCAB)
    chosen = load.auto_procs(wl.items) if procs == "auto" else workers.Procs(int(procs), "--procs")
    procs = chosen.procs
    httpx.post(url + "/v1/synthetic/reset")
    load_before = os.getloadavg()[0]

    async def go(pool):
        return await player.play_level(url, wl, model=synthetic.MODEL, drain_s=60, level=load.level_dict(level),
                                     pool=pool)
    if procs > 1:
        with workers.Workers(procs) as pool:
            played, t0, check = asyncio.run(go(pool))
    else:
        played, t0, check = asyncio.run(go(None))
    log = httpx.get(url + "/v1/synthetic", timeout=120).json()
    reqs = [load.to_req(s, t0) for s in played]
    f = load_figures.level_figures(reqs, load_figures.Slo())
    selfcheck.judge(check, {f"TTFT {q}": f["latency"]["ttft"][q] for q in ("p50", "p99")})
    reads = np.sort([s["read"] for s in log["streams"]])
    gaps = np.diff(reads)
    truth = np.asarray([s["sends"][0] - s["read"] for s in log["streams"] if s["sends"]]) * 1000
    span = reads[-1] - reads[0]
    # where the late sends fell: in the first FIRST_S of the schedule (a process that started
    # late) or all through it (a loop too busy to send on time)
    at = np.asarray([s.rec.scheduled - t0 for s in played if s.rec.sent is not None])
    late = np.asarray([s.lateness(t0) for s in played if s.rec.sent is not None]) * 1000
    p99 = lambda x: round(float(np.percentile(x, 99)), 3) if len(x) else None  # noqa: E731
    if sends:  # every send's offset and lateness, for a look at when the late ones fell
        os.makedirs(sends, exist_ok=True)
        np.savez(os.path.join(sends, f"rate{rate:g}-procs{procs}.npz"), offset=at, late_ms=late)
    return {"rate": rate, "procs": procs, "procs_why": chosen.text(), "requests": len(played),
            "received_per_s": round((len(reads) - 1) / span, 1),
            "server_cv": round(float(gaps.std() / gaps.mean()), 3),
            "server_ks": round(float(stats.kstest(gaps * rate, "expon").statistic), 4),
            "ttft_p50": f["latency"]["ttft"]["p50"], "ttft_p99": f["latency"]["ttft"]["p99"],
            "truth_p50": float(np.median(truth)), "truth_p99": float(np.percentile(truth, 99)),
            "late_p99_ms": check["late_p99_ms"], "late_p99_first_ms": p99(late[at < FIRST_S]),
            "late_p99_after_ms": p99(late[at >= FIRST_S]),
            "late_max_by_25ms": latest_by_bin(at, late), "start_spare_ms": check.get("start_spare_ms"),
            "loop_busy": check["loop_busy"], "cpu_share": check["cpu_share"],
            "send_ks": (check.get("arrivals") or {}).get("ks"), "send_cv": (check.get("arrivals") or {}).get("cv"),
            "invalid": check["invalid"], "load_before": load_before, "load_after": os.getloadavg()[0]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rates", default="1000,2000,4000")
    p.add_argument("--procs", default="1,2")
    p.add_argument("--duration", type=float, default=6.0)
    p.add_argument("--first-ms", type=float, default=5.0)
    p.add_argument("--every-ms", type=float, default=2.0)
    p.add_argument("--input-len", type=int, default=32)
    p.add_argument("--output-len", type=int, default=16)
    p.add_argument("--server-workers", type=int, default=1)
    p.add_argument("--out", default=None)
    p.add_argument("--sends", default=None, help="a folder for each run's sends (offset, lateness) as .npz")
    a = p.parse_args()
    if a.server_workers < 1:
        p.error("--server-workers: must be at least 1")
    t0 = time.perf_counter()
    rows = []
    print(f"the synthetic server: {a.server_workers} worker process{'es' if a.server_workers != 1 else ''}",
          flush=True)
    with capacity.synthetic_server(a.first_ms, a.every_ms, workers=a.server_workers) as srv:
        for rate in [float(r) for r in a.rates.split(",")]:
            for procs in [n.strip() for n in a.procs.split(",")]:
                r = one(srv.url, rate, procs, a, a.sends)
                rows.append(r)
                print(f"rate {rate:g}/s, {r['procs_why']}: received {r['received_per_s']:g}/s, server gaps CV "
                      f"{r['server_cv']:.2f} KS {r['server_ks']:.3f}; TTFT p50/p99 {r['ttft_p50']:.2f}/{r['ttft_p99']:.2f}"
                      f" (truth {r['truth_p50']:.2f}/{r['truth_p99']:.2f}); late p99 {r['late_p99_ms']:.2f} ms (first "
                      f"{FIRST_S:g} s {r['late_p99_first_ms']}, after {r['late_p99_after_ms']}); processes ready "
                      f"{r['start_spare_ms']} ms before the start; latest send by 25 ms of the first 0.5 s "
                      f"{r['late_max_by_25ms']}; "
                      f"send KS {r['send_ks']}; loop busy {r['loop_busy']}; "
                      f"{'valid' if not r['invalid'] else 'INVALID: ' + '; '.join(r['invalid'])}; "
                      f"load {r['load_before']:.2f}->{r['load_after']:.2f}", flush=True)
    write_results({"cpus": os.cpu_count(), "server_workers": a.server_workers, "rows": rows}, t0, a.out)


if __name__ == "__main__":
    main()
