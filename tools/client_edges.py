"""The client's edges, re-made against the synthetic server with the truth from its reads: bursts
at given levels (a sweep's level: N streams started together, `tfbench calibrate`'s play) and
open-loop load at given rates (`tfbench load`'s play, processes chosen by its automatic rule, as
tools/open_loop_probe.py plays it). A Markdown table to stdout, the rows as JSON to --out.

Bursts: first token `--burst-first-ms` (20) after the server read the request, then one every
`--burst-every-ms` (10), `--tokens` (200) tokens: first-token p50 and inter-token p99, measured
against the truth, and the spread of the burst's sends. Open loop: `--duration` (6) s at each rate,
first token `--load-first-ms` (5) after the read, then one every `--load-every-ms` (2), input
`--input-len` (32) and output `--output-len` (16) tokens: the rate the server received, its
inter-arrival CV and Kolmogorov-Smirnov distance to the exponential, TTFT p50/p99 measured
against the truth, the client's own send gaps against the exponential, send lateness p99, client
CPU, the processes used and the self-check's verdict. `--server-workers N` (1) serves the open
loops from N synthetic server processes on one port (its `--workers`), so that one server loop
reading every request does not bunch the reads at high rates; `--burst-server-workers N` (1) does
the same for the bursts, where one loop cannot send 1,024 streams' tokens on time. A burst is played
by `--burst-procs` client processes: auto (default) is the sweep's rule, one per 256 streams, up
to the cores beside the server's.

    python3 -m tools.client_edges --levels 8,64,256 --rates 1000,2000,4000 [--server-workers N]
        [--burst-server-workers N] [--burst-procs auto|N] [--out FILE]
"""
from __future__ import annotations

import argparse
import os
import time

from tensorfold_bench.calibrate import client_error, synthetic
from tensorfold_bench.client import workers
from tensorfold_bench.errors import FlagError
from tensorfold_bench.scenarios import capacity
from tensorfold_bench.scenarios.sweep import parse_levels
from tools.open_loop_probe import one as open_loop
from tools.results import write_results

BURST_COLUMNS = ("streams", "first token p50 ms, measured (truth)", "inter-token p99 ms, measured (truth)",
                 "send spread ms", "client processes", "self-check")
LOAD_COLUMNS = ("rate req/s", "received at the server /s", "server inter-arrival CV (Poisson 1.0)",
                "server KS to the exponential", "client's send gaps KS (CV)", "TTFT p50 ms, measured (truth)", "TTFT p99 ms, measured (truth)",
                "send lateness p99 ms", "client CPU", "processes", "self-check")


def bursts(levels: tuple[int, ...], tokens: int, first_ms: float, every_ms: float, server_workers: int = 1,
           procs: int | str = "auto") -> list[dict]:
    """One burst per level on the wire client over `procs` processes (auto: the sweep's rule, on the
    cores beside the server's), its errors against the server's log; each level a fresh server."""
    rows, schedule = [], synthetic.Schedule(first_ms, every_ms, stall_every=0)
    for level in levels:
        n = (workers.burst_procs(level, max(1, workers.cores() - server_workers), True) if procs == "auto"
             else workers.Procs(int(procs), "--burst-procs"))
        settings = client_error.CalibrateSettings((level,), tokens, schedule, ("wire",), n.procs, server_workers)
        rows += [{**r, "procs": n.procs, "procs_why": n.text(), "server_workers": server_workers}
                 for r in client_error.run(settings)["rows"]]
    return rows


def loads(rates: list[float], a) -> list[dict]:
    """One open loop per rate, its processes chosen by `tfbench load`'s automatic rule."""
    with capacity.synthetic_server(a.load_first_ms, a.load_every_ms, workers=a.server_workers) as srv:
        return [open_loop(srv.url, rate, "auto", a) for rate in rates]


def sends(r: dict) -> str:
    """The client's own send gaps against the exponential: where they hold and the server's reads do
    not, the arrivals bunched after the client (the server's loop), not in it."""
    ks, cv = r.get("send_ks"), r.get("send_cv")
    return "-" if ks is None else f"{ks:.3f} ({cv:.2f})"


def verdict(invalid: list[str]) -> str:
    return "valid" if not invalid else "**invalid**: " + "; ".join(invalid)


def server_workers(n: int) -> str:
    return f"served by {n} synthetic server process{'es' if n != 1 else ''} (--server-workers)"


