"""Text out of token ids, one token at a time: UTF-8 safe (the tokenizer's
IncrementalDetokenizer never sends half a character), and `stop`
strings / `stop_token_ids` honoured as vLLM does (the stop string is not in the text unless
`include_stop_str_in_output`; text that could be the start of a stop string is held back)."""
from __future__ import annotations

from dataclasses import dataclass

from engine.models.tokenizer import IncrementalDetokenizer


@dataclass
class Step:
    text: str  # new text to send with this token ("" while held back)
    finish: str | None = None  # "stop" when a stop string or stop token ended the reply
    stop_reason: str | int | None = None


class ChoiceText:
    """One choice's text as its tokens arrive."""

    def __init__(self, tokenizer, stop: list[str], stop_ids: list[int], include_stop: bool):
        self.detok = IncrementalDetokenizer(tokenizer)
        self.stop, self.stop_ids, self.include_stop = stop, set(stop_ids), include_stop
        self.hold = max((len(s) for s in stop), default=1) - 1  # chars that may start a stop string
        self.text = ""  # decoded so far
        self.sent = 0  # chars of self.text already sent
        self.ids: list[int] = []  # the reply's token ids (a stop token included, as vLLM)
        self.stopped = False

    def add(self, token: int) -> Step:
        self.ids.append(token)
        if token in self.stop_ids:
            self.stopped = True
            return Step(self._send(len(self.text)), "stop", token)
        searched = max(0, len(self.text) - self.hold)
        self.text += self.detok.push(token)
        if self.stop:
            hit = self._find_stop(searched)
            if hit is not None:
                at, s = hit
                end = at + len(s) if self.include_stop else at
                self.text = self.text[:end]
                self.stopped = True
                return Step(self._send(end), "stop", s)
        return Step(self._send(max(self.sent, len(self.text) - self.hold)))

    def finish(self) -> str:
        """The reply ended (length, EOS, cancel): the rest of the text, held-back part included."""
        if self.stopped:
            return ""
        self.text += self.detok.flush()
        if self.stop:
            hit = self._find_stop(max(0, self.sent - self.hold))
            if hit is not None:
                self.text = self.text[:hit[0] + (len(hit[1]) if self.include_stop else 0)]
        return self._send(len(self.text))

    def _find_stop(self, start: int) -> tuple[int, str] | None:
        hits = [(i, s) for s in self.stop if (i := self.text.find(s, start)) >= 0]
        return min(hits) if hits else None

    def _send(self, upto: int) -> str:
        upto = max(upto, self.sent)
        out, self.sent = self.text[self.sent:upto], upto
        return out
