"""The lane host: one loop on one thread that owns the device and decides, each turn, whether
to run a prompt step or a decode round. It moves plain `Sequence` objects between queues and
never touches tensors; the backend does.

A turn:
  1. take new requests and cancels; admit waiting requests into free lanes (prompt cache: the
     free lane holding the longest prefix of the prompt, rounded down to a cut boundary);
  2. every prompt with at most SHORT_ROWS rows left goes in whole, back to back, in fill order
     (in `whole` mode every prompt does);
  3. a longer prompt takes one step if it owes the decoders nothing;
  4. one decode round for every runnable stream (a stream whose client has not drained its
     queue is paused);
  5. with nothing to do, block until something arrives.

The prefill share p: a long step that took t seconds while streams could decode owes them
t (1 - p) / p seconds of decode rounds before the next long step. The clock is read only to
time such a step and to pay its debt down, so with no prompt waiting the loop is the plain
decode loop. Only the order of whole steps changes, never a cut: the bits do not depend on p.
"""
from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from .backend import Backend, next_cut
from .config import SHORT_ROWS, EngineConfig
from .sequence import Sequence, Status

log = logging.getLogger("tfengine.host")

DEBT_CAP_S = 3600.0  # debt saturates here: a tiny share can never grow it without bound
MIN_SHARE = 0.01


def checked_share(p: float) -> float:
    """A share below 0.01, NaN or infinite falls back to 1, with one warning."""
    if not isinstance(p, (int, float)) or math.isnan(p) or math.isinf(p) or p < MIN_SHARE or p > 1:
        log.warning("prefill share %r is outside [%.2f, 1]: using 1 (plain alternation)", p, MIN_SHARE)
        return 1.0
    return float(p)


@dataclass
class Counters:
    requests: int = 0
    prompt_steps: int = 0
    decode_rounds: int = 0
    tokens_out: int = 0
    drafted: int = 0
    accepted: int = 0
    finished: int = 0
    cancelled: int = 0
    failed: int = 0


@dataclass
class TraceStep:
    t: float
    dur: float
    kind: str  # prefill | decode
    rows: int  # prompt rows in a prefill step; streams in a decode round
    streams: int
    seq: int | None

    def as_dict(self) -> dict:
        return dict(t=self.t, dur=self.dur, kind=self.kind, rows=self.rows, streams=self.streams, seq=self.seq)


