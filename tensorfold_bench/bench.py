"""Run the long-prompt scenario over variants, in order, a fresh server per run; return the
receipt data (a plain dict, everything JSON-able: receipt.py renders it).

The pieces, each usable alone: `EngineSetup` (engine flags shared by every variant),
`LongPromptSettings` (what to run), `run_long_prompt(settings, reporter)` (does it).
"""
from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import math
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Iterator, Protocol

import httpx

from tensorfold_bench import __version__
from tensorfold_bench.client import Request, StreamRecord
from tensorfold_bench.errors import BenchError, FlagError, ServerError
from tensorfold_bench.exactness import compare_reply, known_ids, server_sha_matches, short, token_hash
from tensorfold_bench.launcher import REPO_ROOT, existing, launch
from tensorfold_bench.metrics import LongPromptFigures, long_prompt_figures
from tensorfold_bench.scenario import LongPromptScript, Prompts, make_prompts, play_alone, play_long_prompt, play_sequence, requests
from tensorfold_bench.variants import Variant, plain

SCHEMA = "tfbench.receipt/1"


@dataclass
class EngineSetup:
    """Engine flags every variant shares (a variant's own args come after and win)."""

    model: str = "cpu"
    device: str = "cpu"
    dtype: str | None = None
    parallel: int = 4
    prefill_rows: int = 256
    max_model_len: int | None = None
    seed: int = 0
    trace: bool = True
    extra_args: list[str] = field(default_factory=list)

    def flags(self) -> list[str]:
        f = ["--model", self.model, "--device", self.device, "--parallel", str(self.parallel),
             "--prefill-rows", str(self.prefill_rows), "--seed", str(self.seed)]
        if self.dtype:
            f += ["--dtype", self.dtype]
        if self.max_model_len:
            f += ["--max-model-len", str(self.max_model_len)]
        if self.trace:
            f += ["--trace"]
        return f + list(self.extra_args)


@dataclass
class LongPromptSettings:
    engine: EngineSetup
    script: LongPromptScript
    variants: list[Variant]  # the base first
    order: list[str]
    out_dir: Path
    url: str | None = None  # a running server: nothing is launched
    plain_check: bool = False
    alone: bool = True  # measure B alone once per variant
    stamp: str = ""
    vocab: int | None = None  # prompt ids are drawn below this; default: what the server reports

    def __post_init__(self):
        names = [v.name for v in self.variants]
        if len(set(names)) != len(names):
            raise FlagError("--share", f"variant names repeat: {names}")
        for n in self.order:
            if n not in names:
                raise FlagError("--order", f"unknown variant {n!r}")
        if not self.stamp:
            self.stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")

    @property
    def run_dir(self) -> Path:
        return self.out_dir / f"{self.stamp}-long-prompt"


class Reporter(Protocol):
    def start(self, total: int) -> None: ...
    def step(self, text: str) -> None: ...
    def advance(self) -> None: ...
    def note(self, text: str) -> None: ...


class QuietReporter:
    def start(self, total): pass
    def step(self, text): pass
    def advance(self): pass
    def note(self, text): pass


def git_commit(root: Path) -> str | None:
    """HEAD's sha (with '+dirty' if the tree has changes), or TFBENCH_COMMIT for a copy without git."""
    try:
        p = subprocess.run(["git", "rev-parse", "--verify", "-q", "HEAD"], cwd=root, capture_output=True, text=True,
                           timeout=10)
        sha = p.stdout.strip()
        if p.returncode == 0 and len(sha) == 40 and all(c in "0123456789abcdef" for c in sha):
            dirty = subprocess.run(["git", "status", "--porcelain", "-uno"], cwd=root, capture_output=True,
                                   text=True, timeout=10).stdout.strip()
            return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return os.environ.get("TFBENCH_COMMIT") or None


def host_info() -> dict:
    return {"python": sys.version.split()[0], "platform": platform.platform(), "machine": platform.machine(),
            "tfbench": __version__, "harness_commit": git_commit(REPO_ROOT)}


def source_root(variant: Variant) -> Path:
    """Where a variant's engine source lives: this repository, or a worktree of its ref."""
    if variant.ref is None:
        return REPO_ROOT
    from tensorfold_bench import worktree

    return Path(worktree.source(variant.ref).path)


@contextlib.contextmanager
def server_for(settings: LongPromptSettings, variant: Variant, log: Path, facts: dict) -> Iterator[str]:
    """The run's server URL; `facts` gets the launched server's pid (= its process group) and argv."""
    if settings.url:
        with existing(settings.url) as url:
            yield url
        return
    root = source_root(variant)
    with launch(settings.engine.flags() + variant.args, log, env=variant.env, root=root) as srv:
        facts.update(pgid=srv.pgid, argv=srv.argv, root=str(root))
        yield srv.url


