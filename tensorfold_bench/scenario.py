"""The long-prompt scenario: pacing (when each request goes out) apart from sending (client.py).

Stream A decodes a long reply (ignore_eos). `b_at` seconds after A's send, B sends a cold
prompt of `b_tokens` random token ids; `c_after` seconds later, C sends a short prompt of
`c_tokens` ids with a short reply. When B and C are done, A is cancelled (its stream closed).
"""
from __future__ import annotations

import asyncio
import hashlib
from dataclasses import asdict, dataclass

import httpx
import numpy as np

from tensorfold_bench.client import Request, StreamRecord, clock, new_record, stream

A_PROMPT_TOKENS = 16
PROMPT_ID_FLOOR = 256  # stay clear of the low (byte / special) ids


@dataclass(frozen=True)
class LongPromptScript:
    b_at: float
    c_after: float
    b_tokens: int
    c_tokens: int = 34
    a_prompt_tokens: int = A_PROMPT_TOKENS
    a_max_tokens: int = 4000  # large enough that A outlasts B; A is cancelled at the end
    b_max_tokens: int = 8
    c_max_tokens: int = 16
    seed: int = 0
    timeout_s: float = 900.0  # B and C must be done by then

    def to_dict(self) -> dict:
        return asdict(self)


def prompt_ids(seed: int, key: str, n: int, vocab: int) -> list[int]:
    """n random token ids in [PROMPT_ID_FLOOR, vocab), from a generator seeded by (seed, key)."""
    digest = hashlib.sha256(f"{seed}:{key}".encode()).digest()
    rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
    lo = min(PROMPT_ID_FLOOR, max(vocab // 4, 0))
    return rng.integers(lo, vocab, size=n).tolist()


@dataclass(frozen=True)
class Prompts:
    a: list[int]
    b: list[int]
    c: list[int]


def make_prompts(script: LongPromptScript, vocab: int, key: str = "") -> Prompts:
    """A's, B's and C's prompts. `key` distinguishes runs that share one server (--url), so each
    run's B is cold; fresh servers use one key, so every run's replies compare."""
    return Prompts(prompt_ids(script.seed, f"A{key}", script.a_prompt_tokens, vocab),
                   prompt_ids(script.seed, f"B{key}", script.b_tokens, vocab),
                   prompt_ids(script.seed, f"C{key}", script.c_tokens, vocab))


def requests(script: LongPromptScript, prompts: Prompts, extra: dict | None = None) -> tuple[Request, Request, Request]:
    extra = extra or {}
    return (Request("A", prompts.a, max_tokens=script.a_max_tokens, ignore_eos=True, extra=extra),
            Request("B", prompts.b, max_tokens=script.b_max_tokens, ignore_eos=True, extra=extra),
            Request("C", prompts.c, max_tokens=script.c_max_tokens, ignore_eos=True, extra=extra))


async def _sleep_until(t: float) -> None:
    d = t - clock()
    if d > 0:
        await asyncio.sleep(d)


def http_client() -> httpx.AsyncClient:
    return httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0),
                             limits=httpx.Limits(max_connections=64, max_keepalive_connections=0))


async def play_long_prompt(url: str, script: LongPromptScript, prompts: Prompts, model: str = "default",
                           extra: dict | None = None) -> dict[str, StreamRecord]:
    """Play A, B and C on the script; return their raw records."""
    ra, rb, rc = requests(script, prompts, extra)
    async with http_client() as client:
        t0 = clock()
        a = new_record(ra, t0)
        b = new_record(rb, t0 + script.b_at)
        c = new_record(rc, t0 + script.b_at + script.c_after)
        a_task = asyncio.create_task(stream(client, url, ra, a, model))
        try:
            await _sleep_until(b.scheduled)
            b_task = asyncio.create_task(stream(client, url, rb, b, model))
            await _sleep_until(c.scheduled)
            c_task = asyncio.create_task(stream(client, url, rc, c, model))
            done, pending = await asyncio.wait({b_task, c_task}, timeout=script.timeout_s)
            for t in pending:
                t.cancel()
                rec = b if t is b_task else c
                rec.error = rec.error or f"not done after {script.timeout_s:.0f} s"
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
        finally:
            if not a_task.done():
                a_task.cancel()
            await asyncio.gather(a_task, return_exceptions=True)
    return {"A": a, "B": b, "C": c}


async def play_alone(url: str, req: Request, model: str = "default") -> StreamRecord:
    """One request with nothing else running (B alone, or a plain reference reply)."""
    async with http_client() as client:
        rec = new_record(req)
        await stream(client, url, req, rec, model)
        return rec


async def play_sequence(url: str, reqs: list[Request], model: str = "default") -> dict[str, StreamRecord]:
    """Each request alone, one after another (the plain reference)."""
    out = {}
    for r in reqs:
        out[r.name] = await play_alone(url, r, model)
    return out
