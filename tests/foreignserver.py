"""A stand-in for an OpenAI-compatible server that is not tfengine (vLLM-like by default), for
tests of the client, the launcher and the identity helpers without vLLM installed.

Unlike fakeserver (the tfengine stand-in) it has no /v1/engine, no /v1/trace and never sends
`token_sha`; its knobs select the other gaps a real server may have:

    python tests/foreignserver.py serve --port 8000
        [--ids asked|always|never]   token_ids per event: only when the request says
                                     return_token_ids (vLLM >= 0.10, the default), always, never
        [--logprobs refuse|ids]      a request with logprobs: 400 (vLLM started without a
                                     tokenizer), or "token_id:N" entries (--return-tokens-as-token-ids)
        [--usage asked|never]        usage in a final choices-less chunk when stream_options asks
        [--cached-tokens]            usage.prompt_tokens_details.cached_tokens (off, as vLLM's default)
        [--models-vocab]             vocab_size in /v1/models (off, as vLLM)
        [--tokens-per-chunk K]       K tokens per event (one text chunk)
        [--fingerprint FP]           system_fingerprint on each chunk
        [--no-health]                no /health (health falls back to /v1/models)
        [--root DIR]                 the model directory /v1/models names as `root`
"""
from __future__ import annotations

import sys
from pathlib import Path

from aiohttp import web

import fakeserver
from fakeserver import VOCAB, Fake, parser

CMD = [sys.executable, str(Path(__file__).resolve())]  # the stand-in's command line

VERSION = "0.0.1-standin"
REFUSAL = "Unable to get tokenizer because skip_tokenizer_init=True"


class Foreign(Fake):
    def check(self, body: dict) -> str | None:
        if body.get("model") != self.args.model:  # vLLM answers only to the name it serves
            return f"The model `{body.get('model')}` does not exist."
        if body.get("logprobs") not in (None, False) and self.args.logprobs == "refuse":
            return REFUSAL
        return None

    def wants_ids(self, body: dict) -> bool:
        return self.args.ids == "always" or (self.args.ids == "asked" and body.get("return_token_ids") is True)

    def token_event(self, body: dict, toks: list[int]) -> dict:
        choice: dict = {"index": 0, "text": "".join(f"t{t} " for t in toks), "finish_reason": None}
        if "messages" in body:
            choice["delta"] = {"content": choice.pop("text")}
        if self.wants_ids(body):
            choice["token_ids"] = toks
        if body.get("logprobs") not in (None, False) and self.args.logprobs == "ids":
            choice["logprobs"] = {"tokens": [f"token_id:{t}" for t in toks], "token_logprobs": [0.0] * len(toks)}
        ev = {"id": "cmpl-f", "object": "text_completion", "model": self.args.model, "choices": [choice]}
        if self.args.fingerprint:
            ev["system_fingerprint"] = self.args.fingerprint
        return ev

    def final_events(self, body: dict, prompt: list[int], out: list[int], cached: int) -> list[dict]:
        last = {"id": "cmpl-f", "object": "text_completion", "model": self.args.model,
                "choices": [{"index": 0, "text": "", "finish_reason": "length"}]}
        events = [last]
        asked = (body.get("stream_options") or {}).get("include_usage") is True
        if self.args.usage == "asked" and asked:
            usage = {"prompt_tokens": len(prompt), "completion_tokens": len(out),
                     "total_tokens": len(prompt) + len(out)}
            if self.args.cached_tokens:
                usage["prompt_tokens_details"] = {"cached_tokens": cached}
            events.append({"id": "cmpl-f", "object": "text_completion", "model": self.args.model, "choices": [],
                           "usage": usage})
        return events

    def endpoints(self) -> dict:
        return {"/health": self.health, "/v1/models": self.models, "/version": self.version,
                "POST /v1/completions": self.completions, "POST /v1/chat/completions": self.completions}

    async def health(self, request):
        if self.args.no_health:
            raise web.HTTPNotFound()
        return web.Response(text="")

    async def models(self, _):
        entry = {"id": self.args.model, "object": "model", "owned_by": "standin", "root": self.args.root or self.args.model,
                 "max_model_len": self.args.max_model_len}
        if self.args.models_vocab:
            entry["vocab_size"] = VOCAB
        return web.json_response({"object": "list", "data": [entry]})

    async def version(self, _):
        return web.json_response({"version": VERSION})


def main(argv=None) -> None:
    p = parser()
    p.add_argument("--ids", choices=["asked", "always", "never"], default="asked")
    p.add_argument("--logprobs", choices=["refuse", "ids"], default="refuse")
    p.add_argument("--usage", choices=["asked", "never"], default="asked")
    p.add_argument("--cached-tokens", action="store_true")
    p.add_argument("--models-vocab", action="store_true")
    p.add_argument("--tokens-per-chunk", type=int, default=1)
    p.add_argument("--fingerprint", default=None)
    p.add_argument("--no-health", action="store_true")
    p.add_argument("--root", default=None)
    fakeserver.main(argv, p, Foreign)


if __name__ == "__main__":
    main()
