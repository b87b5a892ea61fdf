"""The session driver: variants -> their engine sources -> a fresh server per run, in the run
order (or the running servers, `--url`) -> per-run records, under one receipt header.

`run(scenario)` plays a `Scenario` end to end: every run through `run_all`, the receipt checked
after each (`analyse`: exactness, "not run", statistics, predictions), then the plain reference
(`run_plain`). A scenario says what it plays on a ready server (`play`: raw records), what it
measures from them, which replies must be equal and what the plain reference answers; it never
knows how its server came to be.

How a run is played is one seam, `serve`: it yields the URL of the run's server (launched for
the run, or reached with --url), and `run_all` hands the scenario a `Run` built from what that
server says about itself (`servers.identity`). Every request a scenario sends leaves through the
client (`client.stream.stream` on a `client.play.http_client`), timed by `client.stream.clock`.
A target that plays in virtual time replaces `serve` and those two, and nothing above them
changes.
"""
from __future__ import annotations

import contextlib
import datetime as dt
import os
import platform
import secrets
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol

from tensorfold_bench import SCHEMA, __version__
from tensorfold_bench.analysis import exactness, stats
from tensorfold_bench.analysis.predictions import Predictions
from tensorfold_bench.client.stream import TOKEN_ID_ROUTES, StreamRecord
from tensorfold_bench.errors import BenchError, FlagError, ServerError
from tensorfold_bench.servers import worktree
from tensorfold_bench.servers.identity import ServerIdentity, discover_vocab, identify, wait_idle
from tensorfold_bench.servers.launcher import REPO_ROOT, check_engine_flags, engine_program, existing, launch, need_engine
from tensorfold_bench.session.defaults import EngineSetup, check_margin, positive
from tensorfold_bench.session.simulate import CANNOT_KNOW, SimRun, SimTarget
from tensorfold_bench.session.targets import command_argv
from tensorfold_bench.session.variants import Variant, plain

@dataclass
class Session:
    """What every scenario's session shares: engine flags, variants (the base first), run order."""

    engine: EngineSetup
    variants: list[Variant]
    order: list[str]
    out_dir: Path
    scenario: str  # long-prompt, sweep, gate: the receipt's kind and the run folder's suffix
    url: str | None = None  # --url: running servers (the variants say which); nothing is launched
    margin: float = stats.DEFAULT_MARGIN
    predictions: Predictions | None = None  # read (and stamped) before the first run
    stamp: str = ""
    repo: Path | None = None  # the repository variants' refs name (default: this one)
    vocab: int | None = None  # --vocab: prompt ids are drawn below it (default: discovered)
    tokenizer: str | None = None  # --tokenizer DIR: where the vocabulary may be read
    token_ids: str = "ids"  # --token-ids: how replies' token ids are asked for (client.TOKEN_ID_ROUTES)
    salt: str = ""  # --url: a fresh key per session, so no earlier prompt is a prefix of this one's
    sim: "SimTarget | None" = None  # --sim PROFILE: every run in virtual time on the profile's costs

    def __post_init__(self):
        names = [v.name for v in self.variants]
        if len(set(names)) != len(names):
            raise FlagError("--variants", f"variant names repeat: {names}")
        for n in self.order:
            if n not in names:
                raise FlagError("--order", f"unknown variant {n!r}; known: {', '.join(names)}")
        # --order picks which variants run (the first of them in the file's order is the base)
        self.variants = [v for v in self.variants if v.name in self.order]
        check_margin(self.margin)
        if self.token_ids not in TOKEN_ID_ROUTES:
            raise FlagError("--token-ids", f"must be one of {', '.join(TOKEN_ID_ROUTES)}, not {self.token_ids!r}")
        positive("--vocab", self.vocab)
        if self.tokenizer is not None and not Path(self.tokenizer).is_dir():
            raise FlagError("--tokenizer", f"{self.tokenizer} is not a directory")
        if self.url and not self.salt:
            self.salt = "-" + secrets.token_hex(4)
        if not self.stamp:
            self.stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")

    @property
    def run_dir(self) -> Path:
        return self.out_dir / f"{self.stamp}-{self.scenario}"


# the writer's checkpoint: the receipt's data so far and its summary (Scenario.summarise's)
Save = Callable[[dict, Any], None]


