"""Reading workload files (`--dataset FILE --format auto|jsonl|sharegpt|mooncake`), whole and at
once, into `files.Dataset`. Every malformed line is a WorkloadError `FILE:LINE: what`; a format
that does not fit names --format; a needed but missing tokenizer names --tokenizer.

- JSONL: an object a line: `prompt` (text, or a list of token ids), optional `output_len`, optional
  `timestamp` (ms: then every line has one and the file is a timed trace). Other keys are ignored.
- ShareGPT: a JSON list (or an object a line) of `{"conversations": [{"from", "value"}, ...]}`.
  Each human message with a gpt reply right after it is a turn: the human value the prompt, the
  reply's token count the output length; a conversation's turns end where that alternation does
  (an unknown role or an empty message ends them too, as real ShareGPT dumps have both). `--turns T` keeps the first T turns of each
  conversation as a session (default 1: the first turn only, as vLLM's benchmark does).
- Mooncake: an object a line: `timestamp` (ms), `input_length`, `output_length`, `hash_ids`."""
from __future__ import annotations

import json
import math
from pathlib import Path

from tensorfold_bench.errors import FlagError, WorkloadError
from tensorfold_bench.workload.files import FORMATS, MOONCAKE_BLOCK, Dataset, Record, Turn
from tensorfold_bench.workload.lengths import Lengths

HUMAN = ("human", "user")
GPT = ("gpt", "assistant", "chatgpt", "bard", "bing")
SKIP = ("system",)
MOONCAKE_KEYS = ("timestamp", "input_length", "output_length", "hash_ids")


class Tokenizer:
    """What turns text into ids (and counts a text reply's tokens): a tokenizer.json read with the
    `tokenizers` library (`--tokenizer`), loaded on first use (only text needs it), else the
    `fallback` (the server's /tokenize, or a launched preset's own tokenizer); `used` says which
    counted, once one did."""

    def __init__(self, where: Path | None, fallback: "Counter | None" = None):
        self.where, self._tok, self.fallback = where, None, fallback
        self.used: str | None = None

    @property
    def have(self) -> bool:
        return self.where is not None or self.fallback is not None

    def need(self, path: Path, line: int, why: str) -> None:
        if not self.have:
            raise FlagError("--tokenizer", f"{path}:{line}: {why}: give --tokenizer DIR (a tokenizer.json)")

    def encode(self, text: str) -> tuple[int, ...]:
        if self.where is None:
            ids = self.fallback.encode(text)
            self.used = self.fallback.name
            return ids
        if self._tok is None:
            f = self.where / "tokenizer.json" if self.where.is_dir() else self.where
            if not f.is_file():
                raise FlagError("--tokenizer", f"{self.where}: no tokenizer.json there")
            self._tok = hf_tokenizer(f)
        self.used = f"the tokenizer.json of --tokenizer {self.where}"
        return tuple(self._tok.encode(text, add_special_tokens=False).ids)


def hf_tokenizer(f: Path):
    try:
        from tokenizers import Tokenizer as HFTokenizer
    except ImportError:
        raise FlagError("--tokenizer", "reading text needs the 'tokenizers' package, which is in "
                                       "tfbench's [engine] extra (pip install '.[engine]')") from None
    try:
        return HFTokenizer.from_file(str(f))
    except Exception as e:  # tokenizers raises a bare Exception on a bad file
        raise FlagError("--tokenizer", f"{f}: not a tokenizer.json ({str(e).splitlines()[0][:120]})") from None


class Counter:
    """Text -> ids without --tokenizer; `name` says which tokenizer counted, for the receipt."""

    name = ""

    def encode(self, text: str) -> tuple[int, ...]:
        raise NotImplementedError


class ServerCounter(Counter):
    """The running server's own tokenizer, through its `/tokenize` (vLLM's and tfengine's shape:
    {"prompt": text, "add_special_tokens": false} -> {"tokens": [...]})."""

    def __init__(self, url: str):
        self.url = url.rstrip("/")
        self.name = f"the server's /tokenize ({self.url})"
        self._client = None

    def encode(self, text: str) -> tuple[int, ...]:
        import httpx
        self._client = self._client or httpx.Client(timeout=30.0)
        fail = (f"{self.url}/tokenize: the server cannot count text tokens ({{}}): give --tokenizer DIR "
                "(a tokenizer.json)")
        try:
            r = self._client.post(self.url + "/tokenize", json={"prompt": text, "add_special_tokens": False})
        except httpx.HTTPError as e:
            raise FlagError("--tokenizer", fail.format(type(e).__name__)) from None
        try:
            tokens = r.json()["tokens"] if r.status_code == 200 else None
        except (ValueError, KeyError, TypeError):
            tokens = None
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise FlagError("--tokenizer", fail.format(f"HTTP {r.status_code}" if r.status_code != 200
                                                       else "its reply has no token list"))
        return tuple(tokens)


