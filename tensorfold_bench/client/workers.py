"""A burst spread over worker processes, each with its own event loop, for levels one loop
cannot stamp in time (on this 2-core machine one loop keeps up with 256 streams of 100 tokens/s
while the server shares the cores; a 16-core host with 1,024 streams needs more than one).

Every worker is started before the clock (a spawned interpreter takes about a second to
import), builds its share of the requests, and sleeps until the burst's start `t0`, a
CLOCK_MONOTONIC time all processes of the host share; its records come back whole, with its
loop's lag samples and CPU. The streams open at once are counted from all records' send and end
times together, so the count is the burst's, not one worker's.
"""
from __future__ import annotations

import asyncio
import math
import multiprocessing
import os
import socket
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from urllib.parse import urlsplit

from tensorfold_bench.client import selfcheck
from tensorfold_bench.client.play import http_client
from tensorfold_bench.client.stream import Request, StreamRecord, clock, collector_held, new_record, stream
from tensorfold_bench.errors import FlagError

START_AHEAD_S = 1.0  # the burst starts this long after its requests are handed to the workers (each opens its connections first)
# the share of one core a process's loop may spend on the client's work: past about half, sends
# bunch behind reads (on 2 cores one loop at 82 % of a core sent Poisson arrivals with a gap CV of
# 1.27 at the server, at 56 % 1.08), long before the self-check's saturation bound
BUSY_TARGET = 0.5


def parse_procs(v) -> int | str:
    """`--procs` (load and sweep): "auto" or a whole number, at least 1."""
    if isinstance(v, str) and v.strip().lower() == "auto":
        return "auto"
    try:
        n = int(v) if not isinstance(v, (bool, float)) else None
    except ValueError:
        n = None
    if n is None or n < 1:
        raise FlagError("--procs", f"must be auto or a whole number, at least 1, not {v!r}")
    return n


def cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def on_this_host(url: str | None) -> bool:
    """Whether the server at `url` shares this host's cores (a loopback address, or one launched here)."""
    if not url:
        return True
    host = (urlsplit(url).hostname or "").lower()
    return host in ("localhost", "::1") or host.startswith("127.") or host == socket.gethostname().lower()


@dataclass(frozen=True)
class Procs:
    """How many client processes play a level, and why: `--procs N` as given, or (auto) enough
    that each carries at most BUSY_TARGET of a core at the level's rate, from the client's
    measured CPU a request, never more than the host's cores."""

    procs: int
    rule: str  # "--procs" (as given), "auto" or "closed loop" (one process keeps a closed loop's slots)
    rate: float | None = None  # requests per second asked
    cpu_ms: float | None = None  # the client's measured CPU a request (ms), the workload's lengths
    cores: int | None = None  # the cores the client may use: the host's, less one for a server on it
    busy: float | None = None  # BUSY_TARGET
    server_here: bool | None = None  # the server shares this host (it keeps a core of its own)
    streams: int | None = None  # rule "streams": the burst's size

    def to_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if v is not None}

    def text(self) -> str:
        if self.rule == "streams":
            return (f"{self.procs} client process{'es' if self.procs > 1 else ''} (auto: {self.streams} streams, at "
                    f"most {STREAMS_A_PROCESS} a process, {self.cores} core{'s' if self.cores != 1 else ''}"
                    f"{self._beside()})")
        if self.rule != "auto":
            return f"{self.procs} client process{'es' if self.procs > 1 else ''} ({self.rule})"
        if self.rate is None or self.cpu_ms is None:  # nothing to divide: too few sends, or no core to spare
            return (f"{self.procs} client process (auto: "
                    + ("fewer than two timed sends" if self.rate is None else f"{self.cores} core{self._beside()}") + ")")
        need = self.rate * self.cpu_ms / 1000
        return (f"{self.procs} client process{'es' if self.procs > 1 else ''} (auto: {self.rate:g} req/s at "
                f"{self.cpu_ms:.3f} ms of client CPU each is {need:.2f} of a core, at most {self.busy:g} a process, "
                f"{self.cores} cores{self._beside()})")

    def _beside(self) -> str:
        return " beside the server's" if self.server_here else ""


# one loop keeps up with this many streams of a burst: 256 streams of 100 tokens/s each were
# within 1 ms of the truth from one process on 2 cores beside the server
STREAMS_A_PROCESS = 256