@dataclass
class LaneHost:
    backend: Backend
    cfg: EngineConfig
    clock: Callable[[], float] = time.monotonic
    drafter: object | None = None  # engine.drafter: proposes tokens to check in spare rows

    def __post_init__(self):
        self.share = checked_share(self.cfg.prefill_share)
        self.rows = self.cfg.prefill_rows
        self.whole = self.cfg.prefill_mode == "whole"
        self.free: list[int] = list(range(self.backend.parallel))
        self.lane_rows: dict[int, list[int]] = {}  # prompt rows a free lane still holds
        self.waiting: deque[Sequence] = deque()
        self.prompts: list[Sequence] = []  # in a lane, rows left to fill
        self.decoding: list[Sequence] = []
        self.debt = 0.0
        self.counters = Counters()
        self.trace: deque[TraceStep] | None = deque(maxlen=200_000) if self.cfg.trace else None
        self._inbox: list[Sequence] = []
        self._cv = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None

    # ---- any thread -------------------------------------------------------------------------
    def submit(self, seq: Sequence) -> None:
        with self._cv:
            self._inbox.append(seq)
            self._cv.notify()

    def wake(self) -> None:
        """Something changed outside the loop (a cancel, a drained queue): look again."""
        with self._cv:
            self._cv.notify()

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run_forever, name="lane-host", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()
        if self._thread:
            self._thread.join(timeout=10)

    def run_forever(self) -> None:
        while True:
            with self._cv:
                if self._stop:
                    return
            if not self.turn():
                with self._cv:
                    # Block; the timeout is only a safety net against a lost wake-up.
                    if not self._inbox and not self._stop and not self._has_cancel():
                        self._cv.wait(timeout=0.5)

    # ---- gauges (read by /metrics from another thread: plain reads are fine) ---------------
    @property
    def running(self) -> int:
        return len(self.prompts) + len(self.decoding)

    @property
    def paused(self) -> int:
        return sum(1 for s in self.decoding if not self._runnable(s))

    # ---- the turn ---------------------------------------------------------------------------
    def turn(self) -> bool:
        """One turn of the loop. Returns False when there was nothing to do."""
        self._take_inbox()
        self._reap_cancels()
        self._admit()
        worked = self._fill_prompts()
        runnable = [s for s in self.decoding if self._runnable(s)]
        if runnable:
            self._decode_round(runnable)
            worked = True
        return worked

    def _take_inbox(self) -> None:
        with self._cv:
            new, self._inbox = self._inbox, []
        for seq in new:
            self.counters.requests += 1
            self.waiting.append(seq)

    def _has_cancel(self) -> bool:
        return any(s.cancel_requested for s in (*self.waiting, *self.prompts, *self.decoding))

    def _reap_cancels(self) -> None:
        for seq in [s for s in self.waiting if s.cancel_requested]:
            self.waiting.remove(seq)
            self._end(seq, Status.CANCELLED, "cancelled")
        for seq in [s for s in (*self.prompts, *self.decoding) if s.cancel_requested]:
            self._end(seq, Status.CANCELLED, "cancelled")

    def _admit(self) -> None:
        while self.waiting and self.free:
            seq = self._pick_waiting()
            lane, reuse = self._pick_lane(seq.prompt)
            self.free.remove(lane)
            self.lane_rows.pop(lane, None)
            seq.lane, seq.filled, seq.cached = lane, reuse, reuse
            seq.status = Status.PREFILL
            self.prompts.append(seq)

    def _pick_waiting(self) -> Sequence:
        seq = next((s for s in self.waiting if not s.background), self.waiting[0])
        self.waiting.remove(seq)
        return seq

    def _pick_lane(self, prompt: list[int]) -> tuple[int, int]:
        """The free lane holding the longest prefix of `prompt`, and how many rows to reuse:
        rounded down to a cut boundary, so the resumed prompt runs the same cuts as a cold one,
        and short of the last cut, which must run to give the first token."""
        if not self.cfg.prompt_cache:
            return self.free[0], 0
        best, best_n = self.free[0], -1
        for lane in self.free:
            held = self.lane_rows.get(lane, ())
            n = _common_prefix(held, prompt)
            if n > best_n:
                best, best_n = lane, n
        last_cut_start = (len(prompt) - 1) // self.rows * self.rows
        reuse = min(best_n // self.rows * self.rows, last_cut_start)
        return best, max(reuse, 0)

    def _fill_order(self, prompts: list[Sequence]) -> list[Sequence]:
        """Foreground before background, then aged (waited past the threshold), then fewest rows
        left, then arrival."""
        if len(prompts) < 2:
            return prompts
        now = self.clock()
        return sorted(prompts, key=lambda s: (s.background, now - s.arrival <= self.cfg.aging_s,
                                              s.rows_left, s.arrival, s.id))

    def _fill_prompts(self) -> bool:
        if not self.prompts:
            self.debt = 0.0  # no prompt waits: nothing to pay for, and no clock reads
            return False
        ordered = self._fill_order(self.prompts)
        worked = False
        for seq in ordered:  # short prompts (all of them in whole mode) go in whole
            if self.whole or seq.rows_left <= SHORT_ROWS:
                while seq in self.prompts and not seq.cancel_requested:
                    self._prompt_step(seq, timed=False)
                    worked = True
        long_ = [s for s in ordered if s in self.prompts and not s.cancel_requested]
        runnable = any(self._runnable(s) for s in self.decoding)
        if not runnable:
            self.debt = 0.0  # debt is owed to runnable decoders only
        if long_ and self.debt <= 0.0:
            # Only a step taken while streams can decode builds debt, and only p < 1 needs it.
            self._prompt_step(long_[0], timed=runnable and self.share < 1.0)
            worked = True
        return worked

    def _prompt_step(self, seq: Sequence, timed: bool) -> None:
        start = seq.filled
        end = next_cut(start, len(seq.prompt), self.rows)
        t0 = self.clock() if (timed or self.trace is not None) else 0.0
        try:
            tok = self.backend.prefill_step(seq.lane, seq.prompt, start, end)
        except Exception as exc:  # a failed step ends that stream only
            log.error("prompt step %d..%d of stream %d failed: %s", start, end, seq.id, exc)
            self._end(seq, Status.FAILED, f"backend failure during prompt step: {exc}")
            return
        self.counters.prompt_steps += 1
        seq.filled = end
        if timed or self.trace is not None:
            t = self.clock() - t0
            if timed:
                self.debt = min(DEBT_CAP_S, self.debt + t * (1.0 - self.share) / self.share)
            if self.trace is not None:
                self.trace.append(TraceStep(t0, t, "prefill", end - start, 1, seq.id))
        if tok is not None:
            self.prompts.remove(seq)
            seq.status = Status.DECODE
            self.decoding.append(seq)
            self._emit_token(seq, tok)

    def _runnable(self, seq: Sequence) -> bool:
        return seq.undrained < self.cfg.out_queue and not seq.cancel_requested

    def _decode_round(self, runnable: list[Sequence]) -> None:
        paying = self.debt > 0.0
        if paying and not self.prompts:
            self.debt, paying = 0.0, False
        t0 = self.clock() if (paying or self.trace is not None) else 0.0
        feeds = self._feeds(runnable)
        lanes = [s.lane for s, toks in zip(runnable, feeds) for _ in toks]
        tokens = [t for toks in feeds for t in toks]
        positions = [len(s.prompt) + len(s.output) - 1 + i for s, toks in zip(runnable, feeds)
                     for i in range(len(toks))]
        try:
            new = self.backend.decode(lanes, tokens, positions)
        except Exception as exc:
            log.error("decode round failed: %s", exc)
            for seq in runnable:
                self._end(seq, Status.FAILED, f"backend failure during decode: {exc}")
            return
        self.counters.decode_rounds += 1
        if paying or self.trace is not None:
            t = self.clock() - t0
            if paying:
                self.debt = max(0.0, self.debt - t)
            if self.trace is not None:
                self.trace.append(TraceStep(t0, t, "decode", len(tokens), len(runnable), None))
        at = 0
        for seq, toks in zip(runnable, feeds):
            out = new[at:at + len(toks)]
            at += len(toks)
            # out[0] is the round's own token; out[i] stands if the draft it was fed, toks[i],
            # is the token the target gave just before it.
            keep = 1
            while keep < len(toks) and toks[keep] == out[keep - 1]:
                keep += 1
            self.counters.drafted += len(toks) - 1
            self.counters.accepted += keep - 1
            for tok in out[:keep]:
                if seq.done:
                    break
                self._emit_token(seq, tok)

    def _feeds(self, runnable: list[Sequence]) -> list[list[int]]:
        """The tokens each stream feeds this round: its last token, then any drafts, in the rows
        the round would otherwise pad."""
        feeds = [[s.output[-1]] for s in runnable]
        if self.drafter is None or not self.cfg.drafts:
            return feeds
        free = self.backend.parallel - len(runnable)
        for seq, feed in zip(runnable, feeds):
            if free <= 0:
                break
            if not seq.draft:
                continue
            room = min(free, seq.max_tokens - len(seq.output) - 1,
                       self.backend.max_model_len - len(seq.prompt) - len(seq.output) - 1)
            if room > 0:
                drafts = self.drafter.propose(seq.id, seq.prompt, seq.output, room)
                feed += drafts
                free -= len(drafts)
        return feeds

    def _emit_token(self, seq: Sequence, tok: int) -> None:
        seq.output.append(tok)
        seq.pushed()
        self.counters.tokens_out += 1
        seq.emit("token", tok)
        eos = getattr(self.backend, "eos_token_ids", None) or (self.backend.eos_token_id,)  # any EOS ends it
        if tok in eos and not seq.ignore_eos:
            self._end(seq, Status.FINISHED, "stop")
        elif len(seq.output) >= seq.max_tokens or len(seq.prompt) + len(seq.output) >= self.backend.max_model_len:
            self._end(seq, Status.FINISHED, "length")

    def _end(self, seq: Sequence, status: Status, reason: str) -> None:
        for queue in (self.prompts, self.decoding):
            if seq in queue:
                queue.remove(seq)
        if seq.lane is not None:
            lane, seq.lane = seq.lane, None
            # The lane keeps the prompt rows of its last complete cut: the prompt cache.
            keep = self.cfg.prompt_cache and status != Status.FAILED
            self.lane_rows[lane] = seq.prompt[: seq.filled] if keep else []
            self.free.append(lane)
        seq.status = status
        if self.drafter is not None:
            self.drafter.forget(seq.id)
        if status == Status.FINISHED:
            self.counters.finished += 1
            seq.emit("done", reason)
        elif status == Status.CANCELLED:
            self.counters.cancelled += 1
            seq.emit("done", "cancelled")
        else:
            self.counters.failed += 1
            seq.emit("error", reason)

    def trace_steps(self) -> list[dict]:
        return [s.as_dict() for s in list(self.trace or ())]


def _common_prefix(a, b) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
