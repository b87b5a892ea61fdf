"""A synthetic OpenAI-compatible server with an exact schedule: the truth `tfbench calibrate`
holds the client against.

Every completion streams `max_tokens` tokens, one event each (the first one's text " sN", N its
arrival number in the log; then " t"): the first `first_ms` after its
request was read, then one every `every_ms`; every `stall_every`-th stream (by arrival) waits
`stall_ms` more before token `max_tokens // 2`. Each event's send time is logged on
CLOCK_MONOTONIC (`time.monotonic()`, the client's clock), so on one host the client's error is
its arrival time minus the send time, token by token.

It is a bare asyncio protocol, one timer heap for all streams (a token costs a heap pop and one
write), so that it is not the bottleneck; its own lateness against the schedule is in its log.

    GET /v1/synthetic         the log since the last reset: open streams' peak, per stream the
                              read time and every send time
    POST /v1/synthetic/reset  empty the log
    GET /metrics              tfengine's gauges (running_streams, waiting_streams) and the peak

    python -m tensorfold_bench.calibrate.synthetic --port 8000 [--first-ms 20 --every-ms 10 ...]
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import heapq
import itertools
import json
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path

clock = time.monotonic
VOCAB = 50000
MODEL = "synthetic"


@dataclass(frozen=True)
class Schedule:
    first_ms: float = 20.0  # first token after the request was read
    every_ms: float = 10.0  # then one token every this
    stall_every: int = 16  # every this-th stream by arrival stalls once (0: none)
    stall_ms: float = 100.0  # the stall's extra wait, before the middle token

    def __post_init__(self):
        if self.first_ms < 0 or self.every_ms <= 0 or self.stall_ms < 0 or self.stall_every < 0:
            raise ValueError("first_ms, stall_ms and stall_every must be >= 0 and every_ms > 0")

    def stalls(self, arrival: int) -> bool:
        return bool(self.stall_every) and arrival % self.stall_every == 0


def key_of(prompt) -> str:
    """A stream's name in the log: the hash of its prompt (the client knows it too)."""
    return hashlib.sha256(json.dumps(prompt, separators=(",", ":")).encode()).hexdigest()[:16]


def token_of(key: str, j: int) -> int:
    return int.from_bytes(hashlib.sha256(f"{key}:{j}".encode()).digest()[:4], "little") % (VOCAB - 256) + 256


class Stream:
    def __init__(self, conn: "Conn", key: str, n: int, arrival: int, read: float, stalled: bool):
        self.conn, self.key, self.n, self.arrival, self.read, self.stalled = conn, key, n, arrival, read, stalled
        self.sends: list[float] = []
        self.due: list[float] = []  # the schedule, kept beside the sends


