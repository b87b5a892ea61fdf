"""Streaming client: one async function per request, recording raw facts only.

Every timestamp is `time.monotonic()` (CLOCK_MONOTONIC), the clock the engine's `/v1/trace`
uses, so the harness's and the server's times line up on one host. Figures are computed apart
(tensorfold_bench/analysis/figures.py, sweep_figures.py); nothing here aggregates.

Chunk rule: a server-sent event carrying k tokens counts as k tokens that all arrived at that
event's arrival time. Every request asks for `return_token_ids: true` (tfengine and vLLM >= 0.10
answer with `token_ids` per event) and `stream_options: {include_usage: true}`. `logprobs` is sent
only on the logprobs route (`Request.token_ids="logprobs"`, for vLLM started with
--return-tokens-as-token-ids: entries "token_id:123"), since a server without a tokenizer
refuses it. An event with neither counts each non-empty text chunk as one token of unknown id
(None); the record then says it was counted by chunks and `tokens` prefers the server's
`usage.completion_tokens`. Unknown ids make the reply's hash unknown, never a mismatch.
"""
from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import time
from dataclasses import asdict, dataclass, field, fields

import httpx

from tensorfold_bench.client import timer, wire

clock = time.monotonic

# How a record's tokens were counted, strongest first; a record keeps the weakest it met.
COUNTED_BY = ("ids", "logprobs", "chunks")
TOKEN_ID_ROUTES = ("ids", "logprobs", "chunks")  # what a request asks for: ids, logprobs, nothing


@dataclass
class Request:
    """What to send: a token-id completion prompt, or chat messages."""

    name: str  # "A", "B", "C", ...
    prompt: list[int] | None = None  # /v1/completions with token ids
    messages: list[dict] | None = None  # /v1/chat/completions
    max_tokens: int = 16
    ignore_eos: bool = True
    extra: dict = field(default_factory=dict)  # extra body fields (e.g. for vLLM)
    token_ids: str = "ids"  # TOKEN_ID_ROUTES: return_token_ids, logprobs "token_id:N", or neither
    temperature: float = 0.0  # 0: greedy
    seed: int | None = None  # sent only when sampling (tensorfold_bench.client.sampling derives it)

    @property
    def prompt_len(self) -> int:
        return len(self.prompt) if self.prompt is not None else 0

    def body(self, model: str) -> dict:
        b = {"model": model, "max_tokens": self.max_tokens, "stream": True, "temperature": self.temperature or 0,
             "ignore_eos": self.ignore_eos, "stream_options": {"include_usage": True}}
        if self.temperature and self.seed is not None:
            b["seed"] = self.seed
        if self.prompt is not None:
            b["prompt"] = self.prompt
        else:
            b["messages"] = self.messages
        b["stream_options"] = {"include_usage": True}
        if self.token_ids == "ids":
            b["return_token_ids"] = True
        elif self.token_ids == "logprobs":
            b["logprobs"] = 1 if self.prompt is not None else True
        elif self.token_ids != "chunks":
            raise ValueError(f"token_ids must be one of {', '.join(TOKEN_ID_ROUTES)}, not {self.token_ids!r}")
        b.update(self.extra)
        return b

    @property
    def path(self) -> str:
        return "/v1/completions" if self.prompt is not None else "/v1/chat/completions"