def server_info(url: str) -> dict:
    """GET /v1/engine and /v1/models (either may be missing on foreign servers)."""
    out: dict = {}
    with httpx.Client(timeout=10) as c:
        for path, key in (("/v1/engine", "engine"), ("/v1/models", "models")):
            try:
                r = c.get(url + path)
                out[key] = r.json() if r.status_code == 200 else None
            except (httpx.HTTPError, ValueError):
                out[key] = None
    return out


def wait_idle(url: str, timeout: float = 15.0) -> dict:
    """Wait until a tfengine server runs and queues no stream (GET /metrics); other servers: no wait.
    Returns {"confirmed": bool | None, "waited_s": float}."""
    t0 = time.monotonic()
    while True:
        try:
            r = httpx.get(url + "/metrics", timeout=5)
            text = r.text if r.status_code == 200 else ""
        except httpx.HTTPError:
            text = ""
        vals = {}
        for line in text.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] in ("tfengine_running_streams", "tfengine_waiting_streams"):
                vals[parts[0]] = float(parts[1])
        if len(vals) < 2:
            return {"confirmed": None, "waited_s": time.monotonic() - t0}
        if not any(vals.values()):
            return {"confirmed": True, "waited_s": time.monotonic() - t0}
        if time.monotonic() - t0 > timeout:
            return {"confirmed": False, "waited_s": time.monotonic() - t0}
        time.sleep(0.05)


def fetch_trace(url: str) -> list[dict] | None:
    try:
        r = httpx.get(url + "/v1/trace", timeout=30)
        return r.json().get("steps") if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


def model_facts(info: dict) -> tuple[str, int | None, int | None]:
    """(model id, vocab size, max_model_len) from /v1/engine and /v1/models."""
    model, vocab, mml = "default", None, None
    models = (info.get("models") or {}).get("data") or []
    if models:
        model = models[0].get("id", model)
        mml = models[0].get("max_model_len")
        vocab = models[0].get("vocab_size")
    eng = info.get("engine") or {}
    desc = eng.get("engine") or {}
    shape = desc.get("shape") or {}
    vocab = vocab or shape.get("vocab") or shape.get("vocab_size")
    mml = mml or desc.get("max_model_len") or (eng.get("config") or {}).get("max_model_len")
    return model, vocab, mml


def foreign_extra(url: str | None) -> dict:
    """Extra request fields for servers other than tfengine: usage in the stream, and token ids
    (vLLM's `return_token_ids`; else logprobs "token_id:N" with --return-tokens-as-token-ids)."""
    return {"stream_options": {"include_usage": True}, "logprobs": 1, "return_token_ids": True} if url else {}


def records_dict(recs: dict[str, StreamRecord]) -> dict[str, dict]:
    return {k: v.to_dict() for k, v in recs.items()}


def reply_hashes(recs: dict[str, StreamRecord]) -> dict[str, dict]:
    out = {}
    for k, r in recs.items():
        ids = known_ids(r.token_ids)
        out[k] = {"tokens": len(r.token_ids), "sha256": token_hash(ids) if ids is not None else None,
                  "server_sha": r.server_sha, "server_sha_matches": server_sha_matches(r.token_ids, r.server_sha)}
    return out


def check_script(script: LongPromptScript, vocab: int | None, mml: int | None) -> None:
    if vocab is not None and vocab < 2:
        raise BenchError(f"server reports a vocabulary of {vocab}")
    if mml is not None and script.b_tokens + script.b_max_tokens > mml:
        raise FlagError("--b-tokens", f"{script.b_tokens} + {script.b_max_tokens} reply tokens exceed the server's "
                                      f"max_model_len {mml}")


def fit_script(script: LongPromptScript, mml: int | None) -> LongPromptScript:
    """A's reply as long as the server's context allows (it is cancelled anyway)."""
    if mml is None or script.a_prompt_tokens + script.a_max_tokens <= mml:
        return script
    return replace(script, a_max_tokens=max(1, mml - script.a_prompt_tokens - 1))


