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
import multiprocessing
from concurrent.futures import ProcessPoolExecutor

from tensorfold_bench.client import selfcheck
from tensorfold_bench.client.play import http_client, sleep_until
from tensorfold_bench.client.stream import Request, StreamRecord, clock, collector_held, new_record, stream

START_AHEAD_S = 1.0  # the burst starts this long after its requests are handed to the workers (each opens its connections first)


def _ready() -> bool:
    return True


async def _play(url: str, reqs: list[Request], model: str, t0: float, timeout_s: float) -> dict:
    async with http_client() as client, selfcheck.Watch(lambda: client.open.now > 0) as watch:
        ready = [client.prepare(url, q, model) for q in reqs]
        conns = await client.preopen(url, len(reqs))  # connected before the burst's start: then only writes
        with collector_held():
            await sleep_until(t0)
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
    return {"records": [r.to_dict() for r in recs], "lags": watch.lags, "cpu_s": watch.cpu_s, "wall_s": watch.wall_s,
            "open_s": watch.open_s, "open_idle_s": watch.open_idle_s}


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

    async def burst(self, url: str, reqs: list[Request], model: str, timeout_s: float
                    ) -> tuple[list[StreamRecord], selfcheck.Watch]:
        """Every request at once, dealt round robin over the workers; the records in request
        order and one Watch holding all workers' lag samples and CPU."""
        loop = asyncio.get_running_loop()
        t0 = clock() + START_AHEAD_S
        shares = [list(range(i, len(reqs), self.procs)) for i in range(self.procs)]
        outs = await asyncio.gather(*(loop.run_in_executor(self.pool, _worker, url, [reqs[j] for j in idx], model,
                                                           t0, timeout_s) for idx in shares if idx))
        recs: list[StreamRecord | None] = [None] * len(reqs)
        watch = selfcheck.Watch()
        watch.procs = len([s for s in shares if s])
        for idx, out in zip([s for s in shares if s], outs):
            for j, d in zip(idx, out["records"]):
                recs[j] = StreamRecord.from_dict(d)
            watch.lags += out["lags"]
            watch.cpu_s += out["cpu_s"]
            watch.open_s += out["open_s"]
            watch.open_idle_s += out["open_idle_s"] or 0.0
            watch.wall_s = max(watch.wall_s, out["wall_s"])
        return recs, watch
