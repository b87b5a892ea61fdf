"""What every scenario sends with: seeded prompt token ids (drawn in tensorfold_bench.workload.ids),
one HTTP client setup, and one request played alone."""
from __future__ import annotations

import asyncio

from tensorfold_bench.client import Request, StreamClient, StreamRecord, clock, new_record, stream
from tensorfold_bench.workload.ids import PROMPT_ID_FLOOR, prompt_ids  # noqa: F401 (the scenarios draw prompts here)


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