def run_long_prompt(settings: LongPromptSettings, reporter: Reporter | None = None) -> dict:
    """Every run in order, a fresh server each, then the plain reference; the receipt data.
    A server that dies or never gets healthy makes that run a failed one (kept, with the log's
    tail, left out of the medians); the other runs go on."""
    rep = reporter or QuietReporter()
    by_name = {v.name: v for v in settings.variants}
    total = len(settings.order) + (1 if settings.plain_check and not settings.url else 0)
    rep.start(total)
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    data: dict = {"schema": SCHEMA, "scenario": "long-prompt", "created": dt.datetime.now().isoformat(timespec="seconds"),
                  "host": host_info(), "settings": {"engine": asdict(settings.engine), "engine_flags": settings.engine.flags(),
                                                    "script": settings.script.to_dict(), "order": settings.order,
                                                    "url": settings.url, "plain_check": settings.plain_check,
                                                    "run_dir": str(settings.run_dir)},
                  "variants": [v.to_dict() for v in settings.variants], "runs": [], "alone": {}, "plain": None,
                  "environment": None, "not_run": []}
    vocab_seen = None
    for i, name in enumerate(settings.order, 1):
        rep.step(f"run {i}/{len(settings.order)}: {name}")
        log = settings.run_dir / f"run{i}-{slug(name)}.log"
        try:
            run, vocab_seen = play_run(settings, by_name[name], i, log, data, rep)
        except ServerError as e:
            run = failed_run(i, name, log, e)
        data["runs"].append(run)
        f = LongPromptFigures.from_dict(run["figures"])
        rep.note(f"{name}: B first token {fmt_s(f.b_first_token)}, C {fmt_s(f.c_first_token)}, "
                 f"A pause {fmt_s(f.a_longest_pause)}" + ("" if f.valid else f"  INVALID: {'; '.join(f.invalid_reasons)}"))
        rep.advance()
    if settings.plain_check and not settings.url:
        rep.step("plain reference")
        try:
            data["plain"] = run_plain(settings, data, vocab_seen) if vocab_seen else None
        except ServerError as e:
            data["plain_error"] = e.what + (f": {e.last_line}" if e.last_line else "") + f" (log {e.log})"
        rep.advance()
    data["exactness"] = exactness(data)
    data["not_run"] = not_run(settings, data)
    return data


def play_run(settings: LongPromptSettings, v: Variant, i: int, log: Path, data: dict,
             rep: Reporter) -> tuple[dict, int]:
    """One run: a fresh server (unless --url), A/B/C on the script, its trace, and B alone once
    per variant. Returns the run's record and the vocabulary size."""
    s = settings.script
    server: dict = {"load_before": os.getloadavg()[0]}
    with server_for(settings, v, log, server) as url:
        info = server_info(url)
        model, vocab, mml = model_facts(info)
        vocab = settings.vocab or vocab
        if vocab is None:
            raise FlagError("--vocab", "the server reports no vocabulary size (GET /v1/engine, /v1/models): give it")
        check_script(s, vocab, mml)
        s = fit_script(s, mml)
        data["settings"]["script"] = s.to_dict()
        if data["environment"] is None:
            data["environment"] = info
        if settings.url:
            server["idle"] = wait_idle(url)  # the last run's streams are gone
        prompts = make_prompts(s, vocab, f"-run{i}" if settings.url else "")
        recs = asyncio.run(play_long_prompt(url, s, prompts, model, foreign_extra(settings.url)))
        trace = fetch_trace(url) if (settings.engine.trace or settings.url) else None
        if settings.alone and v.name not in data["alone"]:
            rep.note(f"{v.name}: B alone")
            data["alone"][v.name] = play_b_alone(url, s, vocab, model, i, settings.url, trace is not None)
    figs = long_prompt_figures(recs["A"], recs["B"], recs["C"])
    return ({"index": i, "variant": v.name, "figures": figs.to_dict(), "records": records_dict(recs),
             "hashes": reply_hashes(recs), "trace": trace, "log": None if settings.url else str(log),
             "server": server, "engine": info.get("engine")}, vocab)


def play_b_alone(url: str, s: LongPromptScript, vocab: int, model: str, i: int, foreign: str | None,
                 traced: bool) -> dict:
    """B's first token with nothing else running (checked on /metrics), on a prompt of its own."""
    idle = wait_idle(url)
    req = Request("B", make_prompts(s, vocab, f"-alone{i}").b, max_tokens=s.b_max_tokens, extra=foreign_extra(foreign))
    rec = asyncio.run(play_alone(url, req, model))
    tr = fetch_trace(url) if traced else None
    return {"record": rec.to_dict(), "run": i, "idle": idle, "error": rec.error,
            "b_first_token": (rec.token_times[0] - rec.sent) if rec.token_times and rec.sent else None,
            "trace": [st for st in tr if st["t"] >= rec.sent] if tr else None}


def failed_run(i: int, name: str, log: Path, err: ServerError) -> dict:
    why = err.what + (f": {err.last_line}" if err.last_line else "")
    figs = LongPromptFigures(None, None, None, None, None, 0, None, {}, valid=False,
                             invalid_reasons=[f"the server failed: {why}"])
    return {"index": i, "variant": name, "figures": figs.to_dict(), "records": None, "hashes": None, "trace": None,
            "log": str(log), "server": {}, "engine": None, "error": str(err)}


