"""One generation request in flight: its choices (one `Sequence` each: prompts x n), the events
the host emits for them, and the text, stop and logprob bookkeeping per choice. The server
turns it into a stream of chunks or one reply object (engine.server.reply)."""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from engine.scheduler.sampling import SamplingParams
from engine.scheduler.sequence import Sequence
from engine.server.handoff import Outbox
from engine.server.params import GenRequest
from engine.server.render import Logprobs, token_sha, usage
from engine.server.text import ChoiceText


@dataclass
class Choice:
    index: int
    seq: Sequence
    text: ChoiceText
    finish: str | None = None
    stop_reason: str | int | None = None
    received: int = 0  # tokens the host emitted (indexes seq.logprobs)
    records: list = field(default_factory=list)  # logprob records of the reported tokens
    offsets: list = field(default_factory=list)  # text offset of each reported token
    sent_text: str = ""

    @property
    def tokens(self) -> list[int]:
        return self.text.ids


def make_sequence(req: GenRequest, prompt: list[int], index: int, max_model_len: int) -> Sequence:
    max_tokens = req.max_tokens if req.max_tokens is not None else max_model_len - len(prompt)
    sampling = SamplingParams(temperature=req.temperature, top_p=req.top_p, top_k=req.top_k,
                              seed=req.choice_seed(index), logprobs=req.logprobs)
    return Sequence(prompt=prompt, max_tokens=max_tokens, ignore_eos=req.ignore_eos, background=req.background,
                    draft=req.draft, arrival=time.monotonic(), sampling=sampling)


class Generation:
    def __init__(self, host, model, req: GenRequest):
        self.host, self.model, self.req = host, model, req
        self.events: asyncio.Queue = asyncio.Queue()
        self.logprobs = Logprobs(model.tokenizer, req.logprobs or 0, req.tokens_as_ids)
        self.choices: list[Choice] = []
        for p, prompt in enumerate(req.prompts):
            for i in range(req.n):
                index = p * req.n + i
                seq = make_sequence(req, prompt, index, model.max_model_len)
                text = ChoiceText(model.tokenizer, req.stop, req.stop_token_ids, req.include_stop_str)
                self.choices.append(Choice(index, seq, text))

    def submit(self) -> None:
        box = Outbox.of(asyncio.get_running_loop())
        put, deliver = box.put, self.events.put_nowait
        for c in self.choices:
            c.seq.emit = lambda kind, payload, i=c.index: put(deliver, (i, kind, payload))
            c.seq.flush = box.flush  # the host wakes the loop once a round (engine/server/handoff.py)
            self.host.submit(c.seq)

    @property
    def finished(self) -> bool:
        return all(c.finish is not None for c in self.choices)

    async def next(self) -> tuple[Choice, str, object]:
        """The next event of a choice still running: ("token", Step), ("done", reason) or
        ("error", message). Tokens past a choice's stop are dropped."""
        while True:
            index, kind, payload = await self.events.get()
            c = self.choices[index]
            if c.finish is not None:
                continue
            if kind == "token":
                return c, kind, self._token(c, payload)
            if kind == "done":
                c.finish = payload
                rest = c.text.finish()
                c.sent_text += rest
                return c, kind, rest
            c.finish = "error"
            return c, kind, payload

    def _token(self, c: Choice, token: int):
        c.received += 1
        c.offsets.append(len(c.sent_text))
        if self.req.logprobs is not None and len(c.seq.logprobs) >= c.received:
            c.records.append(c.seq.logprobs[c.received - 1])
        step = c.text.add(token)
        c.sent_text += step.text
        if step.finish:  # a stop string or stop token: the host stops at its next boundary
            c.finish, c.stop_reason = step.finish, step.stop_reason
            c.seq.cancel()
            self.host.wake()
        return step

    def drained(self, c: Choice) -> None:
        """The client has taken one more of this choice's tokens."""
        c.seq.drained()
        if self.host.resumes(c.seq):
            self.host.wake()  # it may have been paused on us

    def cancel(self) -> None:
        """Stop every choice still running (the client went away, or the reply is complete)."""
        for c in self.choices:
            if not c.seq.done:
                c.seq.cancel()
        self.host.wake()

    def logprobs_of(self, c: Choice, start: int = 0, end: int | None = None) -> dict | None:
        if self.req.logprobs is None:
            return None
        toks, recs = c.tokens[start:end], c.records[start:end]
        if self.req.chat:
            return self.logprobs.chat(toks, recs)
        return self.logprobs.completion(toks, recs, c.offsets[start:end])

    def usage(self) -> dict:
        firsts = self.choices[:: self.req.n]  # one per prompt
        return usage(sum(len(c.seq.prompt) for c in firsts), sum(len(c.tokens) for c in self.choices),
                     sum(c.seq.cached for c in firsts))

    def extras(self, c: Choice | None = None) -> dict:
        """tfbench's fields: the token hash (of one choice) and the seed that replays the reply."""
        out = {}
        if c is not None:
            out["token_sha"] = token_sha(c.tokens)
        elif len(self.choices) == 1:
            out["token_sha"] = token_sha(self.choices[0].tokens)
        if self.req.seed is not None and self.req.temperature > 0:
            out["seed"] = self.req.seed
        return out
