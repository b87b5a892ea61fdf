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

`--workers N` (default 1: one process, as above) serves one port from N processes, so that no
one loop reads every request of a fast open loop (at thousands of requests/s one loop bunches its
reads). Each binds its own listening socket with SO_REUSEPORT (worker 0, the process started,
binds the port first; it starts workers 1..N-1 as subprocesses of this module on the port it got,
and stops them when it stops; they die with it), and the kernel spreads the connections over
them. Worker i numbers its arrivals i, i+N, i+2N, ... (unique across workers), and each stalls
every `stall_every`-th stream it reads, so about one in `stall_every` stalls in all. Every worker
answers every route, and each also listens on a unix socket in a shared control dir
(`D/worker-i.sock`, one JSON line in, one JSON reply): the worker that gets a control request asks
the others there, so `GET /v1/synthetic` is the merged log (every worker's streams, ordered by
read time, and "workers": N; `open` is the workers' sum, and `peak_open` the sum of their peaks,
which can exceed the true peak of the union), the reset resets them all, and /metrics sums. All
share CLOCK_MONOTONIC, so the merged read and send times are one clock. /health answers 503 and
the port file is written only once every worker listens.

    python -m tensorfold_bench.calibrate.synthetic --port 8000 [--first-ms 20 --every-ms 10 ...]
        [--workers N [--control-dir D]]
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import hashlib
import heapq
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from tensorfold_bench.client import timer

