"""A backend on a virtual clock: the lane host's protocol (engine/scheduler/backend.py), every call
advancing the clock by what a cost profile (engine/scheduler/costs.py) says it takes on the device
measured. The real `LaneHost` and `LanePolicy` run on it unchanged (`LaneHost(backend, cfg,
clock=backend.clock)`), so the schedule is the engine's own, in virtual seconds.

What it cannot know: token identities. A token is a fixed function of the lane's prompt, its
position and the token fed, so a reply's ids do not depend on the schedule (as the engine's do not)
but are not the model's; it never gives an EOS unless `eos_every` asks for one. Split mode: a
launched cut runs on the prompt partition from when the cut before it ends (or its launch, if
later) for the profile's split cut time; a round while a cut runs costs the round beside a cut;
a whole-device forward meanwhile pushes the cuts back by its own time. A whole-device cut costs
more as the device heats under cuts run back to back (Costs.heat, from the profile's fill).
"""
from __future__ import annotations

import math
from collections import deque
from typing import Sequence

from engine.scheduler.backend import Capabilities
from engine.scheduler.costs import Costs, ProfileError
from engine.scheduler.sampling import TokenLogprob

_M64 = (1 << 64) - 1


class VirtualClock:
    """A clock the backend moves: calls read it as the host reads time.monotonic."""

    def __init__(self, now: float = 0.0):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def to(self, t: float) -> None:
        """Jump forward to `t` (never back)."""
        if t > self.now:
            self.now = t


def _mix(*xs: int) -> int:
    """SplitMix64 over the values in turn: a cheap, well-spread hash of small integers."""
    h = 0x9E3779B97F4A7C15
    for x in xs:
        h = (h ^ (x & _M64)) + 0x9E3779B97F4A7C15 & _M64
        h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9 & _M64
        h = (h ^ (h >> 27)) * 0x94D049BB133111EB & _M64
        h ^= h >> 31
    return h


