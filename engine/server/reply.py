"""A generation's reply on the wire: server-sent events (one chunk per token, then one finish
chunk per choice, then the usage chunk when asked for) or one JSON object.

Back-pressure counts what the client has not read: the socket's send buffer and the transport's
write buffer are kept small, so a write waits (drain) as soon as the client stops reading, and a
token counts as drained only after its chunk has left the process. A stream whose writes wait
longer than the stall time-out is cancelled and its lane freed."""
from __future__ import annotations

import asyncio
import logging
import socket

from aiohttp import web

from engine.server.errors import error_body, error_response
from engine.server.generate import Choice, Generation
from engine.server.render import envelope, sse
from engine.server.text import Step

log = logging.getLogger("tfengine.server")

SNDBUF_BYTES = 4096  # the kernel doubles it: ~40 token chunks in flight at most
WRITE_HIGH_BYTES = 4096


class ClientGone(Exception):
    """The client disconnected or stopped reading for longer than the stall time-out."""


def _choice_delta(gen: Generation, c: Choice, text: str, tokens: list[int], first: bool) -> dict:
    ch: dict = {"index": c.index}
    if gen.req.chat:
        ch["delta"] = ({"role": "assistant"} if first else {}) | ({"content": text} if text or first else {})
    else:
        ch["text"] = text
    ch["logprobs"] = None
    ch["finish_reason"] = None
    ch["token_ids"] = tokens
    return ch


class StreamWriter:
    def __init__(self, request: web.Request, gen: Generation, rid: str, stall_timeout_s: float):
        self.request, self.gen, self.rid, self.stall = request, gen, rid, stall_timeout_s
        self.resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        self.started: set[int] = set()

    async def run(self) -> web.StreamResponse:
        try:
            return await self._run()
        except (ClientGone, ConnectionResetError):
            log.info("%s: the client went away mid-stream", self.rid)
            return self.resp

    async def _run(self) -> web.StreamResponse:
        transport = self.request.transport
        if transport is not None:
            sock = transport.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SNDBUF_BYTES)
            transport.set_write_buffer_limits(high=WRITE_HIGH_BYTES)
        await self.resp.prepare(self.request)
        gen = self.gen
        while not gen.finished:
            c, kind, payload = await gen.next()
            if kind == "token":
                await self._token(c, payload)
            elif kind == "done":
                await self._finish(c, payload)
            else:
                await self._write(error_body(500, str(payload), kind="server_error"))
                break
        if gen.req.include_usage and all(c.finish != "error" for c in gen.choices):
            await self._write(envelope(self.rid, gen.req.chat, True, gen.model.name, []) |
                              {"usage": gen.usage()} | gen.extras())
        await self._send(b"data: [DONE]\n\n")
        await self.resp.write_eof()
        return self.resp

    async def _token(self, c: Choice, step: Step) -> None:
        gen = self.gen
        first = c.index not in self.started
        self.started.add(c.index)
        ch = _choice_delta(gen, c, step.text, [c.tokens[-1]], first)
        ch["logprobs"] = gen.logprobs_of(c, len(c.tokens) - 1)
        await self._write(envelope(self.rid, gen.req.chat, True, gen.model.name, [ch]) | self._usage())
        gen.drained(c)
        if step.finish:  # a stop string or stop token ended it here
            await self._finish(c, "")

    async def _finish(self, c: Choice, rest: str) -> None:
        gen = self.gen
        ch = _choice_delta(gen, c, rest, [], c.index not in self.started)
        ch["finish_reason"] = c.finish if c.finish in ("stop", "length") else "stop"
        ch["stop_reason"] = c.stop_reason
        await self._write(envelope(self.rid, gen.req.chat, True, gen.model.name, [ch]) | self._usage() | gen.extras(c))

    def _usage(self) -> dict:
        """continuous_usage_stats: the usage so far on every chunk."""
        return {"usage": self.gen.usage()} if self.gen.req.continuous_usage else {}

    async def _write(self, obj: dict) -> None:
        await self._send(sse(obj))

    async def _send(self, data: bytes) -> None:
        await self.resp.write(data)
        if not getattr(self.request.protocol, "writing_paused", True):
            return  # drain() would return at once: spare a wait_for task a token
        try:
            await asyncio.wait_for(self.request.writer.drain(), self.stall)
        except asyncio.TimeoutError:
            log.info("%s: the client has read nothing for %g s: stream cancelled", self.rid, self.stall)
            if self.request.transport is not None:
                self.request.transport.abort()
            raise ClientGone() from None


async def collect(gen: Generation, rid: str) -> web.Response:
    while not gen.finished:
        c, kind, payload = await gen.next()
        if kind == "token":
            gen.drained(c)
        elif kind == "error":
            return error_response(500, str(payload), kind="server_error")
    req = gen.req
    choices = []
    for c in gen.choices:
        ch: dict = {"index": c.index}
        if req.chat:
            ch["message"] = {"role": "assistant", "content": c.sent_text}
        else:
            ch["text"] = c.sent_text
        ch["logprobs"] = gen.logprobs_of(c)
        ch["finish_reason"] = c.finish if c.finish in ("stop", "length") else "stop"
        ch["stop_reason"] = c.stop_reason
        ch["token_ids"] = c.tokens
        if len(gen.choices) > 1:
            ch["token_sha"] = gen.extras(c)["token_sha"]
        choices.append(ch)
    body = envelope(rid, req.chat, False, gen.model.name, choices) | {"usage": gen.usage()} | gen.extras()
    return web.json_response(body)