clock = time.monotonic
VOCAB = 50000
MODEL = "synthetic"
MODULE = "tensorfold_bench.calibrate.synthetic"
ROOT = Path(__file__).resolve().parents[2]  # the package's root, on the workers' PYTHONPATH
START_TIMEOUT_S = 60.0  # the workers must all answer within this


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
    def __init__(self, schedule: Schedule, worker: int = 0, workers: int = 1):
        self.schedule = schedule
        self.worker, self.workers = worker, workers
        self.control: Control | None = None  # the other workers, when there are any
        self.ready = workers == 1  # every worker listens (/health says 503 until then)
        self.tasks: set[asyncio.Task] = set()
        self.heap: list[tuple[float, int, Stream, int]] = []
        self.seq = itertools.count()
        self.waiting: asyncio.Future | None = None  # drive's sleep until the next token is due
        self.open = 0
        self.peak = 0
        self.arrivals = 0
        self.log: list[Stream] = []

    def start(self, conn: "Conn", body: dict) -> None:
        prompt = body.get("prompt") if "prompt" in body else body.get("messages")
        n = int(body.get("max_tokens") or 16)
        key = key_of(prompt)
        read = conn.read
        k = self.arrivals  # this worker's count; the arrival number is unique across workers
        s = Stream(conn, key, n, self.worker + self.workers * k, read, self.schedule.stalls(k))
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
        if first and self.waiting is not None and not self.waiting.done():
            self.waiting.set_result(None)  # drive slept until a later token: it wakes now and sleeps again

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
        """Send every token when due: one timer for all streams, to the tens of microseconds
        (tensorfold_bench.client.timer: the loop's own timers round up to the millisecond, which
        would send every token of that millisecond at once)."""
        heap, loop = self.heap, asyncio.get_running_loop()
        while True:
            now = clock()
            while heap and heap[0][0] <= now:
                _, _, s, j = heapq.heappop(heap)
                if s.conn is None:
                    continue
                self.send(s, j)
            self.waiting = timer.call_at(heap[0][0], lambda: None) if heap else loop.create_future()
            await self.waiting

    def report(self) -> dict:
        return {"schedule": asdict(self.schedule), "peak_open": self.peak, "open": self.open,
                "streams": [{"key": s.key, "arrival": s.arrival, "read": s.read, "stalled": s.stalled,
                             "stall_at": s.n // 2 if s.stalled else None, "sends": s.sends, "due": s.due[:len(s.sends)]}
                            for s in self.log]}

    def reset(self) -> None:
        self.log = []
        self.peak = self.open
        self.arrivals = 0
        gc.collect()  # between levels: the collector is off while serving (see serve)

    def local(self, op: str):
        """This worker's answer to a control request."""
        if op == "report":
            return self.report()
        if op == "reset":
            self.reset()
            return {"ok": True}
        if op == "metrics":
            return {"open": self.open, "peak": self.peak}
        if op == "ping":
            return {"worker": self.worker, "pid": os.getpid()}
        raise ValueError(f"no control op {op!r}")

    def is_ready(self) -> bool:
        if not self.ready and self.control is not None and self.control.ready_file().exists():
            self.ready = True
        return self.ready


def merge(reports: list[dict]) -> dict:
    """The workers' logs as one: every stream, by read time; open summed, peak_open the sum of peaks."""
    streams = sorted((s for r in reports for s in r["streams"]), key=lambda s: (s["read"], s["arrival"]))
    return {"schedule": reports[0]["schedule"], "peak_open": sum(r["peak_open"] for r in reports),
            "open": sum(r["open"] for r in reports), "workers": len(reports), "streams": streams}


class Control:
    """The workers' control plane: each listens on `dir/worker-i.sock`; a request is one JSON line
    ({"op": "report" | "reset" | "metrics" | "ping"}), the reply its JSON, then EOF."""

    def __init__(self, sim: Synthetic, directory: Path):
        self.sim, self.dir = sim, Path(directory)
        self.server = None

    def path(self, i: int) -> Path:
        return self.dir / f"worker-{i}.sock"

    def ready_file(self) -> Path:
        return self.dir / "ready"

    async def start(self) -> None:
        self.path(self.sim.worker).unlink(missing_ok=True)
        self.server = await asyncio.start_unix_server(self.handle, path=str(self.path(self.sim.worker)))

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                out = {"ok": self.sim.local(json.loads(await reader.readline())["op"])}
            except (ValueError, KeyError, TypeError) as e:
                out = {"error": str(e)}
            writer.write(json.dumps(out).encode())
            await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def ask(self, i: int, op: str):
        reader, writer = await asyncio.open_unix_connection(str(self.path(i)))
        try:
            writer.write(json.dumps({"op": op}).encode() + b"\n")
            await writer.drain()
            got = json.loads(await reader.read())
        finally:
            writer.close()
        if "error" in got:
            raise RuntimeError(f"worker {i}: {got['error']}")
        return got["ok"]

    async def everyone(self, op: str) -> list:
        """Every worker's answer, this one's first."""
        mine = self.sim.local(op)
        others = await asyncio.gather(*(self.ask(i, op) for i in range(self.sim.workers) if i != self.sim.worker))
        return [mine, *others]


class Conn(asyncio.Protocol):
    """One HTTP/1.1 connection: a request, then (for a completion) the stream, then close."""

    def __init__(self, server: Synthetic):
        self.server = server
        self.buf = b""
        self.transport = None
        self.closed = False
        self.stream: Stream | None = None
        self.read = 0.0

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
        self.read = clock()  # the request's read: when the bytes that complete it came, before any parsing
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
        if srv.control is not None and (path == "/metrics" or path == "/v1/synthetic"
                                        or (method == "POST" and path == "/v1/synthetic/reset")):
            task = asyncio.ensure_future(self.all_workers(method, path))
            srv.tasks.add(task)
            task.add_done_callback(srv.tasks.discard)
            return None
        if method == "POST" and path == "/v1/synthetic/reset":
            srv.reset()
            return self.reply(200, {"ok": True})
        if path == "/v1/synthetic":
            return self.reply(200, srv.report())
        if path == "/health":
            if not srv.is_ready():
                return self.reply(503, {"status": "starting", "error": {"message": "not every worker listens yet",
                                                                        "code": 503}})
            return self.reply(200, {"status": "ok"})
        if path == "/v1/models":
            return self.reply(200, {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "synthetic",
                                                              "max_model_len": 1 << 20, "vocab_size": VOCAB}]})
        if path == "/metrics":
            text = (f"tfengine_running_streams {srv.open}\ntfengine_waiting_streams 0\n"
                    f"synthetic_peak_open_streams {srv.peak}\n")
            return self.reply(200, text.encode(), "text/plain")
        return self.reply(404, {"error": {"message": f"no route {method} {path}", "code": 404}})

    async def all_workers(self, method: str, path: str) -> None:
        """A control route answered for every worker (asked over their unix sockets)."""
        try:
            if path == "/v1/synthetic/reset":
                await self.server.control.everyone("reset")
                return self.reply(200, {"ok": True})
            if path == "/v1/synthetic":
                return self.reply(200, merge(await self.server.control.everyone("report")))
            got = await self.server.control.everyone("metrics")
            text = (f"tfengine_running_streams {sum(g['open'] for g in got)}\ntfengine_waiting_streams 0\n"
                    f"synthetic_peak_open_streams {sum(g['peak'] for g in got)}\n")
            return self.reply(200, text.encode(), "text/plain")
        except (OSError, ValueError, RuntimeError) as e:
            return self.reply(500, {"error": {"message": f"a worker did not answer: {e}", "code": 500}})