class Reporter(Protocol):
    def start(self, total: int) -> None: ...
    def step(self, text: str) -> None: ...  # a run (or step) begins: what it is
    def status(self, text: str) -> None: ...  # where the current run is (a level, a cell): shown in place
    def advance(self) -> None: ...
    def note(self, text: str) -> None: ...  # a line kept on screen (one per finished run)


class QuietReporter:
    def start(self, total): pass
    def step(self, text): pass
    def status(self, text): pass
    def advance(self): pass
    def note(self, text): pass


@dataclass
class Run:
    """One run, its server up: what a scenario's play function gets."""

    index: int
    variant: Variant
    url: str
    info: dict  # the /v1/engine and /v1/models bodies (ServerIdentity.answers)
    model: str
    vocab: int | None
    max_model_len: int | None
    shared: bool  # --url: a server tfbench did not start, so prompts must differ per run
    note: Callable[[str], None]
    identity: ServerIdentity | None = None
    token_ids: str = "ids"
    salt: str = ""
    status: Callable[[str], None] = lambda text: None  # where the run is (progress display only)
    sim: SimRun | None = None  # --sim: the run plays in virtual time on this (url is None)


def harness_commit() -> str | None:
    """This harness's commit ('+dirty' with uncommitted changes), or TFBENCH_COMMIT for a copy
    without git."""
    src = worktree.working_tree(REPO_ROOT)
    if src.commit:
        return src.commit + ("+dirty" if src.dirty else "")
    return os.environ.get("TFBENCH_COMMIT") or None


def host_info() -> dict:
    return {"python": sys.version.split()[0], "platform": platform.platform(), "machine": platform.machine(),
            "tfbench": __version__, "harness_commit": harness_commit()}


def slug(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in ".-" else "-" for ch in name).strip("-")


def sources(session: Session) -> dict[str, worktree.Source]:
    """Each tfengine variant's source (worktrees made now, before any run); none for a command
    variant or a --url server."""
    return {v.name: worktree.source(v.ref, session.repo) for v in session.variants
            if v.launched and v.command is None}


@contextlib.contextmanager
def serve(session: Session, variant: Variant, source: worktree.Source | None, log: Path,
          facts: dict) -> Iterator[str]:
    """The run's server URL; `facts` gets the launched server's pid (= its process group), argv,
    command line and how tfbench knows it is the one launched."""
    if variant.url:
        with existing(variant.url) as url:
            yield url
        return
    if variant.command is not None:
        cm = launch(variant.args, log, env=variant.env, command=command_argv(variant, session.engine),
                    health=variant.health, start_timeout=variant.start_timeout)
    else:
        cm = launch(session.engine.flags() + variant.args, log, env=variant.env, root=Path(source.path))
    with cm as srv:
        facts.update(pgid=srv.pgid, argv=srv.argv, command=srv.command_line, checked=list(srv.checked))
        if source is not None:
            facts["root"] = source.path
        yield srv.url


def run_identity(url: str, facts: dict) -> ServerIdentity:
    """The server's own account of itself, with the command line tfbench launched (if any)."""
    ident = identify(url)
    if facts.get("command"):
        ident.launched, ident.command, ident.checked = True, facts["command"], facts.get("checked", [])
    return ident


def run_vocab(session: Session, ident: ServerIdentity) -> int:
    """--vocab, else the server's vocab_size, --tokenizer DIR or the --model directory."""
    if session.vocab:
        return session.vocab
    model_dir = session.engine.model if Path(session.engine.model).is_dir() else None
    return discover_vocab(ident, session.tokenizer, model_dir)


def header(session: Session, srcs: dict[str, worktree.Source], settings: dict) -> dict:
    """The receipt's data before its runs: what ran where, with which settings."""
    return {"schema": SCHEMA, "scenario": session.scenario, "created": dt.datetime.now().isoformat(timespec="seconds"),
            "host": host_info(),
            "settings": {"engine": asdict(session.engine), "engine_flags": session.engine.flags(),
                         "order": session.order, "url": session.url, "base": session.variants[0].name,
                         "margin": session.margin, "run_dir": str(session.run_dir),
                         "token_ids": session.token_ids, **settings},
            "identities": {},
            "variants": [{**v.to_dict(), "source": srcs[v.name].to_dict() if v.name in srcs else None}
                         for v in session.variants],
            "predictions": session.predictions.to_dict() if session.predictions else None,
            "runs": [], "environment": None, "not_run": [], "partial": None,
            "simulated": session.sim.describe() if session.sim else None}


