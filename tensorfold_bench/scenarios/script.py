"""`tfbench run script FILE`: a script's timeline (tensorfold_bench.workload.script_file) played on the session's
run loop, one fresh server per run in the variants' order (or running servers, --url), then the
plain reference; figures from the figures registry, exactness per stream.

Pacing apart from sending: each stream waits for its send time (seconds from the run's start,
or an event of another stream plus seconds), then goes out through the one client
(client.stream). Events are read off the streams' raw records (figures.event_time), looked at
every POLL_S; a send's lateness against its script time (the event's own time plus the
seconds) is measured, so a late send makes the run invalid rather than silently shifting it.
A stream whose event can no longer happen (the stream it waits for ended without it) is not
sent, and says why. A stream is cancelled by closing its stream: `cancel` after seconds or
tokens, or `until` once every listed event has happened or can no longer happen.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from pathlib import Path

from tensorfold_bench.analysis import exactness, figures
from tensorfold_bench.analysis.figures import num
from tensorfold_bench.analysis.predictions import read as read_predictions
from tensorfold_bench.client import selfcheck
from tensorfold_bench.client.play import http_client, play_alone
from tensorfold_bench.client.sampling import GREEDY, Sampling, request_seed
from tensorfold_bench.client.stream import (Request, StreamRecord, clock, collector_held, fingerprint, new_record, stream,
                                             weakest_count)
from tensorfold_bench.client.timer import sleep_until
from tensorfold_bench.client.virtual import SimError, SimRequest, SimResult
from tensorfold_bench.client.virtual import play as play_virtual
from tensorfold_bench.errors import BenchError, FlagError
from tensorfold_bench.session import defaults, driver, targets
from tensorfold_bench.session.driver import Reporter, Run, Session
from tensorfold_bench.workload.ids import prompt_ids
from tensorfold_bench.workload.script_file import Event, Point, Script, Stream, load

POLL_S = 0.002  # how often waiting streams look at the records: a bound on an event-driven send's lateness


# ---- prompts and requests ------------------------------------------------------------------

def make_prompts(script: Script, vocab: int, key: str = "", seed: int = 0) -> dict[str, list[int] | str]:
    """Each stream's prompt. Random ids are seeded by (script seed + --seed, stream name + key):
    `key` distinguishes runs that share one server (--url), so no run's prompt is cached from an
    earlier one; fresh servers use one key, so every run's replies compare."""
    out: dict[str, list[int] | str] = {}
    todo = list(script.streams)
    while todo:  # a prompt that repeats or extends another comes after it (the checks refuse cycles)
        s = next(s for s in todo if not s.prompt.source or s.prompt.source in out)
        todo.remove(s)
        p, base = s.prompt, script.seed + seed
        if p.random is not None:
            out[s.name] = prompt_ids(base, f"{s.name}{key}", p.random, vocab)
        elif p.text is not None:
            out[s.name] = p.text
        elif p.same_as:
            out[s.name] = out[p.same_as]
        else:
            out[s.name] = list(out[p.prefix_of]) + prompt_ids(base, f"{s.name}+{key}", p.plus, vocab)
    return out


def prompt_len(prompt: list[int] | str) -> int:
    """Token count of a prompt; a text prompt's is bounded by its UTF-8 bytes (byte-level presets)."""
    return len(prompt.encode()) + 1 if isinstance(prompt, str) else len(prompt)


def request(s: Stream, prompt: list[int] | str, token_ids: str, sampling: Sampling) -> Request:
    """The stream as a request: fields beyond the OpenAI ones are sent only when the script asks,
    so a server that knows none of them takes a plain script."""
    extra: dict = {}
    if s.priority != "foreground":
        extra["priority"] = s.priority
    if not s.draft:
        extra["draft"] = False
    # a text prompt goes to /v1/completions as a string (Request sends `prompt` as it is)
    req = Request(s.name, prompt, max_tokens=s.max_tokens, ignore_eos=s.ignore_eos, extra=extra, token_ids=token_ids)
    temperature = sampling.temperature if s.temperature is None else s.temperature
    if not temperature:
        return req
    seed = s.seed if s.seed is not None else request_seed(sampling.seed, s.name)
    return replace(req, temperature=float(temperature), seed=seed)


# ---- one run's timeline --------------------------------------------------------------------

