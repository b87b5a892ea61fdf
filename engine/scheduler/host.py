"""The lane host: one loop on one thread that owns the device. It takes requests and cancels
from other threads (the inbox), admits them into free lanes, runs the prompt steps and decode
rounds that the policy (engine/scheduler/policy.py) decides, and emits each stream's tokens. It moves plain
`Sequence` objects between queues and never touches tensors; the backend does.

A turn:
  1. take new requests and cancels; admit waiting requests into free lanes (prompt cache: the
     free lane holding the longest prefix of the prompt, rounded down to a cut boundary);
  2. run the prompts the policy sends in whole, then the long step it allows, if any (a backend
     declaring `batch_cuts` fills several short greedy prompts' cuts in one `prefill_many`
     forward, each cut with the bits it has alone);
  3. one decode round for every runnable stream; what a step or round emitted is handed to its
     consumer once (`Sequence.flush`), not once a token; in mixed mode, while a prompt waits,
     steps 2 and 3 are one forward (`backend.mixed`): the policy's cut and every runnable
     stream's row;
  4. with nothing to do, block until something arrives.
In split mode (a backend declaring `split`: backend.SplitBackend), while streams decode a long prompt's next cut is
launched on SMs of its own and the turns go on with decode rounds on the others; a turn lands the
cut once it is done (its first token out then) and launches the next.
"""
from __future__ import annotations

import contextlib
import logging
import secrets
import threading
import time
from collections import deque
from dataclasses import dataclass, replace
from typing import Callable

from engine.scheduler.backend import Backend, next_cut
from engine.config import SHORT_ROWS, EngineConfig
from engine.scheduler.policy import LanePolicy
from engine.scheduler.sequence import Sequence, Status
from engine.scheduler.trace import TraceRing

# Rows of short cuts a backend with prefill_many fills in one forward: a bigger forward makes
# every prompt in it wait for all of it. Eight 200-token prompts on the H200: one forward of 1,600
# rows gives all eight their first token at 50 ms; forwards of <= 1,024 (5 prompts, then 3) give
# the first five theirs at 35 ms.
BATCH_ROWS = 1024
# Split mode: cuts in flight at once. Two keep the prompt's SMs busy through the host's turn
# (the next cut waits on the device behind the one running); more would only lengthen a cancel.
SPLIT_DEPTH = 2

