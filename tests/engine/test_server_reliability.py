"""Hostile clients against the engine served for real on loopback: fuzzed bodies never get a
5xx, disconnects leave no lane or stream behind, a stalled reader is paused then freed while a
neighbour keeps its ids, and slow connections are closed by the time-outs."""
import asyncio
import json
import os
import random
import socket
import sys
import time

import httpx
import pytest

from tensorfold_bench.servers.launcher import launch
from tests.hostile import fuzz_case, request_then_close
from tests.openai_helpers import engine_pid, metrics, prompt_ids, sse_events, wait_idle

FLAGS = ["--model", "tiny", "--parallel", "4", "--max-model-len", "512", "--prefill-rows", "8",
         "--max-body-mb", "1", "--stall-timeout-s", "3", "--idle-timeout-s", "2", "--body-timeout-s", "2"]


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    with launch(FLAGS, tmp_path_factory.mktemp("rel") / "server.log") as server:
        yield server


# ---- fuzz ------------------------------------------------------------------------------------
def test_fuzzed_bodies_never_get_a_5xx(srv):
    rng = random.Random(1234)
    cases = [fuzz_case(rng) for _ in range(2000)]
    statuses: dict[int, int] = {}
    bad: list = []

    async def worker(client, queue):
        while queue:
            method, path, body, headers = queue.pop()
            r = await client.request(method, srv.url + path, content=body, headers=headers)
            statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
            if r.status_code >= 500 or (r.status_code >= 400 and "error" not in r.json()):
                bad.append((method, path, body[:200], r.status_code, r.text[:300]))
            else:
                await r.aread()

    async def main():
        queue = list(cases)
        async with httpx.AsyncClient(timeout=60) as client:
            await asyncio.gather(*(worker(client, queue) for _ in range(8)))

    asyncio.run(main())
    assert not bad, bad[:5]
    assert sum(statuses.values()) == 2000 and statuses.get(200, 0) > 50 and statuses.get(400, 0) > 1000, statuses
    wait_idle(srv.url)


# ---- disconnects -----------------------------------------------------------------------------
def test_disconnects_mid_prompt_and_mid_decode_leave_nothing(srv):
    before = metrics(srv.url)
    pid = engine_pid(srv)
    fds_before = len(os.listdir(f"/proc/{pid}/fd"))
    long_prompt = prompt_ids(400, 5)  # 50 cuts of 8 rows

    async def main():
        sem = asyncio.Semaphore(6)

        async def one(i):
            async with sem:
                if i % 3 == 0:
                    await request_then_close(srv.url, {"prompt": long_prompt, "max_tokens": 8}, -1)
                elif i % 3 == 1:
                    await request_then_close(srv.url, {"prompt": long_prompt, "max_tokens": 8}, 0)
                else:
                    await request_then_close(srv.url, {"prompt": prompt_ids(10, i), "max_tokens": 400,
                                                        "ignore_eos": True}, 3)
        await asyncio.gather(*(one(i) for i in range(120)))

    asyncio.run(main())
    after = wait_idle(srv.url)
    assert after["tfengine_paused_streams"] == 0
    submitted = after["tfengine_requests_total"] - before["tfengine_requests_total"]
    assert 80 <= submitted <= 120  # a client gone before its body was read never reaches the host
    ended = sum(after[k] - before[k] for k in ("tfengine_cancelled_streams_total", "tfengine_finished_streams_total"))
    assert ended == submitted
    assert after["tfengine_cancelled_streams_total"] - before["tfengine_cancelled_streams_total"] >= 40
    deadline = time.monotonic() + 10  # the server closes its side of each socket
    while len(os.listdir(f"/proc/{pid}/fd")) > fds_before + 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(os.listdir(f"/proc/{pid}/fd")) <= fds_before + 2
    log = srv.log.read_text()
    assert "Traceback" not in log and " ERROR " not in log


