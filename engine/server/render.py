"""The JSON shapes of replies: completion / chat objects and stream chunks (OpenAI's, with
vLLM's extras: `token_ids` per choice, `stop_reason`; and tfbench's: `token_sha`, `seed`)."""
from __future__ import annotations

import hashlib
import json
import time

NO_LOGPROB = -9999.0  # JSON has no -inf (vLLM's stand-in)


def token_sha(ids: list[int]) -> str:
    """TensorFold's convention: sha256 over the comma-joined decimal ids, first 12 hex chars."""
    return hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()[:12]


def sse(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


def usage(prompt_tokens: int, completion_tokens: int, cached: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached}}


def envelope(rid: str, chat: bool, stream: bool, model: str, choices: list[dict]) -> dict:
    kind = ("chat.completion.chunk" if stream else "chat.completion") if chat else "text_completion"
    return {"id": rid, "object": kind, "created": int(time.time()), "model": model, "choices": choices}


class Logprobs:
    """Renders the host's TokenLogprob(logprob, top=[(id, logprob)]) records as OpenAI does:
    completions `{tokens, token_logprobs, top_logprobs, text_offset}`, chat `{content: [...]}`."""

    def __init__(self, tokenizer, k: int, as_ids: bool):
        self.tok, self.k, self.as_ids = tokenizer, k, as_ids

    def name(self, token: int) -> str:
        return f"token_id:{token}" if self.as_ids else self.tok.decode([token])

    def _bytes(self, token: int) -> list[int]:
        raw = getattr(self.tok, "decode_bytes", None)
        return list(raw([token]) if raw else self.tok.decode([token]).encode())

    def completion(self, tokens: list[int], records: list, offsets: list[int]) -> dict:
        out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": list(offsets)}
        for token, rec in zip(tokens, records):
            out["tokens"].append(self.name(token))
            out["token_logprobs"].append(_lp(rec.logprob))
            top = {self.name(t): _lp(lp) for t, lp in rec.top[: self.k]}
            top.setdefault(self.name(token), _lp(rec.logprob))
            out["top_logprobs"].append(top)
        return out

    def chat(self, tokens: list[int], records: list) -> dict:
        content = []
        for token, rec in zip(tokens, records):
            content.append({"token": self.name(token), "logprob": _lp(rec.logprob), "bytes": self._bytes(token),
                            "top_logprobs": [{"token": self.name(t), "logprob": _lp(lp), "bytes": self._bytes(t)}
                                             for t, lp in rec.top[: self.k]]})
        return {"content": content}


def _lp(x: float) -> float:
    x = float(x)
    return x if x > NO_LOGPROB else NO_LOGPROB  # also NaN -> the stand-in