log = logging.getLogger("tfengine.host")


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
class LaneHost:
    backend: Backend
    cfg: EngineConfig
    clock: Callable[[], float] = time.monotonic
    drafter: object | None = None  # engine.scheduler.drafter: proposes tokens to check in spare rows

    def __post_init__(self):
        self.caps = self.backend.caps  # what the backend offers, declared (backend.Capabilities)
        self.policy = LanePolicy(self.cfg, self.clock, self.caps.cut_granule, self.caps.cut_sizes)
        self.rows = self.cfg.prefill_rows
        self.eos = frozenset(self.backend.eos_token_ids)
        self.free: list[int] = list(range(self.backend.parallel))
        self.lane_rows: dict[int, list[int]] = {}  # prompt rows a free lane still holds
        self.waiting: deque[Sequence] = deque()
        self.prompts: list[Sequence] = []  # in a lane, rows left to fill
        self.decoding: list[Sequence] = []
        self.counters = Counters()
        self.trace: TraceRing | None = TraceRing(self.cfg.trace_len) if self.cfg.trace else None
        self._inbox: list[Sequence] = []
        self._flushes: dict[Callable[[], None], None] = {}  # consumers to wake (Sequence.flush), in order
        self._cv = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None
        # split mode: a long prompt's cut on SMs of its own beside the rounds (backend.start_step)
        self.split = self.cfg.prefill_mode == "split" and self.caps.split
        # the cuts launched and not yet landed, oldest first: (stream, start, end, launched at); the
        # next is launched while one runs, so the prompt's SMs never wait for the host's turn
        self.inflight: deque[tuple[Sequence, int, int, float]] = deque()

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
        return sum(1 for s in self.decoding if self.policy.is_paused(s))

    @property
    def share(self) -> float:
        return self.policy.budget.share

    @property
    def debt(self) -> float:
        return self.policy.budget.debt

    def resumes(self, seq: Sequence) -> bool:
        """The server asks after each token its client drained: wake the loop if this took the
        stream off pause."""
        return self.policy.resumes(seq)

    # ---- the turn ---------------------------------------------------------------------------
    def turn(self) -> bool:
        """One turn of the loop. Returns False when there was nothing to do."""
        self._take_inbox()
        self._reap_cancels()
        self._admit()
        if self.policy.mixed and self._mixed_forward():
            self._flush()
            return True
        self._land_step(wait=False)
        worked = self._fill_prompts()
        runnable = [s for s in self.decoding if self.policy.runnable(s)]
        if runnable:
            self._decode_round(runnable)
            worked = True
        elif self.inflight:  # nothing to run beside the cuts: wait for them
            self._land_step(wait=True)
            worked = True
        self._flush()  # the round's tokens, every stream's, in one hand-off (and failed steps' ends)
        return worked

    def _emit(self, seq: Sequence, kind: str, payload) -> None:
        seq.emit(kind, payload)
        if seq.flush is not None:  # a queueing consumer: woken by _flush, once a step or round
            self._flushes[seq.flush] = None

    def _flush(self) -> None:
        if self._flushes:
            flushes, self._flushes = self._flushes, {}
            for flush in flushes:
                flush()

    def _take_inbox(self) -> None:
        with self._cv:
            new, self._inbox = self._inbox, []
        for seq in new:
            self.counters.requests += 1
            if seq.sampling.seed is None and not seq.sampling.greedy:
                # The server draws and reports one; a caller that did not gets one here.
                seq.sampling = replace(seq.sampling, seed=secrets.randbits(63))
            self.waiting.append(seq)

    def _has_cancel(self) -> bool:
        return any(s.cancel_requested for s in (*self.waiting, *self.prompts, *self.decoding))

    def _reap_cancels(self) -> None:
        if any(c[0].cancel_requested for c in self.inflight):
            self._land_step(wait=True)  # a lane is written until its cuts are done
        for seq in [s for s in self.waiting if s.cancel_requested]:
            self.waiting.remove(seq)
            self._end(seq, Status.CANCELLED, "cancelled")
        for seq in [s for s in (*self.prompts, *self.decoding) if s.cancel_requested]:
            self._end(seq, Status.CANCELLED, "cancelled")
        self._flush()

    def _admit(self) -> None:
        while self.waiting and self.free:
            seq = self._pick_waiting()
            lane, reuse = self.policy.pick_lane(self.free, self.lane_rows, seq.prompt)
            self.free.remove(lane)
            self.lane_rows.pop(lane, None)
            seq.lane, seq.filled, seq.cached = lane, reuse, reuse
            seq.status = Status.PREFILL
            self.prompts.append(seq)

    def _pick_waiting(self) -> Sequence:
        seq = next((s for s in self.waiting if not s.background), self.waiting[0])
        self.waiting.remove(seq)
        return seq

    def _fill_prompts(self) -> bool:
        if not self.prompts:
            self.policy.budget.forgive()  # no prompt waits: nothing to pay for, and no clock reads
            return False
        ordered = self.policy.fill_order(self.prompts)
        shorts = [s for s in ordered if self.policy.goes_whole(s)]
        worked = self.caps.batch_cuts and self._fill_together(shorts)
        for seq in shorts:
            while seq in self.prompts and not seq.cancel_requested:
                self._prompt_step(seq, timed=False)
                worked = True
        long_ = [s for s in ordered if s in self.prompts and not s.cancel_requested]
        decoders = any(self.policy.runnable(s) for s in self.decoding)
        if self.split and (decoders or self.inflight):
            return self._launch_step(long_) or worked
        step = self.policy.long_step(long_, bool(self.prompts), decoders)
        if step is not None:
            self._prompt_step(*step)
            worked = True
        return worked

    def _fill_together(self, shorts: list[Sequence]) -> bool:
        """A backend that fills several short cuts in one forward, each with the bits it has
        alone (`prefill_many`), takes the greedy short prompts' next cuts together, in fill order,
        up to BATCH_ROWS rows a forward; what is left goes one cut at a time as before."""
        worked = False
        while True:
            group, rows = [], 0
            for seq in shorts:
                if seq in self.prompts and not seq.cancel_requested and seq.sampling.plain:
                    end = next_cut(seq.filled, len(seq.prompt), self.rows)
                    if end - seq.filled <= SHORT_ROWS and rows + end - seq.filled <= BATCH_ROWS:
                        group.append((seq, seq.filled, end))
                        rows += end - seq.filled
            if len(group) < 2:
                return worked
            items = [(seq.lane, seq.prompt, start, end) for seq, start, end in group]
            try:
                toks, t0, dur = self._timed(False, lambda: self.backend.prefill_many(items))
            except Exception as exc:  # a failed forward ends the streams in it
                log.error("prompt steps of streams %s failed together: %s", [g[0].id for g in group], exc)
                for seq, _, _ in group:
                    self._end(seq, Status.FAILED, f"backend failure during prompt step: {exc}")
                return True
            worked = True
            for (seq, start, end), tok in zip(group, toks):
                self._after_step(seq, start, end, tok, None, t0, dur, False)

    def _launch_step(self, long_: list[Sequence]) -> bool:
        """Split mode with streams decoding: the first long prompt's next cuts launched on the prompt
        SMs, up to SPLIT_DEPTH in flight (one runs, the next waits behind it on the device); the
        rounds go on beside them. A sampled or logprobs stream's cuts run in turn on the whole
        device instead (prefill_step draws its first token)."""
        if self.inflight:  # the next cut of the prompt whose cut was launched last
            seq, _, start, _ = self.inflight[-1]  # (its end is this cut's start)
            if len(self.inflight) >= SPLIT_DEPTH or start == len(seq.prompt) or seq.cancel_requested:
                return False
        elif not long_:
            return False
        else:
            seq, start = long_[0], long_[0].filled
            if not seq.sampling.plain:
                self._prompt_step(seq, timed=False)
                return True
        end = next_cut(start, len(seq.prompt), self.rows)
        try:
            self.backend.start_step(seq.lane, seq.prompt, start, end)
        except Exception as exc:  # a failed step ends that stream only, once its cuts in flight land
            log.error("prompt step %d..%d of stream %d failed to launch: %s", start, end, seq.id, exc)
            self._land_step(wait=True)
            self._end(seq, Status.FAILED, f"backend failure during prompt step: {exc}")
            return True
        self.inflight.append((seq, start, end, self.clock() if self.trace is not None else 0.0))
        return True

    def _land_step(self, wait: bool) -> None:
        """The cuts in flight that are done (every one, waited for, with `wait`), oldest first: their
        rows filled, the prompt's first token out after its last cut; a cancelled stream keeps the
        rows (the prompt cache); a failed cut ends its stream once its other cuts have landed."""
        while self.inflight and (wait or self.backend.step_done()):
            seq, start, end, t0 = self.inflight.popleft()
            try:
                tok = self.backend.finish_step()
            except Exception as exc:
                log.error("prompt step %d..%d of stream %d failed: %s", start, end, seq.id, exc)
                while self.inflight and self.inflight[0][0] is seq:  # its cuts behind it: waited for, dropped
                    self.inflight.popleft()
                    with contextlib.suppress(Exception):  # the stream has failed already
                        self.backend.finish_step()
                self._end(seq, Status.FAILED, f"backend failure during prompt step: {exc}")
                continue
            if seq.cancel_requested or seq not in self.prompts:
                seq.filled = max(seq.filled, end)
                continue
            dur = self.clock() - t0 if self.trace is not None else 0.0
            self._after_step(seq, start, end, tok, None, t0, dur, False)

    def _mixes(self, runnable: list[Sequence]) -> bool:
        """Whether this turn may be one mixed forward: a backend that has one, streams that can
        decode, and every row greedy without drafts (the mixed forward's rows are plain ones;
        otherwise the turn runs as in stepped mode, with the same bits)."""
        if not (runnable and self.prompts and self.caps.mixed):
            return False
        if self.drafter is not None and self.cfg.drafts:
            return False
        return all(s.sampling.plain for s in (*runnable, *self.prompts))

    def _mixed_forward(self) -> bool:
        """One forward carrying the policy's cut and one row for every runnable stream. Returns
        False where this turn is not one (the stepped turn runs instead)."""
        runnable = [s for s in self.decoding if self.policy.runnable(s)]
        if not self._mixes(runnable):
            return False
        ordered = [s for s in self.policy.fill_order(self.prompts) if not s.cancel_requested]
        shorts = [s for s in ordered if self.policy.goes_whole(s)]
        # several short prompts waiting fill together in one forward, as in the other modes; one a
        # mixed forward left 64 streams arriving within milliseconds 12 % below whole on the H200
        if len(shorts) > 1 and self.caps.batch_cuts and self._fill_together(shorts):
            return True
        pick = self.policy.mixed_cut(ordered, self.caps.cut_free)
        if pick is None:  # the cost model's base first: a timed round of the decode rows alone
            self._decode_round(runnable)
            return True
        seq, start, end, sized = pick
        lanes = [s.lane for s in runnable]
        tokens = [s.output[-1] for s in runnable]
        positions = [len(s.prompt) + len(s.output) - 1 for s in runnable]
        cut = [(seq.lane, seq.prompt, start, end)]
        try:
            (firsts, new), t0, dur = self._timed(sized, lambda: self.backend.mixed(cut, lanes, tokens, positions))
        except Exception as exc:  # the forward's streams end, as a failed step's and round's would
            log.error("mixed forward (stream %d's cut %d..%d, %d streams) failed: %s", seq.id, start, end,
                      len(runnable), exc)
            for s in (seq, *runnable):
                self._end(s, Status.FAILED, f"backend failure during a mixed forward: {exc}")
            return True
        if sized:
            self.policy.cost.add_mixed(end - start, start, dur)
        self.counters.decode_rounds += 1
        if self.trace is not None:
            self.trace.add(t0, dur, "mixed", end - start, len(runnable), seq.id)
        self._emit_round(runnable, [[t] for t in tokens], new, None)
        self._after_step(seq, start, end, firsts[0], None, t0, dur, False)
        return True

    def _timed(self, charge: bool, call: Callable[[], object]) -> tuple[object, float, float]:
        """Run `call`, reading the clock around it only when the budget needs the time or the
        trace is on (the one clock rule). Returns (result, start, seconds); a raise passes."""
        if not charge and self.trace is None:
            return call(), 0.0, 0.0
        t0 = self.clock()
        out = call()
        return out, t0, self.clock() - t0

    def _prompt_step(self, seq: Sequence, timed: bool) -> None:
        start = seq.filled
        end = next_cut(start, len(seq.prompt), self.rows)
        lps: list | None = None if seq.sampling.plain else []

        def step():
            if lps is None:  # greedy: the backend's plain call, as it always was
                return self.backend.prefill_step(seq.lane, seq.prompt, start, end)
            return self.backend.prefill_step(seq.lane, seq.prompt, start, end, sampling=seq.sampling, logprobs=lps)
        try:
            tok, t0, dur = self._timed(timed, step)
        except Exception as exc:  # a failed step ends that stream only
            log.error("prompt step %d..%d of stream %d failed: %s", start, end, seq.id, exc)
            self._end(seq, Status.FAILED, f"backend failure during prompt step: {exc}")
            return
        self._after_step(seq, start, end, tok, lps, t0, dur, timed)

    def _after_step(self, seq: Sequence, start: int, end: int, tok, lps, t0: float, dur: float, timed: bool) -> None:
        self.counters.prompt_steps += 1
        seq.filled = end
        if timed:
            self.policy.budget.charge(dur)
        if self.trace is not None:
            self.trace.add(t0, dur, "prefill", end - start, 1, seq.id)
        if tok is not None:
            self.prompts.remove(seq)
            seq.status = Status.DECODE
            self.decoding.append(seq)
            self._emit_token(seq, tok, lps[0] if lps else None)
            self._flush()  # a first token goes out now, not after the turn's other prompts

    def _decode_round(self, runnable: list[Sequence]) -> None:
        paying = self.policy.round_timed(bool(self.prompts))
        feeds = self._feeds(runnable)
        lanes = [s.lane for s, toks in zip(runnable, feeds) for _ in toks]
        tokens = [t for toks in feeds for t in toks]
        positions = [len(s.prompt) + len(s.output) - 1 + i for s, toks in zip(runnable, feeds)
                     for i in range(len(toks))]
        lps: list | None = None if all(s.sampling.plain for s in runnable) else []
        # no prompt waits, one greedy row a stream: the next round is most likely this one's
        # streams fed their ids, which a backend that runs ahead launches now (engine/runner/ahead.py)
        ahead = self.caps.runs_ahead and lps is None and not self.prompts and len(tokens) == len(runnable)

        def round_():
            if ahead:
                return self.backend.decode(lanes, tokens, positions, ahead=True)
            if lps is None:  # every stream greedy: the backend's plain call
                return self.backend.decode(lanes, tokens, positions)
            sampling = [s.sampling for s, toks in zip(runnable, feeds) for _ in toks]
            return self.backend.decode(lanes, tokens, positions, sampling=sampling, logprobs=lps)
        try:
            new, t0, dur = self._timed(paying, round_)
        except Exception as exc:  # every stream of the round ends; the lanes serve again
            log.error("decode round failed: %s", exc)
            for seq in runnable:
                self._end(seq, Status.FAILED, f"backend failure during decode: {exc}")
            return
        self.counters.decode_rounds += 1
        if paying:
            self.policy.budget.pay(dur)
            if self.policy.mixed:
                self.policy.cost.add_round(dur)
        if self.trace is not None:
            self.trace.add(t0, dur, "decode", len(tokens), len(runnable), None)
        self._emit_round(runnable, feeds, new, lps)

    def _emit_round(self, runnable: list[Sequence], feeds: list[list[int]], new: list[int], lps) -> None:
        """Each stream's tokens of a round: its own, then the drafts that stood."""
        at = 0
        for seq, toks in zip(runnable, feeds):
            out = new[at:at + len(toks)]
            out_lps = lps[at:at + len(toks)] if lps else [None] * len(toks)
            at += len(toks)
            # out[0] is the round's own token; out[i] stands if the draft it was fed, toks[i],
            # is the token the target gave just before it. A sampled row's draw depends only on
            # its seed, position and logits, so this check keeps sampled replies exact too.
            keep = 1
            while keep < len(toks) and toks[keep] == out[keep - 1]:
                keep += 1
            self.counters.drafted += len(toks) - 1
            self.counters.accepted += keep - 1
            for tok, lp in zip(out[:keep], out_lps):
                if seq.done:
                    break
                self._emit_token(seq, tok, lp)

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

    def _emit_token(self, seq: Sequence, tok: int, logprob=None) -> None:
        if seq.sampling.logprobs is not None:
            seq.logprobs.append(logprob)
        seq.output.append(tok)
        seq.pushed()
        self.counters.tokens_out += 1
        self._emit(seq, "token", tok)
        if tok in self.eos and not seq.ignore_eos:  # any EOS ends it
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
            self._emit(seq, "done", reason)
        elif status == Status.CANCELLED:
            self.counters.cancelled += 1
            self._emit(seq, "done", "cancelled")
        else:
            self.counters.failed += 1
            self._emit(seq, "error", reason)

    def trace_steps(self) -> list[dict]:
        return self.trace.steps() if self.trace is not None else []

