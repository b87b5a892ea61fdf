"""`tfbench load`: a workload (tensorfold_bench.workload) played at each level by the arrival
player (tensorfold_bench.client.player), on the session driver (variants whole vs stepped,
command variants, --url; a fresh server per run in the order base/new/new/base; the plain
reference; predictions), figures from tensorfold_bench.analysis.load. An open loop is dealt over
worker processes (tensorfold_bench.client.player.play_shares): `--procs N` of them, or by default
(`auto`) as many as the level's rate needs at the client's measured CPU a request
(tensorfold_bench.scenarios.capacity), up to the host's cores; each level's self-check says how
many ran and why.
"""
from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from dataclasses import dataclass, replace
from pathlib import Path

from tensorfold_bench.analysis import exactness, figures, load as load_figures
from tensorfold_bench.analysis.figures import num
from tensorfold_bench.analysis.load import Req, Slo
from tensorfold_bench.analysis.predictions import read as read_predictions
from tensorfold_bench.client import selfcheck, workers
from tensorfold_bench.client.play import play_alone
from tensorfold_bench.client.player import DRAIN_S, Sent, play_level, request_for, sessions
from tensorfold_bench.client.sampling import GREEDY, Sampling
from tensorfold_bench.client.virtual import SimError, SimRequest
from tensorfold_bench.client.virtual import play as play_virtual
from tensorfold_bench.client.workers import parse_procs
from tensorfold_bench.errors import BenchError, FlagError
from tensorfold_bench.scenarios import capacity
from tensorfold_bench.session import defaults, driver, targets
from tensorfold_bench.session.driver import Reporter, Run, Session
from tensorfold_bench.workload.ids import prompt_ids
from tensorfold_bench.workload.model import Item


