"""The streaming client's HTTP/1.1 on a bare asyncio protocol: one connection per stream, no pool.

Why not httpx's line iterator: at hundreds of streams its per-token path (a pool, anyio
streams, a line decoder, one task wake-up per line) makes the event loop the thing measured.
Here a token's only work while the clock runs is `data_received`: stamp the time and keep the
bytes. Chunked decoding, SSE splitting and JSON happen when the stream has ended (`defer=True`),
off the clock; every event keeps the arrival time of the read that completed it, so the record
is the same as parsing live, minus the client's own delay. `defer=False` parses as bytes come,
for comparison (`tfbench calibrate --client live`).

The end of a stream is seen without parsing: the response's Content-Length reached, `[DONE]`
or the chunked terminator at the end of a read, or the server closing the connection (every
request says `Connection: close`).
"""
from __future__ import annotations

import asyncio
import functools
import json
import ssl
from dataclasses import dataclass
from typing import Callable
from urllib.parse import urlsplit

CONNECT_TIMEOUT_S = 10.0
LAST_CHUNK = b"\r\n0\r\n\r\n"  # a chunked body's end: the previous chunk's CRLF, then the zero-size chunk


class WireError(Exception):
    """The connection failed or the reply broke off: one line for the record's `error`."""


@dataclass(frozen=True)
class Target:
    host: str
    port: int
    tls: bool
    prefix: str  # the base URL's path, prepended to each request's path

    @classmethod
    @functools.lru_cache(maxsize=64)  # asked once per request: a run talks to a few servers
    def parse(cls, base_url: str) -> "Target":
        u = urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise WireError(f"not an http(s) URL: {base_url!r}")
        tls = u.scheme == "https"
        return cls(u.hostname, u.port or (443 if tls else 80), tls, u.path.rstrip("/"))

    def request(self, path: str, body: dict) -> bytes:
        """The whole request, headers and JSON body, ready to write."""
        payload = json.dumps(body, separators=(",", ":")).encode()
        host = self.host if self.port in (80, 443) else f"{self.host}:{self.port}"
        head = (f"POST {self.prefix}{path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                f"Accept: text/event-stream\r\nConnection: close\r\nContent-Length: {len(payload)}\r\n\r\n")
        return head.encode("latin-1") + payload

    def get_request(self, path: str) -> bytes:
        host = self.host if self.port in (80, 443) else f"{self.host}:{self.port}"
        return f"GET {self.prefix}{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode("latin-1")


class Decoder:
    """Response bytes -> status, headers and SSE `data:` payloads, fed read by read."""

    def __init__(self, on_data: Callable[[str, float], None], sse: bool = True):
        self.on_data = on_data  # (payload of one `data:` line, arrival time of its read)
        self.sse = sse  # False: keep the whole body (`kept`), as for a non-200 reply
        self.status: int | None = None
        self.headers: dict[str, str] = {}
        self._head = b""
        self._raw = bytearray()  # chunked framing not yet decoded
        self._body = bytearray()  # decoded bytes not yet split into events
        self.chunked = False
        self.complete = False  # the body's end was decoded
        self.done_seen = False  # the `data: [DONE]` line came
        self.kept = bytearray()  # a non-200 (or non-SSE) reply's body, whole

    def feed(self, data: bytes, t: float) -> None:
        if self.status is None:
            data = self._feed_head(data)
            if data is None:
                return
        if self.chunked:
            self._raw += data
            self._dechunk()
        else:
            self._body += data
        if self.status != 200 or not self.sse:
            self.kept += self._body
            self._body.clear()
            return
        self._split(t)

    def _feed_head(self, data: bytes) -> bytes | None:
        self._head += data
        end = self._head.find(b"\r\n\r\n")
        if end < 0:
            return None
        lines = self._head[:end].decode("latin-1").split("\r\n")
        try:
            self.status = int(lines[0].split(" ", 2)[1])
        except (IndexError, ValueError):
            raise WireError(f"RemoteProtocolError: not an HTTP status line: {lines[0][:80]!r}") from None
        for ln in lines[1:]:
            k, _, v = ln.partition(":")
            self.headers[k.strip().lower()] = v.strip()
        self.chunked = "chunked" in self.headers.get("transfer-encoding", "").lower()
        rest = self._head[end + 4:]
        self._head = b""
        return rest

    def _dechunk(self) -> None:
        raw = self._raw
        pos = 0
        while True:
            nl = raw.find(b"\r\n", pos)
            if nl < 0:
                break
            size = int(raw[pos:nl].split(b";", 1)[0] or b"0", 16)
            if size == 0:
                self.complete = True
                pos = len(raw)
                break
            if len(raw) < nl + 2 + size + 2:
                break
            self._body += raw[nl + 2:nl + 2 + size]
            pos = nl + 2 + size + 2
        del raw[:pos]

    def _split(self, t: float) -> None:
        body = self._body
        start = 0
        while True:
            end = body.find(b"\n", start)
            if end < 0:
                break
            line = body[start:end]
            start = end + 1
            if line.startswith(b"data:"):
                payload = line[5:].strip().decode("utf-8", "replace")
                if payload == "[DONE]":
                    self.done_seen = True
                    continue
                self.on_data(payload, t)
        del body[:start]

    @property
    def content_length(self) -> int | None:
        v = self.headers.get("content-length")
        return int(v) if v and v.isdigit() else None


class StreamProtocol(asyncio.Protocol):
    """One request's connection: writes the request, keeps each read with its arrival time. With
    no request at connect (`request=None`: opened before a burst's clock starts), `send` writes it."""

    def __init__(self, request: bytes | None, clock: Callable[[], float], decoder: Decoder, defer: bool):
        self.request, self.clock, self.decoder, self.defer = request, clock, decoder, defer
        self.reads: list[tuple[float, bytes]] = []  # deferred: every read, stamped, not yet fed
        self.done = asyncio.get_running_loop().create_future()
        self.transport: asyncio.Transport | None = None
        self.sent: float | None = None
        self._tail = b""
        self._head: bytearray | None = bytearray()  # deferred: the reply's head, until it is whole
        self._length: int | None = None  # its Content-Length, if any
        self._received = 0  # body bytes since the head

    def connection_made(self, transport):
        self.transport = transport
        if self.request is not None:
            self.sent = self.clock()
            transport.write(self.request)

    @property
    def idle(self) -> bool:
        """Connected, nothing sent, and still open (a server may close an idle connection)."""
        return (self.request is None and self.transport is not None and not self.transport.is_closing()
                and not self.done.done())

    def send(self, request: bytes) -> None:
        """Write the request on this open connection."""
        self.request, self.sent = request, self.clock()
        self.transport.write(request)

    def data_received(self, data: bytes):
        t = self.clock()
        if self.defer:
            self.reads.append((t, data))
            # the end marks may straddle two reads: the last few bytes of the one before are kept
            edge = self._tail + data[:8]
            if (b"[DONE]" in data or b"[DONE]" in edge or data.endswith(LAST_CHUNK) or edge.endswith(LAST_CHUNK)
                    or ((self._head is not None or self._length is not None) and self._length_reached(data))):
                self._finish(None)
            self._tail = data[-8:]
            return
        try:
            self.decoder.feed(data, t)
        except WireError as e:
            self._finish(e)
            return
        d = self.decoder
        cl = d.content_length
        if d.complete or d.done_seen or (d.status is not None and not d.chunked and cl is not None
                          and len(d.kept) + len(d._body) >= cl):
            self._finish(None)

    def _length_reached(self, data: bytes) -> bool:
        """Deferred: a Content-Length reply (an error's JSON) is over once that many bytes came."""
        if self._head is not None:
            self._head += data
            end = self._head.find(b"\r\n\r\n")
            if end < 0:
                return False
            text = self._head[:end].decode("latin-1").lower()
            self._received, self._head = len(self._head) - end - 4, None
            if "chunked" not in text:
                for ln in text.split("\r\n"):
                    if ln.startswith("content-length:") and ln[15:].strip().isdigit():
                        self._length = int(ln[15:].strip())
        else:
            self._received += len(data)
        return self._length is not None and self._received >= self._length

    def connection_lost(self, exc):
        self._finish(None)

    def _finish(self, exc):
        if not self.done.done():
            self.done.set_exception(exc) if exc else self.done.set_result(None)
        if self.transport is not None:
            self.transport.close()

    def replay(self) -> None:
        """Deferred: feed every kept read to the decoder, each with its own arrival time."""
        reads, self.reads = self.reads, []
        for t, data in reads:
            self.decoder.feed(data, t)


def new_stream(request: bytes, clock: Callable[[], float], on_data: Callable[[str, float], None],
               defer: bool = True, sse: bool = True) -> StreamProtocol:
    """A connection for one prepared request; `on_data(payload, t)` per SSE `data:` line."""
    return StreamProtocol(request, clock, Decoder(on_data, sse), defer)


async def connect(target: Target, proto: StreamProtocol) -> None:
    """Open proto's connection (its request, if any, is written once connected)."""
    loop = asyncio.get_running_loop()
    ctx = ssl.create_default_context() if target.tls else None
    # the timeout as a timer that cancels this task, not asyncio.wait_for's task of its own: an
    # open loop connects thousands of times a second on this loop
    task, late = asyncio.current_task(), []
    timeout = loop.call_later(CONNECT_TIMEOUT_S, lambda: (late.append(True), task.cancel()))
    try:
        await loop.create_connection(lambda: proto, target.host, target.port, ssl=ctx,
                                     server_hostname=target.host if ctx else None)
    except asyncio.CancelledError:
        if not late:
            raise
        raise WireError(f"ConnectTimeout: no connection to {target.host}:{target.port} "
                        f"in {CONNECT_TIMEOUT_S:g} s") from None
    except OSError as e:
        raise WireError(f"ConnectError: {e.strerror or e}") from None
    finally:
        timeout.cancel()


async def exchange(target: Target, proto: StreamProtocol, on_open: Callable[[], None] | None = None,
                   on_close: Callable[[float], None] | None = None, connected: bool = False) -> None:
    """Connect (unless `connected`: the request was sent on a connection opened before), send the
    request and read the reply to its end; `on_open()` once connected, `on_close(t)` when the
    reply is over. Then `settle(proto)` decodes what it kept and says how the reply ended:
    deferred, nothing is decoded here, so a caller running other streams on this loop settles
    them all once none is running. Cancelling closes the connection (what came is kept for settle)."""
    if not connected:
        await connect(target, proto)
    if on_open:
        on_open()
    try:
        await proto.done
    finally:
        if proto.transport is not None:
            proto.transport.close()
        if on_close:
            on_close(proto.clock())


def settle(proto: StreamProtocol) -> Decoder:
    """Decode every read the connection kept (each with its own arrival time) and check the end:
    the decoder (its status, and a non-200 reply's body), or WireError for a broken reply."""
    if proto.defer:
        proto.replay()
    decoder = proto.decoder
    if decoder.status is None:
        raise WireError("RemoteProtocolError: the server closed the connection without a response")
    if decoder.status == 200 and decoder.chunked and not decoder.complete and not decoder.done_seen:
        raise WireError("RemoteProtocolError: peer closed connection without sending complete message body "
                        "(incomplete chunked read)")
    return decoder


async def get_text(target: Target, path: str, clock: Callable[[], float]) -> str | None:
    """GET path's body as text; None unless it answers 200 (e.g. a server without /metrics)."""
    proto = new_stream(target.get_request(path), clock, lambda payload, t: None, sse=False)
    await exchange(target, proto)
    dec = settle(proto)
    return bytes(dec.kept).decode(errors="replace") if dec.status == 200 else None
