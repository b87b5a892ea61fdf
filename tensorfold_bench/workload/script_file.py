"""A script: a YAML timeline of named streams and the figures measured over it (`tfbench run
script FILE`). This module is the script's model and its checks, pure (no server, no clock):
a bad script is one line naming the stream (or figure) and the field, before any server starts.

```yaml
name: cancel-and-retry
streams:
  - name: A
    at: 0                        # seconds from the run's start, or an event plus seconds
    prompt: {random: 64}         # {random: N} | {same_as: X} | {prefix_of: X, plus: N} | {text: "..."}
    max_tokens: 4000
    until: [R.done]              # cancelled (its stream closed) once all of these happened
  - name: X
    at: 3
    prompt: {random: 4096}
    max_tokens: 8
    cancel: {after: 1.0}         # seconds after its send, or {tokens: K}
  - name: R
    at: X.cancelled + 0.2        # events: NAME.sent / first_token / done / cancelled
    prompt: {same_as: X}
    max_tokens: 8
    expect: {cached_tokens: ">= 256"}
figures:
  - {first_token: R}
  - {longest_pause: A, window: [X.sent, R.first_token]}
  - {rate: A, window: [X.sent, R.first_token], versus: before}
```

Per stream also: `priority` (foreground, background), `temperature` and `seed`, `draft: false`,
`ignore_eos` (default true), `repeat: N` with `every: S` (copies NAME-2 ... NAME-N, each sent S
seconds after the one before; a `{random: N}` prompt is drawn afresh for each copy).

Events: `sent` (the request left), `first_token`, `done` (the stream finished by itself) and
`cancelled` (tfbench closed it). Orders that hold on every run are what the checks rely on: a
stream's events come after its `sent`, `done` after `first_token`; a stream sent at an event
plus s is sent at least s after it; a stream sent at t seconds is sent at t (its lateness is
measured, and a late send makes the run invalid). A window `[start, end]` must end after it
starts by these orders alone, and a prompt may repeat or extend only a stream that is sent
before it.
"""
from __future__ import annotations

import hashlib
import math
import re
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import yaml

from tensorfold_bench.errors import BenchError

EVENTS = ("sent", "first_token", "done", "cancelled")
PRIORITIES = ("foreground", "background")
FIGURES = ("first_token", "longest_pause", "rate", "cached_tokens")  # the kinds a script may ask for
WINDOWED = ("longest_pause", "rate")
VERSUS = ("before",)
EXPECTS = ("cached_tokens",)
OPS = {">=": lambda a, b: a >= b, "<=": lambda a, b: a <= b, "==": lambda a, b: a == b,
       ">": lambda a, b: a > b, "<": lambda a, b: a < b}

TOP_KEYS = ("name", "streams", "figures", "seed", "timeout")
STREAM_KEYS = ("name", "at", "prompt", "max_tokens", "until", "cancel", "expect", "priority", "temperature",
               "seed", "draft", "ignore_eos", "repeat", "every")
PROMPT_KEYS = ("random", "same_as", "prefix_of", "plus", "text")

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_COPY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(-[0-9]+)?$")
_POINT = re.compile(r"^\s*(?P<stream>[A-Za-z_][A-Za-z0-9_-]*)\.(?P<kind>[A-Za-z_]+)\s*"
                    r"(?:(?P<sign>[+-])\s*(?P<plus>[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*)?$")
_COMPARE = re.compile(r"^\s*(?P<op>>=|<=|==|>|<)?\s*(?P<value>[0-9]+)\s*$")


class ScriptError(BenchError):
    """A bad script: the message names the file, the stream (or figure) and the field."""


@dataclass(frozen=True)
class Event:
    stream: str
    kind: str  # EVENTS

    def __str__(self) -> str:
        return f"{self.stream}.{self.kind}"


@dataclass(frozen=True)
class Point:
    """A time on a run's clock: `plus` seconds after `event`, or after the run's start (None)."""

    event: Event | None = None
    plus: float = 0.0

    def __str__(self) -> str:
        if self.event is None:
            return f"{self.plus:g}"
        return str(self.event) + (f" + {self.plus:g}" if self.plus else "")