class Timeline:
    """The records of one run as they fill, and what its events say."""

    def __init__(self, script: Script, reqs: dict[str, Request]):
        self.script, self.reqs = script, reqs
        self.recs = {n: new_record(r) for n, r in reqs.items()}
        self.given_up: set[str] = set()
        self.t0 = 0.0

    def event(self, e: Event) -> float | None | bool:
        """Its time; None while it may still happen; False once it cannot."""
        rec = self.recs[e.stream]
        t = figures.event_time(rec, e.kind)
        if t is not None:
            return t
        return False if (e.stream in self.given_up or rec.ended is not None) else None

    async def when(self, p: Point) -> float | str:
        """The time p falls at, once known; or why it never will."""
        if p.event is None:
            return self.t0 + p.plus
        while True:
            t = self.event(p.event)
            if t is False:
                return f"{p.event} did not happen"
            if t is not None:
                return t + p.plus
            await asyncio.sleep(POLL_S)

    def must_cancel(self, s: Stream, rec: StreamRecord) -> bool:
        if s.cancel and s.cancel.after is not None and rec.sent is not None and clock() >= rec.sent + s.cancel.after:
            return True
        if s.cancel and s.cancel.tokens is not None and len(rec.token_times) >= s.cancel.tokens:
            return True
        return bool(s.until) and all(self.event(e) is not None for e in s.until)

    async def play(self, client, url: str, s: Stream, model: str) -> None:
        rec, req = self.recs[s.name], self.reqs[s.name]
        at = await self.when(s.at)
        if isinstance(at, str):
            rec.error, rec.ended = f"not sent: {at}", clock()
            self.given_up.add(s.name)
            return
        rec.scheduled = at
        await sleep_until(at)
        task = asyncio.create_task(stream(client, url, req, rec, model))
        if s.cancellable:
            while not task.done():
                if self.must_cancel(s, rec):
                    task.cancel()
                    break
                await asyncio.sleep(POLL_S)
        await asyncio.gather(task, return_exceptions=True)


def live_client():
    """The one client, its records filled as each reply arrives ("live"): a script's events (a
    first token, a count of tokens) are read off the records while the streams still run."""
    return http_client("live")


async def play_timeline(url: str, script: Script, reqs: dict[str, Request], model: str = "default"
                        ) -> tuple[dict[str, StreamRecord], float, dict]:
    """Every stream on the script's timeline; their raw records, the run's start time and the
    client's self-check. A run past the script's timeout closes what is still open, each such
    stream marked."""
    with collector_held():
        return await _play_timeline(url, script, reqs, model)


async def _play_timeline(url: str, script: Script, reqs: dict[str, Request], model: str
                         ) -> tuple[dict[str, StreamRecord], float, dict]:
    tl = Timeline(script, reqs)
    async with live_client() as client, selfcheck.Watch.over(client.open) as watch:
        tl.t0 = clock()
        tasks = {s.name: asyncio.create_task(tl.play(client, url, s, model)) for s in script.streams}
        done, pending = await asyncio.wait(tasks.values(), timeout=script.timeout_s)
        for name, t in tasks.items():
            if t in pending:
                t.cancel()
                rec = tl.recs[name]
                if rec.sent is None:
                    rec.error = rec.error or f"not sent in {script.timeout_s:g} s"
                elif not script.stream(name).cancellable:  # one cancelled anyway is closed, not failed
                    rec.error = rec.error or f"not done after {script.timeout_s:.0f} s"
        await asyncio.gather(*tasks.values(), return_exceptions=True)
    check = selfcheck.summary(watch, [figures.lateness(r) for r in tl.recs.values() if r.sent is not None],
                              open_peak=client.open.peak)
    return tl.recs, tl.t0, check


# ---- one run's timeline in virtual time (--sim) -----------------------------------------------

def sim_prompt(prompt: list[int] | str) -> list[int]:
    """A text prompt as the byte-level ids its length is bounded by (the simulation needs lengths only)."""
    return list(prompt.encode()) + [0] if isinstance(prompt, str) else list(prompt)


def sim_requests(script: Script, reqs: dict[str, Request]) -> list[SimRequest]:
    """The script's streams as the virtual-time player's requests: the same send points, cancels and
    `until`s. An `until` waits for streams to end; one on another event is refused (FlagError)."""
    out = []
    for s in script.streams:
        r = reqs[s.name]
        bad = [str(e) for e in s.until if e.kind not in ("done", "cancelled")]
        if bad:
            raise FlagError("--sim", f"stream {s.name}'s until on {', '.join(bad)}: the simulation ends a stream "
                                     "once the streams it waits for end (done or cancelled) only")
        out.append(SimRequest(s.name, sim_prompt(r.prompt if r.prompt is not None else ""), r.max_tokens,
                              at=s.at.plus, after=(s.at.event.stream, s.at.event.kind) if s.at.event else None,
                              ignore_eos=r.ignore_eos, background=s.priority == "background",
                              cancel_after=s.cancel.after if s.cancel else None,
                              cancel_tokens=s.cancel.tokens if s.cancel else None,
                              until=tuple(dict.fromkeys(e.stream for e in s.until))))
    return out