def _row(cells) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def table(res: dict) -> str:
    """Both tables, Markdown."""
    a = res["settings"]
    out = [f"{res['cpus']} CPUs, load average before {res['load_before']:.2f}, after {res['load_after']:.2f}.", ""]
    if res["bursts"]:
        out += [f"**Bursts**: first token {a['burst_first_ms']:g} ms after the server's read, then every "
                f"{a['burst_every_ms']:g} ms, {a['tokens']} tokens; "
                f"{server_workers(a.get('burst_server_workers', 1))}.", "",
                _row(BURST_COLUMNS), _row(["---"] * len(BURST_COLUMNS))]
        out += [_row([r["level"], f"{r['first_p50']:.1f} ({r['first_truth_p50']:.1f})",
                      f"{r['itl_p99']:.2f} ({r['itl_truth_p99']:.2f})", f"{r['send_spread']:.2f}",
                      r.get("procs_why", "1 client process"), verdict(r["invalid"])]) for r in res["bursts"]]
        out.append("")
    if res["loads"]:
        out += [f"**Open loop**: {a['duration']:g} s a rate, Poisson; first token {a['load_first_ms']:g} ms after "
                f"the server's read, then every {a['load_every_ms']:g} ms; input {a['input_len']}, output "
                f"{a['output_len']}; {server_workers(a.get('server_workers', 1))}.", "", _row(LOAD_COLUMNS),
                _row(["---"] * len(LOAD_COLUMNS))]
        out += [_row([f"{r['rate']:,.0f}", f"{r['received_per_s']:,.0f}", f"{r['server_cv']:.2f}",
                      f"{r['server_ks']:.3f}", sends(r), f"{r['ttft_p50']:.2f} ({r['truth_p50']:.2f})",
                      f"{r['ttft_p99']:.2f} ({r['truth_p99']:.2f})", f"{r['late_p99_ms']:.2f}",
                      f"{100 * (r['cpu_share'] or 0):.0f} %", r["procs_why"], verdict(r["invalid"])])
                for r in res["loads"]]
        out.append("")
    out.append("Truth: the server's own log (first token: its first send minus its read of the request, so the "
               "request's way to the server is the client's error; gaps: its sends). Client CPU: per process. "
               "Send gaps: the client's sends against the schedule's exponential, all processes together.")
    return "\n".join(out) + "\n"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--levels", default="8,64,256", help="burst levels (streams), e.g. 8,64,256,1024; none: ''")
    p.add_argument("--rates", default="1000,2000,4000", help="open-loop rates (requests/s); none: ''")
    p.add_argument("--tokens", type=int, default=200)
    p.add_argument("--burst-first-ms", type=float, default=20.0)
    p.add_argument("--burst-every-ms", type=float, default=10.0)
    p.add_argument("--duration", type=float, default=6.0)
    p.add_argument("--load-first-ms", type=float, default=5.0)
    p.add_argument("--load-every-ms", type=float, default=2.0)
    p.add_argument("--input-len", type=int, default=32)
    p.add_argument("--output-len", type=int, default=16)
    p.add_argument("--server-workers", type=int, default=1,
                   help="synthetic server processes for the open loops (one port, SO_REUSEPORT)")
    p.add_argument("--burst-server-workers", type=int, default=1,
                   help="synthetic server processes for the bursts (at 1,024 streams of 100 tokens/s one sends too few)")
    p.add_argument("--burst-procs", default="auto",
                   help="client processes a burst: auto (the sweep's rule, one per 256 streams) or N")
    p.add_argument("--out", default=None, help="the rows as JSON")
    return p


def main(argv=None) -> None:
    p = parser()
    a = p.parse_args(argv)
    try:
        levels = parse_levels(a.levels) if a.levels.strip() else ()
    except FlagError as e:
        p.error(str(e))
    try:
        rates = [float(r) for r in a.rates.split(",") if r.strip()]
    except ValueError:
        p.error(f"--rates: {a.rates!r} is not a list of requests per second (e.g. 1000,2000)")
    if any(not r > 0 or r == float("inf") for r in rates):
        p.error(f"--rates: each rate must be a number above 0, not {a.rates!r}")
    for flag, v in (("--tokens", a.tokens - 1), ("--duration", a.duration), ("--input-len", a.input_len),
                    ("--output-len", a.output_len), ("--burst-every-ms", a.burst_every_ms),
                    ("--load-every-ms", a.load_every_ms)):
        if not v > 0:
            p.error(f"{flag}: must be above {1 if flag == '--tokens' else 0}")
    for flag, v in (("--server-workers", a.server_workers), ("--burst-server-workers", a.burst_server_workers)):
        if v < 1:
            p.error(f"{flag}: must be at least 1, not {v}")
    try:
        burst_procs = workers.parse_procs(a.burst_procs)
    except FlagError as e:
        p.error(str(e).replace("--procs", "--burst-procs"))
    t0, load_before = time.perf_counter(), os.getloadavg()[0]
    res = {"settings": vars(a), "cpus": os.cpu_count(), "load_before": load_before,
           "bursts": (bursts(levels, a.tokens, a.burst_first_ms, a.burst_every_ms, a.burst_server_workers, burst_procs)
                      if levels else []),
           "loads": loads(rates, a) if rates else []}
    res["load_after"] = os.getloadavg()[0]
    print(table(res), end="")
    write_results(res, t0, a.out)


if __name__ == "__main__":
    main()
