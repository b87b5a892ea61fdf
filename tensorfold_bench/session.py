"""The one run loop every scenario plays through: variants -> their engine sources -> a fresh
server per run, in the run order (or one running server, `--url`) -> per-run records, under one
receipt header. A scenario gives `run_all` a function that plays one run on a ready server and
returns its raw records; figures are computed elsewhere (tensorfold_bench.figures).

The shared engine flags, device presets and flag checks live in tensorfold_bench.defaults, what a
running server says about itself in tensorfold_bench.probe; both are re-exported here, where the
scenarios have always found them.
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
from typing import Callable, Iterator, Protocol

from tensorfold_bench import __version__, stats, worktree
from tensorfold_bench.client import TOKEN_ID_ROUTES
from tensorfold_bench.errors import BenchError, FlagError, ServerError
from tensorfold_bench.identity import ServerIdentity, discover_vocab, identify
from tensorfold_bench.launcher import REPO_ROOT, check_engine_flags, engine_program, existing, launch, need_engine
from tensorfold_bench.defaults import (DEVICE_PRESETS, FULL, DevicePreset, EngineSetup, check_margin,  # noqa: F401
                                       device_preset, engine_setup, positive, scaled_note, sized)
from tensorfold_bench.predictions import Predictions
from tensorfold_bench.targets import command_argv
from tensorfold_bench.probe import fetch_trace, healthy, model_facts, server_info, wait_idle  # noqa: F401
from tensorfold_bench.variants import Variant

SCHEMA = "tfbench.receipt/1"


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
    info: dict  # GET /v1/engine and /v1/models
    model: str
    vocab: int | None
    max_model_len: int | None
    shared: bool  # --url: a server tfbench did not start, so prompts must differ per run
    note: Callable[[str], None]
    identity: ServerIdentity | None = None
    token_ids: str = "ids"
    salt: str = ""
    status: Callable[[str], None] = lambda text: None  # where the run is (progress display only)


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
            "runs": [], "environment": None, "not_run": [], "partial": None}


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
                info = server_info(url)
                ident = run_identity(url, server)
                data["identities"].setdefault(name, identity_record(ident))
                if data["environment"] is None or (info.get("engine") and not data["environment"].get("engine")):
                    data["environment"] = info  # tfengine's account of the device, where one ran
                if not variant.launched:
                    server["idle"] = wait_idle(url)  # the last run's streams are gone
                model, _, mml = model_facts(info)
                entry = play(Run(i, variant, url, info, ident.model or model, run_vocab(session, ident),
                                 ident.max_model_len or mml, not variant.launched, rep.note, ident,
                                 session.token_ids, session.salt, rep.status))
        except ServerError as e:
            e.variant = name
            if not keep_failed:
                raise
            entry = {"error": str(e), "failure": e.what + (f": {e.last_line}" if e.last_line else "")}
        entry = {"index": i, "variant": name, "started": started, **entry,
                 "log": str(log) if variant.launched else None, "server": server, "engine": info.get("engine"),
                 "identity": identity_record(ident, entry.get("system_fingerprint")) if ident else None}
        if entry["identity"] and entry["identity"]["system_fingerprint"]:
            data["identities"][name]["system_fingerprint"] = entry["identity"]["system_fingerprint"]
        data["runs"].append(entry)
        rep.note(finish(entry))
        data["partial"] = partial_mark(session.order, i, after) if i < len(session.order) or after else None
        if checkpoint:
            checkpoint()
        rep.advance()


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
