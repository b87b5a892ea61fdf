"""Streaming client: one async function per request, recording raw facts only.

Every timestamp is `time.monotonic()` (CLOCK_MONOTONIC), the clock the engine's `/v1/trace`
uses, so the harness's and the server's times line up on one host. Metrics are computed apart
(metrics.py); nothing here aggregates.

Chunk rule: a server-sent event carrying k tokens counts as k tokens that all arrived at that
event's arrival time. Token ids come from `token_ids` (tfengine); from other servers, from
logprobs entries of the form "token_id:123" (vLLM's --return-tokens-as-token-ids), else each
non-empty text chunk counts as one token of unknown id (None).
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass, field

import httpx

clock = time.monotonic


@dataclass
class Request:
    """What to send: a token-id completion prompt, or chat messages."""

    name: str  # "A", "B", "C", ...
    prompt: list[int] | None = None  # /v1/completions with token ids
    messages: list[dict] | None = None  # /v1/chat/completions
    max_tokens: int = 16
    ignore_eos: bool = True
    extra: dict = field(default_factory=dict)  # extra body fields (e.g. for vLLM)

    @property
    def prompt_len(self) -> int:
        return len(self.prompt) if self.prompt is not None else 0

    def body(self, model: str) -> dict:
        b = {"model": model, "max_tokens": self.max_tokens, "stream": True, "temperature": 0,
             "ignore_eos": self.ignore_eos, "stream_options": {"include_usage": True}}
        if self.prompt is not None:
            b["prompt"] = self.prompt
        else:
            b["messages"] = self.messages
        b.update(self.extra)
        return b

    @property
    def path(self) -> str:
        return "/v1/completions" if self.prompt is not None else "/v1/chat/completions"


@dataclass
class StreamRecord:
    """The raw facts of one streamed request. Times are time.monotonic() seconds."""

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

    @property
    def first_token(self) -> float | None:
        return self.token_times[0] if self.token_times else None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "StreamRecord":
        return cls(**d)


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


def chunk_tokens(event: dict) -> list[int | None]:
    """The tokens one event carries (see the chunk rule in this module's docstring)."""
    choices = event.get("choices") or []
    if not choices:
        return []
    ch = choices[0]
    if ch.get("token_ids") is not None:
        return [int(t) for t in ch["token_ids"]]
    ids = _ids_from_logprobs(ch)
    if ids is not None:
        return ids
    text = ch.get("text")
    if text is None:
        text = (ch.get("delta") or {}).get("content")
    return [None] if text else []


def _apply_event(rec: StreamRecord, event: dict, now: float) -> None:
    if "error" in event:
        err = event["error"]
        rec.error = err.get("message", str(err)) if isinstance(err, dict) else str(err)
        return
    toks = chunk_tokens(event)
    rec.token_ids.extend(toks)
    rec.token_times.extend([now] * len(toks))
    for ch in event.get("choices") or []:
        if ch.get("finish_reason"):
            rec.finish_reason = ch["finish_reason"]
    if event.get("usage"):
        rec.usage = event["usage"]
    sha = event.get("token_sha") or (event.get("tensorfold") or {}).get("token_sha")
    if sha:
        rec.server_sha = sha


async def stream(client: httpx.AsyncClient, base_url: str, req: Request, rec: StreamRecord,
                 model: str = "default") -> StreamRecord:
    """Send `req` and fill `rec` as tokens arrive. Cancelling the task closes the stream (the
    server cancels the request): `rec.cancelled` is set and the CancelledError propagates."""
    rec.sent = clock()
    try:
        async with client.stream("POST", base_url.rstrip("/") + req.path, json=req.body(model)) as resp:
            if resp.status_code != 200:
                body = (await resp.aread()).decode(errors="replace")
                try:
                    rec.error = f"HTTP {resp.status_code}: {json.loads(body)['error']['message']}"
                except Exception:
                    rec.error = f"HTTP {resp.status_code}: {body[:300]}"
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
    return rec


def new_record(req: Request, scheduled: float | None = None) -> StreamRecord:
    return StreamRecord(req.name, req.path, req.prompt_len, req.max_tokens, scheduled=scheduled)


async def get_json(client: httpx.AsyncClient, base_url: str, path: str) -> dict | None:
    """GET a JSON endpoint; None when the server does not have it (foreign servers)."""
    try:
        r = await client.get(base_url.rstrip("/") + path, timeout=10)
    except httpx.HTTPError:
        return None
    if r.status_code != 200:
        return None
    try:
        return r.json()
    except ValueError:
        return None
