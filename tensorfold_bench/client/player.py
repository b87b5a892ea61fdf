"""The arrival player: one level's workload played on one server, each request's raw record kept
with its schedule.

Every level's requests are built (and their bytes prepared) before its clock
starts. Open loop (a rate or a trace): each item goes at start + offset whatever is in flight;
with --max-concurrency M at most M are in flight, and an item past that waits for a free slot
(the wait is queueing, kept apart from the send's own lateness, and counted in the latency
from the scheduled send). Closed loop (--concurrency N): N workers, each sending its next item
when its last reply ended. A multi-turn session sends turn k `think` seconds after turn k-1's
reply ended, its prompt turn k-1's prompt + that reply's token ids + the new part. Every
record keeps its scheduled, released and actual send time. An open loop may be dealt over
worker processes, each sending its share at the share's own offsets (play_shares).
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace

from tensorfold_bench.client import selfcheck, workers
from tensorfold_bench.client.play import http_client
from tensorfold_bench.client.sampling import GREEDY, Sampling, request_seed
from tensorfold_bench.client.stream import Request, StreamClient, StreamRecord, clock, collector_held, new_record, stream
from tensorfold_bench.client.timer import sleep_until
from tensorfold_bench.workload.model import Item, Workload

# an open loop's request is given to its task this long before its send time: the connection is
# open by then and the write alone is on time (connecting on a loop busy with 2,000 requests a
# second took up to a few milliseconds)
AHEAD_S = 0.01
DRAIN_S = 600.0  # after a level's last scheduled send, how long its replies may take before they are closed


def request_for(item: Item, prompt, token_ids: str, sampling: Sampling) -> Request:
    """The item as a request: its prompt (ids or text), output length with ignore_eos; sampling
    with a seed of the item's id, the same in every run, variant and the plain reference."""
    req = Request(item.id, list(prompt) if not isinstance(prompt, str) else prompt, max_tokens=item.output_len,
                  ignore_eos=True, token_ids=token_ids)
    if sampling.greedy:
        return req
    return replace(req, temperature=float(sampling.temperature), seed=request_seed(sampling.seed, f"load:{item.id}"))


def next_prompt(prev_prompt, reply: list[int | None], part):
    """A later turn's prompt: the history (the previous prompt and its reply's ids) and the new
    part. A text session carries its text only (the harness keeps no reply text)."""
    if isinstance(prev_prompt, str) or isinstance(part, str):
        return (prev_prompt if isinstance(prev_prompt, str) else "") + (part if isinstance(part, str) else "")
    return tuple(prev_prompt) + tuple(int(t) for t in reply if t is not None) + tuple(part)


def sessions(items: tuple[Item, ...]) -> list[list[Item]]:
    """Items grouped into what one task plays in turn: a single request, or a session's turns;
    in the order of their first item."""
    out: list[list[Item]] = []
    by: dict[str, list[Item]] = {}
    for it in items:
        if it.session is None:
            out.append([it])
        elif it.session in by:
            by[it.session].append(it)
        else:
            by[it.session] = [it]
            out.append(by[it.session])
    for turns in by.values():
        turns.sort(key=lambda it: it.turn)
    return out


@dataclass
class Sent:
    """One played item: its request and record, and when a slot let it go."""

    item: Item
    req: Request
    rec: StreamRecord
    released: float | None = None

    def lateness(self, t0: float) -> float | None:
        """Release (or schedule) to send: the client's own delay (None: not sent), from times
        relative to the level's start `t0`, as the receipt keeps them."""
        if self.rec.sent is None:
            return None
        ref = self.released if self.released is not None else self.rec.scheduled
        return None if ref is None else (self.rec.sent - t0) - (ref - t0)