@dataclass
class StreamRecord:
    """The raw facts of one streamed request. Times are time.monotonic() seconds.

    A stream's record in memory, from the client through the scenario's measure and the analysis
    to report.store, which writes `to_dict()`: it is what the client fills and the figures read,
    with `tokens` and `known_ids`. The typed receipt's `Record` (the same fields) is what reading a
    written receipt gives."""

    name: str
    path: str
    prompt_len: int
    max_tokens: int
    scheduled: float | None = None  # when the script meant to send it
    sent: float | None = None  # just before the request left
    token_times: list[float] = field(default_factory=list)
    token_ids: list[int | None] = field(default_factory=list)
    finish_reason: str | None = None
    error: str | None = None
    usage: dict | None = None
    server_sha: str | None = None  # the server's token_sha (12 hex), if it sent one
    cancelled: bool = False  # we closed the stream before it finished
    ended: float | None = None  # finish, error or cancel time
    counted_by: str | None = None  # COUNTED_BY: the weakest way any of its tokens was counted
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens; None: not reported
    system_fingerprint: str | None = None

    @property
    def tokens(self) -> int:
        """Completion tokens: the server's usage count when we could only count chunks."""
        reported = (self.usage or {}).get("completion_tokens")
        if self.counted_by == "chunks" and isinstance(reported, int):
            return reported
        return len(self.token_ids)

    @property
    def known_ids(self) -> list[int] | None:
        """The reply's ids, or None when any is unknown (then its hash is unknown, not different)."""
        return None if any(i is None for i in self.token_ids) else list(self.token_ids)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "StreamRecord":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def _ids_from_logprobs(choice: dict) -> list[int | None] | None:
    lp = choice.get("logprobs")
    if not lp:
        return None
    toks = lp.get("tokens")
    if toks is None and isinstance(lp.get("content"), list):
        toks = [c.get("token") for c in lp["content"]]
    if not toks:
        return None
    out: list[int | None] = []
    for t in toks:
        if isinstance(t, str) and t.startswith("token_id:"):
            out.append(int(t.split(":", 1)[1]))
        else:
            out.append(None)
    return out


def event_tokens(event: dict) -> tuple[list[int | None], str | None]:
    """The tokens one event carries and how they were counted (COUNTED_BY; None: no tokens)."""
    choices = event.get("choices") or []
    if not choices:
        return [], None
    ch = choices[0]
    ids = ch.get("token_ids")
    if ids is None:
        ids = (ch.get("delta") or {}).get("token_ids")
    if ids is not None:
        return [int(t) for t in ids], "ids"
    ids = _ids_from_logprobs(ch)
    if ids is not None:
        return ids, "logprobs"
    text = ch.get("text")
    if text is None:
        text = (ch.get("delta") or {}).get("content")
    return ([None], "chunks") if text else ([], None)


def weakest_count(recs) -> str | None:
    """The weakest way any reply's tokens were counted (COUNTED_BY: ids, logprobs, chunks)."""
    ways = [r.counted_by for r in recs if r.counted_by]
    return max(ways, key=COUNTED_BY.index) if ways else None


def fingerprint(recs) -> str | None:
    """The first system_fingerprint any reply carries."""
    return next((r.system_fingerprint for r in recs if r.system_fingerprint), None)


def _error_message(event: dict) -> str | None:
    if "error" in event:
        err = event["error"]
        return err.get("message", str(err)) if isinstance(err, dict) else str(err)
    if event.get("object") == "error":  # vLLM's in-stream error form
        return str(event.get("message", event))
    return None


def _apply_event(rec: StreamRecord, event: dict, now: float) -> None:
    err = _error_message(event)
    if err is not None:
        rec.error = err
        return
    toks, how = event_tokens(event)
    rec.token_ids.extend(toks)
    rec.token_times.extend([now] * len(toks))
    if toks and (rec.counted_by is None or COUNTED_BY.index(how) > COUNTED_BY.index(rec.counted_by)):
        rec.counted_by = how
    for ch in event.get("choices") or []:
        if ch.get("finish_reason"):
            rec.finish_reason = ch["finish_reason"]
    usage = event.get("usage")
    if isinstance(usage, dict) and usage:
        rec.usage = usage
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        if isinstance(cached, int) and not isinstance(cached, bool):
            rec.cached_tokens = cached
    if event.get("system_fingerprint"):
        rec.system_fingerprint = str(event["system_fingerprint"])
    sha = event.get("token_sha") or (event.get("tensorfold") or {}).get("token_sha")
    if sha:
        rec.server_sha = sha


@dataclass
class OpenStreams:
    """Streams open at once, as the client counts them: from connected to the reply's end."""

    now: int = 0
    peak: int = 0
    quiet: int = 0  # how many times the count fell to none (selfcheck.Watch skips a wake-up spanning one)

    def opened(self) -> None:
        self.now += 1
        self.peak = max(self.peak, self.now)

    def closed(self) -> None:
        self.now -= 1
        if self.now == 0:
            self.quiet += 1

    def restart(self) -> int:
        """The peak so far; the next peak counts from the streams open now."""
        peak, self.peak = self.peak, self.now
        return peak


