"""Reading a request body: a size limit (413 before reading past it), a body time-out (408),
the declared charset (an unknown one is a 400), and JSON parsing that cannot stall the other
streams. A small body is parsed inline (well under a millisecond); a large one in a worker
process, whose answer is bounded by `max_values` (so taking it back is cheap too)."""
from __future__ import annotations

import asyncio
import codecs
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from aiohttp import web

from engine.server.errors import ApiError, BadRequest
from engine.server.jsonparse import parse_checked

INLINE_BYTES = 64 * 1024  # json.loads of 64 KiB of token ids takes ~1.5 ms: fine on the loop


class BodyReader:
    def __init__(self, max_bytes: int, max_values: int, timeout_s: float):
        self.max_bytes, self.max_values, self.timeout_s = max_bytes, max_values, timeout_s
        self._pool: ProcessPoolExecutor | None = None

    async def json(self, request: web.Request) -> object:
        if request.content_length is not None and request.content_length > self.max_bytes:
            raise self.too_large(request.content_length)
        try:
            raw = await asyncio.wait_for(request.read(), self.timeout_s)
        except asyncio.TimeoutError:
            raise ApiError(f"the request body did not arrive within {self.timeout_s:g} s", 408) from None
        except web.HTTPRequestEntityTooLarge:
            raise self.too_large(None) from None
        request["body_bytes"] = len(raw)
        data: bytes | str = raw
        charset = request.charset
        if charset and codecs_name(charset) != "utf-8":
            try:
                data = raw.decode(codecs.lookup(charset).name)
            except LookupError:
                raise BadRequest(f"unknown charset {charset!r}: send UTF-8 JSON") from None
            except UnicodeDecodeError as exc:
                raise BadRequest(f"the body is not valid {charset}: {exc}") from None
        if len(raw) <= INLINE_BYTES:
            status, value = parse_checked(data, self.max_values)
        else:
            status, value = await self._parse_elsewhere(data)
        if status != "ok":
            raise BadRequest(str(value))
        return value

    def too_large(self, size: int | None) -> ApiError:
        what = f"{size} bytes" if size is not None else "larger"
        return ApiError(f"the request body is {what}; at most {self.max_bytes} bytes are accepted "
                        f"(tfengine serve --max-body-mb)", 413)

    def warm(self) -> None:
        """Start the parser's process now, in the background (the server calls it as it starts): spawning
        it costs ~70 ms, which the first long body would otherwise wait (an H200 receipt's 32,000-id prompt
        started its first cut 86 ms after its send, against 12-19 ms with the body parsed inline)."""
        fut = asyncio.get_running_loop().run_in_executor(self._spawned(), parse_checked, "{}", self.max_values)
        fut.add_done_callback(lambda f: f.cancelled() or f.exception())  # a failed warm-up: the first body says

    def _spawned(self) -> ProcessPoolExecutor:
        if self._pool is None:
            # spawn: the worker imports only the parser, never torch or the model
            self._pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
        return self._pool

    async def _parse_elsewhere(self, data: bytes | str) -> tuple[str, object]:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._spawned(), parse_checked, data, self.max_values)
        except BrokenProcessPool:
            self._pool = None
            raise ApiError("the body parser restarted: send the request again", 503) from None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


def codecs_name(charset: str) -> str | None:
    try:
        return codecs.lookup(charset).name
    except LookupError:
        return None
