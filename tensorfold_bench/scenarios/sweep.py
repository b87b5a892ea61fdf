"""The `sweep` scenario (concurrent decode): does anything else get slower?

At each level L of `levels` (1, 2, 4, 8), for each cell c of `cells`, `reps` times: L streams
start together, stream s sending prompt P(c, s) (seeded token ids, `prompt_tokens` long) and
generating `tokens` tokens with `ignore_eos`. One such burst is a *batch*; its figure (aggregate
tok/s) and each level's are computed in tensorfold_bench.analysis.figures, and every token's time is kept
(compactly) so first-token and inter-token latencies come from the saved receipt too.

Prompt P(c, s) is the same at every level, rep and variant, so its reply must be too (greedy
decoding is exact whatever the batch, and so is sampling with `--temperature`: P(c, s) always
sends the seed of its key, tensorfold_bench.client.sampling): each prompt's token hash is compared
across reps, levels and runs. The engine gets `--parallel max(levels)` unless `--parallel N` says
fewer: a level above N is then that many streams open at once, N in lanes and the rest in the
server's queue (their first token includes the wait, which is what such a level measures), and
the receipt marks it.

Reps of a cell run on the same server, so from the second rep on the prompt cache may hold the
prompts: every variant sees the same, and the median over reps is the warm figure.
"""
from __future__ import annotations

import asyncio
import contextlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from tensorfold_bench.analysis import exactness, figures, sweep as sweep_figures
from tensorfold_bench.analysis.figures import num
from tensorfold_bench.analysis.predictions import read as read_predictions
from tensorfold_bench.client import selfcheck, wire, workers
from tensorfold_bench.client.play import http_client
from tensorfold_bench.client.sampling import GREEDY, Sampling
from tensorfold_bench.client.stream import Request, StreamClient, StreamRecord, clock, collector_held, new_record, stream
from tensorfold_bench.client.virtual import SimError, SimRequest
from tensorfold_bench.client.virtual import play as play_virtual
from tensorfold_bench.errors import BenchError, FlagError
from tensorfold_bench.session import defaults, driver, targets
from tensorfold_bench.session.driver import Reporter, Run, Session
from tensorfold_bench.workload.ids import prompt_ids


@dataclass(frozen=True)
class SweepScript:
    levels: tuple[int, ...] = (1, 2, 4, 8)
    tokens: int = 256
    cells: int = 4
    reps: int = 3
    prompt_tokens: int = 200
    seed: int = 0
    timeout_s: float = 900.0  # per batch
    sampling: Sampling = GREEDY  # stored in the receipt's settings, not the script's

    def __post_init__(self):
        if not self.levels or any(lv < 1 for lv in self.levels):
            raise FlagError("--levels", "each level must be a positive stream count")
        for flag, v in (("--tokens", self.tokens), ("--cells", self.cells), ("--reps", self.reps),
                        ("--prompt-tokens", self.prompt_tokens)):
            if v < 1:
                raise FlagError(flag, f"must be at least 1, not {v}")

    @property
    def max_level(self) -> int:
        return max(self.levels)

    def to_dict(self) -> dict:
        d = asdict(self)
        del d["sampling"]
        return d


def parse_levels(text: str) -> tuple[int, ...]:
    out = []
    for part in text.split(","):
        try:
            v = int(part.strip())
        except ValueError:
            raise FlagError("--levels", f"{part.strip()!r} is not a stream count (e.g. 1,2,4,8)") from None
        if v < 1:
            raise FlagError("--levels", f"{v} is not a positive stream count")
        out.append(v)
    if len(set(out)) != len(out):
        raise FlagError("--levels", f"{text!r} repeats a level")
    return tuple(out)


def prompt_name(cell: int, stream_i: int) -> str:
    """P(c, s)'s name: it seeds the prompt's ids and, sampling, the request's seed."""
    return "sweep:" + exactness.prompt_key(cell, stream_i)


def cell_prompts(script: SweepScript, cell: int, level: int, vocab: int) -> list[list[int]]:
    return [prompt_ids(script.seed, prompt_name(cell, s), script.prompt_tokens, vocab) for s in range(level)]


@dataclass
class Burst:
    """One batch's records and what the client saw of it: the streams open at once (its own
    count, and the server's running + waiting streams where its /metrics says, with the split
    at that reading: in lanes, and queued for one)."""

    records: list[StreamRecord]
    peak_open: int
    server_open: int | None = None
    server_running: int | None = None
    server_waiting: int | None = None


