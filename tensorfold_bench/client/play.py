"""What every scenario sends with: one HTTP client setup and one request played alone (a sleep to
a send time is tensorfold_bench.client.timer.sleep_until)."""
from __future__ import annotations

from tensorfold_bench.client.stream import Request, StreamClient, StreamRecord, new_record, stream


def http_client(kind: str = "wire") -> StreamClient:
    """One connection per stream and no cap: a level of N streams is N open at once."""
    return StreamClient(kind)


async def play_alone(url: str, req: Request, model: str = "default") -> StreamRecord:
    """One request with nothing else running."""
    async with http_client() as client:
        rec = new_record(req)
        await stream(client, url, req, rec, model)
        return rec
