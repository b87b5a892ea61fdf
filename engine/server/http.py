"""OpenAI-compatible HTTP over the lane host (aiohttp): routes, error middleware and connection
time-outs. Request parsing, text, replies and streams live in `engine.server`; the server hands
`Sequence`s to the host and never touches the model."""
from __future__ import annotations

import asyncio
import itertools
import logging
import math
import time
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from engine.server.body import INLINE_BYTES, BodyReader
from engine.server.errors import ApiError, BadRequest, error_response, model_not_found
from engine.server.fields import get_bool
from engine.server.generate import Generation
from engine.server.params import (chat_messages, chat_prompt, check_fields, check_model, encode, parse_chat,
                          parse_completion)
from engine.server.reply import collect, StreamWriter
from engine.config import ConfigError
from engine.scheduler.host import LaneHost
from engine.server.metrics import render_metrics

LISTEN_BACKLOG = 4096  # the kernel caps it at net.core.somaxconn
log = logging.getLogger("tfengine.server")


@dataclass(frozen=True)
class HttpConfig:
    """Limits that keep one client from holding the server (`tfengine serve` flags)."""

    max_body_mb: float = 8.0  # a larger body is a 413
    stall_timeout_s: float = 30.0  # a stream whose client reads nothing this long is cancelled
    idle_timeout_s: float = 30.0  # a connection with no request in progress (or half its headers)
    body_timeout_s: float = 30.0  # a request body must arrive within this

    def __post_init__(self):
        for name in ("max_body_mb", "stall_timeout_s", "idle_timeout_s", "body_timeout_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ConfigError(f"--{name.replace('_', '-')} must be a positive number, not {value!r}")


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
    root: str | None = None  # where the weights come from (a directory), as vLLM's `root`
    # generation_config.json's sampling defaults under request names (temperature, top_p, top_k,
    # max_tokens; min_p / repetition_penalty are not implemented): applied to fields a request leaves out
    defaults: dict = field(default_factory=dict)

    @property
    def names(self) -> tuple[str, ...]:
        """Names a request's `model` may use: the served name, or the root."""
        return (self.name,) if not self.root else (self.name, self.root)


def _version() -> str:
    try:
        return metadata.version("tfbench")
    except metadata.PackageNotFoundError:
        return "0+unknown"


class Api:
    def __init__(self, host: LaneHost, model: ServedModel, http: HttpConfig | None = None):
        self.host, self.model, self.http = host, model, http or HttpConfig()
        self.started = time.time()
        self._ids = itertools.count(1)
        self.bodies = BodyReader(int(self.http.max_body_mb * 2 ** 20),
                                 max(65_536, 4 * model.max_model_len), self.http.body_timeout_s)
        self.active: dict[object, int] = {}  # connection -> requests in progress
        self.last_end: dict[object, float] = {}  # connection -> when its last request ended

    def routes(self, app: web.Application) -> None:
        app.router.add_get("/health", self.health)
        app.router.add_get("/version", self.version)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/v1/models/{id:.+}", self.model_entry)
        app.router.add_get("/v1/engine", self.engine)
        app.router.add_get("/v1/trace", self.trace)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_post("/detokenize", self.detokenize)

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": _version()})

    def _card(self) -> dict:
        return {"id": self.model.name, "object": "model", "created": int(self.started), "owned_by": "tfengine",
                "root": self.model.root or self.model.name, "parent": None,
                "max_model_len": self.model.max_model_len, "vocab_size": self.model.vocab_size, "permission": []}

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [self._card()]})

    async def model_entry(self, request: web.Request) -> web.Response:
        if request.match_info["id"] not in self.model.names:
            raise model_not_found(request.match_info["id"][:200])
        return web.json_response(self._card())

    async def engine(self, request: web.Request) -> web.Response:
        cfg = asdict(self.host.cfg)
        return web.json_response({"engine": self.model.describe, "config": cfg,
                                  "commit": self.model.commit, "prefill_share": self.host.share,
                                  "nonce": self.model.nonce})

    async def trace(self, request: web.Request) -> web.Response:
        if self.host.trace is None:
            raise ApiError("the trace is off: start the engine with --trace", 404)
        return web.Response(body=self.host.trace.json(), content_type="application/json")

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=render_metrics(self.host), content_type="text/plain")

    # ---- tokenizer endpoints (vLLM's shapes) ---------------------------------------------------
    async def tokenize(self, request: web.Request) -> web.Response:
        body = await self._object(request)
        check_model(body, self.model.names)
        if "messages" in body:
            check_fields(body, {"model", "messages", "return_token_strs"},
                         {"add_generation_prompt": (True,), "add_special_tokens": (False,)})
            tokens = chat_prompt(self.model, chat_messages(body["messages"]))
        else:
            check_fields(body, {"model", "prompt", "add_special_tokens", "return_token_strs"}, {})
            if not isinstance(body.get("prompt"), str):
                raise BadRequest("'prompt' must be a string (or send 'messages')", "prompt")
            tokens = encode(self.model, body["prompt"], "prompt", get_bool(body, "add_special_tokens", True))
        strs = get_bool(body, "return_token_strs", False)
        return web.json_response({"count": len(tokens), "max_model_len": self.model.max_model_len, "tokens": tokens,
                                  "token_strs": [self.model.tokenizer.decode([t]) for t in tokens] if strs else None})

    async def detokenize(self, request: web.Request) -> web.Response:
        body = await self._object(request)
        check_model(body, self.model.names)
        check_fields(body, {"model", "tokens"}, {})
        tokens = body.get("tokens")
        vocab = self.model.vocab_size
        if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab
                                                   for t in tokens):
            raise BadRequest(f"'tokens' must be a list of token ids in 0..{vocab - 1}", "tokens")
        return web.json_response({"prompt": self.model.tokenizer.decode(tokens)})

    async def _object(self, request: web.Request) -> dict:
        body = await self.bodies.json(request)
        if not isinstance(body, dict):
            raise BadRequest("the request body must be a JSON object")
        return body

    # ---- generation -----------------------------------------------------------------------------
    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        body = await self.bodies.json(request)
        parse = parse_chat if chat else parse_completion
        if request.get("body_bytes", 0) > INLINE_BYTES:  # tokenizing a long text: off the loop
            req = await asyncio.to_thread(parse, body, self.model)
        else:
            req = parse(body, self.model)
        gen = Generation(self.host, self.model, req)
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{next(self._ids)}"
        gen.submit()
        try:
            if req.stream:
                return await StreamWriter(request, gen, rid, self.http.stall_timeout_s).run()
            return await collect(gen, rid)
        except asyncio.CancelledError:
            log.info("%s: the client went away", rid)
            raise
        finally:
            gen.cancel()  # frees the lanes of choices still running (a no-op for finished ones)

    # ---- connections ------------------------------------------------------------------------------
    @web.middleware
    async def middleware(self, request: web.Request, handler) -> web.StreamResponse:
        """Every error as JSON in OpenAI's shape; requests in progress counted per connection."""
        conn = request.protocol
        self.active[conn] = self.active.get(conn, 0) + 1
        try:
            return await handler(request)
        except ApiError as exc:
            return error_response(exc.status, exc.message, exc.param)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            allow = exc.headers.get("Allow")
            message = {404: f"no route for {request.method} {request.path[:200]}",
                       405: f"{request.method} is not allowed on {request.path[:200]} (allowed: {allow})",
                       413: "the request body is too large (tfengine serve --max-body-mb)"}.get(exc.status, exc.reason)
            return error_response(exc.status, message, headers={"Allow": allow} if allow else None)
        except ConnectionResetError:  # an ordinary disconnect: info, not an ERROR traceback
            log.info("%s %s: the client went away", request.method, request.path[:200])
            return web.Response(status=499)  # never sent: the connection is gone
        except Exception as exc:  # a bug: say so in JSON, keep serving
            log.exception("%s %s failed", request.method, request.path[:200])
            return error_response(500, f"internal error: {type(exc).__name__}", kind="server_error")
        finally:
            self.active[conn] -= 1
            self.last_end[conn] = time.monotonic()

    async def reap_idle(self, server: web.Server) -> None:
        """Close connections that have had no request in progress for idle_timeout_s: a client
        that sends half its headers, or keeps an idle connection open, cannot hold an fd."""
        first_seen: dict[object, float] = {}
        period = min(1.0, self.http.idle_timeout_s / 4)
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            live = server.connections
            for conn in live:
                since = max(first_seen.setdefault(conn, now), self.last_end.get(conn, 0.0))
                if not self.active.get(conn) and now - since > self.http.idle_timeout_s:
                    conn.force_close()
            alive = set(live)
            for table in (first_seen, self.last_end, self.active):
                for conn in [c for c in table if c not in alive and not self.active.get(c)]:
                    table.pop(conn, None)