def partial_mark(order: list[str], done: int, after: list[str] = (), why: str = "in progress") -> dict:
    """The receipt's `partial` field while runs are missing: how many are done and which are not."""
    missing = [f"run {j} ({n})" for j, n in enumerate(order[done:], done + 1)] + list(after)
    return {"why": why, "done": done, "total": len(order), "missing": missing}


def check_engines(session: Session, srcs: dict[str, worktree.Source]) -> None:
    """Ask each variant's engine to validate its flags (`serve --check`) before any server starts:
    a bad flag is one line and exit 2 now, not a failed run after others were launched. Raises
    ServerError naming the variant (the gate falls back to A/A on a base that will not serve).
    With no engine installed at all it is one BenchError for all of them: no variant is to blame."""
    if engine_program(None) is None and any(v.launched and v.command is None for v in session.variants):
        need_engine()
    asked = set()
    for v in session.variants:
        if not v.launched or v.command is not None or v.name not in srcs:
            continue  # a running server, or another program: tfengine's --check does not apply
        flags, root = session.engine.flags() + v.args, Path(srcs[v.name].path)
        key = (tuple(flags), tuple(sorted(v.env.items())), root)
        if key in asked:
            continue
        asked.add(key)
        try:
            check_engine_flags(flags, root=root, env=v.env)
        except BenchError as e:
            log = session.run_dir / f"check-{slug(v.name)}.log"  # where the gate's fallback note points
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_text(f"{e}\n")
            err = ServerError(f"variant {v.name!r}: {e}", str(log))
            err.variant = v.name
            raise err from None


def identity_record(ident: ServerIdentity, fingerprint: str | None = None) -> dict:
    """The identity as the receipt keeps it (tfengine's /v1/engine is kept once, beside it), with
    the streams' system_fingerprint."""
    d = ident.to_dict()
    d.pop("engine", None)
    return {**d, "system_fingerprint": fingerprint}


def run_all(session: Session, data: dict, srcs: dict[str, worktree.Source], play: Callable[[Run], dict],
            rep: Reporter, finish: Callable[[dict], str], keep_failed: bool = False,
            checkpoint: Callable[[], None] | None = None, after: list[str] = ()) -> None:
    """Every run in order, a fresh server each, appended to data["runs"]: index, variant, start
    time, `play`'s records, log, server facts. `finish(entry)` adds the run's figures and returns
    the line shown. A server that dies or never gets healthy raises ServerError (its variant
    named), or with `keep_failed` makes a failed run (its error kept) and the others go on.
    After each run data["partial"] says what is still missing (the runs left, then `after`) and
    `checkpoint()` writes the receipt so far: a stop or crash keeps every finished run."""
    by_name = {v.name: v for v in session.variants}
    if session.sim:
        return run_all_simulated(session, data, play, rep, finish, checkpoint, after)
    check_engines(session, srcs)
    session.run_dir.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(session.order, 1):
        data["partial"] = partial_mark(session.order, i - 1, after)
        rep.step(f"run {i}/{len(session.order)}: {name}")
        log = session.run_dir / f"run{i}-{slug(name)}.log"
        started = dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")
        server: dict = {"load_before": os.getloadavg()[0]}
        info: dict = {}
        ident = None
        variant = by_name[name]
        try:
            with serve(session, variant, srcs.get(name), log, server) as url:
                ident = run_identity(url, server)
                info = ident.answers
                data["identities"].setdefault(name, identity_record(ident))
                if data["environment"] is None or (info.get("engine") and not data["environment"].get("engine")):
                    data["environment"] = info  # tfengine's account of the device, where one ran
                if not variant.launched:
                    server["idle"] = wait_idle(url)  # the last run's streams are gone
                entry = play(Run(i, variant, url, info, ident.request_model, run_vocab(session, ident),
                                 ident.max_model_len, not variant.launched, rep.note, ident,
                                 session.token_ids, session.salt, rep.status))
        except ServerError as e:
            e.variant = name
            if not keep_failed:
                raise
            entry = {"error": str(e), "failure": failure_line(e)}
        entry = {"index": i, "variant": name, "started": started, **entry,
                 "log": str(log) if variant.launched else None, "server": server, "engine": info.get("engine"),
                 "identity": identity_record(ident, entry.get("system_fingerprint")) if ident else None}
        if entry["identity"] and entry["identity"]["system_fingerprint"]:
            data["identities"][name]["system_fingerprint"] = entry["identity"]["system_fingerprint"]
        land(session, data, i, entry, rep, finish, checkpoint, after)