@dataclass(frozen=True)
class Prompt:
    random: int | None = None  # that many seeded random token ids
    same_as: str | None = None  # another stream's prompt, again
    prefix_of: str | None = None  # another stream's prompt, then `plus` random ids
    plus: int = 0
    text: str | None = None  # a text prompt, tokenized by the server

    @property
    def source(self) -> str | None:
        """The stream whose prompt this one repeats or extends."""
        return self.same_as or self.prefix_of

    def __str__(self) -> str:
        if self.random is not None:
            return f"{self.random:,} random ids"
        if self.same_as:
            return f"same as {self.same_as}"
        if self.prefix_of:
            return f"{self.prefix_of}'s + {self.plus:,} random ids"
        return f"text ({len(self.text or '')} characters)"


@dataclass(frozen=True)
class Cancel:
    after: float | None = None  # seconds after the stream's send
    tokens: int | None = None  # once it has received this many tokens

    def __str__(self) -> str:
        return f"{self.after:g} s after its send" if self.after is not None else f"after {self.tokens} tokens"


@dataclass(frozen=True)
class Expect:
    """A check on a stream's record: a run that misses it is invalid, with the reason; a server
    that does not report the value makes it unknown, never a failure."""

    what: str  # EXPECTS
    op: str
    value: int

    def holds(self, got: int | None) -> bool | None:
        return None if got is None else OPS[self.op](got, self.value)

    def __str__(self) -> str:
        return f"{self.what} {self.op} {self.value}"


@dataclass(frozen=True)
class Stream:
    name: str
    at: Point
    prompt: Prompt
    max_tokens: int = 16
    until: tuple[Event, ...] = ()
    cancel: Cancel | None = None
    expect: tuple[Expect, ...] = ()
    priority: str = "foreground"
    temperature: float | None = None  # None: the command's --temperature
    seed: int | None = None  # None: derived from --seed and the stream's name when sampling
    draft: bool = True
    ignore_eos: bool = True

    @property
    def cancellable(self) -> bool:
        return bool(self.until) or self.cancel is not None


@dataclass(frozen=True)
class Figure:
    kind: str  # FIGURES
    stream: str
    window: tuple[Point, Point] | None = None
    versus: str | None = None  # "before": the rate in the window of equal length just before it
    label: str | None = None  # `name:` in the file; the key's part after the colon (default: the stream)

    @property
    def key(self) -> str:
        """The figure's name in receipts and predictions: `first_token:R`."""
        return f"{self.kind}:{self.label or self.stream}"

    @property
    def keys(self) -> tuple[str, ...]:
        """Every figure this entry gives: a rate against before gives `rate_before:...` too."""
        if self.versus == "before":
            return self.key, f"rate_before:{self.label or self.stream}"
        return (self.key,)

    def __str__(self) -> str:
        w = f" in [{self.window[0]}, {self.window[1]}]" if self.window else ""
        return f"{self.kind} of {self.stream}{w}" + (f" against the window {self.versus}" if self.versus else "")


@dataclass(frozen=True)
class Script:
    name: str
    streams: tuple[Stream, ...]
    figures: tuple[Figure, ...] = ()
    seed: int = 0  # seeds the random prompts (the command's --seed is added to it)
    timeout_s: float = 900.0  # a run's streams must be done by then
    path: str = "<script>"
    text: str = ""  # the file as read, kept in the receipt
    sha256: str = ""

    def stream(self, name: str) -> Stream:
        return next(s for s in self.streams if s.name == name)

    @property
    def keys(self) -> list[str]:
        return [k for f in self.figures for k in f.keys]

    def to_dict(self) -> dict:
        d = asdict(self)
        del d["text"]
        return d

    @classmethod
    def from_dict(cls, d: dict, text: str = "") -> "Script":
        """to_dict's inverse (a receipt keeps the script's text beside it, as `text`)."""
        return cls(name=d["name"], streams=tuple(_stream_of(x) for x in d["streams"]),
                   figures=tuple(_figure_of(x) for x in d["figures"]), seed=d["seed"], timeout_s=d["timeout_s"],
                   path=d["path"], text=text, sha256=d["sha256"])


def _event_of(d: dict | None) -> Event | None:
    return None if d is None else Event(d["stream"], d["kind"])


def _point_of(d: dict) -> Point:
    return Point(_event_of(d["event"]), d["plus"])


def _stream_of(d: dict) -> Stream:
    return Stream(**{**d, "at": _point_of(d["at"]), "prompt": Prompt(**d["prompt"]),
                     "until": tuple(_event_of(e) for e in d["until"]),
                     "cancel": None if d["cancel"] is None else Cancel(**d["cancel"]),
                     "expect": tuple(Expect(**e) for e in d["expect"])})


def _figure_of(d: dict) -> Figure:
    return Figure(**{**d, "window": None if d["window"] is None else tuple(_point_of(p) for p in d["window"])})