class Synthetic:
    def __init__(self, schedule: Schedule):
        self.schedule = schedule
        self.heap: list[tuple[float, int, Stream, int]] = []
        self.seq = itertools.count()
        self.wake = asyncio.Event()
        self.open = 0
        self.peak = 0
        self.arrivals = 0
        self.log: list[Stream] = []

    def start(self, conn: "Conn", body: dict) -> None:
        prompt = body.get("prompt") if "prompt" in body else body.get("messages")
        n = int(body.get("max_tokens") or 16)
        key = key_of(prompt)
        read = clock()
        s = Stream(conn, key, n, self.arrivals, read, self.schedule.stalls(self.arrivals))
        self.arrivals += 1
        self.open += 1
        self.peak = max(self.peak, self.open)
        self.log.append(s)
        conn.stream = s
        conn.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                   b"Connection: close\r\n\r\n")
        self.push(s, 0)

    def when(self, s: Stream, j: int) -> float:
        sc = self.schedule
        t = s.read + (sc.first_ms + j * sc.every_ms) / 1000
        if s.stalled and j >= s.n // 2:
            t += sc.stall_ms / 1000
        return t

    def push(self, s: Stream, j: int) -> None:
        due = self.when(s, j)
        s.due.append(due)
        first = not self.heap or due < self.heap[0][0]
        heapq.heappush(self.heap, (due, next(self.seq), s, j))
        if first:
            self.wake.set()

    def send(self, s: Stream, j: int) -> None:
        if s.conn.closed:
            self.end(s)
            return
        last = j == s.n - 1
        # the first token's text names the stream's arrival, so a client that keeps only the text
        # (vllm bench serve) can be matched with this log
        text = f" s{s.arrival}" if j == 0 else " t"
        ev = ('{"id":"cmpl-%d","object":"text_completion","model":"%s","choices":[{"index":0,"text":"%s",'
              '"token_ids":[%d],"finish_reason":%s}]}' % (s.arrival, MODEL, text, token_of(s.key, j),
                                                          '"length"' if last else "null"))
        out = b"data: " + ev.encode() + b"\n\n"
        if last:
            usage = {"prompt_tokens": 0, "completion_tokens": s.n, "total_tokens": s.n}
            out += b"data: " + json.dumps({"id": f"cmpl-{s.arrival}", "object": "text_completion", "choices": [],
                                          "usage": usage}).encode() + b"\n\ndata: [DONE]\n\n"
        s.sends.append(clock())
        s.conn.write(out)
        if last:
            s.conn.close()
            self.end(s)
        else:
            self.push(s, j + 1)

    def end(self, s: Stream) -> None:
        if s.conn is not None:
            s.conn = None
            self.open -= 1

    async def drive(self) -> None:
        """Send every token when due: one timer for all streams."""
        heap = self.heap
        while True:
            now = clock()
            while heap and heap[0][0] <= now:
                _, _, s, j = heapq.heappop(heap)
                if s.conn is None:
                    continue
                self.send(s, j)
            self.wake.clear()
            if heap:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), max(heap[0][0] - clock(), 0))
            else:
                await self.wake.wait()

    def report(self) -> dict:
        return {"schedule": asdict(self.schedule), "peak_open": self.peak, "open": self.open,
                "streams": [{"key": s.key, "arrival": s.arrival, "read": s.read, "stalled": s.stalled,
                             "stall_at": s.n // 2 if s.stalled else None, "sends": s.sends, "due": s.due[:len(s.sends)]}
                            for s in self.log]}

    def reset(self) -> None:
        self.log = []
        self.peak = self.open
        self.arrivals = 0


class Conn(asyncio.Protocol):
    """One HTTP/1.1 connection: a request, then (for a completion) the stream, then close."""

    def __init__(self, server: Synthetic):
        self.server = server
        self.buf = b""
        self.transport = None
        self.closed = False
        self.stream: Stream | None = None

    def connection_made(self, transport):
        self.transport = transport

    def connection_lost(self, exc):
        self.closed = True
        if self.stream is not None:
            self.server.end(self.stream)

    def write(self, data: bytes) -> None:
        if not self.closed:
            self.transport.write(data)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.transport.close()

    def data_received(self, data: bytes):
        self.buf += data
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return
        head = self.buf[:end].decode("latin-1").split("\r\n")
        length = 0
        for ln in head[1:]:
            k, _, v = ln.partition(":")
            if k.strip().lower() == "content-length":
                length = int(v.strip())
        if len(self.buf) < end + 4 + length:
            return
        body, self.buf = self.buf[end + 4:end + 4 + length], b""
        method, path = (head[0].split(" ") + ["", ""])[:2]
        self.route(method, path.split("?", 1)[0], body)

    def reply(self, status: int, obj, kind: str = "application/json") -> None:
        data = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
        self.write(f"HTTP/1.1 {status} {'OK' if status == 200 else 'Error'}\r\nContent-Type: {kind}\r\n"
                   f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)
        self.close()

    def route(self, method: str, path: str, body: bytes) -> None:
        srv = self.server
        if method == "POST" and path in ("/v1/completions", "/v1/chat/completions"):
            try:
                req = json.loads(body)
            except ValueError:
                return self.reply(400, {"error": {"message": "the body is not JSON", "code": 400}})
            return srv.start(self, req)
        if method == "POST" and path == "/v1/synthetic/reset":
            srv.reset()
            return self.reply(200, {"ok": True})
        if path == "/v1/synthetic":
            return self.reply(200, srv.report())
        if path == "/health":
            return self.reply(200, {"status": "ok"})
        if path == "/v1/models":
            return self.reply(200, {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "synthetic",
                                                              "max_model_len": 1 << 20, "vocab_size": VOCAB}]})
        if path == "/metrics":
            text = (f"tfengine_running_streams {srv.open}\ntfengine_waiting_streams 0\n"
                    f"synthetic_peak_open_streams {srv.peak}\n")
            return self.reply(200, text.encode(), "text/plain")
        return self.reply(404, {"error": {"message": f"no route {method} {path}", "code": 404}})


async def serve(schedule: Schedule, host: str = "127.0.0.1", port: int = 0, port_file: str | None = None) -> None:
    sim = Synthetic(schedule)
    loop = asyncio.get_running_loop()
    sock = socket.create_server((host, port))
    # the backlog given here: asyncio listens again with its own (100 unless told), and a burst of
    # more connections than the backlog has its SYNs dropped and resent after 1 s
    server = await loop.create_server(lambda: Conn(sim), sock=sock, backlog=4096)
    if port_file:
        tmp = Path(port_file + ".tmp")
        tmp.write_text(f"{sock.getsockname()[1]}\n")
        tmp.replace(port_file)
    async with server:
        await sim.drive()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="A synthetic OpenAI-compatible server with an exact schedule.")
    p.add_argument("serve", nargs="?")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--port-file", default=None)
    d = Schedule()
    p.add_argument("--first-ms", type=float, default=d.first_ms)
    p.add_argument("--every-ms", type=float, default=d.every_ms)
    p.add_argument("--stall-every", type=int, default=d.stall_every)
    p.add_argument("--stall-ms", type=float, default=d.stall_ms)
    return p


def main(argv=None) -> None:
    a, _unknown = parser().parse_known_args(argv)
    try:
        sc = Schedule(a.first_ms, a.every_ms, a.stall_every, a.stall_ms)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(sc, a.host, a.port, a.port_file))


if __name__ == "__main__":
    main()
