"""What every scenario sends with: seeded prompt token ids, one HTTP client setup, and one
request played alone."""
from __future__ import annotations

import asyncio
import hashlib

import numpy as np

from tensorfold_bench.client import Request, StreamClient, StreamRecord, clock, new_record, stream

PROMPT_ID_FLOOR = 256  # stay clear of the low (byte / special) ids


def prompt_ids(seed: int, key: str, n: int, vocab: int) -> list[int]:
    """n random token ids in [PROMPT_ID_FLOOR, vocab), from a generator seeded by (seed, key)."""
    digest = hashlib.sha256(f"{seed}:{key}".encode()).digest()
    rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
    lo = min(PROMPT_ID_FLOOR, max(vocab // 4, 0))
    return rng.integers(lo, vocab, size=n).tolist()


def http_client(kind: str = "wire") -> StreamClient:
    """One connection per stream and no cap: a level of N streams is N open at once."""
    return StreamClient(kind)


async def sleep_until(t: float) -> None:
    d = t - clock()
    if d > 0:
        await asyncio.sleep(d)


async def play_alone(url: str, req: Request, model: str = "default") -> StreamRecord:
    """One request with nothing else running."""
    async with http_client() as client:
        rec = new_record(req)
        await stream(client, url, req, rec, model)
        return rec