# ---- reading -------------------------------------------------------------------------------

class _Where:
    """Builds the one line that names the file, the stream or figure, and the field."""

    def __init__(self, path: str, what: str = ""):
        self.path, self.what = path, what

    def __call__(self, fld: str, message: str) -> ScriptError:
        return ScriptError(f"{self.path}: {self.what + ': ' if self.what else ''}{fld}: {message}")


def _number(where: _Where, fld: str, x, *, minimum: float = 0.0) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x < minimum:
        raise where(fld, f"must be a finite number of seconds, at least {minimum:g}, not {x!r}")
    return float(x)


def _count(where: _Where, fld: str, x, *, minimum: int = 1) -> int:
    if isinstance(x, bool) or not isinstance(x, int) or x < minimum:
        raise where(fld, f"must be a whole number, at least {minimum}, not {x!r}")
    return x


def _event(where: _Where, fld: str, text) -> Event:
    p = _point(where, fld, text)
    if p.event is None or p.plus:
        raise where(fld, f"{text!r} is not an event (NAME.sent, NAME.first_token, NAME.done or NAME.cancelled)")
    return p.event


def _point(where: _Where, fld: str, x) -> Point:
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return Point(None, _number(where, fld, x))
    if not isinstance(x, str):
        raise where(fld, f"expected seconds or an event plus seconds (e.g. X.done + 0.5), not {x!r}")
    m = _POINT.match(x)
    if not m:
        try:
            return Point(None, _number(where, fld, float(x)))
        except ValueError:
            raise where(fld, f"{x!r} is neither seconds nor an event plus seconds (e.g. X.done + 0.5)") from None
    if m["kind"] not in EVENTS:
        raise where(fld, f"unknown event {m['stream']}.{m['kind']} (events: {', '.join(EVENTS)})")
    if m["sign"] == "-":
        raise where(fld, f"{x!r}: a time before an event cannot be known when the event happens; use + seconds")
    return Point(Event(m["stream"], m["kind"]), float(m["plus"]) if m["plus"] else 0.0)


def _prompt(where: _Where, x) -> Prompt:
    if isinstance(x, str):
        x = {"text": x}
    if not isinstance(x, dict):
        raise where("prompt", f"expected {{random: N}}, {{same_as: X}}, {{prefix_of: X, plus: N}} or {{text: ...}}, "
                              f"not {x!r}")
    bad = [k for k in x if k not in PROMPT_KEYS]
    if bad:
        raise where(f"prompt.{bad[0]}", f"unknown field (prompt fields: {', '.join(PROMPT_KEYS)})")
    kinds = [k for k in ("random", "same_as", "prefix_of", "text") if k in x]
    if len(kinds) != 1:
        raise where("prompt", "give exactly one of random, same_as, prefix_of, text"
                              + (f" (got {', '.join(kinds)})" if kinds else ""))
    kind = kinds[0]
    if "plus" in x and kind != "prefix_of":
        raise where("prompt.plus", "goes with prefix_of only")
    if kind == "random":
        return Prompt(random=_count(where, "prompt.random", x["random"]))
    if kind == "text":
        if not isinstance(x["text"], str) or not x["text"]:
            raise where("prompt.text", f"must be a non-empty string, not {x['text']!r}")
        return Prompt(text=x["text"])
    ref = x[kind]
    if not isinstance(ref, str) or not _COPY.match(ref):
        raise where(f"prompt.{kind}", f"must name a stream, not {ref!r}")
    if kind == "same_as":
        return Prompt(same_as=ref)
    return Prompt(prefix_of=ref, plus=_count(where, "prompt.plus", x.get("plus"), minimum=1))


def _expect(where: _Where, x) -> tuple[Expect, ...]:
    if x is None:
        return ()
    if not isinstance(x, dict):
        raise where("expect", f"expected a mapping such as {{cached_tokens: \">= 256\"}}, not {x!r}")
    out = []
    for k, v in x.items():
        if k not in EXPECTS:
            raise where(f"expect.{k}", f"unknown check (checks: {', '.join(EXPECTS)})")
        m = _COMPARE.match(str(v)) if not isinstance(v, bool) else None
        if not m:
            raise where(f"expect.{k}", f"{v!r} is not a comparison with a whole number (e.g. \">= 256\", \"== 0\")")
        out.append(Expect(k, m["op"] or "==", int(m["value"])))
    return tuple(out)