@dataclass
class Player:
    """Plays one level's workload on one server (see the module docstring)."""

    client: StreamClient
    url: str
    model: str
    token_ids: str = "ids"
    sampling: Sampling = GREEDY
    max_concurrency: int | None = None
    played: list[Sent] = field(default_factory=list)

    def __post_init__(self):
        self.slots = asyncio.Semaphore(self.max_concurrency) if self.max_concurrency else None

    async def send(self, item: Item, prompt, scheduled: float, prepared=None, ahead: bool = False) -> Sent:
        """`ahead`: called before `scheduled` (by up to AHEAD_S), to connect first and write at
        that time; with no slots to wait for only (a slot's release, not the clock, sends then)."""
        req = request_for(item, prompt, self.token_ids, self.sampling)
        s = Sent(item, req, new_record(req, scheduled))
        self.played.append(s)
        conn = None
        if ahead and self.slots is None:
            conn = await self.client.send_at(self.url, prepared, scheduled)
        if ahead and conn is None:  # nothing written ahead (slots, httpx, no connection): `stream` sends, on time
            await sleep_until(scheduled)
        if self.slots is not None:  # released: when a full set of slots let it go (None: it never waited)
            waited = self.slots.locked()
            await self.slots.acquire()
            s.released = clock() if waited else None
        try:
            await stream(self.client, self.url, req, s.rec, self.model, prepared, conn)
        finally:
            if self.slots is not None:
                self.slots.release()
        return s

    async def turns(self, turns: list[Item], scheduled: float, prepared=None, ahead: bool = False) -> None:
        """A single request, or a session's turns one after another (`ahead`: see send)."""
        prompt = turns[0].prompt
        s = await self.send(turns[0], prompt, scheduled, prepared, ahead)
        for it in turns[1:]:
            self.client.settle()  # the reply's ids, for the next prompt (decoded once, as at the end)
            if s.rec.error or s.rec.cancelled or not s.rec.token_ids:
                req = request_for(it, (), self.token_ids, self.sampling)
                s = Sent(it, req, new_record(req))
                s.rec.error = f"not sent: turn {it.turn - 1} of its session got no reply"
                self.played.append(s)
                continue
            prompt = next_prompt(prompt, s.rec.token_ids, it.prompt)
            at = (s.rec.ended or clock()) + it.think
            await sleep_until(at)
            s = await self.send(it, prompt, at)


class Tasks:
    """A level's tasks, and a wait for them all that costs nothing when it starts: asyncio.wait
    over 12,000 tasks adds a callback to each at once, 10-16 ms during which the level's last
    sends waited; here each task gets its callback as it is created."""

    def __init__(self):
        self.all: list[asyncio.Task] = []
        self.left = 0
        self.done: asyncio.Future | None = None

    def start(self, coro) -> None:
        t = asyncio.create_task(coro)
        self.all.append(t)
        self.left += 1
        t.add_done_callback(self._ended)

    def _ended(self, _t) -> None:
        self.left -= 1
        if self.left == 0 and self.done is not None and not self.done.done():
            self.done.set_result(None)

    async def wait(self, timeout: float) -> list[asyncio.Task]:
        """Until every task started has ended, or `timeout` seconds; the tasks still running."""
        if self.left:
            self.done = asyncio.get_running_loop().create_future()
            await asyncio.wait([self.done], timeout=timeout)
        return [t for t in self.all if not t.done()]


async def play_level(url: str, workload: Workload, *, model: str = "default", token_ids: str = "ids",
                     sampling: Sampling = GREEDY, concurrency: int | None = None, max_concurrency: int | None = None,
                     duration: float | None = None, drain_s: float = DRAIN_S, level: dict | None = None,
                     pool: workers.Workers | None = None, procs: int | None = None) -> tuple[list[Sent], float, dict]:
    """Every item of one level; (what was played, the level's start time, the client's self-check,
    naming `level` ({label, value}) when given). `concurrency`: a closed loop of that many; else
    open loop on the items' offsets, over `procs` of `pool`'s worker processes (all by default;
    see play_shares)."""
    kw = dict(model=model, token_ids=token_ids, sampling=sampling, concurrency=concurrency,
              max_concurrency=max_concurrency, duration=duration, drain_s=drain_s)
    procs = min(procs or (pool.procs if pool else 1), pool.procs if pool else 1)
    if procs > 1 and not concurrency and not max_concurrency:
        played, t0, watch, peak = await play_shares(pool, url, workload, kw, procs)
    else:
        played, t0, watch, peak = await _play(url, workload, **kw)
    check = selfcheck.summary(watch, [s.lateness(t0) for s in played], open_peak=peak,
                              arrivals=None if concurrency or max_concurrency else open_loop_fit(played), level=level)
    return played, t0, check


