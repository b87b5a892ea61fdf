"""The virtual-time player: requests at virtual send times, driven through the engine's real
`LaneHost` turn by turn on a simulated backend, recorded as the client records a real run.

Each step: every request the server has read by now (its send time, plus the profile's intake per
prompt token) is submitted, every cancel due is asked; one turn of the host runs, and the clock
moves on by the host's own time (the profile's `host` costs: a turn's, and a token's for each
token the turn emitted) on top of what its forwards cost. A turn that does nothing jumps the clock
to the next send or cancel. A stream never pauses: the simulated client takes each token as it
comes. A token's time is the virtual time it was emitted; the real client's own latency (HTTP,
its event loop) is not in the profile, so it is not here.

A request is sent at a time, or at another request's event plus seconds (the script's events:
`sent`, `first_token`, `done`, `cancelled`); it is cancelled at a time, some seconds after its
send, once it has some tokens, or once every request it waits `until` has ended.
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
from tensorfold_bench.client.stream import StreamRecord

EVENTS = ("sent", "first_token", "done", "cancelled")


class SimError(RuntimeError):
    """A simulation that cannot go on (the host stalled with streams left): one line."""


@dataclass(frozen=True)
class SimRequest:
    """One request at a virtual send time."""
    name: str
    prompt: list[int]
    max_tokens: int
    at: float = 0.0  # virtual send time, seconds; with `after`, seconds after that event
    after: tuple[str, str] | None = None  # (request, event): sent when it happens, plus `at`
    ignore_eos: bool = True
    background: bool = False  # priority "background"
    cancel_at: float | None = None  # the client closes the stream at this virtual time
    cancel_after: float | None = None  # ...or this many seconds after its send
    cancel_tokens: int | None = None  # ...or once it has received this many tokens
    until: tuple[str, ...] = ()  # ...or once every one of these requests has ended


@dataclass
class SimResult:
    records: dict[str, StreamRecord]
    trace: list[dict]  # the host's per-step trace (virtual times), when asked
    turns: int
    end: float  # the virtual time the last request ended
    events: dict[tuple[str, str], float] = field(default_factory=dict)  # (request, event) -> when
    host: LaneHost | None = field(default=None, repr=False)


def _check(requests: list[SimRequest]) -> None:
    names = [r.name for r in requests]
    if len(set(names)) != len(names):
        raise ValueError(f"request names must be unique: {names}")
    for r in requests:
        waits = set(r.until) | ({r.after[0]} if r.after else set())
        if waits - set(names):
            raise ValueError(f"request {r.name} waits for requests that are not played: {sorted(waits - set(names))}")
        if r.after and r.after[1] not in EVENTS:
            raise ValueError(f"request {r.name}: event {r.after[1]!r} is not one of {', '.join(EVENTS)}")


def needs(costs: Costs, cfg: EngineConfig, caps: Capabilities) -> None:
    """Refuse, before the first turn, a configuration whose forwards the profile has no costs for
    (ProfileError naming the profile and the kind)."""
    costs.prefill(1, 0)
    costs.decode(1, 1, 1)
    if cfg.prefill_mode == "mixed" and caps.mixed:
        costs.mixed(caps.cut_granule, 0, 1, 1, 1)
    if cfg.prefill_mode == "split" and caps.split:
        costs.split(cfg.decode_sms, cfg.prefill_rows, 0)


def play(requests: list[SimRequest], cfg: EngineConfig, costs: Costs, caps: Capabilities = Capabilities(), *,
         vocab_size: int = 151_936, trace: bool = False, start: float = 0.0, max_turns: int = 10_000_000,
         host_cls: type[LaneHost] = LaneHost) -> SimResult:
    """Play `requests` on the engine's lane host over a simulated backend; one record per request
    sent (a request waiting for an event that never happened is not sent, as in a real run).
    `host_cls`: the lane host to drive (another tree's, to compare two schedulers on one profile)."""
    _check(requests)
    needs(costs, cfg, caps)
    clock = VirtualClock(start)
    backend = SimulatedBackend(costs, cfg.parallel, cfg.max_model_len, vocab_size, caps, clock=clock,
                               decode_sms=cfg.decode_sms if caps.split else None)
    host = host_cls(backend, replace(cfg, trace=trace) if trace != cfg.trace else cfg, clock=clock)
    turn_s, token_s, intake = costs.host_turn, costs.host_token, costs.host_prompt_token
    order = {r.name: i for i, r in enumerate(requests)}
    waiting_on: dict[tuple[str, str], list[SimRequest]] = {}
    sends: list[tuple[float, int, SimRequest]] = []  # (send time, order, request)
    for r in requests:
        if r.after:
            waiting_on.setdefault(r.after, []).append(r)
        else:
            heapq.heappush(sends, (start + r.at, order[r.name], r))
    reads: list[tuple[float, int, SimRequest, float]] = []  # (read by the server, order, request, sent)
    cancels = [(r.cancel_at, order[r.name], r.name) for r in requests if r.cancel_at is not None]
    heapq.heapify(cancels)
    asked: set[str] = set()  # cancels asked, of requests the server may not have read yet
    records: dict[str, StreamRecord] = {}
    seqs: dict[str, Sequence] = {}
    events: dict[tuple[str, str], float] = {}
    ended: set[str] = set()
    untils = {r.name: set(r.until) for r in requests if r.until}

    def happened(name: str, kind: str, t: float) -> None:
        events[(name, kind)] = t
        for r in waiting_on.pop((name, kind), []):
            heapq.heappush(sends, (t + r.at, order[r.name], r))

    def on_end(name: str) -> None:
        ended.add(name)
        for other, need in untils.items():
            if other not in ended and need <= ended and other in seqs:
                seqs[other].cancel()

    def emitter(r: SimRequest, rec: StreamRecord, box: list):
        times, ids = rec.token_times, rec.token_ids

        def emit(kind: str, payload) -> None:
            seq = box[0]
            if kind == "token":
                times.append(clock.now)
                ids.append(payload)
                seq.drained()  # the simulated client drains at once: never paused
                if len(times) == 1:
                    happened(r.name, "first_token", clock.now)
                if r.cancel_tokens is not None and len(times) >= r.cancel_tokens:
                    seq.cancel()
                return
            rec.ended = clock.now
            rec.cached_tokens = seq.cached
            if kind == "error":
                rec.error = str(payload)
            elif payload == "cancelled":
                rec.cancelled = True
            else:
                rec.finish_reason = str(payload)
                rec.usage = {"prompt_tokens": len(seq.prompt), "completion_tokens": len(seq.output),
                             "total_tokens": len(seq.prompt) + len(seq.output),
                             "prompt_tokens_details": {"cached_tokens": seq.cached}}
            if kind != "error":
                happened(r.name, "cancelled" if rec.cancelled else "done", clock.now)
            on_end(r.name)
        return emit

    turns = 0
    while True:
        now = clock.now
        while sends and sends[0][0] <= now:  # the client sends; the server reads it a moment later
            t, i, r = heapq.heappop(sends)
            heapq.heappush(reads, (t + intake * len(r.prompt), i, r, t))
            records[r.name] = StreamRecord(r.name, "/v1/completions", len(r.prompt), r.max_tokens,
                                           scheduled=t, sent=t, counted_by="ids")
            happened(r.name, "sent", t)
            if r.cancel_after is not None:
                heapq.heappush(cancels, (t + r.cancel_after, i, r.name))
        while reads and reads[0][0] <= now:
            _, _, r, t = heapq.heappop(reads)
            box: list = [None]
            seq = Sequence(list(r.prompt), r.max_tokens, ignore_eos=r.ignore_eos, background=r.background,
                           arrival=now, emit=emitter(r, records[r.name], box))
            box[0] = seqs[r.name] = seq
            host.submit(seq)
            if r.name in asked or (r.name in untils and untils[r.name] <= ended):
                seq.cancel()  # closed before the server had read it
        while cancels and cancels[0][0] <= now:
            _, _, name = heapq.heappop(cancels)
            asked.add(name)
            if name in seqs and name not in ended:
                seqs[name].cancel()
        emitted = host.counters.tokens_out
        worked = host.turn()
        if backend.refused is not None:
            raise backend.refused
        if worked:
            turns += 1
            clock.advance(turn_s + token_s * (host.counters.tokens_out - emitted))
            if turns >= max_turns:
                raise SimError(f"the simulation ran {max_turns} turns without ending")
            continue
        upcoming = [q[0][0] for q in (sends, reads, cancels) if q]
        if upcoming:
            clock.to(min(upcoming))
            continue
        if host.running or host.waiting:
            left = sorted(n for n in seqs if n not in ended)
            raise SimError(f"the lane host stalled at {clock.now:.3f} s with {', '.join(left)} unfinished")
        break
    return SimResult(records, host.trace_steps() if trace else [], turns,
                     max((r.ended or 0.0 for r in records.values()), default=start), events, host)
