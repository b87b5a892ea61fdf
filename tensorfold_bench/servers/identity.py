"""What a server is, asked of the server itself, and the vocabulary random prompts are drawn from.

`identify(url)` reads what any OpenAI-compatible server offers: `/v1/models` (id, owned_by,
root, max_model_len, vocab_size where given), `/version` when present (vLLM), and tfengine's
`/v1/engine` when present. It is the one place a server is asked about itself, and the one place
each fact is decided where two answers could give it (the model's context and vocabulary: the
models list first, tfengine's own account second). The result is a plain dataclass the receipt
can print: the server's own name and version, the model, and the command line tfbench launched
(None under --url).

`discover_vocab(...)` finds how many token ids a random prompt may use: the server's vocab_size,
else a tokenizer or model directory (config.json's vocab_size, capped by tokenizer.json's
largest id, since a server with a tokenizer refuses ids beyond it).

During a session: `healthy`, `wait_idle`
(/metrics: no stream running or waiting) and `fetch_trace` (the engine's /v1/trace).
"""
from __future__ import annotations

import contextlib
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from tensorfold_bench.errors import BenchError


@dataclass
class ServerIdentity:
    url: str
    name: str  # tfengine, the models' owned_by (vllm, ...), or "unknown"
    version: str | None = None  # /version's version; tfengine: its source commit
    model: str | None = None  # the first /v1/models id: the name requests must use
    owned_by: str | None = None
    root: str | None = None  # where the model came from (vLLM: the path or hub id it loaded)
    max_model_len: int | None = None
    vocab_size: int | None = None  # as the server reports it; None: not reported
    launched: bool = False  # False: reached by --url, run by someone else
    command: str | None = None  # the command line as launched (tfengine: with the flags applied)
    checked: list[str] = field(default_factory=list)  # how tfbench knows it launched this server
    engine: dict | None = None  # tfengine's /v1/engine payload
    models: list[dict] = field(default_factory=list)  # /v1/models data, as served
    # the /v1/engine and /v1/models bodies as served (None: no answer): the receipt's environment
    answers: dict = field(default_factory=dict, repr=False)

    @property
    def request_model(self) -> str:
        """The model name requests carry: the server's first model, else "default"."""
        return self.model or "default"

    @property
    def label(self) -> str:
        """One line for a receipt: `vllm 0.10.1, model Qwen/Qwen3-0.6B`."""
        head = self.name + (f" {self.version}" if self.version else "")
        return head + (f", model {self.model}" if self.model else "")

    def to_dict(self) -> dict:
        """The identity as a receipt keeps it (the raw answers are kept once, as its environment)."""
        d = asdict(self)
        del d["answers"]
        return d


def _get(client: httpx.Client, url: str, must_answer: bool = False) -> dict | None:
    """A JSON object from GET url; None when the server has no such endpoint."""
    try:
        r = client.get(url)
    except httpx.HTTPError as e:
        if must_answer:
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise BenchError(f"{url}: cannot reach the server ({reason})") from None
        return None
    if r.status_code != 200:
        return None
    try:
        body = r.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def _int(v) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def identify(url: str, server=None, timeout: float = 10.0) -> ServerIdentity:
    """Ask the server at `url` what it is. `server`: the launcher's Server when tfbench launched it."""
    base = url.rstrip("/")
    with httpx.Client(timeout=timeout) as c:
        listed = _get(c, base + "/v1/models", must_answer=True)
        version = _get(c, base + "/version")
        engine = _get(c, base + "/v1/engine")
    ident = identity_of(base, listed, version, engine)
    if server is not None:
        ident.launched, ident.command, ident.checked = True, server.command_line, list(server.checked)
    return ident


def identity_of(base: str, listed: dict | None, version: dict | None, engine: dict | None) -> ServerIdentity:
    """The identity from the server's answers to /v1/models, /version and /v1/engine (None: no
    answer). Where two answers could give a fact, the models list wins, then tfengine's account."""
    models = (listed or {}).get("data") or []
    first = models[0] if models and isinstance(models[0], dict) else {}
    is_tfengine = engine is not None and isinstance(engine.get("engine"), dict)
    desc = engine["engine"] if is_tfengine else {}
    config = (engine.get("config") or {}) if is_tfengine else {}
    shape = desc.get("shape") or {}
    return ServerIdentity(
        url=base, name="tfengine" if is_tfengine else str(first.get("owned_by") or "unknown"),
        version=(version or {}).get("version") or (engine or {}).get("commit"),
        model=first.get("id"), owned_by=first.get("owned_by"), root=first.get("root"),
        max_model_len=(_int(first.get("max_model_len")) or _int(desc.get("max_model_len"))
                       or _int(config.get("max_model_len"))),
        vocab_size=_int(first.get("vocab_size")) or _int(shape.get("vocab")) or _int(shape.get("vocab_size")),
        engine=engine if is_tfengine else None, models=[m for m in models if isinstance(m, dict)],
        answers={"engine": engine, "models": listed})


def vocab_from_dir(path: Path) -> int | None:
    """config.json's vocab_size (or text_config's), capped by tokenizer.json's largest id + 1."""
    sizes = []
    try:
        cfg = json.loads((path / "config.json").read_text())
        v = _int(cfg.get("vocab_size")) or _int((cfg.get("text_config") or {}).get("vocab_size"))
        if v:
            sizes.append(v)
    except (OSError, ValueError, AttributeError):
        pass
    try:
        tok = json.loads((path / "tokenizer.json").read_text())
        ids = list(((tok.get("model") or {}).get("vocab") or {}).values())
        ids += [t.get("id") for t in tok.get("added_tokens") or [] if isinstance(t, dict)]
        ids = [i for i in ids if _int(i) is not None]
        if ids:
            sizes.append(max(ids) + 1)
    except (OSError, ValueError, AttributeError):
        pass
    return min(sizes) if sizes else None


def discover_vocab(ident: ServerIdentity | None = None, tokenizer: str | Path | None = None,
                   model_dir: str | Path | None = None) -> int:
    """How many token ids random prompts may draw from. In order: the server's own vocab_size,
    `tokenizer` (--tokenizer DIR), `model_dir`, and the server's `root` when it is a local
    directory (vLLM serving a path). Raises BenchError naming the flags to pass otherwise."""
    if ident is not None and ident.vocab_size:
        return ident.vocab_size
    for flag, d in (("--tokenizer", tokenizer), ("the model directory", model_dir)):
        if d is None:
            continue
        if not Path(d).is_dir():
            raise BenchError(f"{flag} {d}: not a directory")
        v = vocab_from_dir(Path(d))
        if v is None:
            raise BenchError(f"{flag} {d}: no vocab_size in config.json and no tokenizer.json; pass --vocab N")
        return v
    if ident is not None and ident.root and Path(ident.root).is_dir():
        v = vocab_from_dir(Path(ident.root))
        if v is not None:
            return v
    where = f"{ident.url} reports no vocab_size in /v1/models" if ident else "no server to ask"
    raise BenchError(f"no vocabulary size for random prompt ids: {where}; pass --vocab N, or "
                     "--tokenizer DIR (a directory with config.json or tokenizer.json)")


# ---- during a session -----------------------------------------------------------------------

def healthy(url: str, timeout: float = 5.0) -> bool:
    """Does the server still serve (GET /health, else /v1/models: 200)?"""
    with httpx.Client(timeout=timeout) as c:
        for path in ("/health", "/v1/models"):
            with contextlib.suppress(httpx.HTTPError):
                if c.get(url + path).status_code == 200:
                    return True
    return False


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