@contextlib.contextmanager
def collector_held():
    """No garbage collection while streams are open: one full collection of the harness's heap
    took over 100 ms at 256 streams, and every token arriving then was stamped that late.
    Collected and frozen first (so what was there is never traversed again), resumed after."""
    was = gc.isenabled()
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.unfreeze()
        if was:
            gc.enable()


CLIENT_KINDS = ("wire", "live", "httpx")  # the default first; calibrate compares them


class StreamClient:
    """Every scenario's HTTP client: one connection per stream and no pool, so a level of N is N
    streams open at once. kind "wire" decodes each reply after it ended (tensorfold_bench.client.wire),
    "live" as it comes; "httpx" is httpx's line iterator (`limit`: its connection cap, None for
    none), kept so `tfbench calibrate` can show what the choice is worth."""

    def __init__(self, kind: str = "wire", limit: int | None = None):
        if kind not in CLIENT_KINDS:
            raise ValueError(f"client must be one of {', '.join(CLIENT_KINDS)}, not {kind!r}")
        self.kind, self.limit = kind, limit
        self.open = OpenStreams()
        self.pending: list[tuple[wire.StreamProtocol, StreamRecord]] = []  # streams over, not yet decoded
        self._httpx: httpx.AsyncClient | None = None

    async def __aenter__(self) -> "StreamClient":
        if self.kind == "httpx":
            self._httpx = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=wire.CONNECT_TIMEOUT_S),
                                            limits=httpx.Limits(max_connections=self.limit,
                                                                max_keepalive_connections=0))
        return self

    async def __aexit__(self, *exc) -> None:
        self.settle()
        if self._httpx is not None:
            await self._httpx.aclose()
            self._httpx = None

    def settle(self) -> None:
        """Decode every stream that has ended into its record. Call it when none is running: the
        decoding then costs no stream its arrival times."""
        pending, self.pending = self.pending, []
        for proto, rec in pending:
            try:
                dec = wire.settle(proto)
            except wire.WireError as e:
                if not rec.error and not rec.cancelled:
                    rec.error = str(e)
                continue
            if dec.status != 200 and not rec.error:
                rec.error = _http_error(dec.status, bytes(dec.kept).decode(errors="replace"))

    async def preopen(self, base_url: str, n: int) -> list[wire.StreamProtocol | None]:
        """n connections opened before a burst's clock starts, so that its requests are only
        written when it starts (a connect from one loop costs about 0.1 ms: 256 of them spread a
        burst's sends over 29 ms). A connection that fails to open is None (that stream connects
        when it is sent, and reports the failure then); none for httpx, which has its own pool."""
        if self.kind == "httpx" or n < 1:
            return [None] * max(n, 0)
        target = wire.Target.parse(base_url)
        protos = [self._unsent() for _ in range(n)]
        got = await asyncio.gather(*(wire.connect(target, p) for p in protos), return_exceptions=True)
        return [p if not isinstance(g, BaseException) else None for p, g in zip(protos, got)]

    def _unsent(self) -> wire.StreamProtocol:
        """A connection with no request yet (`stream` gives it its reply's decoder when it sends)."""
        return wire.new_stream(None, clock, lambda payload, t: None, defer=self.kind == "wire")

    async def send_at(self, base_url: str, prepared: tuple[wire.Target, bytes] | None, at: float
                      ) -> wire.StreamProtocol | None:
        """A connection opened now, its request written at monotonic time `at` by the timer's own
        wake-up (tensorfold_bench.client.timer.call_at): no connect and no task step between an
        open loop's send time and its write, which on a busy loop each wait behind a batch of
        reads. Give it to `stream` as `conn`. None (httpx, or no connection): `stream` connects
        and sends itself; a connection the server closed before `at` is not written to."""
        if self.kind == "httpx" or prepared is None:
            return None
        conn = self._unsent()
        try:
            await wire.connect(wire.Target.parse(base_url), conn)
        except wire.WireError:
            return None
        await timer.call_at(at, lambda: conn.idle and conn.send(prepared[1]))
        return conn

    @staticmethod
    def write_all(conns: list[wire.StreamProtocol | None], ready: list[tuple[wire.Target, bytes] | None]) -> None:
        """Write every prepared request on its open connection, back to back, before any stream's
        task starts: a burst's N requests leave within the writes' own time (a task's first step
        each would add its own). `stream` then reads each reply; a connection not open is left to it."""
        for c, w in zip(conns, ready):
            if c is not None and w is not None and c.idle:
                c.send(w[1])

    def prepare(self, base_url: str, req: Request, model: str) -> tuple[wire.Target, bytes] | None:
        """The request's bytes, built before its send time (None for httpx, which builds its own)."""
        if self.kind == "httpx":
            return None
        target = wire.Target.parse(base_url)
        return target, target.request(req.path, req.body(model))