class EngineCounter(Counter):
    """A launched tfengine's own tokenizer, read here as the engine reads it: a preset's byte-level
    one, or the model directory's tokenizer.json."""

    def __init__(self, model: str):
        from engine.models.presets import PRESETS
        from engine.models.tokenizer import load_tokenizer
        d = Path(model)
        if model in PRESETS:
            cfg = PRESETS[model]
            self._tok = load_tokenizer(None, cfg.vocab_size, cfg.eos_token_id)
            self.name = f"tfengine's byte-level tokenizer (preset {model})"
        elif (d / "tokenizer.json").is_file():
            self._tok = hf_tokenizer(d / "tokenizer.json")
            self.name = f"the tokenizer.json of --model {model}"
        else:
            self._tok = load_tokenizer(None, 1 << 30, -1)
            self.name = f"tfengine's byte-level tokenizer (--model {model} has no tokenizer.json)"

    def encode(self, text: str) -> tuple[int, ...]:
        out = self._tok.encode(text, add_special_tokens=False)
        return tuple(out.ids if hasattr(out, "ids") else out)


def counter_for(url: str | None, model: str | None) -> Counter | None:
    """What counts text without --tokenizer: the first --url server's /tokenize, else the launched
    tfengine's own tokenizer for `model` (None: the engine is not installed here)."""
    if url:
        return ServerCounter(url.split("=", 1)[1] if "=" in url and not url.startswith("http") else url)
    if model is None:
        return None
    try:
        return EngineCounter(model)
    except ImportError:
        return None


def read(path: Path, fmt: str = "auto", *, tokenizer: Path | None = None, output_len: Lengths | None = None,
         turns: int = 1, limit: int | None = None, fallback: Counter | None = None) -> Dataset:
    """The file, every entry checked; only the first `limit` requests (or sessions) kept, for no
    level sends more: tokenizing a whole ShareGPT dump for a hundred requests took minutes. Text
    is counted by `tokenizer`, else by `fallback` (counter_for); the dataset says which did."""
    if not path.is_file():
        raise FlagError("--dataset", f"{path}: no such file (or 'synthetic')")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise FlagError("--dataset", f"{path}: not UTF-8 text") from None
    if not text.strip():
        raise FlagError("--dataset", f"{path}: the file is empty")
    if fmt == "auto":
        fmt = detect(path, text)
    tok = Tokenizer(tokenizer, fallback)
    if fmt == "jsonl":
        return _jsonl(path, text, tok, output_len, limit)
    if fmt == "sharegpt":
        return _sharegpt(path, text, tok, output_len, turns, limit)
    if fmt == "mooncake":
        return _mooncake(path, text)
    raise FlagError("--format", f"{fmt!r}: expected one of {', '.join(FORMATS)}")


def detect(path: Path, text: str) -> str:
    """The format, from the extension and the first line: a file that opens a list is ShareGPT
    (unless it is named .jsonl: JSON lines of lists are none of the formats); otherwise the first
    line's keys decide."""
    n, first = next((n, ln.strip()) for n, ln in enumerate(text.splitlines(), 1) if ln.strip())
    if first.startswith("[") and path.suffix != ".jsonl":
        return "sharegpt"
    try:
        obj = json.loads(first)
    except json.JSONDecodeError:
        obj = None
    if isinstance(obj, dict):
        if "hash_ids" in obj or "input_length" in obj:
            return "mooncake"
        if "conversations" in obj:
            return "sharegpt"
        if "prompt" in obj:
            return "jsonl"
    kind = f"a {path.suffix} file" if path.suffix else "the file"
    raise FlagError("--format", f"{path}: {kind} that matches none of jsonl (prompt), sharegpt (conversations), "
                                f"mooncake (hash_ids) at line {n}: {first[:60]!r}; give --format")


# ---- the three formats ------------------------------------------------------------------------