class SimulatedBackend:
    """The backend protocol in virtual time (Backend, BatchBackend, MixedBackend, SplitBackend)."""

    def __init__(self, costs: Costs, parallel: int, max_model_len: int, vocab_size: int,
                 caps: Capabilities = Capabilities(), *, clock: VirtualClock | None = None,
                 decode_sms: int | None = None, eos_token_ids: tuple[int, ...] = (0,), eos_every: int = 0):
        """decode_sms: split mode's decode partition (the profile's split samples at that count);
        eos_every: a token at a position that is a multiple of it is EOS (0: never)."""
        if caps.split and decode_sms is None:
            raise ValueError("a split backend needs decode_sms (the decode partition's SMs)")
        self.costs = costs
        self.parallel = parallel
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.eos_token_ids = tuple(eos_token_ids)
        self.caps = caps
        self.clock = clock or VirtualClock()
        self.decode_sms = decode_sms
        self.eos_every = eos_every
        self._prompt: list[int] = [0] * parallel  # the hash of the lane's whole prompt, once filled
        # split: the cuts launched and not landed, oldest first: (ends at, lane, tokens, start, end)
        self._cuts: deque[tuple[float, int, Sequence[int], int, int]] = deque()
        self._busy_until = 0.0  # when the prompt partition's last launched cut ends
        # the profile's refusal of a call it has no costs for: the host ends the call's streams as
        # failed, as for any backend failure, and the player stops the simulation with this message
        self.refused: ProfileError | None = None
        self._heat, self._heat_at = 0.0, self.clock.now  # the device's heat (Costs.heat), and when it was

    # ---- tokens -------------------------------------------------------------------------------
    def _fill(self, lane: int, tokens: Sequence[int], start: int, end: int) -> int | None:
        """The first token where the cut ends the prompt: a function of the whole prompt, however it
        was cut (ints' hashes are fixed across runs)."""
        if end < len(tokens):
            return None
        self._prompt[lane] = hash(tuple(tokens)) & _M64
        return self._token(lane, end - 1, tokens[end - 1])

    def _token(self, lane: int, position: int, fed: int) -> int:
        if self.eos_every and (position + 1) % self.eos_every == 0:
            return self.eos_token_ids[0]
        tok = _mix(self._prompt[lane], position, fed) % self.vocab_size
        while tok in self.eos_token_ids:
            tok = (tok + 1) % self.vocab_size
        return tok

    def _cost(self, ask, *args) -> float:
        try:
            return ask(*args)
        except ProfileError as exc:
            self.refused = self.refused or exc
            raise

    def _charge(self, seconds: float) -> None:
        self.clock.advance(seconds)

    def _whole_device(self, seconds: float) -> None:
        """A forward on the whole device. Beside a split cut that is running it starts at once and
        the running cut and those queued behind it end its time later: the GPU hands SMs over
        kernel by kernel, not cut by cut (on the H100, 256-token prompts arriving at 8/s beside a
        32,000-token prompt's cuts kept a first-token p99 of 64 ms while the cuts took 50-110 ms;
        waiting for each cut's end gave 548 ms in simulation). It does not model the two sharing
        the SMs, so the cuts come out later than on the device (B's first token 15 % late there)."""
        now = self.clock.now
        running = next((i for i, c in enumerate(self._cuts) if c[0] > now), None)
        self._charge(seconds)
        if running is None:
            return
        for i in range(running, len(self._cuts)):
            self._cuts[i] = (self._cuts[i][0] + seconds, *self._cuts[i][1:])
        self._busy_until += seconds

    # ---- the protocol ----------------------------------------------------------------------------
    def _heated(self, seconds: float) -> float:
        """A cut of `seconds` cold, as the device's heat makes it: cooled since the last cut, the heat
        at the cut's middle (it rises while the cut runs) prices it; the heat then at its end."""
        k, tau = self.costs.heat
        if not k:
            return seconds
        h = self._heat * math.exp(-max(0.0, self.clock.now - self._heat_at) / tau)
        mid = 1.0 - (1.0 - h) * math.exp(-seconds / (2 * tau))
        cost = seconds * (1.0 + k * mid)
        self._heat = 1.0 - (1.0 - h) * math.exp(-cost / tau)
        self._heat_at = self.clock.now + cost
        return cost

    def prefill_step(self, lane: int, tokens: Sequence[int], start: int, end: int, *,
                     sampling=None, logprobs: list | None = None) -> int | None:
        self._whole_device(self._heated(self._cost(self.costs.prefill, end - start, start)))
        tok = self._fill(lane, tokens, start, end)
        if tok is not None and logprobs is not None:
            logprobs.append(TokenLogprob(0.0))
        return tok

    def decode(self, lanes: Sequence[int], tokens: Sequence[int], positions: Sequence[int], *,
               sampling=None, logprobs: list | None = None, ahead: bool = False) -> list[int]:
        n, keys, longest = self._round(lanes, positions)
        if self.caps.split and self._cuts:
            beside = self.clock.now < self._busy_until
            self._charge(self._cost(self.costs.split_round, self.decode_sms, n, keys, longest, beside))
        else:
            self._charge(self._cost(self.costs.decode, n, keys, longest, ahead))
        out = [self._token(lane, pos, tok) for lane, tok, pos in zip(lanes, tokens, positions)]
        if logprobs is not None:
            logprobs.extend(TokenLogprob(0.0) for _ in out)
        return out

    def prefill_many(self, items: Sequence[tuple[int, Sequence[int], int, int]]) -> list[int | None]:
        rows = sum(end - start for _, _, start, end in items)
        self._whole_device(self._cost(self.costs.prefill_many, len(items), rows))
        return [self._fill(lane, tokens, start, end) for lane, tokens, start, end in items]

    def mixed(self, cuts: Sequence[tuple[int, Sequence[int], int, int]], lanes: Sequence[int],
              tokens: Sequence[int], positions: Sequence[int]) -> tuple[list[int | None], list[int]]:
        n, keys, longest = self._round(lanes, positions)
        cost = 0.0
        for _, _, start, end in cuts:
            cost += self._cost(self.costs.mixed, self._charged(end - start), start, n, keys, longest)
        self._whole_device(cost)
        firsts = [self._fill(lane, toks, start, end) for lane, toks, start, end in cuts]
        return firsts, [self._token(lane, pos, tok) for lane, tok, pos in zip(lanes, tokens, positions)]

    def _round(self, lanes: Sequence[int], positions: Sequence[int]) -> tuple[int, int, int]:
        """A round's (n, keys, longest) as the profile counts them: n the rows it runs at (the
        declared round sizes) or its streams, as the profile's rounds are counted."""
        n = self.caps.round_rows(lanes) if self.costs.rows_run_at else len(lanes)
        return n, sum(positions) + len(positions), max(positions, default=-1) + 1

    def _charged(self, rows: int) -> int:
        """A cut's rows as the forward runs them: its size's where cuts run at sizes (CUDA graphs)."""
        sizes = self.caps.cut_sizes
        return next((s for s in sizes if s >= rows), rows) if sizes else rows

    def start_step(self, lane: int, tokens: Sequence[int], start: int, end: int) -> None:
        if not self.caps.split:
            raise ProfileError("start_step on a backend that does not declare split")
        begin = max(self.clock.now, self._busy_until)
        self._busy_until = begin + self._cost(self.costs.split, self.decode_sms, end - start, start)
        self._cuts.append((self._busy_until, lane, tokens, start, end))

    def step_done(self) -> bool:
        return bool(self._cuts) and self.clock.now >= self._cuts[0][0]

    def finish_step(self) -> int | None:
        ends, lane, tokens, start, end = self._cuts.popleft()
        self.clock.to(ends)
        return self._fill(lane, tokens, start, end)
