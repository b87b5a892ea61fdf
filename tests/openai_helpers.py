"""Shared helpers for the HTTP tests: a real streaming client over loopback."""
import json
import time

import httpx

from engine.server.render import token_sha as sha12  # noqa: F401  (the engine's one rule)
from engine.server.metrics import parse_metrics


def prompt_ids(n, seed):
    return [(seed * 7919 + i * 104729) % 256 for i in range(n)]


async def sse_events(url, body, path="/v1/completions", timeout=60):
    """Every `data:` object of a stream, in order ([DONE] excluded)."""
    out = []
    async with httpx.AsyncClient(timeout=timeout) as client:
        async with client.stream("POST", url + path, json={**body, "stream": True}) as resp:
            assert resp.status_code == 200, await resp.aread()
            async for line in resp.aiter_lines():
                if line.startswith("data: "):
                    if line[6:] == "[DONE]":
                        return out
                    out.append(json.loads(line[6:]))
    raise AssertionError("the stream ended without [DONE]")


def metrics(url):
    return parse_metrics(httpx.get(url + "/metrics").text)


def wait_idle(url, lanes=4, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = metrics(url)
        if m["tfengine_running_streams"] == 0 and m["tfengine_free_lanes"] == lanes and m["tfengine_waiting_streams"] == 0:
            return m
        time.sleep(0.05)
    raise AssertionError(f"lanes not free: {metrics(url)}")


def engine_pid(server) -> int:
    """The engine's pid: the launcher's process is the lifeline supervisor, the engine its child."""
    pid = server.proc.pid
    kids = open(f"/proc/{pid}/task/{pid}/children").read().split()
    assert len(kids) == 1, kids
    return int(kids[0])
