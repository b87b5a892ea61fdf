"""A request's life in the engine, as plain Python the lane host moves between queues."""
from __future__ import annotations

import enum
import itertools
import threading
from dataclasses import dataclass, field
from typing import Callable

from engine.scheduler.sampling import SamplingParams, TokenLogprob

_ids = itertools.count()


class Status(enum.Enum):
    WAITING = "waiting"  # queued, no lane yet
    PREFILL = "prefill"  # in a lane, prompt rows still to fill
    DECODE = "decode"
    FINISHED = "finished"
    CANCELLED = "cancelled"
    FAILED = "failed"


@dataclass
class Sequence:
    prompt: list[int]
    max_tokens: int
    ignore_eos: bool = False
    background: bool = False  # priority: "background" fills after foreground prompts
    draft: bool = True
    arrival: float = 0.0
    sampling: SamplingParams = SamplingParams()  # greedy unless temperature > 0
    # emit(kind, payload) is called on the host thread: kind is "token" (an int), "done"
    # (finish reason) or "error" (a message). The server turns it into SSE events.
    emit: Callable[[str, object], None] = lambda kind, payload: None
    # set when emit only queues (engine/server/handoff.py): the host calls it once after a step's or
    # a round's emits, so the consumer is woken once a round, not once a token
    flush: Callable[[], None] | None = None
    id: int = field(default_factory=lambda: next(_ids))
    status: Status = Status.WAITING
    lane: int | None = None
    filled: int = 0  # prompt rows whose KV the lane holds
    cached: int = 0  # prompt rows reused from the prompt cache
    output: list[int] = field(default_factory=list)
    # with sampling.logprobs set: one per output token, appended before the token is emitted
    logprobs: list[TokenLogprob] = field(default_factory=list)
    undrained: int = 0  # tokens emitted but not yet taken by the client
    cancel_requested: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def rows_left(self) -> int:
        return len(self.prompt) - self.filled

    @property
    def done(self) -> bool:
        return self.status in (Status.FINISHED, Status.CANCELLED, Status.FAILED)

    def cancel(self) -> None:
        """Any thread: ask the host to stop this stream at its next boundary (between cuts)."""
        self.cancel_requested = True

    def drained(self, n: int = 1) -> None:
        """The client took n tokens off its queue (any thread)."""
        with self._lock:
            self.undrained -= n

    def pushed(self) -> None:
        with self._lock:
            self.undrained += 1
