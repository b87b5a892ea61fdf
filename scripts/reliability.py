"""The large reliability run against a real tiny engine on loopback: fuzzed bodies, disconnects
mid-prompt and mid-decode, a soak with queueing, slow connections; then leaks and RSS. Writes a
receipt (JSON + Markdown table) under receipts/reliability/.

    PYTHONPATH=$PWD python scripts/reliability.py [--fuzz 10000] [--disconnects 1000]
        [--soak 10000] [--slow 300] [--out receipts/reliability]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from engine.server.metrics import parse_metrics  # noqa: E402
from tensorfold_bench.servers.launcher import launch  # noqa: E402
from tests.hostile import fuzz_case, request_then_close  # noqa: E402
from tests.openai_helpers import engine_pid  # noqa: E402

FLAGS = ["--model", "tiny", "--parallel", "4", "--max-model-len", "512", "--prefill-rows", "8",
         "--max-body-mb", "1", "--stall-timeout-s", "5", "--idle-timeout-s", "5", "--body-timeout-s", "5"]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


async def run_requests(url: str, cases, concurrency: int) -> dict:
    statuses: dict[int, int] = {}
    lat: list[float] = []
    fivexx: list = []
    queue = list(cases)

    async def worker(client):
        while queue:
            method, path, body, headers = queue.pop()
            t0 = time.monotonic()
            try:
                r = await client.request(method, url + path, content=body, headers=headers)
                status = r.status_code
            except httpx.HTTPError as exc:
                status = 0
                fivexx.append((path, body[:120], repr(exc)))
            lat.append(time.monotonic() - t0)
            statuses[status] = statuses.get(status, 0) + 1
            if status >= 500:
                fivexx.append((path, body[:120], status))

    async with httpx.AsyncClient(timeout=120) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    return {"n": len(cases), "statuses": dict(sorted(statuses.items())), "bad": len(fivexx), "examples": fivexx[:5],
            "p50_s": pct(lat, 0.5), "p99_s": pct(lat, 0.99)}


def soak_cases(n: int, seed: int):
    rng = random.Random(seed)
    for _ in range(n):
        body = {"prompt": [rng.randrange(256) for _ in range(rng.randrange(4, 40))], "max_tokens": rng.randrange(1, 8),
                "ignore_eos": True}
        yield "POST", "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}


async def disconnects(url: str, n: int) -> dict:
    sem = asyncio.Semaphore(8)
    long_prompt = [(i * 104729) % 256 for i in range(400)]

    async def one(i):
        async with sem:
            mode = i % 3
            body = ({"prompt": long_prompt, "max_tokens": 8} if mode < 2 else
                    {"prompt": [i % 256, 7, 9], "max_tokens": 400, "ignore_eos": True})
            await request_then_close(url, body, (-1, 0, 3)[mode])

    t0 = time.monotonic()
    await asyncio.gather(*(one(i) for i in range(n)))
    return {"n": n, "seconds": time.monotonic() - t0}


def slow_connections(url: str, n: int, wait_s: float) -> dict:
    host, port = url.removeprefix("http://").split(":")
    socks = []
    for i in range(n):
        s = socket.create_connection((host, int(port)))
        if i % 2:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")  # headers that never end
        socks.append(s)
    t0 = time.monotonic()
    health = httpx.get(url + "/health", timeout=30).status_code
    closed = 0
    deadline = t0 + wait_s
    for s in socks:
        s.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            closed += s.recv(1) == b""
        except OSError:
            pass
        s.close()
    return {"n": n, "closed_by_server": closed, "health_while_open": health, "seconds": time.monotonic() - t0}


def idle_metrics(url: str, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        m = parse_metrics(httpx.get(url + "/metrics").text)
        if (m["tfengine_running_streams"] == 0 and m["tfengine_waiting_streams"] == 0) or time.monotonic() > deadline:
            return m
        time.sleep(0.1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fuzz", type=int, default=10_000)
    ap.add_argument("--disconnects", type=int, default=1_000)
    ap.add_argument("--soak", type=int, default=10_000)
    ap.add_argument("--slow", type=int, default=300)
    ap.add_argument("--out", type=Path, default=Path("receipts/reliability"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    out = args.out / f"{stamp}-reliability"
    with launch(FLAGS, Path(tempfile.mkdtemp()) / "server.log") as srv:
        pid, url = engine_pid(srv), srv.url
        asyncio.run(run_requests(url, list(soak_cases(50, 0)), 4))  # warm-up
        before = {"rss_mb": rss_mb(pid), "fds": fds(pid)}
        rng = random.Random(20261130)
        res = {"flags": FLAGS, "before": before}
        res["fuzz"] = asyncio.run(run_requests(url, [fuzz_case(rng) for _ in range(args.fuzz)], 8))
        res["disconnects"] = asyncio.run(disconnects(url, args.disconnects))
        res["soak"] = asyncio.run(run_requests(url, list(soak_cases(args.soak, 1)), 16))
        res["slow"] = slow_connections(url, args.slow, 20.0)
        m = idle_metrics(url)
        time.sleep(6)  # idle connections close after --idle-timeout-s
        res["after"] = {"rss_mb": rss_mb(pid), "fds": fds(pid), "alive": srv.proc.poll() is None,
                        "running": m["tfengine_running_streams"], "waiting": m["tfengine_waiting_streams"],
                        "paused": m["tfengine_paused_streams"], "free_lanes": m["tfengine_free_lanes"]}
        log = srv.log.read_text()
        res["log"] = {"tracebacks": log.count("Traceback"), "error_lines": log.count(" ERROR "), "bytes": len(log)}
    out.with_suffix(".json").write_text(json.dumps(res, indent=1))
    out.with_suffix(".md").write_text(render(res))
    print(render(res))


def render(r: dict) -> str:
    a, b = r["after"], r["before"]
    rows = [("fuzzed bodies", r["fuzz"]["n"], r["fuzz"]["bad"], f"{r['fuzz']['p99_s'] * 1000:.1f} ms",
             json.dumps(r["fuzz"]["statuses"])),
            ("disconnects (1/3 before headers, 1/3 mid-prompt, 1/3 mid-decode)", r["disconnects"]["n"], "-", "-",
             f"{r['disconnects']['seconds']:.1f} s"),
            ("soak (16 clients, 4 lanes)", r["soak"]["n"], r["soak"]["bad"], f"{r['soak']['p99_s'] * 1000:.1f} ms",
             json.dumps(r["soak"]["statuses"])),
            ("slow connections", r["slow"]["n"], "-", "-",
             f"{r['slow']['closed_by_server']} closed by the server; /health {r['slow']['health_while_open']}")]
    lines = ["# Reliability run (tiny preset, loopback)", "", f"Flags: `{' '.join(r['flags'])}`", "",
             "| inputs | count | 5xx / transport errors | p99 latency | notes |", "|---|---|---|---|---|"]
    lines += [f"| {a_} | {n} | {bad} | {p99} | {note} |" for a_, n, bad, p99, note in rows]
    lines += ["", f"After: server alive {a['alive']}; running {a['running']:.0f}, waiting {a['waiting']:.0f}, "
              f"paused {a['paused']:.0f}, free lanes {a['free_lanes']:.0f}; fds {b['fds']} -> {a['fds']}; "
              f"RSS {b['rss_mb']:.0f} -> {a['rss_mb']:.0f} MB; log: {r['log']['tracebacks']} tracebacks, "
              f"{r['log']['error_lines']} ERROR lines, {r['log']['bytes']} bytes.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