async def _play(url: str, workload: Workload, *, model: str, token_ids: str, sampling: Sampling,
                concurrency: int | None, max_concurrency: int | None, duration: float | None, drain_s: float,
                start: float | None = None) -> tuple[list[Sent], float, selfcheck.Watch, int]:
    """play_level on this process's loop: (played, t0, the Watch, the most streams open at once);
    `start`: the level's start time (a CLOCK_MONOTONIC time every process shares), else now."""
    groups = sessions(workload.items)
    # a closed loop's injected prompts still go at their own offsets
    timed = [g for g in groups if g[0].kind == "inject"] if concurrency else []
    groups = [g for g in groups if g not in timed]
    playing = [False]  # the level's clock runs: a late wake-up then delays a send or a token, open streams or not
    async with http_client() as client, selfcheck.Watch(lambda: playing[0] or client.open.now > 0) as watch:
        p = Player(client, url, model, token_ids, sampling, max_concurrency)
        prep = lambda gs: [client.prepare(url, request_for(g[0], g[0].prompt, token_ids, sampling), model)  # noqa: E731
                           for g in gs]
        ready, timed_ready = prep(groups), prep(timed)
        with collector_held():
            # every timed send is handed to its task AHEAD_S early (it connects, then writes on time)
            t0 = clock() + AHEAD_S if start is None else start
            if start is None:
                await sleep_until(t0 - AHEAD_S)
            else:
                await watch.start_at(t0 - AHEAD_S)
            playing[0] = True
            tasks, last = Tasks(), 0.0
            if concurrency:
                queue = list(zip(groups, ready))

                async def worker():
                    while queue and (duration is None or clock() - t0 < duration):
                        g, w = queue.pop(0)
                        await p.turns(g, clock(), w)
                for _ in range(concurrency):
                    tasks.start(worker())
                last = duration or 0.0
                groups, ready = timed, timed_ready  # what the dispatcher below sends on time
            for g, w in sorted(zip(groups, ready), key=lambda x: x[0][0].offset or 0.0):
                at = t0 + (g[0].offset or 0.0)
                last = max(last, g[0].offset or 0.0)
                if at - AHEAD_S > clock():  # the loop's own timer: a millisecond late here is still ahead
                    await asyncio.sleep(at - AHEAD_S - clock())
                tasks.start(p.turns(g, at, w, ahead=True))
            pending = await tasks.wait(max(last - (clock() - t0), 0.0) + drain_s)
            playing[0] = False
            for t in pending:
                t.cancel()
            await asyncio.gather(*tasks.all, return_exceptions=True)
        client.settle()
    for s in p.played:
        if s.rec.cancelled and not s.rec.error:
            s.rec.error = f"not done {drain_s:.0f} s after the last scheduled send"
    return p.played, t0, watch, client.open.peak


def _play_share(url: str, workload: Workload, kw: dict, start: float) -> dict:
    """One worker process's share of an open loop (its own event loop), played from `start`."""
    played, _, watch, peak = asyncio.run(_play(url, workload, **kw, start=start))
    return {"played": played, "watch": watch.share()}


def deal(workload: Workload, procs: int) -> list[Workload]:
    """The workload's sessions, in order of their first offset, dealt round robin into `procs`
    parts (none empty), each item keeping its own offset: the parts' union is the workload itself,
    so sent from one start the server sees the schedule's own arrival process (Poisson, gamma or a
    trace, exactly) while each part holds about 1/procs of it."""
    groups = sorted(sessions(workload.items), key=lambda g: g[0].offset or 0.0)
    shares = [groups[i::procs] for i in range(procs)]
    return [replace(workload, items=tuple(it for g in share for it in g)) for share in shares if share]


async def play_shares(pool: workers.Workers, url: str, workload: Workload, kw: dict, procs: int | None = None
                      ) -> tuple[list[Sent], float, selfcheck.Watch, int]:
    """An open loop over `procs` of the pool's processes (all by default): its parts (`deal`), each
    sent at its own offsets from one start (a CLOCK_MONOTONIC time all processes share). One Watch
    holds every process's lag and CPU; the streams open at once are counted over all records."""
    parts = deal(workload, procs or pool.procs)
    start = clock() + workers.START_AHEAD_S
    outs = await pool.each(_play_share, [(url, w, kw, start) for w in parts])
    watch = selfcheck.Watch.of_shares([out["watch"] for out in outs])
    played = [s for out in outs for s in out["played"]]
    played.sort(key=lambda s: (s.rec.scheduled if s.rec.scheduled is not None else float("inf")))
    return played, start, watch, workers.peak_open([s.rec for s in played])


def open_loop_fit(played: list[Sent]) -> dict | None:
    """The open loop's sends against their schedule (selfcheck.arrival_fit): every item sent at
    its offset (a session's later turns go after replies, off the schedule)."""
    timed = [s for s in played if s.item.turn == 0 and s.rec.sent is not None and s.rec.scheduled is not None]
    return selfcheck.arrival_fit([s.rec.scheduled for s in timed], [s.rec.sent for s in timed])
