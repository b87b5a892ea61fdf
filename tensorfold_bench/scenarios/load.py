"""`tfbench load`: a workload (tensorfold_bench.workload) played at each level, on the session's
run loop (variants whole vs stepped, command variants, --url; a fresh server per run in the
order base/new/new/base; the plain reference; predictions), figures from load_figures.

The player. Every level's requests are built (and their bytes prepared) before its clock
starts. Open loop (a rate or a trace): each item goes at start + offset whatever is in flight;
with --max-concurrency M at most M are in flight, and an item past that waits for a free slot
(the wait is queueing, kept apart from the send's own lateness, and counted in the latency
from the scheduled send). Closed loop (--concurrency N): N workers, each sending its next item
when its last reply ended. A multi-turn session sends turn k `think` seconds after turn k-1's
reply ended, its prompt turn k-1's prompt + that reply's token ids + the new part. Every
record keeps its scheduled, released and actual send time. With `--procs N` an open loop is
dealt over N worker processes, each sending its share at the share's own offsets (play_shares).
"""
from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from tensorfold_bench import exactness, load_figures, selfcheck, session, targets, workers
from tensorfold_bench.client import Request, StreamClient, StreamRecord, clock, collector_held, new_record, stream
from tensorfold_bench.errors import BenchError, FlagError, ServerError
from tensorfold_bench.load_figures import Req, Slo
from tensorfold_bench.predictions import read as read_predictions
from tensorfold_bench.report.fmt import num
from tensorfold_bench.sampling import GREEDY, Sampling, request_seed
from tensorfold_bench.scenarios.streams import http_client, play_alone, prompt_ids, sleep_until
from tensorfold_bench.session import Reporter, Run, Session
from tensorfold_bench.variants import plain
from tensorfold_bench.workload.model import Item, Workload

DRAIN_S = 600.0  # after a level's last scheduled send, how long its replies may take before they are closed


# ---- requests ------------------------------------------------------------------------------