@dataclass(frozen=True)
class ServerCount:
    """One reading of tfengine's /metrics: streams in a lane and streams queued for one."""

    running: int
    waiting: int

    @property
    def open(self) -> int:
        return self.running + self.waiting


async def server_open(url: str, level: int, all_open: Callable[[], bool], within_s: float = 2.0
                      ) -> ServerCount | None:
    """While the burst has all `level` streams open (`all_open()`; it waits for the first time),
    the reading of tfengine's /metrics with the most running + waiting streams, read every 10 ms
    until it shows all of them or `within_s` passes (a request reaches the lane host some
    milliseconds after its connection opens, later on a busy server); None if the server has no
    such gauges or a stream ended before the first count."""
    while not all_open():
        await asyncio.sleep(0.005)
    best, deadline, target = None, clock() + within_s, wire.Target.parse(url)
    while all_open() and clock() < deadline:
        try:
            text = await wire.get_text(target, "/metrics", clock)
        except wire.WireError:
            return best
        if text is None:
            return best
        vals = {}
        for ln in text.splitlines():
            name, _, v = ln.partition(" ")
            if name in ("tfengine_running_streams", "tfengine_waiting_streams"):
                vals[name] = float(v)
        if len(vals) != 2:
            return best
        now = ServerCount(int(vals["tfengine_running_streams"]), int(vals["tfengine_waiting_streams"]))
        if best is None or now.open > best.open:
            best = now
        if best.open >= level:
            break
        await asyncio.sleep(0.01)
    return best


def burst_requests(prompts: list[list[int]], tokens: int, token_ids: str = "ids", sampling: Sampling = GREEDY,
                   cell: int = 0) -> list[Request]:
    return [sampling.apply(Request(f"s{i}", p, max_tokens=tokens, ignore_eos=True, token_ids=token_ids),
                           prompt_name(cell, i)) for i, p in enumerate(prompts)]


async def play_burst(client: StreamClient, url: str, prompts: list[list[int]], tokens: int, model: str = "default",
                     timeout_s: float = 900.0, token_ids: str = "ids", sampling: Sampling = GREEDY,
                     cell: int = 0) -> Burst:
    """All streams of one burst, built first, then started together (each one's schedule is that
    start); stream s samples with prompt P(cell, s)'s seed."""
    reqs = burst_requests(prompts, tokens, token_ids, sampling, cell)
    ready = [client.prepare(url, q, model) for q in reqs]
    conns = await client.preopen(url, len(reqs))  # connected before the clock: at t0 only writes
    with collector_held():
        client.open.restart()
        t0 = clock()
        recs = [new_record(r, t0) for r in reqs]
        client.write_all(conns, ready)
        tasks = [asyncio.create_task(stream(client, url, q, r, model, w, c))
                 for q, r, w, c in zip(reqs, recs, ready, conns)]
        count = asyncio.create_task(server_open(url, len(reqs), lambda: client.open.now >= len(reqs)))
        done, pending = await asyncio.wait(tasks, timeout=timeout_s)
        for t in pending:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        count.cancel()
        srv = (await asyncio.gather(count, return_exceptions=True))[0]
        client.settle()  # every stream is over: decoding now delays none
    for r, t in zip(recs, tasks):
        if t in pending and not r.error:
            r.error = f"not done after {timeout_s:.0f} s"
    if not isinstance(srv, ServerCount):
        return Burst(recs, client.open.restart())
    return Burst(recs, client.open.restart(), srv.open, srv.running, srv.waiting)


async def play_burst_procs(pool: workers.Workers, procs: int, url: str, prompts: list[list[int]], tokens: int,
                           model: str = "default", timeout_s: float = 900.0, token_ids: str = "ids",
                           sampling: Sampling = GREEDY, cell: int = 0) -> tuple[Burst, selfcheck.Watch]:
    """play_burst dealt over `procs` worker processes, each with its own loop and connections
    opened before the one start (workers.Workers.burst); the burst and the workers' Watch. The
    streams open at once are counted from the records; the server's count is read from here
    while the burst runs."""
    reqs = burst_requests(prompts, tokens, token_ids, sampling, cell)
    t0 = clock() + workers.START_AHEAD_S
    played = asyncio.ensure_future(pool.burst(url, reqs, model, timeout_s, procs, t0))
    count = asyncio.create_task(server_open(url, len(reqs), lambda: clock() >= t0 + 0.05 and not played.done()))
    recs, watch = await played
    count.cancel()
    srv = (await asyncio.gather(count, return_exceptions=True))[0]
    peak = workers.peak_open(recs)
    if not isinstance(srv, ServerCount):
        return Burst(recs, peak), watch
    return Burst(recs, peak, srv.open, srv.running, srv.waiting), watch