def land(session: Session, data: dict, i: int, entry: dict, rep: Reporter, finish: Callable[[dict], str],
         checkpoint: Callable[[], None] | None, after: list[str]) -> None:
    """A played run into the receipt: its entry, its progress line, the partial mark, a checkpoint."""
    data["runs"].append(entry)
    rep.note(finish(entry))
    data["partial"] = partial_mark(session.order, i, after) if i < len(session.order) or after else None
    if checkpoint:
        checkpoint()
    rep.advance()


def run_all_simulated(session: Session, data: dict, play: Callable[[Run], dict], rep: Reporter,
                      finish: Callable[[dict], str], checkpoint: Callable[[], None] | None = None,
                      after: list[str] = ()) -> None:
    """`run_all` in virtual time: each run's `Run` carries its engine configuration on the
    profile (`Run.sim`) instead of a server's URL; nothing is launched. Every variant is checked
    against the profile before the first run, so a kind the profile lacks is one line."""
    sim = session.sim
    configs = {v.name: sim.config(v, session.engine.flags()) for v in session.variants}
    data["environment"] = {"simulated": True, "device": sim.profile.device, "model": sim.profile.model,
                           "engine": {"device_name": sim.profile.device.get("name"), "model": sim.model}}
    for i, name in enumerate(session.order, 1):
        data["partial"] = partial_mark(session.order, i - 1, after)
        rep.step(f"run {i}/{len(session.order)}: {name} (simulated)")
        started = dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")
        sr = configs[name]
        variant = next(v for v in session.variants if v.name == name)
        entry = play(Run(i, variant, None, {}, sim.model, session.vocab or sr.vocab, sr.cfg.max_model_len, False,
                         rep.note, None, session.token_ids, "", rep.status, sim=sr))
        entry = {"index": i, "variant": name, "started": started, **entry, "log": None,
                 "server": {"simulated": str(sim.path)},
                 "engine": {"config": asdict(sr.cfg), "caps": asdict(sr.caps), "simulated": True},
                 "identity": None}
        land(session, data, i, entry, rep, finish, checkpoint, after)


def url_not_run(url: str, cache: str = "") -> str:
    """The receipt's "not run" line for servers reached by --url: nothing launched, so no fresh
    server, cold cache or verdicts; `cache` says how the scenario's prompts meet a warm cache."""
    return (f"Fresh servers: --url {url}: servers tfbench did not launch, measured as they are configured; "
            f"no fresh server per run and no cold cache is guaranteed{f' ({cache})' if cache else ''}, and no verdicts.")


def plain_not_run(session: "Session", plain_check: bool, plain_error: str | None) -> list[str]:
    """The receipt's "not run" line for the plain reference (1 stream, whole prefill, no cache,
    no drafts), where it was not asked for or could not run."""
    if not plain_check:
        return ["The plain reference (--plain-check): not asked for; replies are compared across runs only."]
    if session.url:
        return ["The plain reference: needs launched servers, not --url."]
    if session.variants[0].command is not None:
        return ["The plain reference: runs tfengine only; the base is a command variant."]
    if plain_error:
        return [f"The plain reference: its server failed: {plain_error.splitlines()[0]}"]
    return []


# ---- a scenario's session, end to end ------------------------------------------------------

@dataclass(frozen=True)
class Analysis:
    """A scenario's functions of its receipt's data (tensorfold_bench.analysis): which replies are
    equal, the verdicts' statistics (only where there are verdicts), the figures predictions are
    checked against, and the summary computed once per checkpoint (`summary`: the predictions,
    the receipt's tables and pictures and the command's printed summary all read that one
    object; `predicted` then reads it instead of the data)."""

    exactness: Callable[[dict], dict] | None = None
    stats: Callable[[dict], dict] | None = None
    predicted: Callable[[Any], dict] | None = None
    summary: Callable[[dict], Any] | None = None