def build_app(host: LaneHost, model: ServedModel, http: HttpConfig | None = None) -> tuple[web.Application, Api]:
    http = http or HttpConfig()
    api = Api(host, model, http)
    app = web.Application(client_max_size=int(http.max_body_mb * 2 ** 20), middlewares=[api.middleware])
    api.routes(app)
    return app, api


class _LogOncePerSecond:
    """asyncio's exception handler, each message at most once a second (accept() at the fd
    limit would otherwise fill the log)."""

    def __init__(self):
        self.last: dict[str, float] = {}
        self.dropped: dict[str, int] = {}

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict) -> None:
        key, now = str(context.get("message")), time.monotonic()
        if now - self.last.get(key, -1e9) < 1.0:
            self.dropped[key] = self.dropped.get(key, 0) + 1
            return
        dropped = self.dropped.pop(key, 0)
        if dropped:
            context = {**context, "message": f"{key} ({dropped} more in the last second, not shown)"}
        if len(self.last) > 1000:
            self.last.clear()
        self.last[key] = now
        exc = context.get("exception")
        if isinstance(exc, OSError):  # the fd limit, mostly: one line, no traceback
            log.warning("%s: %s", context["message"], exc)
        else:
            loop.default_exception_handler(context)


class _QuietProtocolErrors(logging.Filter):
    """A message that is not valid HTTP (aiohttp's parser answers 400 itself) is the client's
    fault: one INFO line at most once a second, not an ERROR traceback per message."""

    def __init__(self):
        super().__init__()
        self.last = 0.0

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, HttpProcessingError):
            return True
        now = time.monotonic()
        if now - self.last < 1.0:
            return False
        self.last = now
        record.levelno, record.levelname = logging.INFO, "INFO"
        record.msg, record.args = "malformed HTTP from a client: %s", (str(exc.message).splitlines()[0][:200],)
        record.exc_info = record.exc_text = None
        return True