def run_plain(settings: LongPromptSettings, data: dict, vocab: int) -> dict:
    """Each request alone, whole prompt, no cache, no drafts, one stream, on the base's source."""
    s = settings.script
    base = settings.variants[0]
    pv = plain(base)
    a_len = max([len(r["records"]["A"]["token_ids"]) for r in data["runs"] if r["records"]] + [1])
    prompts = make_prompts(s, vocab, "")
    ra, rb, rc = requests(s, prompts)
    ra.max_tokens = a_len
    log = settings.run_dir / "plain.log"
    with launch(settings.engine.flags() + pv.args, log, env=pv.env, root=source_root(pv)) as srv:
        info = server_info(srv.url)
        model, _, _ = model_facts(info)
        recs = asyncio.run(play_sequence(srv.url, [ra, rb, rc], model))
    return {"variant": pv.to_dict(), "records": records_dict(recs), "hashes": reply_hashes(recs), "log": str(log),
            "server": {"pgid": srv.pgid, "argv": srv.argv},
            "engine": info.get("engine")}


def compare_run(run: dict, ref: dict, ref_a: dict | None = None) -> list[dict]:
    """A, B and C of `run` against `ref` (A against `ref_a` if given: the longest A, so that each
    run's A is compared on its whole length)."""
    out = []
    for k in ("A", "B", "C"):
        r, f = run["records"][k], (ref_a if k == "A" and ref_a is not None else ref)["records"][k]
        c = compare_reply(k, r["token_ids"], f["token_ids"], prefix=(k == "A"), server_sha=r["server_sha"],
                          ref_sha=f["server_sha"])
        out.append({"stream": k, "equal": c.equal, "detail": c.detail})
    return out


def exactness(data: dict) -> dict:
    """Each run's replies against the other runs (B and C against the first complete run, A against
    the longest A) and against the plain reference (if run); the servers' token_sha against our
    own hashes; A's table hash over the common prefix."""
    runs = [r for r in data["runs"] if r["records"] and not any(rec["error"] for rec in r["records"].values())]
    out: dict = {"across_runs": {}, "refs": None, "vs_plain": {}, "server_sha": {"match": 0, "mismatch": 0, "absent": 0},
                 "a_prefix": None, "hashes": {}}
    if not runs:
        return out
    first = runs[0]
    longest = max(runs, key=lambda r: len(r["records"]["A"]["token_ids"]))
    out["refs"] = {"BC": first["index"], "A": longest["index"]}
    same_prompts = not data["settings"].get("url")
    for r in data["runs"]:
        if not r["records"]:
            continue
        if same_prompts:
            out["across_runs"][str(r["index"])] = compare_run(r, first, longest)
        if data.get("plain"):
            out["vs_plain"][str(r["index"])] = compare_run(r, data["plain"])
        for h in r["hashes"].values():
            m = h["server_sha_matches"]
            out["server_sha"]["absent" if m is None else ("match" if m else "mismatch")] += 1
    a_lens = [len(r["records"]["A"]["token_ids"]) for r in runs]
    if data.get("plain"):
        a_lens.append(len(data["plain"]["records"]["A"]["token_ids"]))
    n = min(a_lens)
    out["a_prefix"] = n
    for r in runs:
        ids = known_ids(r["records"]["A"]["token_ids"])
        out["hashes"][str(r["index"])] = {
            "A": short(token_hash(ids[:n])) if ids is not None and len(ids) >= n else None,
            "A_tokens": len(r["records"]["A"]["token_ids"]),
            "B": short(r["hashes"]["B"]["sha256"]), "C": short(r["hashes"]["C"]["sha256"])}
    return out


def not_run(settings: LongPromptSettings, data: dict) -> list[str]:
    out = []
    if settings.engine.device == "cpu" and not settings.url:
        out.append("CUDA: this receipt is the cpu preset (fp32 on the host's cores). The same command with "
                   "--device cuda runs qwen3-8b in bf16 with a 32,000-token B at 5 s.")
    if settings.url:
        out.append(f"Fresh servers: --url {settings.url} targets a running server, so every variant ran on it "
                   "as it is configured and each run used its own prompts (cold B) instead of a restart.")
    if not settings.plain_check:
        out.append("The plain reference (--plain-check): not asked for; replies are compared across runs only.")
    elif settings.url:
        out.append("The plain reference: needs launched servers, not --url.")
    elif data.get("plain_error"):
        out.append(f"The plain reference: its server failed: {data['plain_error'].splitlines()[0]}")
    bad = [r for r in data["runs"] if not r["figures"]["valid"]]
    for r in bad:
        out.append(f"Run {r['index']} ({r['variant']}) is invalid and left out of the medians: "
                   + "; ".join(r["figures"]["invalid_reasons"]) + (f" (log: {r['log']})" if r.get("error") else ""))
    return out


def slug(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in ".-" else "-" for ch in name).strip("-")


def fmt_s(v: float | None) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:.2f} s"
