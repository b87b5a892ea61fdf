"""A tiny stand-in for `tfengine serve`, for the harness's own tests: the same HTTP contract
(docs/API.md), a simulated device (one asyncio lock; a prompt row costs ROW_S, a decode round
ROUND_S), deterministic greedy-looking tokens. Whole prompts hold the device for the whole
prompt; stepped prompts release it after each cut. Not a scheduler model, just enough for the
harness to see stalls and hashes. It lives with the tests, not in the package: a user of
tfbench never needs it. Run it as a script (`CMD`); its directory is then on sys.path, which is
how foreignserver.py finds it.

    python tests/fakeserver.py serve --port 8000 [--prefill-mode whole] ...
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import socket
import sys
import time
from pathlib import Path

from aiohttp import web

ROW_S = 0.0004
ROUND_S = 0.01
VOCAB = 1000
CMD = [sys.executable, str(Path(__file__).resolve())]  # the stand-in's command line
# The first line of a generated server script that imports this module (it runs elsewhere).
IMPORT = f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})\nimport fakeserver\n"


def token_for(prompt: list[int], out: list[int]) -> int:
    h = hashlib.sha256((",".join(map(str, prompt[-8:])) + "|" + ",".join(map(str, out[-4:]))).encode()).digest()
    return int.from_bytes(h[:4], "little") % VOCAB


def sha(ids: list[int]) -> str:
    return hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()[:12]


class Fake:
    def __init__(self, args):
        self.args = args
        self.device = asyncio.Lock()
        self.trace: list[dict] = []
        self.seen: set[tuple] = set()

    async def run(self, kind: str, dur: float, rows: int) -> None:
        async with self.device:
            t = time.monotonic()
            await asyncio.sleep(dur)
            if self.args.trace:
                self.trace.append({"t": t, "dur": time.monotonic() - t, "kind": kind, "rows": rows,
                                   "streams": 1, "seq": None})

    async def prefill(self, prompt: list[int]) -> int:
        key = tuple(prompt)
        cached = len(prompt) - 1 if (not self.args.no_prompt_cache and key in self.seen) else 0
        self.seen.add(key)
        rows = len(prompt) - cached
        if self.args.prefill_mode == "whole" or rows <= 512:
            await self.run("prefill", rows * ROW_S, rows)
        else:
            r = self.args.prefill_rows
            for s in range(0, rows, r):
                n = min(r, rows - s)
                await self.run("prefill", n * ROW_S, n)
                await asyncio.sleep(0)
        return cached

    def bad(self, message: str) -> web.Response:
        return web.json_response({"error": {"message": message, "type": "invalid_request_error", "code": 400}},
                                 status=400)

    def check(self, body: dict) -> str | None:
        """A reason to refuse the request (400), or None. Stand-ins override."""
        return None

    def token_event(self, body: dict, toks: list[int]) -> dict:
        return {"id": "cmpl-1", "object": "text_completion", "choices": [
            {"index": 0, "text": "x" * len(toks), "token_ids": toks, "finish_reason": None}]}

    def final_events(self, body: dict, prompt: list[int], out: list[int], cached: int) -> list[dict]:
        usage = {"prompt_tokens": len(prompt), "completion_tokens": len(out), "total_tokens": len(prompt) + len(out),
                 "prompt_tokens_details": {"cached_tokens": cached}}
        return [{"id": "cmpl-1", "object": "text_completion", "choices": [
            {"index": 0, "text": "", "token_ids": [], "finish_reason": "length"}], "usage": usage,
            "token_sha": sha(out)}]

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        prompt = body.get("prompt")
        if "messages" in body:
            prompt = list(" ".join(m["content"] for m in body["messages"]).encode())
        if not isinstance(prompt, list) or not prompt:
            return self.bad("prompt must be token ids")
        refusal = self.check(body)
        if refusal:
            return self.bad(refusal)
        max_tokens = int(body.get("max_tokens", 16))
        per_event = max(1, getattr(self.args, "tokens_per_chunk", 1))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        cached = await self.prefill(prompt)
        out: list[int] = []
        pending: list[int] = []
        while len(out) < max_tokens:
            if out:
                await self.run("decode", ROUND_S, 1)
            tok = token_for(prompt, out)
            out.append(tok)
            pending.append(tok)
            if len(pending) == per_event or len(out) == max_tokens:
                await resp.write(f"data: {json.dumps(self.token_event(body, pending))}\n\n".encode())
                pending = []
        for ev in self.final_events(body, prompt, out, cached):
            await resp.write(f"data: {json.dumps(ev)}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        return resp

    def endpoints(self) -> dict:
        return {"/health": self.health, "/v1/models": self.models, "/v1/engine": self.engine,
                "/v1/trace": self.get_trace, "POST /v1/completions": self.completions,
                "POST /v1/chat/completions": self.completions}

    async def health(self, _):
        return web.json_response({"status": "ok"})

    async def models(self, _):
        return web.json_response({"object": "list", "data": [{"id": self.args.model, "object": "model",
                                                              "max_model_len": self.args.max_model_len}]})

    async def engine(self, _):
        a = self.args
        return web.json_response({"engine": {"device": "cpu", "device_name": "fake", "torch": None, "dtype": "float32",
                                             "model": a.model, "shape": {"vocab": VOCAB, "fake": True}},
                                  "config": {"model": a.model, "parallel": a.parallel, "prefill_rows": a.prefill_rows,
                                             "prefill_mode": a.prefill_mode, "prefill_share": a.prefill_share},
                                  "commit": None, "prefill_share": a.prefill_share, "nonce": a.nonce})

    async def get_trace(self, _):
        if not self.args.trace:
            return web.json_response({"error": {"message": "run with --trace", "code": 404}}, status=404)
        return web.json_response({"steps": self.trace})


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("cmd", choices=["serve"])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--port-file", default=None)
    p.add_argument("--nonce", default=None)
    p.add_argument("--model", default="tiny")
    p.add_argument("--prefill-mode", default="stepped")
    p.add_argument("--prefill-share", type=float, default=1.0)
    p.add_argument("--prefill-rows", type=int, default=256)
    p.add_argument("--parallel", type=int, default=4)
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--no-prompt-cache", action="store_true")
    p.add_argument("--trace", action="store_true")
    p.add_argument("--check", action="store_true")
    return p


def routes(fake: Fake) -> web.Application:
    app = web.Application()
    for path, handler in fake.endpoints().items():
        if path.startswith("POST "):
            app.router.add_post(path[5:], handler)
        else:
            app.router.add_get(path, handler)
    return app


async def serve(app: web.Application, args) -> None:
    """Bind (port 0: the system picks), write --port-file once serving, serve until killed."""
    sock = socket.create_server((args.host, args.port))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.SockSite(runner, sock).start()
    if args.port_file:
        tmp = Path(args.port_file + ".tmp")
        tmp.write_text(f"{sock.getsockname()[1]}\n")
        tmp.replace(args.port_file)
    await asyncio.Event().wait()


def main(argv=None, p: argparse.ArgumentParser | None = None, kind: type = Fake) -> None:
    args, _unknown = (p or parser()).parse_known_args(argv)
    if args.check:  # like tfengine's: validate, one line, no serving
        if args.prefill_mode not in ("stepped", "whole"):
            raise SystemExit(f"error: --prefill-mode must be stepped or whole, not {args.prefill_mode!r}")
        print(f"ok: {args.model} (fake)")
        return
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(routes(kind(args)), args))


if __name__ == "__main__":
    main()