class Scenario:
    """What a scenario tells the driver: what it plays on one run's server (`play`: raw records
    only), what it measures from them (`measure`), which replies must be equal (`check`), what
    its statistics and predicted figures are, and what the plain reference answers
    (`play_plain`). The driver (`run`) owns launching, the run order, validity, checkpoints,
    analysis, the plain reference and "not run"."""

    has_plain = True  # a scenario without a plain reference (sweep) says no line about one
    # a server that will not serve makes a failed run and the others go on; False: its
    # ServerError goes up (the gate judges every run or none)
    keep_failed = True
    url_cache = ""  # under --url: how the scenario's prompts meet a server's warm cache
    analysis: Analysis = Analysis()  # the receipt's analysis functions, where they serve as they are

    def __init__(self, settings):
        """`settings`: the scenario's own (from its flags), with the `session` they run in."""
        self.settings = settings
        self.session: Session = settings.session
        self.plain_check: bool = getattr(settings, "plain_check", False)

    def header(self) -> dict:
        """The receipt's settings beside the session's."""
        return {}

    def sources(self) -> dict[str, worktree.Source]:
        """Each launched variant's source, made before any run."""
        return sources(self.session)

    def begin(self, data: dict) -> None:
        """The receipt's own fields, before the first run."""
        data.update(plain=None, vocab=None)

    def play(self, data: dict, run: Run) -> dict:
        """One run on its server: the run's raw records."""
        raise NotImplementedError

    def measure(self, entry: dict) -> None:
        """The run's figures and validity from its records."""
        raise NotImplementedError

    def failed(self, entry: dict) -> None:
        """A failed run's entry (`entry["error"]`, `entry["failure"]`): no records, no figures, invalid."""
        raise NotImplementedError

    def line(self, entry: dict) -> str:
        """The run's progress line."""
        return entry["variant"]

    def validity(self, entry: dict) -> tuple[bool, list[str]]:
        f = entry["figures"]
        return f["valid"], f["invalid_reasons"]

    def play_plain(self, data: dict, url: str, model: str, vocab: int) -> dict:
        """The plain reference's answers on its server: the receipt's `plain` beside the server's facts."""
        raise NotImplementedError

    def check(self, data: dict) -> None:
        """Which replies are equal (data["exactness"])."""
        if self.analysis.exactness:
            data["exactness"] = self.analysis.exactness(data)

    def stats(self, data: dict) -> dict | None:
        """The verdicts' statistics; None: no verdicts."""
        return self.analysis.stats(data) if self.analysis.stats and self.verdicts(data) else None

    def verdicts(self, data: dict) -> bool:
        """Whether the runs so far can be judged: two variants or more, on servers tfbench launched."""
        return len(self.session.variants) > 1 and bool(data["runs"]) and not self.session.url

    def summarise(self, data: dict) -> Any:
        """The receipt's summary (Analysis.summary's), computed once per checkpoint; None: none."""
        return self.analysis.summary(data) if self.analysis.summary else None

    def predicted(self, data: dict, summary: Any = None) -> dict[str, dict[str, float | None]]:
        """variant -> figure -> the value predictions are checked against (`summary`: summarise's)."""
        if not self.analysis.predicted:
            return {}
        return self.analysis.predicted(summary if self.analysis.summary else data)

    def notes_before(self, data: dict) -> list[str]:
        """"Not run" lines ahead of the session's own."""
        return []

    def notes_after(self, data: dict) -> list[str]:
        """"Not run" lines after the plain reference's."""
        return []

    def run_notes(self, entry: dict) -> list[str]:
        """"Not run" lines for one run: an invalid one is left out of the medians."""
        valid, why = self.validity(entry)
        if valid:
            return []
        return [f"Run {entry['index']} ({entry['variant']}) is invalid and left out of the medians: "
                + "; ".join(why) + (f" (log: {entry['log']})" if entry.get("error") else "")]


def replies(records: dict[str, StreamRecord]) -> dict:
    """The plain reference's answers: each reply's record and hash."""
    return {"records": records, "hashes": exactness.reply_hashes(records)}


def failure_line(e: ServerError, log: bool = False) -> str:
    """A failed server in one line: what failed, its log's last line (and the log)."""
    return e.what + (f": {e.last_line}" if e.last_line else "") + (f" (log {e.log})" if log else "")