async def play_batch(url: str, prompts: list[list[int]], tokens: int, model: str = "default",
                     timeout_s: float = 900.0, token_ids: str = "ids", sampling: Sampling = GREEDY,
                     cell: int = 0) -> list[StreamRecord]:
    """play_burst on a client of its own; the records."""
    async with http_client() as client:
        return (await play_burst(client, url, prompts, tokens, model, timeout_s, token_ids, sampling, cell)).records


def level_procs(procs: int | str, levels: tuple[int, ...], url: str | None) -> dict[int, workers.Procs]:
    """Each level's client processes: `--procs N` as given, or (auto) workers.burst_procs on this
    host's cores, less one for a server on it."""
    if procs != "auto":
        return {lv: workers.Procs(int(procs), "--procs") for lv in levels}
    here = workers.on_this_host(url)
    n = max(1, workers.cores() - (1 if here else 0))
    return {lv: workers.burst_procs(lv, n, here) for lv in levels}


async def play_levels(url: str, script: SweepScript, vocab: int, label: str, model: str = "default",
                      progress: Callable[[str], None] | None = None, token_ids: str = "ids",
                      procs: int | str = 1) -> tuple[list[dict], dict]:
    """Every level, cell and rep on one server: each batch's records, reduced (sweep_figures.sweep_batch),
    and the client's self-check over them all (tensorfold_bench.client.selfcheck). `procs`: client
    processes (a number, or auto: level_procs); a level with more than one is played by worker
    processes, the rest on this loop."""
    batches, late, peaks, srv, split, spread = [], [], {}, {}, {}, {}
    by_level = level_procs(procs, script.levels, url)
    most = max(p.procs for p in by_level.values())
    with workers.Workers(most) if most > 1 else contextlib.nullcontext() as pool:
        async with http_client() as client, selfcheck.Watch.over(client.open) as watch:

            async def one(level: int, prompts: list[list[int]], cell: int) -> Burst:
                if by_level[level].procs == 1:
                    return await play_burst(client, url, prompts, script.tokens, model, script.timeout_s, token_ids,
                                            script.sampling, cell)
                burst, theirs = await play_burst_procs(pool, by_level[level].procs, url, prompts, script.tokens, model,
                                                       script.timeout_s, token_ids, script.sampling, cell)
                watch.add(theirs)
                return burst

            for level in script.levels:
                for cell in range(script.cells):
                    prompts = cell_prompts(script, cell, level, vocab)
                    for rep in range(script.reps):
                        burst = await one(level, prompts, cell)
                        recs = burst.records
                        hashes = [exactness.reply_sha(r.token_ids, r.server_sha) for r in recs]
                        b = sweep_figures.sweep_batch(level, cell, rep, recs, script.tokens, hashes)
                        b.update(peak_open=burst.peak_open, server_open=burst.server_open)
                        if burst.server_waiting:  # queued behind fewer lanes: where they were
                            b.update(server_running=burst.server_running, server_waiting=burst.server_waiting)
                        batches.append(b)
                        late += [figures.lateness(r) for r in recs]
                        peaks[level] = min(peaks.get(level, level), burst.peak_open)
                        if b.get("send_spread_ms") is not None:
                            spread[level] = max(spread.get(level, 0.0), b["send_spread_ms"])
                        if burst.server_open is not None and burst.server_open <= srv.get(level, level):
                            srv[level] = burst.server_open
                            if burst.server_waiting:
                                split[level] = (burst.server_running, burst.server_waiting)
                            else:
                                split.pop(level, None)
                        if progress:
                            tok = "failed" if b["tok_s"] is None else f"{b['tok_s']:.1f} tok/s"
                            progress(f"{label}: {level} streams, cell {cell + 1}/{script.cells}, "
                                     f"rep {rep + 1}/{script.reps}: {tok}")
    check = selfcheck.summary(watch, late, peaks, srv, server_split=split, spread=spread)
    if most > 1 or procs != 1:
        check["workers"] = {"by_level": {str(lv): p.to_dict() for lv, p in by_level.items()},
                            "why": "; ".join(f"{lv} streams: {p.text()}" for lv, p in by_level.items())}
    return batches, check


