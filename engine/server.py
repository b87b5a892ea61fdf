"""OpenAI-compatible HTTP over the lane host (aiohttp). The server validates requests, hands
`Sequence`s to the host and streams what the host emits; it never touches the model."""
from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from dataclasses import asdict, dataclass
from typing import Any

from aiohttp import web

from .host import LaneHost
from .metrics import render_metrics
from .sequence import Sequence

log = logging.getLogger("tfengine.server")


def token_sha(ids: list[int]) -> str:
    """TensorFold's convention: sha256 over the comma-joined decimal ids, first 12 hex chars."""
    return hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()[:12]


class BadRequest(Exception):
    pass


@dataclass
class ServedModel:
    """What the server needs to know of the model, without the model."""

    name: str
    vocab_size: int
    max_model_len: int
    tokenizer: Any  # encode(str) -> ids, decode(ids) -> str, chat_prompt(messages) -> ids
    describe: dict
    commit: str | None = None
    nonce: str | None = None  # a launcher's token, echoed by /v1/engine


def _field(body: dict, name: str, kind, default):
    value = body.get(name, default)
    if value is None:
        return default
    # bool is an int in Python: never accept one for the other
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise BadRequest(f"'{name}' must be an integer")
    if kind is bool and not isinstance(value, bool):
        raise BadRequest(f"'{name}' must be true or false")
    if kind is float and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise BadRequest(f"'{name}' must be a number")
    return value