def _cancel(where: _Where, x) -> Cancel | None:
    if x is None:
        return None
    if not isinstance(x, dict) or len(x) != 1 or not set(x) <= {"after", "tokens"}:
        raise where("cancel", f"expected {{after: SECONDS}} or {{tokens: K}}, not {x!r}")
    if "after" in x:
        return Cancel(after=_number(where, "cancel.after", x["after"]))
    return Cancel(tokens=_count(where, "cancel.tokens", x["tokens"]))


def _stream(path: str, i: int, x: dict) -> tuple[Stream, int, float]:
    """One entry of `streams:`, and its repeat count and spacing."""
    if not isinstance(x, dict):
        raise _Where(path, f"stream {i + 1}")("", f"expected a mapping with name, at, prompt, not {x!r}")
    name = x.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise _Where(path, f"stream {i + 1}")("name", f"must be letters, digits and _ (not starting with a digit), "
                                                     f"not {name!r}")
    where = _Where(path, f"stream {name}")
    bad = [k for k in x if k not in STREAM_KEYS]
    if bad:
        raise where(bad[0], f"unknown field (stream fields: {', '.join(STREAM_KEYS)})")
    for k in ("at", "prompt"):
        if k not in x:
            raise where(k, "missing")
    until = x.get("until") or []
    until = [until] if isinstance(until, str) else until
    if not isinstance(until, list):
        raise where("until", f"expected a list of events, not {until!r}")
    priority = x.get("priority", "foreground")
    if priority not in PRIORITIES:
        raise where("priority", f"must be one of {', '.join(PRIORITIES)}, not {priority!r}")
    temperature = x.get("temperature")
    if temperature is not None:
        temperature = _number(where, "temperature", temperature)
    seed = x.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise where("seed", f"must be an integer, not {seed!r}")
    for k in ("draft", "ignore_eos"):
        if k in x and not isinstance(x[k], bool):
            raise where(k, f"must be true or false, not {x[k]!r}")
    repeat = _count(where, "repeat", x.get("repeat", 1))
    every = _number(where, "every", x.get("every", 0.0))
    if "every" in x and repeat == 1:
        raise where("every", "goes with repeat: N (N > 1)")
    s = Stream(name=name, at=_point(where, "at", x["at"]), prompt=_prompt(where, x["prompt"]),
               max_tokens=_count(where, "max_tokens", x.get("max_tokens", 16)),
               until=tuple(_event(where, "until", e) for e in until), cancel=_cancel(where, x.get("cancel")),
               expect=_expect(where, x.get("expect")), priority=priority, temperature=temperature, seed=seed,
               draft=x.get("draft", True), ignore_eos=x.get("ignore_eos", True))
    return s, repeat, every


def _copies(s: Stream, repeat: int, every: float) -> list[Stream]:
    """A stream and its repeat copies NAME-2 ... NAME-N, each `every` seconds after the one before."""
    out = [s]
    for k in range(2, repeat + 1):
        out.append(replace(s, name=f"{s.name}-{k}", at=Point(Event(out[-1].name, "sent"), every)))
    return out


def _figure(path: str, i: int, x) -> Figure:
    if not isinstance(x, dict):
        raise _Where(path, f"figure {i + 1}")("", f"expected a mapping such as {{first_token: B}}, not {x!r}")
    kinds = [k for k in x if k in FIGURES]
    if len(kinds) != 1:
        raise _Where(path, f"figure {i + 1}")("", f"give exactly one of {', '.join(FIGURES)}"
                                                  + (f" (got {', '.join(kinds)})" if kinds else ""))
    kind = kinds[0]
    stream = x[kind]
    where = _Where(path, f"figure {i + 1} ({kind}: {stream})")
    if not isinstance(stream, str) or not _COPY.match(stream):
        raise where(kind, f"must name a stream, not {stream!r}")
    bad = [k for k in x if k not in (kind, "window", "versus", "name")]
    if bad:
        raise where(bad[0], "unknown field (figure fields: the kind, window, versus, name)")
    window = x.get("window")
    if kind in WINDOWED:
        if not isinstance(window, list) or len(window) != 2:
            raise where("window", f"{kind} needs window: [START, END] (events plus seconds, or seconds)")
        window = (_point(where, "window", window[0]), _point(where, "window", window[1]))
    elif window is not None:
        raise where("window", f"{kind} is measured from the stream's own send; it takes no window")
    versus = x.get("versus")
    if versus is not None and (kind != "rate" or versus not in VERSUS):
        raise where("versus", f"only rate takes versus: before, not {versus!r}" if kind != "rate"
                    else f"must be {' or '.join(VERSUS)}, not {versus!r}")
    label = x.get("name")
    if label is not None and (not isinstance(label, str) or not _NAME.match(label)):
        raise where("name", f"must be letters, digits and _, not {label!r}")
    return Figure(kind, stream, window, versus, label)