async def serve(schedule: Schedule, host: str = "127.0.0.1", port: int = 0, port_file: str | None = None,
                workers: int = 1, worker: int = 0, control_dir: str | None = None) -> None:
    sim = Synthetic(schedule, worker, workers)
    loop = asyncio.get_running_loop()
    # no automatic garbage collection while serving: a full one over a level's log of streams
    # paused every read and token for 10-17 ms at 2,000 requests a second; a reset collects
    gc.collect()
    gc.disable()
    # more than one worker: each its own listening socket on the port (SO_REUSEPORT), the kernel
    # spreading the connections over them
    sock = socket.create_server((host, port), reuse_port=workers > 1)
    # the backlog given here: asyncio listens again with its own (100 unless told), and a burst of
    # more connections than the backlog has its SYNs dropped and resent after 1 s
    server = await loop.create_server(lambda: Conn(sim), sock=sock, backlog=4096)
    port = sock.getsockname()[1]
    if workers == 1:
        write_port(port_file, port)
        async with server:
            await sim.drive()
        return
    own_dir = control_dir is None
    directory = Path(control_dir or tempfile.mkdtemp(prefix="tfsynth-"))
    sim.control = control = Control(sim, directory)
    await control.start()  # after the TCP socket listens: a worker that answers here is up
    if worker != 0:
        async with server:
            await sim.drive()
        return
    children: list[subprocess.Popen] = []
    me = asyncio.current_task()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # stopped: the workers are stopped first
        loop.add_signal_handler(sig, me.cancel)
    try:
        control.ready_file().unlink(missing_ok=True)
        children = start_workers(schedule, host, port, workers, directory)
        await wait_workers(control, children)
        control.ready_file().touch()
        sim.ready = True
        write_port(port_file, port)
        async with server:
            tasks = [asyncio.ensure_future(sim.drive()), asyncio.ensure_future(watch_workers(children))]
            try:
                done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                for t in done:
                    t.result()  # a worker that died says so
            finally:
                for t in tasks:
                    t.cancel()
    finally:
        stop_workers(children)
        if own_dir:
            shutil.rmtree(directory, ignore_errors=True)
        else:
            for i in range(workers):
                control.path(i).unlink(missing_ok=True)
            control.ready_file().unlink(missing_ok=True)


class WorkerError(Exception):
    """A worker did not start, or died."""


def write_port(port_file: str | None, port: int) -> None:
    if port_file:
        tmp = Path(port_file + ".tmp")
        tmp.write_text(f"{port}\n")
        tmp.replace(port_file)


def start_workers(schedule: Schedule, host: str, port: int, workers: int, directory: Path) -> list[subprocess.Popen]:
    """Workers 1..N-1, this module in processes of their own on `port`, in this process group."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    sc = schedule
    return [subprocess.Popen([sys.executable, "-m", MODULE, "--host", host, "--port", str(port), "--workers",
                              str(workers), "--worker", str(i), "--control-dir", str(directory), "--parent-pid",
                              str(os.getpid()), "--first-ms", repr(sc.first_ms), "--every-ms", repr(sc.every_ms),
                              "--stall-every", str(sc.stall_every), "--stall-ms", repr(sc.stall_ms)],
                             env=env, stdin=subprocess.DEVNULL)
            for i in range(1, workers)]


async def wait_workers(control: Control, children: list[subprocess.Popen]) -> None:
    """Until every worker answers on its control socket (it listens on the port before that)."""
    deadline = clock() + START_TIMEOUT_S
    for i, p in enumerate(children, 1):
        while True:
            if p.poll() is not None:
                raise WorkerError(f"synthetic worker {i} exited with code {p.returncode} before it served")
            try:
                await control.ask(i, "ping")
                break
            except (OSError, ValueError, RuntimeError):
                if clock() > deadline:
                    raise WorkerError(f"synthetic worker {i} did not answer in {START_TIMEOUT_S:g} s") from None
                await asyncio.sleep(0.02)


async def watch_workers(children: list[subprocess.Popen]) -> None:
    """Returns (raising) when a worker exits: the server is then not what it says."""
    while True:
        for i, p in enumerate(children, 1):
            if p.poll() is not None:
                raise WorkerError(f"synthetic worker {i} exited with code {p.returncode}")
        await asyncio.sleep(0.2)


def stop_workers(children: list[subprocess.Popen], grace_s: float = 2.0) -> None:
    for p in children:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                p.terminate()
    deadline = time.monotonic() + grace_s
    for p in children:
        try:
            p.wait(timeout=max(deadline - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def die_with_parent(parent: int) -> None:
    """A worker: killed when worker 0 dies, however it dies (Linux); gone already if it has."""
    if sys.platform.startswith("linux"):
        import ctypes
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        raise SystemExit(0)


def at_least_one(v: str) -> int:
    try:
        n = int(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{v!r} is not a whole number") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {n}")
    return n


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
    p.add_argument("--workers", type=at_least_one, default=1,
                   help="processes serving the port (SO_REUSEPORT), their logs merged (default 1)")
    p.add_argument("--control-dir", default=None,
                   help="where the workers' control sockets go (default: a temporary dir)")
    p.add_argument("--worker", type=int, default=0, help=argparse.SUPPRESS)  # set for the workers started
    p.add_argument("--parent-pid", type=int, default=None, help=argparse.SUPPRESS)
    return p


def main(argv=None) -> None:
    p = parser()
    a, _unknown = p.parse_known_args(argv)
    if not 0 <= a.worker < a.workers or (a.worker and (a.control_dir is None or a.parent_pid is None)):
        p.error("--worker: only for the workers this server starts itself")
    if a.worker:
        die_with_parent(a.parent_pid)
    try:
        sc = Schedule(a.first_ms, a.every_ms, a.stall_every, a.stall_ms)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    try:
        with contextlib.suppress(KeyboardInterrupt, asyncio.CancelledError):  # worker 0 is cancelled by a signal
            asyncio.run(serve(sc, a.host, a.port, a.port_file, a.workers, a.worker, a.control_dir))
    except WorkerError as e:
        raise SystemExit(f"error: {e}") from None


if __name__ == "__main__":
    main()