def burst_procs(level: int, n_cores: int, server_here: bool | None = None) -> Procs:
    """A sweep level's processes, decided before it runs (its token rate is only known after, and
    base and new must get the same client): ceil(level / STREAMS_A_PROCESS), 1 to `n_cores`."""
    n = max(1, min(n_cores, -(-level // STREAMS_A_PROCESS)))
    return Procs(n, "streams", cores=n_cores, server_here=server_here, streams=level)


def choose(rate: float, cpu_s: float, n_cores: int, busy: float = BUSY_TARGET, server_here: bool | None = None) -> Procs:
    """The automatic rule: ceil(rate x CPU a request / busy) processes, 1 to `n_cores`."""
    need = rate * cpu_s / busy
    n = n_cores if math.isinf(need) else max(1, min(n_cores, math.ceil(need - 1e-9)))
    return Procs(n, "auto", round(rate, 3), round(cpu_s * 1000, 4), n_cores, busy, server_here)


def asked_rate(offsets: list[float]) -> float | None:
    """An open loop's rate from its send offsets (a seeded draw or a trace): sends per second over
    their span; None with fewer than two."""
    if len(offsets) < 2:
        return None
    span = max(offsets) - min(offsets)
    return (len(offsets) - 1) / span if span > 0 else float("inf")


def _ready() -> bool:
    return True


async def _play(url: str, reqs: list[Request], model: str, t0: float, timeout_s: float) -> dict:
    async with http_client() as client, selfcheck.Watch.over(client.open) as watch:
        ready = [client.prepare(url, q, model) for q in reqs]
        conns = await client.preopen(url, len(reqs))  # connected before the burst's start: then only writes
        with collector_held():
            await watch.start_at(t0)
            recs = [new_record(r, t0) for r in reqs]
            client.write_all(conns, ready)
            tasks = [asyncio.create_task(stream(client, url, q, r, model, w, c))
                     for q, r, w, c in zip(reqs, recs, ready, conns)]
            _, pending = await asyncio.wait(tasks, timeout=timeout_s)
            for t in pending:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            client.settle()
    for r, t in zip(recs, tasks):
        if t in pending and not r.error:
            r.error = f"not done after {timeout_s:.0f} s"
    return {"records": [r.to_dict() for r in recs], "watch": watch.share()}


def _worker(url: str, reqs: list[Request], model: str, t0: float, timeout_s: float) -> dict:
    return asyncio.run(_play(url, reqs, model, t0, timeout_s))


def peak_open(recs: list[StreamRecord]) -> int:
    """The most streams open at once, each from its send to its end."""
    edges = sorted([(r.sent, 1) for r in recs if r.sent is not None and r.ended is not None]
                   + [(r.ended, -1) for r in recs if r.sent is not None and r.ended is not None])
    now = peak = 0
    for _, d in edges:
        now += d
        peak = max(peak, now)
    return peak


class Workers:
    """`procs` worker processes, started on entry and kept for every burst of a run."""

    def __init__(self, procs: int):
        self.procs = procs
        self.pool: ProcessPoolExecutor | None = None

    def __enter__(self) -> "Workers":
        self.pool = ProcessPoolExecutor(self.procs, mp_context=multiprocessing.get_context("spawn"))
        for f in [self.pool.submit(_ready) for _ in range(self.procs * 2)]:
            f.result()  # every worker up (and its imports done) before any clock starts
        return self

    def __exit__(self, *exc) -> None:
        self.pool.shutdown(cancel_futures=True)

    async def each(self, fn, arg_lists: list[tuple]) -> list:
        """fn(*args) for each args, spread over the workers; the results in order."""
        loop = asyncio.get_running_loop()
        return await asyncio.gather(*(loop.run_in_executor(self.pool, fn, *a) for a in arg_lists))

    async def burst(self, url: str, reqs: list[Request], model: str, timeout_s: float, procs: int | None = None,
                    t0: float | None = None) -> tuple[list[StreamRecord], selfcheck.Watch]:
        """Every request at once, dealt round robin over `procs` of the workers (all by default),
        started at `t0` (by default START_AHEAD_S from now); the records in request order and one
        Watch holding all workers' lag samples and CPU."""
        loop = asyncio.get_running_loop()
        t0 = clock() + START_AHEAD_S if t0 is None else t0
        n = min(procs or self.procs, self.procs)
        shares = [list(range(i, len(reqs), n)) for i in range(n)]
        outs = await asyncio.gather(*(loop.run_in_executor(self.pool, _worker, url, [reqs[j] for j in idx], model,
                                                           t0, timeout_s) for idx in shares if idx))
        recs: list[StreamRecord | None] = [None] * len(reqs)
        for idx, out in zip([s for s in shares if s], outs):
            for j, d in zip(idx, out["records"]):
                recs[j] = StreamRecord.from_dict(d)
        return recs, selfcheck.Watch.of_shares([out["watch"] for out in outs])