class Api:
    def __init__(self, host: LaneHost, model: ServedModel):
        self.host = host
        self.model = model
        self.started = time.time()
        self._next_id = 0

    def routes(self, app: web.Application) -> None:
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/v1/engine", self.engine)
        app.router.add_get("/v1/trace", self.trace)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat)

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{
            "id": self.model.name, "object": "model", "created": int(self.started),
            "owned_by": "tfengine", "max_model_len": self.model.max_model_len,
            "vocab_size": self.model.vocab_size}]})

    async def engine(self, request: web.Request) -> web.Response:
        cfg = asdict(self.host.cfg)
        return web.json_response({"engine": self.model.describe, "config": cfg,
                                  "commit": self.model.commit, "prefill_share": self.host.share,
                                  "nonce": self.model.nonce})

    async def trace(self, request: web.Request) -> web.Response:
        if self.host.trace is None:
            return _error(404, "the trace is off: start the engine with --trace")
        return web.Response(body=self.host.trace.json(), content_type="application/json")

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=render_metrics(self.host), content_type="text/plain")

    # ---- generation -----------------------------------------------------------------------
    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    def _parse(self, body: Any, chat: bool) -> tuple[Sequence, bool]:
        if not isinstance(body, dict):
            raise BadRequest("the request body must be a JSON object")
        if chat:
            msgs = body.get("messages")
            if not isinstance(msgs, list) or not msgs or not all(
                    isinstance(m, dict) and isinstance(m.get("content"), str) and isinstance(m.get("role"), str)
                    for m in msgs):
                raise BadRequest("'messages' must be a non-empty list of {role, content} objects")
            prompt = list(self.model.tokenizer.chat_prompt(msgs))
        else:
            raw = body.get("prompt")
            if raw is None:
                raise BadRequest("'prompt' is required")
            if isinstance(raw, list) and len(raw) == 1 and isinstance(raw[0], (str, list)):
                raw = raw[0]  # OpenAI's batch form with one prompt
            if isinstance(raw, str):
                prompt = list(self.model.tokenizer.encode(raw))
            elif isinstance(raw, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in raw):
                prompt = raw
                bad = next((t for t in prompt if not 0 <= t < self.model.vocab_size), None)
                if bad is not None:
                    raise BadRequest(f"token id {bad} is outside the vocabulary (0..{self.model.vocab_size - 1})")
            else:
                raise BadRequest("'prompt' must be a string or a list of token ids")
        if not prompt:
            raise BadRequest("the prompt is empty")
        max_tokens = _field(body, "max_completion_tokens" if chat and "max_completion_tokens" in body
                            else "max_tokens", int, 16)
        if max_tokens < 1:
            raise BadRequest("'max_tokens' must be at least 1")
        limit = self.model.max_model_len
        if len(prompt) + max_tokens > limit:
            raise BadRequest(f"this model's maximum context length is {limit} tokens; the request asks for "
                             f"{len(prompt) + max_tokens} ({len(prompt)} in the prompt, {max_tokens} in the completion)")
        stream = _field(body, "stream", bool, False)
        ignore_eos = _field(body, "ignore_eos", bool, False)
        draft = _field(body, "draft", bool, True)
        temperature = _field(body, "temperature", float, 0.0)
        if temperature != 0:
            raise BadRequest("only greedy decoding is served: 'temperature' must be 0")
        if _field(body, "n", int, 1) != 1:
            raise BadRequest("'n' must be 1")
        priority = body.get("priority", "foreground") or "foreground"
        if priority not in ("foreground", "background"):
            raise BadRequest("'priority' must be \"foreground\" or \"background\"")
        seq = Sequence(prompt=prompt, max_tokens=max_tokens, ignore_eos=ignore_eos,
                       background=priority == "background", draft=draft, arrival=time.monotonic())
        return seq, stream

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError, ValueError):
            return _error(400, "the request body is not valid JSON")
        try:
            seq, stream = self._parse(body, chat)
        except BadRequest as exc:
            return _error(400, str(exc))
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        seq.emit = lambda kind, payload: loop.call_soon_threadsafe(events.put_nowait, (kind, payload))
        self._next_id += 1
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{self._next_id}"
        self.host.submit(seq)
        try:
            if stream:
                return await self._stream(request, seq, events, rid, chat)
            return await self._collect(seq, events, rid, chat)
        except (asyncio.CancelledError, ConnectionResetError):
            seq.cancel()  # the client went away: free the lane at the next boundary
            self.host.wake()
            raise

    def _chunk(self, rid: str, chat: bool, ids: list[int], finish: str | None) -> dict:
        text = self.model.tokenizer.decode(ids) if ids else ""
        choice: dict = {"index": 0, "token_ids": ids, "finish_reason": finish}
        if chat:
            choice["delta"] = {"content": text} if ids else {}
        else:
            choice["text"] = text
        return {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
                "created": int(time.time()), "model": self.model.name, "choices": [choice]}

    def _usage(self, seq: Sequence) -> dict:
        return {"prompt_tokens": len(seq.prompt), "completion_tokens": len(seq.output),
                "total_tokens": len(seq.prompt) + len(seq.output),
                "prompt_tokens_details": {"cached_tokens": seq.cached}}

    async def _stream(self, request, seq, events, rid, chat) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        while True:
            kind, payload = await events.get()
            if kind == "token":
                await resp.write(_sse(self._chunk(rid, chat, [payload], None)))
                seq.drained()
                if self.host.resumes(seq):
                    self.host.wake()  # it may have been paused on us
            elif kind == "done":
                last = self._chunk(rid, chat, [], payload)
                last["usage"] = self._usage(seq)
                last["token_sha"] = token_sha(seq.output)
                await resp.write(_sse(last))
                break
            else:
                await resp.write(_sse({"error": {"message": payload, "type": "server_error", "code": 500}}))
                break
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def _collect(self, seq, events, rid, chat) -> web.Response:
        while True:
            kind, payload = await events.get()
            if kind == "token":
                seq.drained()
                continue
            if kind == "error":
                return _error(500, payload, "server_error")
            break
        text = self.model.tokenizer.decode(seq.output)
        choice: dict = {"index": 0, "token_ids": seq.output, "finish_reason": payload}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return web.json_response({"id": rid, "object": "chat.completion" if chat else "text_completion",
                                  "created": int(time.time()), "model": self.model.name, "choices": [choice],
                                  "usage": self._usage(seq), "token_sha": token_sha(seq.output)})


def _sse(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def _error(status: int, message: str, kind: str = "invalid_request_error") -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "code": status}}, status=status)


def build_app(host: LaneHost, model: ServedModel) -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    Api(host, model).routes(app)
    return app


async def serve(host: LaneHost, model: ServedModel, bind: str, port: int, ready=None, sock=None) -> None:
    """Serve until cancelled. The client's disconnect cancels its handler, and so its stream."""
    runner = web.AppRunner(build_app(host, model), handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.SockSite(runner, sock) if sock is not None else web.TCPSite(runner, bind, port)
    await site.start()
    log.info("serving %s on http://%s:%d", model.name, bind, port)
    if ready is not None:
        ready()
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