def _lines(path: Path, text: str):
    """(line number, object) for every non-blank line of a JSON-lines file."""
    for n, ln in enumerate(text.splitlines(), 1):
        if not ln.strip():
            continue
        try:
            obj = json.loads(ln)
        except json.JSONDecodeError as e:
            raise WorkloadError(f"{path}:{n}: not JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(obj, dict):
            raise WorkloadError(f"{path}:{n}: expected a JSON object, not {type(obj).__name__}")
        yield n, obj


def _count(path: Path, n: int, key: str, x, minimum: int = 1) -> int:
    if isinstance(x, bool) or not isinstance(x, int) or x < minimum:
        raise WorkloadError(f"{path}:{n}: {key} must be a whole number, at least {minimum}, not {x!r}")
    return x


def _ids(path: Path, n: int, key: str, x) -> tuple[int, ...]:
    if not x or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in x):
        raise WorkloadError(f"{path}:{n}: {key} as a list must hold token ids (whole numbers >= 0), at least one")
    return tuple(x)


def _timestamps(path: Path, recs: list[Record]) -> bool:
    """Whether the records are a timed trace: every one has a timestamp, none goes back in time."""
    have = [r.timestamp is not None for r in recs]
    if any(have) and not all(have):
        bad = next(r for r in recs if (r.timestamp is None) == have[0])
        first = "has none though the first line has one" if have[0] else "has one though the first line has none"
        raise WorkloadError(f"{path}:{bad.line}: timestamp: this line {first} (a trace times every line)")
    for a, b in zip(recs, recs[1:]):
        if all(have) and b.timestamp < a.timestamp:
            raise WorkloadError(f"{path}:{b.line}: timestamp {b.timestamp:g} goes back in time "
                                f"(line {a.line} has {a.timestamp:g}); a trace is in send order")
    return all(have)


def _timestamp(path: Path, n: int, x) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x < 0:
        raise WorkloadError(f"{path}:{n}: timestamp must be milliseconds, a number >= 0, not {x!r}")
    return float(x)


def _jsonl(path: Path, text: str, tok: Tokenizer, output_len: Lengths | None, limit: int | None) -> Dataset:
    recs = []
    for n, obj in _lines(path, text):
        keep = limit is None or len(recs) < limit  # lines past the limit are checked, not tokenized
        if "prompt" not in obj:
            raise WorkloadError(f"{path}:{n}: no prompt (a JSONL line has prompt, optionally output_len, timestamp)")
        p = obj["prompt"]
        if isinstance(p, str) and p:
            prompt = tok.encode(p) if tok.have and keep else p
        elif isinstance(p, list):
            prompt = _ids(path, n, "prompt", p)
        else:
            raise WorkloadError(f"{path}:{n}: prompt must be text or a list of token ids, not {p!r:.40}")
        if "output_len" in obj:
            out = _count(path, n, "output_len", obj["output_len"])
        elif output_len is None:
            raise FlagError("--output-len", f"{path}:{n} gives no output_len: give --output-len for such lines")
        else:
            out = None
        ts = _timestamp(path, n, obj["timestamp"]) if "timestamp" in obj else None
        recs.append(Record(n, (Turn(prompt, out),), ts))
    return Dataset(str(path), "jsonl", tuple(recs[:limit]), _timestamps(path, recs), entries=len(recs),
                   counted_by=tok.used)


def _mooncake(path: Path, text: str) -> Dataset:
    recs = []
    for n, obj in _lines(path, text):
        missing = [k for k in MOONCAKE_KEYS if k not in obj]
        if missing:
            raise WorkloadError(f"{path}:{n}: no {', '.join(missing)} (a Mooncake line has {', '.join(MOONCAKE_KEYS)})")
        ts = _timestamp(path, n, obj["timestamp"])
        inp = _count(path, n, "input_length", obj["input_length"])
        out = _count(path, n, "output_length", obj["output_length"])
        if not isinstance(obj["hash_ids"], list):
            raise WorkloadError(f"{path}:{n}: hash_ids must be a list of block ids")
        hs = _ids(path, n, "hash_ids", obj["hash_ids"])
        if inp > MOONCAKE_BLOCK * len(hs):
            raise WorkloadError(f"{path}:{n}: input_length {inp} is more than its {len(hs)} hash ids of "
                                f"{MOONCAKE_BLOCK} tokens hold ({MOONCAKE_BLOCK * len(hs)})")
        recs.append(Record(n, (Turn(None, out, inp, hs),), ts))
    _timestamps(path, recs)
    return Dataset(str(path), "mooncake", tuple(recs), True)