def not_run(scenario: Scenario, data: dict) -> list[str]:
    """The receipt's "not run" lines: the scenario's, --url's, the plain reference's, each run's."""
    s = scenario.session
    out = scenario.notes_before(data)
    if s.sim:
        out.append(f"Simulated: every run played in virtual time on profile {s.sim.path} "
                   f"({s.sim.profile.device.get('name')}, {s.sim.model}, engine {s.sim.profile.engine.get('commit')}); "
                   "no server ran. " + " ".join(CANNOT_KNOW))
    if s.url:
        out.append(url_not_run(s.url, scenario.url_cache))
    if scenario.has_plain:
        out += plain_not_run(s, scenario.plain_check, data.get("plain_error"))
    out += scenario.notes_after(data)
    for r in data["runs"]:
        out += scenario.run_notes(r)
    return out


def analyse(scenario: Scenario, data: dict) -> Any:
    """Exactness, what was not run, statistics and predictions from the runs so far, into `data`
    (idempotent: after every run for the partial receipt, and once at the end); the scenario's
    summary, computed once here, is returned for the writer and the command to render."""
    scenario.check(data)
    if scenario.session.sim:  # the simulated backend's ids say nothing of the engine's
        data["exactness"] = {"not_judged": "simulated: token identities come from the simulated backend"}
    data["not_run"] = not_run(scenario, data)
    stats_ = scenario.stats(data)
    if stats_ is not None:
        data["stats"] = stats_
    summary = scenario.summarise(data)
    if scenario.session.predictions:
        data["predictions"] = scenario.session.predictions.check(scenario.predicted(data, summary)).to_dict()
    return summary


def run_plain(scenario: Scenario, data: dict, source: worktree.Source) -> dict:
    """The plain reference (one stream, whole prompt, no cache, no drafts) on the base's source."""
    s = scenario.session
    pv = plain(s.variants[0])
    log, facts = s.run_dir / "plain.log", {}
    with serve(s, pv, source, log, facts) as url:
        ident = identify(url)
        answers = scenario.play_plain(data, url, ident.request_model, data["vocab"])
    return {"variant": pv.to_dict(), **answers, "log": str(log),
            "server": {"pgid": facts["pgid"], "argv": facts["argv"]}, "engine": ident.answers["engine"]}


def run(scenario: Scenario, reporter: Reporter | None = None,
        save: Save | None = None) -> tuple[dict, Any]:
    """Every run in order, a fresh server each (or the running servers, --url), then the plain
    reference; the receipt's data, analysed, and its summary (Scenario.summarise's). A server that
    dies or never gets healthy makes that run a failed one (kept, with its log's tail, left out of
    the medians), or raises ServerError where the scenario keeps no failed run. `save(data,
    summary)` gets the receipt so far after every run (marked partial until the last)."""
    rep, s = reporter or QuietReporter(), scenario.session
    srcs = scenario.sources()
    data = header(s, srcs, scenario.header())
    scenario.begin(data)
    plain_ref = (scenario.has_plain and scenario.plain_check and not s.url and not s.sim
                 and s.variants[0].command is None)
    rep.start(len(s.order) + (1 if plain_ref else 0))

    def play(run: Run) -> dict:
        if run.vocab is not None and run.vocab < 2:
            raise BenchError(f"server reports a vocabulary of {run.vocab}")
        if scenario.has_plain:
            data["vocab"] = run.vocab  # the plain reference's prompts are drawn below it
        return scenario.play(data, run)

    def finish(entry: dict) -> str:
        (scenario.failed if entry.get("error") else scenario.measure)(entry)
        return scenario.line(entry)

    run_all(s, data, srcs, play, rep, finish, keep_failed=scenario.keep_failed,
            checkpoint=(lambda: save(data, analyse(scenario, data))) if save else None,
            after=["the plain reference"] if plain_ref else [])
    if plain_ref:
        rep.step("plain reference")
        try:
            data["plain"] = run_plain(scenario, data, srcs[s.variants[0].name]) if data["vocab"] else None
        except ServerError as e:
            data["plain_error"] = failure_line(e, log=True)
        rep.advance()
    data["partial"] = None
    return data, analyse(scenario, data)