def prompt_key(prompt, max_tokens: int, temperature: float, seed: int | None) -> str:
    """A request's identity for the plain reference: its prompt and what it asked for."""
    body = json.dumps([list(prompt) if not isinstance(prompt, str) else prompt, max_tokens, temperature, seed],
                      separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()[:12]


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

    async def send(self, item: Item, prompt, scheduled: float, prepared=None) -> Sent:
        req = request_for(item, prompt, self.token_ids, self.sampling)
        s = Sent(item, req, new_record(req, scheduled))
        self.played.append(s)
        if self.slots is not None:  # released: when a full set of slots let it go (None: it never waited)
            waited = self.slots.locked()
            await self.slots.acquire()
            s.released = clock() if waited else None
        try:
            await stream(self.client, self.url, req, s.rec, self.model, prepared)
        finally:
            if self.slots is not None:
                self.slots.release()
        return s

    async def turns(self, turns: list[Item], scheduled: float, prepared=None) -> None:
        """A single request, or a session's turns one after another."""
        prompt = turns[0].prompt
        s = await self.send(turns[0], prompt, scheduled, prepared)
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


async def play_level(url: str, workload: Workload, *, model: str = "default", token_ids: str = "ids",
                     sampling: Sampling = GREEDY, concurrency: int | None = None, max_concurrency: int | None = None,
                     duration: float | None = None, drain_s: float = DRAIN_S, level: dict | None = None,
                     pool: workers.Workers | None = None) -> tuple[list[Sent], float, dict]:
    """Every item of one level; (what was played, the level's start time, the client's self-check,
    naming `level` ({label, value}) when given). `concurrency`: a closed loop of that many; else
    open loop on the items' offsets, over `pool`'s worker processes when given (see play_shares)."""
    kw = dict(model=model, token_ids=token_ids, sampling=sampling, concurrency=concurrency,
              max_concurrency=max_concurrency, duration=duration, drain_s=drain_s)
    if pool is not None and pool.procs > 1 and not concurrency and not max_concurrency:
        played, t0, watch, peak = await play_shares(pool, url, workload, kw)
    else:
        played, t0, watch, peak = await _play(url, workload, **kw)
    check = selfcheck.summary(watch, [load_figures.Req(**_times(s, t0)).lateness for s in played],
                              open_peak=peak, arrivals=None if concurrency or max_concurrency
                              else open_loop_fit(played), level=level)
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
            if start is not None:
                await sleep_until(start)
            t0 = clock() if start is None else start
            playing[0] = True
            tasks, last = [], 0.0
            if concurrency:
                queue = list(zip(groups, ready))

                async def worker():
                    while queue and (duration is None or clock() - t0 < duration):
                        g, w = queue.pop(0)
                        await p.turns(g, clock(), w)
                tasks = [asyncio.create_task(worker()) for _ in range(concurrency)]
                last = duration or 0.0
                groups, ready = timed, timed_ready  # what the dispatcher below sends on time
            for g, w in sorted(zip(groups, ready), key=lambda x: x[0][0].offset or 0.0):
                at = t0 + (g[0].offset or 0.0)
                last = max(last, g[0].offset or 0.0)
                await sleep_until(at)
                tasks.append(asyncio.create_task(p.turns(g, at, w)))
            timeout = max(last - (clock() - t0), 0.0) + drain_s
            done, pending = await asyncio.wait(tasks, timeout=timeout) if tasks else (set(), set())
            playing[0] = False
            for t in pending:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        client.settle()
    for s in p.played:
        if s.rec.cancelled and not s.rec.error:
            s.rec.error = f"not done {drain_s:.0f} s after the last scheduled send"
    return p.played, t0, watch, client.open.peak


def _play_share(url: str, workload: Workload, kw: dict, start: float) -> dict:
    """One worker process's share of an open loop (its own event loop), played from `start`."""
    played, _, watch, peak = asyncio.run(_play(url, workload, **kw, start=start))
    return {"played": played, "lags": watch.lags, "cpu_s": watch.cpu_s, "wall_s": watch.wall_s,
            "open_s": watch.open_s, "open_idle_s": watch.open_idle_s}


async def play_shares(pool: workers.Workers, url: str, workload: Workload, kw: dict
                      ) -> tuple[list[Sent], float, selfcheck.Watch, int]:
    """An open loop over the pool's processes: its sessions, in order of their first offset, dealt
    round robin, each sent at its own offset from one start (a CLOCK_MONOTONIC time all processes
    share), so the union of the sends is the schedule itself (Poisson, gamma or a trace, exactly)
    while each process keeps only 1/procs of it. One Watch holds every process's lag and CPU; the
    streams open at once are counted over all records."""
    groups = sorted(sessions(workload.items), key=lambda g: g[0].offset or 0.0)
    shares = [groups[i::pool.procs] for i in range(pool.procs)]
    parts = [replace(workload, items=tuple(it for g in share for it in g)) for share in shares if share]
    start = clock() + workers.START_AHEAD_S
    outs = await pool.each(_play_share, [(url, w, kw, start) for w in parts])
    watch = selfcheck.Watch()
    watch.procs, played = len(parts), []
    for out in outs:
        played += out["played"]
        watch.lags += out["lags"]
        watch.cpu_s += out["cpu_s"]
        watch.wall_s = max(watch.wall_s, out["wall_s"])
        watch.open_s += out["open_s"]
        watch.open_idle_s += out["open_idle_s"] or 0.0
    played.sort(key=lambda s: (s.rec.scheduled if s.rec.scheduled is not None else float("inf")))
    return played, start, watch, workers.peak_open([s.rec for s in played])


def open_loop_fit(played: list[Sent]) -> dict | None:
    """The open loop's sends against their schedule (selfcheck.arrival_fit): every item sent at
    its offset (a session's later turns go after replies, off the schedule)."""
    timed = [s for s in played if s.item.turn == 0 and s.rec.sent is not None and s.rec.scheduled is not None]
    return selfcheck.arrival_fit([s.rec.scheduled for s in timed], [s.rec.sent for s in timed])


def _times(s: Sent, t0: float) -> dict:
    rel = lambda t: None if t is None else t - t0  # noqa: E731
    return {"id": s.item.id, "scheduled": rel(s.rec.scheduled), "released": rel(s.released), "sent": rel(s.rec.sent)}


def to_req(s: Sent, t0: float) -> Req:
    """The compact record the receipt keeps."""
    rec, it = s.rec, s.item
    gaps, prev = [], rec.sent
    for t in rec.token_times if rec.sent is not None else []:
        gaps.append(round((t - prev) * 1e6))
        prev = t
    return Req(**_times(s, t0), kind=it.kind, warmup=bool(getattr(it, "warmup", False)), gaps_us=gaps,
               ended=None if rec.ended is None else rec.ended - t0, error=rec.error, prompt_len=rec.prompt_len,
               max_tokens=rec.max_tokens, tokens=rec.tokens, cached=rec.cached_tokens,
               sha=exactness.reply_sha(rec.token_ids, rec.server_sha) if rec.token_ids else None,
               pkey=prompt_key(s.req.prompt, s.req.max_tokens, s.req.temperature, s.req.seed) if s.req.prompt else None,
               session=it.session, turn=it.turn)


# ---- a session of runs ---------------------------------------------------------------------

@dataclass
class LoadSettings:
    session: Session
    spec: object  # tensorfold_bench.workload.spec.LoadSpec: levels, build(level, vocab), describe()
    slo: Slo
    max_concurrency: int | None = None
    plain_check: bool = False
    sampling: Sampling = GREEDY
    drain_s: float = DRAIN_S
    procs: int = 1  # client processes for an open loop (play_shares)


def context_for(spec, vocab: int) -> int:
    """An engine context that holds every request's prompt and reply (a session's whole
    history), rounded up to 256."""
    need = 0
    for level in spec.levels:
        for turns in sessions(spec.build(level, vocab).items):
            total = 0
            for it in turns:
                n = len(it.prompt.encode()) + 1 if isinstance(it.prompt, str) else len(it.prompt)
                total += n + it.output_len
                need = max(need, total + 1)
    return max(256, -(-need // 256) * 256)


def parse_list(flag: str, text, kind: type) -> list | None:
    """`1,2,4` -> [1.0, 2.0, 4.0] (or ints); the values' own checks are the workload's."""
    if text is None or isinstance(text, (list, tuple)):
        return text
    out = []
    for part in str(text).split(","):
        try:
            out.append(kind(part.strip()))
        except ValueError:
            what = "requests per second" if kind is float else "a whole number of requests in flight"
            raise FlagError(flag, f"{part.strip()!r} is not {what} (e.g. {flag} 1,2,4)") from None
    if len(set(out)) != len(out):
        raise FlagError(flag, f"{text!r} repeats a level")
    return out


def parse_max_concurrency(v: int | None) -> int | None:
    if v is not None and v < 1:
        raise FlagError("--max-concurrency", f"must be at least 1, not {v}")
    return v


def settings_from_flags(*, model, device, dtype, share, order, url, out_dir, plain_check, parallel, prefill_rows,
                        max_model_len, seed, engine_args, workload: dict, slo=None, max_concurrency=None, vocab=None,
                        stamp="", variants_file=None, base_ref=None, new_ref=None, aa=False, predict=None,
                        margin=0.02, tokenizer=None, token_ids="ids", temperature=0.0, tensor_parallel=1,
                        procs=1) -> LoadSettings:
    """`tfbench load`'s flags -> settings. The workload's flags and files are checked first
    (tensorfold_bench.workload.spec.from_flags), then the SLO and the rest, before any server
    starts. `workload`: from_flags's keyword arguments."""
    from tensorfold_bench.workload import spec as spec_mod
    w = dict(workload)
    w["rates"] = parse_list("--rate", w.get("rates"), float)
    w["concurrency"] = parse_list("--concurrency", w.get("concurrency"), int)
    spec = spec_mod.from_flags(seed=seed, tokenizer=tokenizer, fallback=text_counter(url, model, device, variants_file),
                               **w)
    slo_v = load_figures.parse_slo(slo)
    mc = parse_max_concurrency(max_concurrency)
    if not isinstance(procs, int) or isinstance(procs, bool) or procs < 1:
        raise FlagError("--procs", f"must be a whole number, at least 1, not {procs!r}")
    if procs > 1 and (mc or w.get("concurrency")):
        raise FlagError("--procs", "spreads an open loop (--rate or a trace) over processes; not --concurrency or "
                                   "--max-concurrency, whose slots one process keeps")
    session.check_margin(margin)
    session.positive("--parallel", parallel)
    conc = [lv.value for lv in spec.levels if lv.kind == "concurrency"]
    par = max([parallel or 0, *[int(c) for c in conc]]) or None  # a closed loop's streams each get a lane
    variants, names, url = targets.select(url, share, variants_file, base_ref, new_ref, order, aa)
    engine = session.engine_setup(device=device, model=model, dtype=dtype, parallel=par, prefill_rows=prefill_rows,
                                  max_model_len=None, seed=seed, trace=False, engine_args=engine_args,
                                  tensor_parallel=tensor_parallel)
    if not url:  # sized from the workload itself (lengths do not depend on the vocabulary)
        engine.max_model_len = max_model_len or context_for(spec, vocab or 1 << 30)
    labels = [lv.label for lv in spec.levels]
    preds = read_predictions(predict, [v.name for v in variants], load_figures.predictable(labels)) if predict else None
    return LoadSettings(Session(engine, variants, names, Path(out_dir), "load", url=url, margin=margin,
                                predictions=preds, stamp=stamp, vocab=vocab, tokenizer=tokenizer,
                                token_ids=token_ids), spec, slo_v, mc, plain_check, Sampling(temperature, seed),
                        procs=procs)


def text_counter(url, model: str | None, device: str, variants_file) -> object | None:
    """What counts a file's text without --tokenizer: the (first) --url server's /tokenize, or
    the launched tfengine's own tokenizer for --model; none for command variants, which may
    serve anything (a text file then needs --tokenizer)."""
    from tensorfold_bench.workload import readers
    first = (url[0] if url else None) if isinstance(url, (list, tuple)) else url
    if first:
        return readers.counter_for(first, None)
    if variants_file:
        return None
    return readers.counter_for(None, model or session.device_preset(device).model)


def level_dict(level) -> dict:
    return {"kind": level.kind, "value": level.value, "label": level.label}


def play_levels(settings: LoadSettings, run: Run, vocab: int, max_concurrency: int | None = None,
                closed: int | None = None) -> tuple[list[dict], dict]:
    """Every level on the run's server; per level its records and figures, and the self-check of
    the worst level (every level's is kept)."""
    with contextlib.ExitStack() as stack:
        pool = stack.enter_context(workers.Workers(settings.procs)) if settings.procs > 1 and not closed else None
        return _play_levels(settings, run, vocab, max_concurrency, closed, pool)


def _play_levels(settings: LoadSettings, run: Run, vocab: int, max_concurrency: int | None, closed: int | None,
                 pool: workers.Workers | None) -> tuple[list[dict], dict]:
    out, checks = [], []
    for level in settings.spec.levels:
        # a server tfbench did not start may hold earlier runs' prompts: each run's are fresh there
        wl = settings.spec.build(level, vocab, f"run{run.index}{run.salt}" if run.shared else "")
        run.status(f"{run.variant.name}: {level.label} ({len(wl.items)} requests)")
        conc = closed or (int(level.value) if level.kind == "concurrency" else None)
        played, t0, check = asyncio.run(play_level(
            run.url, wl, model=run.model, token_ids=run.token_ids, sampling=settings.sampling, concurrency=conc,
            max_concurrency=max_concurrency, duration=getattr(settings.spec, "duration", None) if conc else None,
            drain_s=settings.drain_s, level=level_dict(level), pool=pool))
        reqs = [to_req(s, t0) for s in played]
        out.append({**level_dict(level), "source": wl.source, "client": check,
                    "records": [r.to_dict() for r in reqs]})
        checks.append(check)
    return out, (max(checks, key=lambda c: c["loop_lag_p99_ms"]) if checks else {})


def play(settings: LoadSettings, data: dict, run: Run) -> dict:
    """One run on its server: every level's records, then an injected prompt alone (cold)."""
    if run.vocab is not None and run.vocab < 2:
        raise BenchError(f"server reports a vocabulary of {run.vocab}")
    data["vocab"] = run.vocab
    levels, check = play_levels(settings, run, run.vocab, settings.max_concurrency)
    alone, inj = None, getattr(settings.spec, "inject", None)
    if inj is not None:  # the injected prompt's first token with nothing else running (its ids fresh: cold)
        ids = prompt_ids(settings.sampling.seed, f"load:alone:{run.index}{run.salt}", inj.length, run.vocab)
        req = request_for(Item("inject-alone", tuple(ids), inj.output_len, kind="inject"), ids, run.token_ids,
                          settings.sampling)
        rec = asyncio.run(play_alone(run.url, req, run.model))
        alone = {"ttft_ms": None if not rec.token_times else (rec.token_times[0] - rec.sent) * 1000,
                 "prompt_len": len(ids), "cached": rec.cached_tokens, "error": rec.error}
    return {"levels": levels, "client": check, "alone": alone}


def finish(settings_slo: Slo, entry: dict) -> str:
    """The run's figures per level and flat (statistics, predictions); its validity."""
    if entry.get("error"):
        entry.update(levels=[], figures={}, valid=False, invalid_reasons=[f"the server failed: {entry['failure']}"])
        return f"{entry['variant']}: FAILED: {entry['failure']}"
    reasons, flat = [], {}
    for lv in entry["levels"]:
        f = load_figures.level_figures([Req.from_dict(r) for r in lv["records"]], settings_slo)
        lv["figures"] = f
        if lv.get("client"):  # the client's own delays against the first token it times
            selfcheck.judge(lv["client"], {f"TTFT {q}": f["latency"]["ttft"][q] for q in ("p50", "p99")})
        flat.update(load_figures.flat(lv["label"], f))
        reasons += [f"{lv['label']}: {why}" for why in f["invalid"]]
        reasons += [f"{lv['label']}: {why}" for why in selfcheck.bottleneck(lv.get("client"))]
    entry["figures"], entry["valid"], entry["invalid_reasons"] = flat, not reasons, reasons
    shown = ", ".join(f"{lv['label']}: goodput {num(lv['figures']['goodput'])}, TTFT p99 "
                      f"{num(lv['figures']['latency']['ttft']['p99'], 0)} ms" for lv in entry["levels"])
    return f"{entry['variant']}: {shown}" + ("" if not reasons else f"  INVALID: {'; '.join(reasons[:3])}")


def run_plain(settings: LoadSettings, base_source, vocab: int) -> dict:
    """Every distinct request alone (one stream, whole prompt, no cache, no drafts) on the base's
    source: each level's workload as a closed loop of one, a prompt seen at an earlier level not
    sent again. The reply hashes by prompt key."""
    pv = plain(settings.session.variants[0])
    log, facts = settings.session.run_dir / "plain.log", {}
    hashes: dict[str, str | None] = {}
    with session.serve(settings.session, pv, base_source, log, facts) as url:
        info = session.server_info(url)
        model, _, _ = session.model_facts(info)
        for level in settings.spec.levels:
            wl = settings.spec.build(level, vocab)
            items, seen = [], set()
            for turns in sessions(wl.items):
                key = prompt_key(turns[0].prompt, turns[0].output_len, *_sampled(settings, turns[0]))
                if key in hashes or key in seen:
                    continue
                seen.add(key)
                items += turns
            played, t0, _ = asyncio.run(play_level(url, replace(wl, items=tuple(items)), model=model,
                                                   token_ids=settings.session.token_ids, sampling=settings.sampling,
                                                   concurrency=1, drain_s=settings.drain_s))
            for s in played:
                r = to_req(s, t0)
                if r.pkey:
                    hashes[r.pkey] = r.sha
    return {"variant": pv.to_dict(), "hashes": hashes, "log": str(log),
            "server": {"pgid": facts["pgid"], "argv": facts["argv"]}, "engine": info.get("engine")}


def _sampled(settings: LoadSettings, item: Item) -> tuple[float, int | None]:
    r = request_for(item, item.prompt, "ids", settings.sampling)
    return r.temperature, r.seed


def not_run(settings: LoadSettings, data: dict) -> list[str]:
    out, url = [], settings.session.url
    if url:
        out.append(session.url_not_run(url, "every run sends the same requests, so a later run may hit what an "
                                               "earlier one cached"))
    out += session.plain_not_run(settings.session, settings.plain_check, data.get("plain_error"))
    for r in data["runs"]:
        if not r.get("valid"):
            out.append(f"Run {r['index']} ({r['variant']}) is invalid and left out of the medians: "
                       + "; ".join(r.get("invalid_reasons") or []) + (f" (log: {r['log']})" if r.get("error") else ""))
    return out


def analyse(settings: LoadSettings, data: dict) -> dict:
    """Exactness, statistics, predictions and what was not run, from the runs so far (idempotent)."""
    s = settings.session
    data["exactness"] = exactness.load(data)
    data["not_run"] = not_run(settings, data)
    data["stats"] = load_stats(data)
    if s.predictions:
        data["predictions"] = s.predictions.check(medians(data)).to_dict()
    return data


STATS = (*load_figures.JUDGED, "ttft_p50")  # the verdict rows and what the picture draws


def load_stats(data: dict) -> dict:
    """The statistics of the figures the receipt's verdict rows and picture show, over the runs
    (invalid runs left out); every other figure stays in each run's `figures`."""
    from tensorfold_bench import figures
    runs = data["runs"]
    names = [n for n in dict.fromkeys(n for r in runs for n in r.get("figures") or {})
             if load_figures.family(n) in STATS]
    values = [r["figures"] if r.get("valid") else {} for r in runs]
    return {k: fs.to_dict() for k, fs in figures.stats_for(
        names, [r["variant"] for r in runs], values, data["settings"]["base"], data["settings"]["margin"]).items()}


def medians(data: dict) -> dict[str, dict[str, float | None]]:
    """variant -> flat figure -> median over its valid runs (what predictions are checked against)."""
    from tensorfold_bench.figures import figure_runs, median
    out: dict[str, dict] = {}
    for name, by in figure_runs(data).items():
        for v, xs in by.items():
            out.setdefault(v, {})[name] = median(xs)
    return out


def run(settings: LoadSettings, reporter: Reporter | None = None, save: Callable[[dict], None] | None = None) -> dict:
    """Every run in order, a fresh server each (or the running servers), then the plain
    reference; the receipt's data. `save(data)` gets the receipt so far after every run."""
    rep, s = reporter or session.QuietReporter(), settings.session
    srcs = session.sources(s)
    data = session.header(s, srcs, {"workload": settings.spec.describe(),
                                    "levels": [level_dict(lv) for lv in settings.spec.levels],
                                    "slo": settings.slo.to_dict(), "max_concurrency": settings.max_concurrency,
                                    "plain_check": settings.plain_check, "sampling": settings.sampling.to_dict(),
                                    "late_p99_ms": load_figures.LATE_P99_S * 1000})
    data.update(plain=None, vocab=None)
    plain_ref = settings.plain_check and not s.url and s.variants[0].command is None
    rep.start(len(s.order) + (1 if plain_ref else 0))
    checkpoint = (lambda: save(analyse(settings, data))) if save else None
    session.run_all(s, data, srcs, lambda r: play(settings, data, r), rep, lambda e: finish(settings.slo, e),
                    keep_failed=True, checkpoint=checkpoint, after=["the plain reference"] if plain_ref else [])
    if plain_ref:
        rep.step("plain reference")
        try:
            data["plain"] = run_plain(settings, srcs[s.variants[0].name], data["vocab"]) if data["vocab"] else None
        except ServerError as e:
            data["plain_error"] = e.what + (f": {e.last_line}" if e.last_line else "") + f" (log {e.log})"
        rep.advance()
    data["partial"] = None
    return analyse(settings, data)