def _elements(path: Path, text: str):
    """(line, object) for each element of a top-level JSON list, or each line of JSON lines."""
    i = len(text) - len(text.lstrip())
    if not text.startswith("[", i):
        yield from _lines(path, text)
        return
    dec, line, at = json.JSONDecoder(), 1, 0

    def line_of(pos: int) -> int:
        nonlocal line, at
        line, at = line + text.count("\n", at, pos), pos
        return line

    def skip(pos: int) -> int:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        return pos

    i = skip(i + 1)
    if text.startswith("]", i):
        return
    while True:
        try:
            obj, j = dec.raw_decode(text, i)
        except json.JSONDecodeError as e:
            raise WorkloadError(f"{path}:{e.lineno}: not JSON ({e.msg} at column {e.colno})") from None
        yield line_of(i), obj
        i = skip(j)
        if text.startswith(",", i):
            i = skip(i + 1)
        elif text.startswith("]", i):
            if skip(i + 1) < len(text):
                raise WorkloadError(f"{path}:{line_of(skip(i + 1))}: text after the list's end")
            return
        else:
            raise WorkloadError(f"{path}:{line_of(i)}: expected ',' or ']' between the list's conversations")


def _sharegpt(path: Path, text: str, tok: Tokenizer, output_len: Lengths | None, turns: int,
              limit: int | None) -> Dataset:
    recs, skipped, entries = [], 0, 0
    for n, obj in _elements(path, text):
        conv = obj.get("conversations") if isinstance(obj, dict) else None
        if not isinstance(conv, list):
            raise WorkloadError(f"{path}:{n}: expected {{\"conversations\": [{{\"from\": ..., \"value\": ...}}, ...]}}")
        msgs = []
        for k, m in enumerate(conv):
            if not (isinstance(m, dict) and isinstance(m.get("from"), str) and isinstance(m.get("value"), (str, list))):
                raise WorkloadError(f"{path}:{n}: conversations[{k}] must have \"from\" and \"value\" (text or ids)")
            role = m["from"].lower()
            if role in SKIP:
                continue
            kind = "gpt" if role in GPT else "human" if role in HUMAN and m["value"] else "other"
            msgs.append((k, kind, m["value"]))  # "other" (an unknown role, an empty message) ends the turns
        while msgs and msgs[0][1] == "gpt":  # a reply before any human message has no prompt
            msgs.pop(0)
        pairs = []
        for (k, kind, value), nxt in zip(msgs[::2], msgs[1::2]):
            if kind != "human" or nxt[1] != "gpt":
                break  # the alternation breaks: the turns after would lose their history
            pairs.append((k, value, nxt[0], nxt[2]))
            if len(pairs) == turns:
                break
        if not pairs:
            skipped += 1
            continue
        entries += 1
        if limit is None or len(recs) < limit:  # past the limit: checked, not tokenized
            recs.append(Record(n, tuple(Turn(_prompt(path, n, k, v, tok, turns), _reply(path, n, k2, v2, tok, output_len))
                                        for k, v, k2, v2 in pairs)))
    if not recs:
        raise WorkloadError(f"{path}:1: no conversation has a human message followed by a gpt reply")
    return Dataset(str(path), "sharegpt", tuple(recs), False, skipped, entries, counted_by=tok.used)


def _prompt(path: Path, n: int, k: int, value, tok: Tokenizer, turns: int) -> tuple[int, ...] | str:
    if isinstance(value, list):
        return _ids(path, n, f"conversations[{k}].value", value)
    if turns > 1:  # the player builds each later prompt from ids: history, reply, new part
        tok.need(path, n, "multi-turn sessions (--turns) of text need token ids")
    return tok.encode(value) if tok.have else value


def _reply(path: Path, n: int, k: int, value, tok: Tokenizer, output_len: Lengths | None) -> int | None:
    if output_len is not None:
        return None  # --output-len replaces the replies' lengths
    if isinstance(value, list):
        return max(1, len(_ids(path, n, f"conversations[{k}].value", value) if value else ()))
    tok.need(path, n, "a text reply's length is counted in tokens")
    return max(1, len(tok.encode(value)))