def play_simulated(run: Run, script: Script, reqs: dict[str, Request], trace: bool = False
                   ) -> tuple[dict[str, StreamRecord], SimResult]:
    """Every stream on the script's timeline in virtual time (run.sim): the records a real run's
    client makes, times in virtual seconds from 0. A stream whose event never happened is not sent."""
    sim = run.sim
    try:
        res = play_virtual(sim_requests(script, reqs), sim.cfg, sim.costs, sim.caps, vocab_size=sim.vocab, trace=trace)
    except SimError as e:
        raise BenchError(f"--sim: {e}") from None
    recs = {}
    for s in script.streams:
        rec = res.records.get(s.name)
        if rec is None:
            rec = new_record(reqs[s.name])
            rec.error, rec.ended = f"not sent: {s.at.event} did not happen", res.end
        rec.path = reqs[s.name].path
        recs[s.name] = rec
    return recs, res


# ---- a session of runs ---------------------------------------------------------------------

@dataclass
class ScriptSettings:
    session: Session
    script: Script
    plain_check: bool = False
    sampling: Sampling = GREEDY
    seed: int = 0  # --seed: added to the script's seed for its random prompts
    scaled: dict = field(default_factory=dict)


def context_for(script: Script) -> int:
    """An engine context that holds every stream's prompt and reply, rounded up to 256."""
    lens = {s.name: s.prompt.random or 0 for s in script.streams}
    for s in script.streams:  # sources first: a repeated or extended prompt's length follows its source's
        if s.prompt.text is not None:
            lens[s.name] = len(s.prompt.text.encode()) + 1
    for _ in script.streams:
        for s in script.streams:
            if s.prompt.same_as:
                lens[s.name] = lens[s.prompt.same_as]
            elif s.prompt.prefix_of:
                lens[s.name] = lens[s.prompt.prefix_of] + s.prompt.plus
    need = max(lens[s.name] + s.max_tokens + 1 for s in script.streams)
    return -(-need // 256) * 256


def settings_from_flags(*, file, model, device, dtype, share, order, url, out_dir, plain_check, parallel,
                        prefill_rows, max_model_len, seed, engine_args, vocab=None, stamp="", variants_file=None,
                        base_ref=None, new_ref=None, aa=False, predict=None, margin=0.02, tokenizer=None,
                        token_ids="ids", temperature=0.0, tensor_parallel=1, mixed=None, split=None) -> ScriptSettings:
    """`tfbench run script FILE`'s flags -> settings. The script is read and checked first: a bad
    one is one line naming the stream and the field, before any flag is looked at or any server
    starts. Predictions may name the script's figures (`first_token:R`)."""
    script = load(file)
    variants, names, url = targets.select(url, share, variants_file, base_ref, new_ref, order, aa, mixed, split)
    engine = defaults.engine_setup(device=device, model=model, dtype=dtype, parallel=parallel, prefill_rows=prefill_rows,
                                  max_model_len=None if url else (max_model_len or context_for(script)), seed=seed,
                                  trace=False, engine_args=engine_args, tensor_parallel=tensor_parallel)
    preds = read_predictions(predict, [v.name for v in variants], set(script.keys)) if predict else None
    return ScriptSettings(Session(engine, variants, names, Path(out_dir), "script", url=url, margin=margin,
                                  predictions=preds, stamp=stamp, vocab=vocab, tokenizer=tokenizer,
                                  token_ids=token_ids), script, plain_check, Sampling(temperature, seed), seed)


def fit(script: Script, prompts: dict, mml: int | None) -> dict[str, int]:
    """Each stream's max_tokens on this server: a stream that is cancelled anyway is cut to the
    context; any other that does not fit is an error naming it."""
    out = {}
    for s in script.streams:
        n, room = prompt_len(prompts[s.name]), (mml or 0) - prompt_len(prompts[s.name]) - 1
        if mml is None or n + s.max_tokens <= mml:
            out[s.name] = s.max_tokens
        elif s.cancellable and room >= 1:
            out[s.name] = room
        else:
            raise BenchError(f"{script.path}: stream {s.name}: max_tokens: a {n:,}-token prompt and {s.max_tokens:,} "
                             f"reply tokens exceed the server's max_model_len {mml:,}")
    return out


def requests_for(script: Script, sampling: Sampling, prompts: dict, token_ids: str, mml: int | None
                 ) -> dict[str, Request]:
    sizes = fit(script, prompts, mml)
    return {s.name: replace(request(s, prompts[s.name], token_ids, sampling), max_tokens=sizes[s.name])
            for s in script.streams}


class ScriptScenario(driver.Scenario):
    """A script's timeline as the session driver plays it."""

    url_cache = "each run's random prompts are fresh"
    analysis = driver.Analysis(exactness.script, figures.script_stats, figures.script_medians)

    def __init__(self, settings):
        super().__init__(settings)
        # what the shared play, measure and plain reference read: a scenario that is a script of its
        # own (long-prompt) sets them from its flags
        self.script: Script = settings.script
        self.sampling: Sampling = settings.sampling
        self.seed: int = settings.seed

    def header(self) -> dict:
        s, sc = self.settings, self.settings.script
        return {"script": sc.to_dict(), "script_text": sc.text, "figure_keys": sc.keys, "plain_check": s.plain_check,
                "sampling": s.sampling.to_dict(), "seed": s.seed}

    def prompts(self, run: Run, key: str) -> dict[str, list[int] | str]:
        return make_prompts(self.script, run.vocab, key, self.seed)

    @staticmethod
    def run_key(run: Run) -> str:
        """A server tfbench did not start may hold earlier prompts: each run's (and each session's,
        by the salt) random prompts are fresh, so none is a prefix of an earlier one."""
        return f"-run{run.index}{run.salt}" if run.shared else ""

    def play_streams(self, run: Run, prompts: dict, trace: bool = False
                     ) -> tuple[dict[str, StreamRecord], float, dict | None, list | None]:
        """The timeline's raw records, the run's start, the client's self-check and (in virtual
        time, with `trace`) the simulated host's trace."""
        reqs = requests_for(self.script, self.sampling, prompts, run.token_ids, run.max_model_len)
        if run.sim:
            recs, res = play_simulated(run, self.script, reqs, trace=trace)
            return recs, 0.0, None, res.trace
        recs, t0, check = asyncio.run(play_timeline(run.url, self.script, reqs, run.model))
        return recs, t0, check, None

    def play(self, data: dict, run: Run) -> dict:
        """The timeline's raw records."""
        recs, t0, check, _ = self.play_streams(run, self.prompts(run, self.run_key(run)))
        return {"records": recs, "t0": t0, "client": check, "hashes": exactness.reply_hashes(recs),
                "counted_by": weakest_count(recs.values()), "system_fingerprint": fingerprint(recs.values())}

    def run_figures(self, recs: dict[str, StreamRecord], entry: dict):
        """One run's figures from its records, by the script's figure definitions."""
        return figures.script_run(self.script, recs, entry["t0"])

    def measure(self, entry: dict) -> None:
        f = self.run_figures(entry["records"], entry)
        figures.client_bottleneck(f, entry.get("client"))
        entry["figures"] = f.to_dict()

    def failed(self, entry: dict) -> None:
        entry.update(records=None, hashes=None, t0=None, figures=figures.failed_script(entry["failure"]).to_dict())

    def shown(self, f: dict) -> str:
        """A run's figures as its progress line shows them: the first four."""
        return ", ".join(f"{k} {num(v)}" for k, v in list(f["values"].items())[:4]) or "no figures"

    def line(self, entry: dict) -> str:
        f = entry["figures"]
        return (f"{entry['variant']}: {self.shown(f)}"
                + ("" if f["valid"] else f"  INVALID: {'; '.join(f['invalid_reasons'])}"))

    def play_plain(self, data: dict, url: str, model: str, vocab: int) -> dict:
        """Each stream alone. A stream cancelled in some run generates as many tokens as its
        longest reply; one that got no token in any run is not played (nothing to compare)."""
        script = self.script
        prompts = make_prompts(script, vocab, "", self.seed)
        runs = [r for r in data["runs"] if r.get("records")]
        reqs = []
        for s in script.streams:
            lens = [len(r["records"][s.name].token_ids) for r in runs]
            if not any(lens):
                continue
            req = request(s, prompts[s.name], self.session.token_ids, self.sampling)
            reqs.append(replace(req, max_tokens=max(lens) if s.cancellable else s.max_tokens))
        return driver.replies({r.name: asyncio.run(play_alone(url, r, model)) for r in reqs})

    def notes_after(self, data: dict) -> list[str]:
        unknown = sorted({e["stream"] for r in data["runs"] for e in r["figures"]["expects"] if e.get("unknown")})
        if not unknown:
            return []
        return [f"Expectations on {', '.join(unknown)}: unknown where the server reports no cached tokens "
                "(not counted as a failure)."]


def run(settings: ScriptSettings, reporter: Reporter | None = None,
        save: driver.Save | None = None) -> tuple[dict, object]:
    """Every run in order, a fresh server each (or the running servers), then the plain
    reference (driver.run)."""
    return driver.run(ScriptScenario(settings), reporter, save)