# ---- a session of runs ---------------------------------------------------------------------

@dataclass
class SweepSettings:
    session: Session
    script: SweepScript
    scaled: dict = field(default_factory=dict)  # settings.scaled_down: what the device's defaults cut
    procs: int | str = "auto"  # client processes a level (play_levels); auto: one per 256 streams, up to the cores


def settings_from_flags(*, model, device, dtype, share, variants_file, base_ref, new_ref, aa, order, url, out_dir,
                        parallel, prefill_rows, max_model_len, seed, engine_args, levels, tokens=None, cells=None,
                        reps=None, prompt_tokens=200, predict=None, margin=0.02, stamp="", vocab=None, tokenizer=None,
                        token_ids="ids", temperature=0.0, tensor_parallel=1, mixed=None, split=None,
                        procs="auto") -> SweepSettings:
    """`tfbench sweep`'s flags -> settings; predictions are read here, before any run."""
    v, notes = defaults.sized(device, {"--tokens": tokens, "--cells": cells, "--reps": reps},
                             {"--tokens": "sweep_tokens", "--cells": "sweep_cells", "--reps": "sweep_reps"})
    script = SweepScript(levels=parse_levels(levels), tokens=v["--tokens"], cells=v["--cells"], reps=v["--reps"],
                         prompt_tokens=prompt_tokens, seed=seed, sampling=Sampling(temperature, seed))
    defaults.positive("--parallel", parallel)
    parallel = parallel or script.max_level  # by default every stream gets a lane; fewer queue the rest
    engine = defaults.engine_setup(device=device, model=model, dtype=dtype, parallel=parallel, prefill_rows=prefill_rows,
                                  max_model_len=max_model_len, seed=seed, trace=False, engine_args=engine_args,
                                  tensor_parallel=tensor_parallel)
    need = script.prompt_tokens + script.tokens + 1
    engine.max_model_len = None if url else (max_model_len or max(1024, -(-need // 256) * 256))
    vs, names, url = targets.select(url, share, variants_file, base_ref, new_ref, order, aa, mixed, split)
    preds = read_predictions(predict, [v.name for v in vs], figures.predictable_sweep(script.levels)) if predict else None
    return SweepSettings(Session(engine, vs, names, Path(out_dir), "sweep", url=url, margin=margin,
                                 predictions=preds, stamp=stamp, vocab=vocab, tokenizer=tokenizer,
                                 token_ids=token_ids), script, defaults.scaled_note(device, notes),
                         workers.parse_procs(procs))


def lanes(run: Run) -> int | None:
    """The server's lanes as its /v1/engine says (None: a server that does not say)."""
    return ((run.info.get("engine") or {}).get("config") or {}).get("parallel")


def check_server(run: Run, script: SweepScript) -> int:
    """The run's vocabulary, once the server's context is known to fit the script (fewer lanes
    than a level only queue its streams)."""
    if run.max_model_len is not None and script.prompt_tokens + script.tokens > run.max_model_len:
        raise FlagError("--tokens", f"{script.prompt_tokens} prompt + {script.tokens} tokens exceed the server's "
                                    f"max_model_len {run.max_model_len}")
    return run.vocab


def play_levels_simulated(script: SweepScript, run: Run, vocab: int) -> list[dict]:
    """Every level, cell and rep in virtual time (run.sim): each batch its own simulation, its
    streams sent together at 0 (so a rep never finds an earlier rep's prompts cached)."""
    sim, batches = run.sim, []
    for level in script.levels:
        for cell in range(script.cells):
            prompts = cell_prompts(script, cell, level, vocab)
            reqs = [SimRequest(f"s{i}", p, script.tokens) for i, p in enumerate(prompts)]
            for rep in range(script.reps):
                try:
                    res = play_virtual(reqs, sim.cfg, sim.costs, sim.caps, vocab_size=sim.vocab)
                except SimError as e:
                    raise BenchError(f"--sim: {e}") from None
                recs = [res.records[r.name] for r in reqs]
                hashes = [exactness.reply_sha(r.token_ids, None) for r in recs]
                b = sweep_figures.sweep_batch(level, cell, rep, recs, script.tokens, hashes)
                b.update(peak_open=level, server_open=None)
                batches.append(b)
            run.status(f"{run.variant.name}: {level} streams, cell {cell + 1}/{script.cells} (simulated)")
    return batches


def play(script: SweepScript, run: Run, procs: int | str = "auto") -> dict:
    """One run on its server: every batch, raw times kept (`procs`: client processes, play_levels)."""
    vocab = check_server(run, script)
    if run.sim:
        return {"batches": play_levels_simulated(script, run, vocab), "client": None,
                "lanes": run.sim.cfg.parallel, "system_fingerprint": None}
    batches, check = asyncio.run(play_levels(run.url, script, vocab, run.variant.name, run.model, run.status,
                                             run.token_ids, procs))
    return {"batches": batches, "client": check, "lanes": lanes(run),
            "system_fingerprint": next((b["system_fingerprint"] for b in batches if b["system_fingerprint"]), None)}


def measure(entry: dict) -> None:
    """The run's figures; a failed run (its server never served) has none."""
    if entry.get("error"):
        entry.update(batches=[], figures={}, errors=[entry["failure"]])
        return
    entry["figures"] = sweep_figures.sweep_run(entry["batches"])
    entry["errors"] = sweep_figures.batch_errors(entry["batches"])
    entry["counted_by"] = sweep_figures.sweep_counted_by(entry["batches"])


def line(entry: dict) -> str:
    """The run's progress line: its tok/s per level."""
    if entry.get("error"):
        return f"{entry['variant']}: FAILED: {entry['failure']}"
    bad = (entry.get("client") or {}).get("invalid")
    return f"{entry['variant']}: " + ", ".join(f"{k} {num(v, 1, '–')}" for k, v in entry["figures"].items()
                                               if k.startswith("tok_s")) + (f"  INVALID: {'; '.join(bad)}" if bad else "")


class Sweep(driver.Scenario):
    """Concurrent decode at each level as the session driver plays it: no plain reference (every
    reply is compared across reps, levels and runs)."""

    has_plain = False


    def header(self) -> dict:
        s = self.settings
        return {"script": s.script.to_dict(), "sampling": s.script.sampling.to_dict(), **s.scaled}

    def begin(self, data: dict) -> None:
        pass

    def play(self, data: dict, run: Run) -> dict:
        return play(self.settings.script, run, self.settings.procs)

    def measure(self, entry: dict) -> None:
        measure(entry)

    failed = measure

    def line(self, entry: dict) -> str:
        return line(entry)

    def stats(self, data: dict) -> dict | None:
        return sweep_figures.sweep_stats(data)

    def check(self, data: dict) -> None:
        ref = next((i for i, r in enumerate(data["runs"]) if r["variant"] == data["settings"]["base"]), 0)
        data["hashes"] = exactness.sweep([(r["variant"], r["batches"]) for r in data["runs"]], ref).to_dict()

    def predicted(self, data: dict, summary=None) -> dict:
        return sweep_figures.sweep_predicted(data)

    def notes_before(self, data: dict) -> list[str]:
        st = data["settings"]
        return [st["scaled_down"]] if st.get("scaled_down") else []

    def run_notes(self, entry: dict) -> list[str]:
        """A failed run and a batch with errors are left out; a run the client limited is invalid."""
        r = entry
        if r.get("error"):
            return [f"Run {r['index']} ({r['variant']}) failed and is left out: {r['failure']} (log: {r['log']})"]
        out = [f"Run {r['index']} ({r['variant']}): {e}: that batch is left out." for e in r.get("errors", [])]
        if (r.get("client") or {}).get("invalid"):
            out.append(f"Run {r['index']} ({r['variant']}) is invalid, the client was the bottleneck, and its "
                       f"figures are left out: {'; '.join(r['client']['invalid'])}.")
        return out


def run(settings: SweepSettings, reporter: Reporter | None = None,
        save: driver.Save | None = None) -> tuple[dict, object]:
    """Every run in order, a fresh server each (unless --url); the receipt's data (driver.run)."""
    return driver.run(Sweep(settings), reporter, save)
