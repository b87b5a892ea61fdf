"""The virtual-time player: requests at virtual send times, driven through the engine's real
`LaneHost` turn by turn on a simulated backend, recorded as the client records a real run.

Each step: every request the server has read by now (its send time, plus the profile's intake per
prompt token) is submitted, every cancel due is asked; one
turn of the host runs, and the clock moves on by the host's own time (the profile's `host` costs:
a turn's, and a token's for each token the turn emitted) on top of what its forwards cost. A turn
that does nothing jumps the clock to the next arrival or cancel. A stream never pauses: the
simulated client takes each token as it comes. A token's time is the virtual time it was emitted;
the real client's own latency (HTTP, the event loop) is not in the profile, so it is not here.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field, replace

from engine.config import EngineConfig
from engine.scheduler.backend import Capabilities
from engine.scheduler.costs import Costs
from engine.scheduler.host import LaneHost
from engine.scheduler.sequence import Sequence
from engine.scheduler.simulated import SimulatedBackend, VirtualClock
from tensorfold_bench.client import StreamRecord


class SimError(RuntimeError):
    """A simulation that cannot go on (the host stalled with streams left): one line."""


@dataclass(frozen=True)
class SimRequest:
    """One request at a virtual send time."""
    name: str
    prompt: list[int]
    max_tokens: int
    at: float  # virtual send time, seconds
    ignore_eos: bool = True
    background: bool = False  # priority "background"
    cancel_at: float | None = None  # the client closes the stream then
    until: tuple[str, ...] = ()  # ...or once every one of these requests has ended


@dataclass
class SimResult:
    records: dict[str, StreamRecord]
    trace: list[dict]  # the host's per-step trace (virtual times), when asked
    turns: int
    end: float  # the virtual time the last request ended
    host: LaneHost = field(repr=False)


def play(requests: list[SimRequest], cfg: EngineConfig, costs: Costs, caps: Capabilities = Capabilities(), *,
         vocab_size: int = 151_936, trace: bool = False, start: float = 0.0, max_turns: int = 10_000_000) -> SimResult:
    """Play `requests` on the engine's lane host over a simulated backend; one record per request."""
    names = [r.name for r in requests]
    if len(set(names)) != len(names):
        raise ValueError(f"request names must be unique: {names}")
    clock = VirtualClock(start)
    backend = SimulatedBackend(costs, cfg.parallel, cfg.max_model_len, vocab_size, caps, clock=clock,
                               decode_sms=cfg.decode_sms if caps.split else None)
    if trace != cfg.trace:
        cfg = replace(cfg, trace=trace)
    host = LaneHost(backend, cfg, clock=clock)
    turn_s, token_s = costs.host_turn, costs.host_token

    records: dict[str, StreamRecord] = {}
    seqs: dict[str, Sequence] = {}
    ended: set[str] = set()
    # a request reaches the host once the server has read it (the profile's intake per prompt token)
    intake = costs.host_prompt_token
    due = {r.name: r.at + intake * len(r.prompt) for r in requests}
    arrivals = sorted(requests, key=lambda r: (due[r.name], names.index(r.name)))
    cancels = [(r.cancel_at, i, r.name) for i, r in enumerate(requests) if r.cancel_at is not None]
    heapq.heapify(cancels)
    waits = {r.name: set(r.until) for r in requests if r.until}
    unknown = {n for w in waits.values() for n in w} - set(names)
    if unknown:
        raise ValueError(f"`until` names requests that are not played: {sorted(unknown)}")

    def on_end(name: str) -> None:
        ended.add(name)
        for other, need in waits.items():
            if other not in ended and need <= ended and other in seqs:
                seqs[other].cancel()

    def emitter(rec: StreamRecord, seq_box: list) -> callable:
        times, ids = rec.token_times, rec.token_ids

        def emit(kind: str, payload) -> None:
            if kind == "token":
                times.append(clock.now)
                ids.append(payload)
                seq_box[0].drained()  # the simulated client drains at once: never paused
                return
            rec.ended = clock.now
            if kind == "error":
                rec.error = str(payload)
            elif payload == "cancelled":
                rec.cancelled = True
            else:
                rec.finish_reason = str(payload)
            seq = seq_box[0]
            rec.cached_tokens = seq.cached
            rec.usage = {"prompt_tokens": len(seq.prompt), "completion_tokens": len(seq.output),
                         "total_tokens": len(seq.prompt) + len(seq.output),
                         "prompt_tokens_details": {"cached_tokens": seq.cached}}
            if rec.cancelled:
                rec.usage = None
            on_end(rec.name)
        return emit

    nxt, turns = 0, 0
    while True:
        now = clock.now
        while nxt < len(arrivals) and due[arrivals[nxt].name] <= now:
            r = arrivals[nxt]
            nxt += 1
            rec = StreamRecord(r.name, "/v1/completions", len(r.prompt), r.max_tokens, scheduled=r.at,
                               sent=r.at, counted_by="ids")
            box: list = [None]
            seq = Sequence(list(r.prompt), r.max_tokens, ignore_eos=r.ignore_eos, background=r.background,
                           arrival=now, emit=emitter(rec, box))
            box[0] = seq
            records[r.name], seqs[r.name] = rec, seq
            host.submit(seq)
            if r.name in waits and waits[r.name] <= ended:
                seq.cancel()
        while cancels and cancels[0][0] <= now:
            _, _, name = heapq.heappop(cancels)
            if name in seqs and name not in ended:
                seqs[name].cancel()
        emitted = host.counters.tokens_out
        if host.turn():
            turns += 1
            clock.advance(turn_s + token_s * (host.counters.tokens_out - emitted))
            if turns >= max_turns:
                raise SimError(f"the simulation ran {max_turns} turns without ending")
            continue
        upcoming = [t for t in (due[arrivals[nxt].name] if nxt < len(arrivals) else None,
                                cancels[0][0] if cancels else None) if t is not None]
        if upcoming:
            clock.to(min(upcoming))
            continue
        if host.running or host.waiting:
            left = sorted(n for n in names if n not in ended)
            raise SimError(f"the lane host stalled at {clock.now:.3f} s with {', '.join(left)} unfinished")
        break
    return SimResult(records, host.trace_steps() if trace else [], turns,
                     max((r.ended or 0.0 for r in records.values()), default=start), host)