def request_key(prompt, max_tokens: int, temperature: float, seed: int | None) -> str:
    """A request's identity for the plain reference: its prompt and what it asked for."""
    body = json.dumps([list(prompt) if not isinstance(prompt, str) else prompt, max_tokens, temperature, seed],
                      separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()[:12]


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
               pkey=request_key(s.req.prompt, s.req.max_tokens, s.req.temperature, s.req.seed) if s.req.prompt else None,
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
    procs: int | str = "auto"  # client processes for an open loop (play_shares); "auto": level_procs decides


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
                        procs="auto") -> LoadSettings:
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
    procs = parse_procs(procs)
    if procs != "auto" and procs > 1 and (mc or w.get("concurrency")):
        raise FlagError("--procs", "spreads an open loop (--rate or a trace) over processes; not --concurrency or "
                                   "--max-concurrency, whose slots one process keeps")
    defaults.positive("--parallel", parallel)
    conc = [lv.value for lv in spec.levels if lv.kind == "concurrency"]
    par = max([parallel or 0, *[int(c) for c in conc]]) or None  # a closed loop's streams each get a lane
    variants, names, url = targets.select(url, share, variants_file, base_ref, new_ref, order, aa)
    engine = defaults.engine_setup(device=device, model=model, dtype=dtype, parallel=par, prefill_rows=prefill_rows,
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


def level_procs(settings: LoadSettings, items: tuple[Item, ...], closed: bool, max_concurrency: int | None,
                server_here: bool = True) -> workers.Procs:
    """How many client processes play a level: one for a closed loop or --max-concurrency (one
    process keeps their slots), `--procs N` as given, else the automatic rule on the level's
    rate (its first turns' offsets) and the client's CPU a request of its mean lengths."""
    if closed or max_concurrency:
        return workers.Procs(1, "closed loop" if closed else "--max-concurrency")
    if settings.procs != "auto":
        return workers.Procs(settings.procs, "--procs")
    return auto_procs(items, server_here)


def auto_procs(items: tuple[Item, ...], server_here: bool = True) -> workers.Procs:
    """The automatic rule for an open loop's items: its rate (the first turns' offsets) against
    the client's CPU a request of their mean lengths, measured here; one process on one core. A
    server on this host keeps a core of its own: on 2 cores a second client process beside a local
    server lagged more than one (2.6 against 1.1 ms at p99, 1,000 req/s, quiet)."""
    timed = [it for it in items if it.turn == 0 and it.offset is not None]
    rate = workers.asked_rate([it.offset for it in timed])
    n_cores = workers.cores() - (1 if server_here else 0)
    if rate is None or n_cores < 2:
        return workers.Procs(1, "auto", rate, None, n_cores, workers.BUSY_TARGET, server_here)
    lens = [it.prompt_len or len(str(it.prompt).encode()) for it in timed]
    cost = capacity.cpu_per_request(round(sum(lens) / len(lens)), round(sum(it.output_len for it in timed) / len(timed)))
    return workers.choose(rate, cost, n_cores, server_here=server_here)


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
    return readers.counter_for(None, model or defaults.device_preset(device).model)


def level_dict(level) -> dict:
    return {"kind": level.kind, "value": level.value, "label": level.label}


def play_levels(settings: LoadSettings, run: Run, vocab: int, max_concurrency: int | None = None,
                closed: int | None = None) -> tuple[list[dict], dict]:
    """Every level on the run's server; per level its records and figures, and the self-check of
    the worst level (every level's is kept)."""
    # a server tfbench did not start may hold earlier runs' prompts: each run's are fresh there
    wls = [settings.spec.build(level, vocab, f"run{run.index}{run.salt}" if run.shared else "")
           for level in settings.spec.levels]
    concs = [closed or (int(level.value) if level.kind == "concurrency" else None) for level in settings.spec.levels]
    local = workers.on_this_host(run.url)
    procs = [level_procs(settings, wl.items, bool(conc), max_concurrency, local) for wl, conc in zip(wls, concs)]
    with contextlib.ExitStack() as stack:
        most = max((p.procs for p in procs), default=1)
        pool = stack.enter_context(workers.Workers(most)) if most > 1 else None
        return _play_levels(settings, run, list(zip(settings.spec.levels, wls, concs, procs)), max_concurrency, pool)


def _play_levels(settings: LoadSettings, run: Run, levels: list, max_concurrency: int | None,
                 pool: workers.Workers | None) -> tuple[list[dict], dict]:
    out, checks = [], []
    for level, wl, conc, procs in levels:
        run.status(f"{run.variant.name}: {level.label} ({len(wl.items)} requests, {procs.text()})")
        played, t0, check = asyncio.run(play_level(
            run.url, wl, model=run.model, token_ids=run.token_ids, sampling=settings.sampling, concurrency=conc,
            max_concurrency=max_concurrency, duration=getattr(settings.spec, "duration", None) if conc else None,
            drain_s=settings.drain_s, level=level_dict(level), pool=pool, procs=procs.procs))
        check["workers"] = {**procs.to_dict(), "why": procs.text()}
        reqs = [to_req(s, t0) for s in played]
        out.append({**level_dict(level), "source": wl.source, "client": check,
                    "records": reqs})
        checks.append(check)
    return out, (max(checks, key=lambda c: c["loop_lag_p99_ms"]) if checks else {})


def measure_levels(entry: dict, slo: Slo) -> None:
    """The run's figures per level and flat (statistics, predictions); its validity, the client's
    self-check judged against the first tokens each level reports."""
    reasons, flat = [], {}
    for lv in entry["levels"]:
        f = load_figures.level_figures(lv["records"], slo)
        lv["figures"] = f
        if lv.get("client"):  # the client's own delays against the first token it times
            selfcheck.judge(lv["client"], {f"TTFT {q}": f["latency"]["ttft"][q] for q in ("p50", "p99")})
        flat.update(load_figures.flat(lv["label"], f))
        reasons += [f"{lv['label']}: {why}" for why in f["invalid"]]
        reasons += [f"{lv['label']}: {why}" for why in selfcheck.bottleneck(lv.get("client"))]
    entry["figures"], entry["valid"], entry["invalid_reasons"] = flat, not reasons, reasons


def sim_prompt(prompt) -> list[int]:
    return list(prompt.encode()) + [0] if isinstance(prompt, str) else list(prompt)


def level_requests(items: tuple[Item, ...], closed: int | None) -> list[SimRequest]:
    """One level's items as the virtual-time player's requests. Open loop: each at its offset.
    Closed loop (`closed` workers): worker j plays items j, j + N, ... each sent when its last
    reply ended; injected prompts keep their offsets. A session's later turn is sent `think`
    seconds after the last turn's reply ended, its prompt the history with the reply's length in
    placeholder ids (the simulation's reply ids are not the engine's)."""
    groups = sessions(items)
    timed = [g for g in groups if g[0].kind == "inject"] if closed else []
    chained = [g for g in groups if g not in timed] if closed else []
    out: list[SimRequest] = []

    def turns(g: list[Item], first_at: float, first_after: tuple[str, str] | None) -> str:
        prompt = sim_prompt(g[0].prompt)
        out.append(SimRequest(g[0].id, prompt, g[0].output_len, at=first_at, after=first_after))
        for prev, it in zip(g, g[1:]):
            prompt = prompt + [1] * prev.output_len + sim_prompt(it.prompt)
            out.append(SimRequest(it.id, prompt, it.output_len, at=it.think, after=(prev.id, "done")))
        return g[-1].id

    for g in (timed if closed else groups):
        turns(g, g[0].offset or 0.0, None)
    for j in range(closed or 0):
        last = None
        for g in chained[j::closed]:
            last = turns(g, 0.0, (last, "done") if last else None)
    return out


def play_levels_simulated(settings: "LoadSettings", run: Run, vocab: int, closed: int | None = None) -> list[dict]:
    """Every level in virtual time (run.sim): the records the receipt keeps, as play_levels'."""
    sim, out = run.sim, []
    for level in settings.spec.levels:
        wl = settings.spec.build(level, vocab, "")
        run.status(f"{run.variant.name}: {level.label} ({len(wl.items)} requests, simulated)")
        conc = closed or (int(level.value) if level.kind == "concurrency" else None)
        reqs = level_requests(wl.items, conc)
        try:
            res = play_virtual(reqs, sim.cfg, sim.costs, sim.caps, vocab_size=sim.vocab)
        except SimError as e:
            raise BenchError(f"--sim: {e}") from None
        by_id = {r.name: r for r in reqs}
        recs = []
        for it in wl.items:
            rec = res.records.get(it.id)
            if rec is None:
                recs.append(Req(it.id, kind=it.kind, warmup=it.warmup, error="not sent: its session's last turn "
                                "got no reply", max_tokens=it.output_len, session=it.session, turn=it.turn))
                continue
            gaps, prev = [], rec.sent
            for t in rec.token_times:
                gaps.append(round((t - prev) * 1e6))
                prev = t
            recs.append(Req(it.id, kind=it.kind, warmup=it.warmup, scheduled=rec.scheduled, sent=rec.sent,
                            gaps_us=gaps, ended=rec.ended, error=rec.error, prompt_len=rec.prompt_len,
                            max_tokens=rec.max_tokens, tokens=len(rec.token_times), cached=rec.cached_tokens,
                            sha=exactness.reply_sha(rec.token_ids, None) if rec.token_ids else None,
                            pkey=request_key(by_id[it.id].prompt, it.output_len, 0.0, None),
                            session=it.session, turn=it.turn))
        out.append({**level_dict(level), "source": wl.source, "client": None, "records": recs})
    return out


class Load(driver.Scenario):
    """A workload at each level as the session driver plays it."""

    url_cache = "every run sends the same requests, so a later run may hit what an earlier one cached"
    analysis = driver.Analysis(exactness.load)

    def header(self) -> dict:
        s = self.settings
        return {"workload": s.spec.describe(), "levels": [level_dict(lv) for lv in s.spec.levels],
                "slo": s.slo.to_dict(), "max_concurrency": s.max_concurrency, "plain_check": s.plain_check,
                "sampling": s.sampling.to_dict(), "late_p99_ms": load_figures.LATE_P99_S * 1000}

    def play(self, data: dict, run: Run) -> dict:
        """Every level's records, then an injected prompt alone (cold)."""
        settings = self.settings
        if run.sim:
            if settings.max_concurrency:
                raise FlagError("--max-concurrency", "not with --sim: the simulated player sends open loop or "
                                                     "closed loop (--concurrency) only")
            levels, check = play_levels_simulated(settings, run, run.vocab), None
        else:
            levels, check = play_levels(settings, run, run.vocab, settings.max_concurrency)
        alone, inj = None, getattr(settings.spec, "inject", None)
        if inj is not None:  # the injected prompt's first token with nothing else running (its ids fresh: cold)
            ids = prompt_ids(settings.sampling.seed, f"load:alone:{run.index}{run.salt}", inj.length, run.vocab)
            req = request_for(Item("inject-alone", tuple(ids), inj.output_len, kind="inject"), ids, run.token_ids,
                              settings.sampling)
            if run.sim:
                rec = play_virtual([SimRequest("inject-alone", list(ids), inj.output_len)], run.sim.cfg, run.sim.costs,
                                   run.sim.caps, vocab_size=run.sim.vocab).records["inject-alone"]
            else:
                rec = asyncio.run(play_alone(run.url, req, run.model))
            alone = {"ttft_ms": None if not rec.token_times else (rec.token_times[0] - rec.sent) * 1000,
                     "prompt_len": len(ids), "cached": rec.cached_tokens, "error": rec.error}
        return {"levels": levels, "client": check, "alone": alone}

    def measure(self, entry: dict) -> None:
        measure_levels(entry, self.settings.slo)

    def failed(self, entry: dict) -> None:
        entry.update(levels=[], figures={}, valid=False, invalid_reasons=[f"the server failed: {entry['failure']}"])

    def line(self, entry: dict) -> str:
        if entry.get("error"):
            return f"{entry['variant']}: FAILED: {entry['failure']}"
        reasons = entry["invalid_reasons"]
        shown = ", ".join(f"{lv['label']}: goodput {num(lv['figures']['goodput'])}, TTFT p99 "
                          f"{num(lv['figures']['latency']['ttft']['p99'], 0)} ms" for lv in entry["levels"])
        return f"{entry['variant']}: {shown}" + ("" if not reasons else f"  INVALID: {'; '.join(reasons[:3])}")

    def validity(self, entry: dict) -> tuple[bool, list[str]]:
        return bool(entry.get("valid")), entry.get("invalid_reasons") or []

    def play_plain(self, data: dict, url: str, model: str, vocab: int) -> dict:
        return {"hashes": plain_hashes(self.settings, url, model, vocab)}

    def stats(self, data: dict) -> dict | None:
        return load_stats(data)

    def predicted(self, data: dict, summary=None) -> dict:
        return medians(data)


def plain_hashes(settings: LoadSettings, url: str, model: str, vocab: int) -> dict[str, str | None]:
    """Every distinct request alone (a closed loop of one) on the plain reference's server: each
    level's workload, a prompt seen at an earlier level not sent again. The reply hashes by
    request key."""
    hashes: dict[str, str | None] = {}
    for level in settings.spec.levels:
        wl = settings.spec.build(level, vocab)
        items, seen = [], set()
        for turns in sessions(wl.items):
            key = request_key(turns[0].prompt, turns[0].output_len, *_sampled(settings, turns[0]))
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
    return hashes


def _sampled(settings: LoadSettings, item: Item) -> tuple[float, int | None]:
    r = request_for(item, item.prompt, "ids", settings.sampling)
    return r.temperature, r.seed


STATS = (*load_figures.JUDGED, "ttft_p50")  # the verdict rows and what the picture draws


def load_stats(data: dict) -> dict:
    """The statistics of the figures the receipt's verdict rows and picture show, over the runs
    (invalid runs left out); every other figure stays in each run's `figures`."""
    runs = data["runs"]
    names = [n for n in dict.fromkeys(n for r in runs for n in r.get("figures") or {})
             if load_figures.family(n) in STATS]
    values = [r["figures"] if r.get("valid") else {} for r in runs]
    return {k: fs.to_dict() for k, fs in figures.stats_for(
        names, [r["variant"] for r in runs], values, data["settings"]["base"], data["settings"]["margin"]).items()}


def medians(data: dict) -> dict[str, dict[str, float | None]]:
    """variant -> flat figure -> median over its valid runs (what predictions are checked against)."""
    out: dict[str, dict] = {}
    for name, by in figures.figure_runs(data).items():
        for v, xs in by.items():
            out.setdefault(v, {})[name] = figures.median(xs)
    return out


def run(settings: LoadSettings, reporter: Reporter | None = None,
        save: driver.Save | None = None) -> tuple[dict, object]:
    """Every run in order, a fresh server each (or the running servers), then the plain
    reference (driver.run)."""
    return driver.run(Load(settings), reporter, save)