# ---- a stalled reader --------------------------------------------------------------------------
def test_stalled_reader_is_paused_then_freed_while_a_neighbour_keeps_its_ids(srv):
    neighbour = {"prompt": prompt_ids(12, 8), "max_tokens": 60, "ignore_eos": True}
    reference = httpx.post(srv.url + "/v1/completions", json=neighbour, timeout=60).json()["choices"][0]["token_ids"]
    wait_idle(srv.url)
    before = metrics(srv.url)
    host, port = srv.url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a client that reads nothing
    sock.connect((host, int(port)))
    body = json.dumps({"prompt": prompt_ids(8, 9), "max_tokens": 480, "ignore_eos": True, "stream": True}).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    try:
        deadline = time.monotonic() + 30
        while metrics(srv.url)["tfengine_paused_streams"] < 1:
            assert time.monotonic() < deadline, metrics(srv.url)
            time.sleep(0.02)
        paused_at = metrics(srv.url)["tfengine_tokens_out_total"] - before["tfengine_tokens_out_total"]
        # 64 undrained tokens + what the small socket buffers hold; before, ~13.9k tokens
        assert 64 <= paused_at < 300, paused_at
        events = asyncio.run(sse_events(srv.url, neighbour))
        assert [t for e in events for t in e["choices"][0]["token_ids"]] == reference
        m = wait_idle(srv.url)  # the stall time-out (3 s) cancels the stalled stream and frees its lane
        assert m["tfengine_cancelled_streams_total"] == before["tfengine_cancelled_streams_total"] + 1
    finally:
        sock.close()


# ---- slow connections ----------------------------------------------------------------------------
def _closed_by_server(sock: socket.socket, wait_s: float = 20.0) -> bytes:
    sock.settimeout(wait_s)
    got = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return got
        got += chunk


def test_half_headers_idle_and_slow_body_connections_are_closed(srv):
    host, port = srv.url.removeprefix("http://").split(":")
    idle = socket.create_connection((host, int(port)))
    half = socket.create_connection((host, int(port)))
    half.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
    slow = socket.create_connection((host, int(port)))
    slow.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 100\r\n\r\n{\"prompt\":")
    try:
        assert _closed_by_server(idle) == b""
        assert _closed_by_server(half) == b""
        reply = _closed_by_server(slow)
        assert reply.startswith(b"HTTP/1.1 408") and b'"code": 408' in reply
    finally:
        for s in (idle, half, slow):
            s.close()
    assert httpx.get(srv.url + "/health").status_code == 200


def test_at_the_fd_limit_accept_errors_are_logged_once_a_second(tmp_path):
    command = ["prlimit", "--nofile=100", sys.executable, "-m", "engine"]
    with launch(FLAGS, tmp_path / "fd.log", command=command) as server:
        host, port = server.url.removeprefix("http://").split(":")
        t0 = time.monotonic()
        socks = [socket.create_connection((host, int(port))) for _ in range(150)]  # the backlog takes the rest
        try:
            time.sleep(3)
            for s in socks:  # the idle time-out (2 s) has closed the ones it accepted
                s.settimeout(0.01)
                try:
                    s.recv(1)
                except (socket.timeout, OSError):
                    pass
        finally:
            for s in socks:
                s.close()
        elapsed = time.monotonic() - t0
        assert httpx.get(server.url + "/health", timeout=30).status_code == 200
        lines = [ln for ln in server.log.read_text().splitlines() if "out of system resource" in ln]
        assert 1 <= len(lines) <= elapsed + 2, lines


def test_malformed_http_is_a_400_and_one_quiet_log_line(srv):
    host, port = srv.url.removeprefix("http://").split(":")
    junk = [b"BLAH\r\n\r\n", b"GET / HTTP/1.1\r\nContent-Length: abc\r\n\r\n", b"GET / HTTP/1.1\r\nX: " + b"a" * 9000 + b"\r\n\r\n",
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"]
    for i in range(50):
        with socket.create_connection((host, int(port))) as s:
            s.sendall(junk[i % len(junk)])
            s.settimeout(10)
            head = s.recv(64)
            assert head.startswith(b"HTTP/1.") and b" 400 " in head or head == b"", head
    log = srv.log.read_text()
    assert "Traceback" not in log and " ERROR " not in log
    assert log.count("malformed HTTP") <= 10