_PROTOCOL_FILTER = _QuietProtocolErrors()


async def serve(host: LaneHost, model: ServedModel, bind: str, port: int, ready=None, sock=None,
                http: HttpConfig | None = None) -> None:
    """Serve until cancelled. The client's disconnect cancels its handler, and so its stream."""
    asyncio.get_running_loop().set_exception_handler(_LogOncePerSecond())
    logging.getLogger("aiohttp.server").addFilter(_PROTOCOL_FILTER)
    if model.root is None and Path(str(host.cfg.model)).is_dir():
        model.root = str(Path(str(host.cfg.model)).resolve())
    unserved = {k: v for k, v in model.defaults.items() if (k, v) not in (("min_p", 0), ("repetition_penalty", 1))
                and k in ("min_p", "repetition_penalty")}
    if unserved:
        log.warning("generation_config.json sets %s: not implemented, replies are sampled without it", unserved)
    app, api = build_app(host, model, http)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    # aiohttp's default listen backlog (128) drops the SYNs of a burst of more connections than
    # that, which the client resends after 1 s: of 1,024 connections opened at once on two busy
    # cores, 91 to 1,024 took 1 s or more to connect with it, 0 to 70 with this backlog
    site = web.SockSite(runner, sock, backlog=LISTEN_BACKLOG) if sock is not None else \
        web.TCPSite(runner, bind, port, backlog=LISTEN_BACKLOG)
    await site.start()
    reaper = asyncio.create_task(api.reap_idle(runner.server))
    api.bodies.warm()
    log.info("serving %s on http://%s:%d", model.name, bind, port)
    if ready is not None:
        ready()
    try:
        await asyncio.Event().wait()
    finally:
        reaper.cancel()
        api.bodies.close()
        await runner.cleanup()