def parse(text: str, path: str = "<script>") -> Script:
    """The script in `text`, checked whole (see `check`); every error is one ScriptError line."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        msg = " ".join(ln.strip() for ln in str(e).splitlines() if ln.strip() and ln.strip() != "^")
        raise ScriptError(f"{path}: not valid YAML: {msg}") from None
    top = _Where(path)
    if not isinstance(doc, dict):
        raise ScriptError(f"{path}: expected a mapping with name, streams and figures")
    bad = [k for k in doc if k not in TOP_KEYS]
    if bad:
        raise top(str(bad[0]), f"unknown field (script fields: {', '.join(TOP_KEYS)})")
    name = doc.get("name") or Path(path).stem
    if not isinstance(name, str):
        raise top("name", f"must be a string, not {name!r}")
    raw = doc.get("streams")
    if not isinstance(raw, list) or not raw:
        raise top("streams", "expected a non-empty list of streams")
    streams: list[Stream] = []
    for i, x in enumerate(raw):
        s, repeat, every = _stream(path, i, x)
        streams += _copies(s, repeat, every)
    figs = doc.get("figures") or []
    if not isinstance(figs, list):
        raise top("figures", f"expected a list of figures, not {figs!r}")
    seed = doc.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise top("seed", f"must be an integer, not {seed!r}")
    timeout = _number(top, "timeout", doc.get("timeout", 900.0), minimum=0.001)
    script = Script(name, tuple(streams), tuple(_figure(path, i, f) for i, f in enumerate(figs)), seed, timeout,
                    path, text, hashlib.sha256(text.encode()).hexdigest())
    check(script)
    return script


def load(path: str | Path) -> Script:
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ScriptError(f"{path}: cannot read: {e.strerror}") from None
    except UnicodeDecodeError:
        raise ScriptError(f"{path}: not a text file") from None
    return parse(text, str(path))


# ---- the checks ----------------------------------------------------------------------------

@dataclass
class Order:
    """What every run's clock must respect: edges `a -> b, w` (b happens at least w seconds after
    a), the earliest time each event can happen, and the latest time a send at t seconds can."""

    edges: dict[Event, list[tuple[Event, float]]] = field(default_factory=dict)
    earliest: dict[Event, float] = field(default_factory=dict)
    latest: dict[Event, float] = field(default_factory=dict)

    def after(self, a: Event, b: Event) -> float | None:
        """The least time from a to b along the edges (b >= a + that), or None: no path."""
        best: dict[Event, float] = {a: 0.0}
        todo = [a]
        while todo:  # longest path in a DAG: the checks refuse cycles before this runs
            x = todo.pop()
            for y, w in self.edges.get(x, []):
                if best.get(y, -math.inf) < best[x] + w:
                    best[y] = best[x] + w
                    todo.append(y)
        return best.get(b)

    def precedes(self, p: Point, q: Point) -> bool:
        """Does p <= q hold on every run?"""
        lo_q = q.plus + (self.earliest[q.event] if q.event else 0.0)
        hi_p = p.plus + (self.latest.get(p.event, math.inf) if p.event else 0.0)
        if hi_p <= lo_q:
            return True
        if p.event and q.event:
            w = self.after(p.event, q.event)
            return w is not None and w + q.plus >= p.plus
        return False


def order_of(script: Script) -> Order:
    o = Order()

    def edge(a: Event, b: Event, w: float = 0.0) -> None:
        o.edges.setdefault(a, []).append((b, w))

    for s in script.streams:
        sent, first, done, cancelled = (Event(s.name, k) for k in EVENTS)
        edge(sent, first)
        edge(first, done)
        edge(sent, cancelled, s.cancel.after if s.cancel and s.cancel.after is not None and not s.until else 0.0)
        if s.at.event:
            edge(s.at.event, sent, s.at.plus)
        else:
            o.latest[sent] = s.at.plus
        if s.until and s.cancel is None:  # cancelled only once every until event happened
            for e in s.until:
                edge(e, cancelled)
    # earliest times: longest paths from the run's start, in an order where causes come first
    for e in _topological(script, o):
        base = next((s.at.plus for s in script.streams if e == Event(s.name, "sent") and s.at.event is None), 0.0)
        o.earliest.setdefault(e, base)
        o.earliest[e] = max(o.earliest[e], base)
        for y, w in o.edges.get(e, []):
            o.earliest[y] = max(o.earliest.get(y, 0.0), o.earliest[e] + w)
    return o


def _topological(script: Script, o: Order) -> list[Event]:
    nodes = [Event(s.name, k) for s in script.streams for k in EVENTS]
    indeg = {n: 0 for n in nodes}
    for a in nodes:
        for b, _ in o.edges.get(a, []):
            indeg[b] += 1
    ready = [n for n in nodes if indeg[n] == 0]
    out = []
    while ready:
        n = ready.pop(0)
        out.append(n)
        for b, _ in o.edges.get(n, []):
            indeg[b] -= 1
            if indeg[b] == 0:
                ready.append(b)
    return out


def _cycle(script: Script, o: Order) -> list[Event] | None:
    """One cycle of the event graph (each event waiting for the next one's cause), if any."""
    state: dict[Event, int] = {}
    stack: list[Event] = []

    def visit(n: Event) -> list[Event] | None:
        state[n] = 1
        stack.append(n)
        for m, _ in o.edges.get(n, []):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for s in script.streams:
        n = Event(s.name, "sent")
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def check(script: Script) -> None:
    """Names unique; every event names a stream and can happen; no cycle of events; prompts that
    repeat or extend a stream sent before them; windows whose end cannot precede their start."""
    path = script.path
    names = [s.name for s in script.streams]
    seen: set[str] = set()
    for n in names:
        if n in seen:
            raise _Where(path, f"stream {n}")("name", "two streams (or a stream and a repeat copy) have this name")
        seen.add(n)
    by_name = {s.name: s for s in script.streams}

    def known(where: _Where, fld: str, e: Event, own: str | None = None) -> None:
        if e.stream not in by_name:
            raise where(fld, f"unknown event {e}: no stream {e.stream} (streams: {', '.join(names)})")
        if own is not None and e.stream == own:
            raise where(fld, f"{e} is the stream's own event")
        if e.kind == "cancelled" and not by_name[e.stream].cancellable:
            raise where(fld, f"{e} never happens: {e.stream} has neither cancel nor until")

    for s in script.streams:
        where = _Where(path, f"stream {s.name}")
        if s.at.event:
            known(where, "at", s.at.event, s.name)
        for e in s.until:
            known(where, "until", e, s.name)
        if s.prompt.source and s.prompt.source not in by_name:
            kind = "same_as" if s.prompt.same_as else "prefix_of"
            raise where(f"prompt.{kind}", f"no stream {s.prompt.source} (streams: {', '.join(names)})")
        if s.prompt.source == s.name:
            raise where("prompt", "a stream's prompt cannot repeat itself")
    o = order_of(script)
    cyc = _cycle(script, o)
    if cyc:
        owner = next((e.stream for a, e in zip(cyc, cyc[1:]) if e.kind == "sent" and a.stream != e.stream), cyc[0].stream)
        fld = "at" if any(e.kind == "sent" and e.stream == owner for e in cyc) else "until"
        raise _Where(path, f"stream {owner}")(fld, "a cycle in events: " + " waits for ".join(
            str(e) for e in reversed(cyc)))
    for s in script.streams:
        src = s.prompt.source
        if not src:
            continue
        kind = "same_as" if s.prompt.same_as else "prefix_of"
        where = _Where(path, f"stream {s.name}")
        if by_name[src].prompt.text is not None and kind == "prefix_of":
            raise where("prompt.prefix_of", f"{src}'s prompt is text; prefix_of extends token ids")
        if not o.precedes(Point(Event(src, "sent")), Point(Event(s.name, "sent"))):
            raise where(f"prompt.{kind}", f"{src} may not be sent yet when {s.name} is sent (at {s.at}); send "
                                          f"{s.name} at an event of {src}, or at a time after {src}'s")
    keys: set[str] = set()
    for i, f in enumerate(script.figures):
        where = _Where(path, f"figure {i + 1} ({f.kind}: {f.stream})")
        if f.stream not in by_name:
            raise where(f.kind, f"no stream {f.stream} (streams: {', '.join(names)})")
        for k in f.keys:
            if k in keys:
                raise where("name", f"{k} is measured twice; give one of them a name: LABEL")
            keys.add(k)
        if f.window:
            for p in f.window:
                if p.event:
                    known(where, "window", p.event)
            start, end = f.window
            if not o.precedes(start, end):
                raise where("window", f"its end {end} can precede its start {start}")