def _http_error(status: int, body: str) -> str:
    try:
        return f"HTTP {status}: {json.loads(body)['error']['message']}"
    except Exception:
        return f"HTTP {status}: {body[:300]}"


async def stream(client: StreamClient, base_url: str, req: Request, rec: StreamRecord,
                 model: str = "default", prepared: tuple[wire.Target, bytes] | None = None,
                 conn: wire.StreamProtocol | None = None) -> StreamRecord:
    """Send `req` and stamp its reply's reads as they arrive; `rec` is filled once the client
    settles (`client.settle()`, or leaving its `async with`), at once for kinds live and httpx.
    Cancelling the task closes the stream (the server cancels the request): `rec.cancelled` is
    set and the CancelledError propagates. `prepared`: the request's bytes from `client.prepare`;
    `conn`: a connection from `client.preopen` to send it on (one the server closed meanwhile is
    dropped and a new one opened)."""
    if client.kind == "httpx":
        return await _stream_httpx(client, base_url, req, rec, model)
    opened = False

    def on_open():
        nonlocal opened
        opened = True
        client.open.opened()

    def on_close(t: float):
        rec.ended = t
        if opened:
            client.open.closed()

    def on_data(payload: str, t: float):
        try:
            event = json.loads(payload)
        except json.JSONDecodeError:
            return
        _apply_event(rec, event, t)

    proto = None
    try:
        target, payload = prepared or client.prepare(base_url, req, model)
        if conn is not None and conn.request is payload and conn.sent is not None:  # written (write_all)
            proto = conn
            proto.decoder.on_data = on_data
            rec.sent = conn.sent
            await wire.exchange(target, proto, on_open, on_close, connected=True)
        elif conn is not None and conn.idle:
            proto = conn
            proto.decoder.on_data = on_data
            rec.sent = clock()
            proto.send(payload)
            await wire.exchange(target, proto, on_open, on_close, connected=True)
        else:
            if conn is not None and conn.transport is not None:
                conn.transport.close()
            rec.sent = clock()
            proto = wire.new_stream(payload, clock, on_data, defer=client.kind == "wire")
            await wire.exchange(target, proto, on_open, on_close)
    except asyncio.CancelledError:
        rec.cancelled = True
        raise
    except wire.WireError as e:
        rec.error = str(e)
    finally:
        if rec.ended is None:
            rec.ended = clock()
        if proto is not None:
            client.pending.append((proto, rec))
            if client.kind == "live":
                client.settle()
    return rec


async def _stream_httpx(client: StreamClient, base_url: str, req: Request, rec: StreamRecord,
                        model: str) -> StreamRecord:
    """The same through httpx's line iterator (parsing each event as it comes)."""
    rec.sent = clock()
    opened = False
    try:
        async with client._httpx.stream("POST", base_url.rstrip("/") + req.path, json=req.body(model)) as resp:
            opened = True
            client.open.opened()
            if resp.status_code != 200:
                rec.error = _http_error(resp.status_code, (await resp.aread()).decode(errors="replace"))
                return rec
            async for line in resp.aiter_lines():
                now = clock()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                try:
                    event = json.loads(data)
                except json.JSONDecodeError:
                    continue
                _apply_event(rec, event, now)
    except asyncio.CancelledError:
        rec.cancelled = True
        raise
    except httpx.HTTPError as e:
        rec.error = f"{type(e).__name__}: {e}"
    finally:
        rec.ended = clock()
        if opened:
            client.open.closed()
    return rec


def new_record(req: Request, scheduled: float | None = None) -> StreamRecord:
    return StreamRecord(req.name, req.path, req.prompt_len, req.max_tokens, scheduled=scheduled)
