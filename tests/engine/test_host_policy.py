"""The lane host's policy, driven turn by turn with a fake backend and an injected clock."""
import logging
import math

import pytest

from engine.config import EngineConfig
from engine.scheduler.backend import Capabilities
from engine.scheduler.host import LaneHost
from engine.faults import Faults, FaultyBackend
from engine.scheduler.policy import DEBT_CAP_S, PrefillBudget, checked_share
from engine.scheduler.sequence import Sequence, Status

R = 256
LONG = 2048  # 8 cuts: more than SHORT_ROWS, so it steps


class Clock:
    def __init__(self):
        self.now = 0.0
        self.reads = 0

    def __call__(self):
        self.reads += 1
        return self.now


class FakeBackend:
    """Advances the fake clock by a cost per prompt row and per decode round, and logs calls."""

    def __init__(self, clock, parallel=4, row_cost=1.0 / R, round_cost=0.25, fail_at=None):
        self.clock, self.parallel, self.max_model_len = clock, parallel, 100_000
        self.vocab_size, self.eos_token_ids = 1000, (999,)
        self.caps = Capabilities()
        self.row_cost, self.round_cost, self.fail_at = row_cost, round_cost, fail_at
        self.calls: list[tuple] = []

    def prefill_step(self, lane, tokens, start, end):
        self.calls.append(("prefill", lane, start, end))
        if self.fail_at is not None and (lane, start) == self.fail_at:
            raise RuntimeError("injected")
        self.clock.now += (end - start) * self.row_cost
        return (sum(tokens) + end) % 997 if end == len(tokens) else None

    def decode(self, lanes, tokens, positions):
        self.calls.append(("decode", tuple(lanes)))
        self.clock.now += self.round_cost
        return [(t * 31 + p) % 997 for t, p in zip(tokens, positions)]


def make(share=1.0, parallel=4, mode="stepped", cache=True, **kw):
    clock = Clock()
    backend = FakeBackend(clock, parallel=parallel, **kw)
    cfg = EngineConfig(parallel=parallel, prefill_rows=R, prefill_share=share, prefill_mode=mode,
                       prompt_cache=cache, out_queue=4)
    return LaneHost(backend, cfg, clock=clock), backend, clock


def seq(n, max_tokens=10_000, tag=0, **kw):
    events = []
    s = Sequence(prompt=[(tag * 7 + i) % 500 for i in range(n)], max_tokens=max_tokens, ignore_eos=True,
                 emit=lambda k, p: events.append((k, p)), **kw)
    s.events = events
    return s


def drain(*seqs):
    for s in seqs:
        s.undrained = 0


def start_decoder(host, backend):
    a = seq(10, tag=1)
    host.submit(a)
    host.turn()
    drain(a)
    backend.calls.clear()
    return a


def fill_beside(host, a, b):
    """Submit b and turn until it decodes, a draining as it goes."""
    host.submit(b)
    while b.status != Status.DECODE:
        host.turn()
        drain(a, b)


def kinds(calls):
    return "".join("P" if c[0] == "prefill" else "D" for c in calls)


def run_turns(host, n, *decoders):
    for _ in range(n):
        host.turn()
        drain(*decoders)


def test_share_one_alternates_step_and_round():
    host, backend, _ = make(share=1.0)
    a = start_decoder(host, backend)
    host.submit(seq(LONG, tag=2))
    run_turns(host, 7, a)
    # A long prompt steps to its end: its last 512 rows are cuts like the others, each followed
    # by a round (they once went in whole, back to back, owing nothing).
    assert kinds(backend.calls) == "PD" * 7


@pytest.mark.parametrize("share,rounds", [(0.5, 4), (0.25, 12)])
def test_debt_pays_rounds_after_each_step(share, rounds):
    # A step costs 1 s, a round 0.25 s: at p a step owes (1 - p) / p seconds of rounds,
    # the round in the step's own turn included.
    host, backend, _ = make(share=share)
    a = start_decoder(host, backend)
    host.submit(seq(LONG, tag=2))
    run_turns(host, rounds + 1, a)
    assert kinds(backend.calls) == "PD" + "D" * (rounds - 1) + "PD"
    assert host.debt == pytest.approx((1 - share) / share - 0.25)


@pytest.mark.parametrize("share,rounds", [(0.5, 4), (0.75, 2)])
def test_a_long_prompts_last_rows_are_charged_like_its_other_cuts(share, rounds):
    # Every cut of a long prompt, its last 512 rows too, owes (1 - p) / p of rounds: between any
    # two of its cuts the decoders get their rounds (1 s cuts, 0.25 s rounds; at 0.75 a cut owes
    # 1/3 s, paid by two rounds).
    host, backend, _ = make(share=share)
    a = start_decoder(host, backend)
    b = seq(LONG, tag=2)
    fill_beside(host, a, b)
    cuts = kinds(backend.calls).rstrip("D").split("P")[1:]
    assert len(cuts) == LONG // R
    assert cuts[:-1] == ["D" * rounds] * (LONG // R - 1)


def test_a_resumed_prompt_with_little_left_goes_in_whole():
    # Short is what a prompt must fill when admitted: 2,048 rows with 1,792 cached is one cut.
    host, backend, _ = make(share=0.5)
    a = start_decoder(host, backend)
    b = seq(LONG, tag=2)
    fill_beside(host, a, b)
    host.turn()
    drain(a, b)
    b.cancel_requested = True
    host.turn()
    again = seq(LONG, tag=2)
    host.submit(again)
    backend.calls.clear()
    host.turn()
    assert again.cached == LONG - R
    assert kinds(backend.calls)[:2] == "PD"
    assert again.status == Status.DECODE


def test_short_prompts_go_in_whole_before_the_next_round():
    host, backend, _ = make(share=0.5, parallel=9)
    a = start_decoder(host, backend)
    burst = [seq(300, tag=10 + i) for i in range(8)]  # 2 cuts each, short
    for s in burst:
        host.submit(s)
    host.turn()
    assert kinds(backend.calls) == "P" * 16 + "D"
    assert len(backend.calls[-1][1]) == 9  # all eight decode in the same round as A
    assert all(s.status == Status.DECODE for s in burst)
    assert host.debt == 0.0  # short prompts build no debt


def test_fill_order_foreground_then_aged_then_fewest_rows():
    host, backend, clock = make(parallel=4)
    clock.now = 100.0
    young_small = seq(600, tag=1, arrival=99.0)
    young_big = seq(1600, tag=2, arrival=99.0)
    aged_big = seq(2000, tag=3, arrival=10.0)  # waited 90 s > aging threshold 30 s
    background_small = seq(520, tag=4, arrival=0.0, background=True)
    for s in (background_small, young_big, aged_big, young_small):
        host.submit(s)
    host._take_inbox()
    host._admit()
    order = host.policy.fill_order(list(host.prompts))
    assert order == [aged_big, young_small, young_big, background_small]


def test_paused_stream_gets_no_rounds_and_builds_no_debt():
    host, backend, _ = make(share=0.5)
    a = start_decoder(host, backend)
    a.undrained = host.cfg.out_queue  # the client stopped reading
    host.submit(seq(LONG, tag=2))
    host.turn()
    host.turn()
    assert kinds(backend.calls) == "PP"  # no rounds for a paused stream, no debt to wait out
    assert host.paused == 1 and host.debt == 0.0


def test_debt_is_forgiven_when_every_decoder_pauses():
    host, backend, _ = make(share=0.25)
    a = start_decoder(host, backend)
    host.submit(seq(LONG, tag=2))
    host.turn()
    assert host.debt > 0
    a.undrained = host.cfg.out_queue
    host.turn()
    assert host.debt == 0.0 and kinds(backend.calls) == "PDP"


def test_clock_is_never_read_with_no_prompt_waiting():
    host, backend, clock = make(share=0.5)
    a = seq(10, tag=1)
    b = seq(20, tag=2)
    host.submit(a)
    host.submit(b)
    host.turn()
    clock.reads = 0
    run_turns(host, 50, a, b)
    assert clock.reads == 0
    assert kinds(backend.calls[-50:]) == "D" * 50


def test_whole_mode_runs_a_long_prompt_before_the_next_round():
    host, backend, _ = make(mode="whole")
    a = start_decoder(host, backend)
    host.submit(seq(LONG, tag=2))
    host.turn()
    assert kinds(backend.calls) == "P" * 8 + "D"


@pytest.mark.parametrize("bad", [0.001, 0.0, -1, 1.5, math.nan, math.inf])
def test_bad_share_falls_back_to_one_with_a_warning(bad, caplog):
    with caplog.at_level(logging.WARNING, logger="tfengine.policy"):
        assert checked_share(bad) == 1.0
    assert len(caplog.records) == 1 and "prefill share" in caplog.text


def test_debt_saturates():
    host, backend, _ = make(share=0.01, row_cost=100.0)  # a 25,600 s step owes 99x that
    a = start_decoder(host, backend)
    host.submit(seq(LONG, tag=2))
    host.turn()
    assert host.debt == pytest.approx(DEBT_CAP_S - 0.25)


def test_cancel_lands_between_cuts_and_the_lane_keeps_complete_cuts():
    host, backend, _ = make(share=1.0)
    b = seq(LONG, tag=2)
    host.submit(b)
    host.turn()
    host.turn()
    lane = b.lane
    b.cancel()
    host.turn()
    assert b.status == Status.CANCELLED and b.events[-1] == ("done", "cancelled")
    assert host.lane_rows[lane] == b.prompt[: 2 * R] and lane in host.free
    # The same prompt again resumes at the last complete cut, in the same lane.
    again = seq(LONG, tag=2)
    host.submit(again)
    backend.calls.clear()
    host.turn()
    assert again.lane == lane and again.cached == 2 * R
    assert backend.calls[0] == ("prefill", lane, 2 * R, 3 * R)


def test_prompt_cache_reuse_rounds_down_to_the_grid_and_leaves_the_last_cut():
    host, backend, _ = make(share=1.0)
    first = seq(700, max_tokens=1, tag=5)
    host.submit(first)
    run_turns(host, 3)  # a long prompt: a cut a turn
    assert first.status == Status.FINISHED
    longer = seq(900, max_tokens=1, tag=5)  # shares 700 rows: reuse 512, the grid boundary below
    host.submit(longer)
    host.turn()
    assert longer.cached == 512 and longer.status == Status.FINISHED
    same = seq(512, max_tokens=1, tag=5)  # fully cached, but its last cut must still run
    host.submit(same)
    host.turn()
    assert same.cached == 256 and same.status == Status.FINISHED


def test_no_prompt_cache_reuses_nothing():
    host, backend, _ = make(cache=False)
    first = seq(700, max_tokens=1, tag=5)
    host.submit(first)
    run_turns(host, 2)
    again = seq(700, max_tokens=1, tag=5)
    host.submit(again)
    host.turn()
    assert again.cached == 0


def test_failed_step_ends_that_stream_and_the_neighbour_keeps_going():
    host, backend, _ = make(share=1.0)
    a = start_decoder(host, backend)
    b = seq(LONG, tag=2)
    host.submit(b)
    host.turn()
    backend.fail_at = (b.lane, R)
    host.turn()
    assert b.status == Status.FAILED and b.events[-1][0] == "error"
    assert b.lane is None and len(host.free) == 3
    before = len(a.output)
    run_turns(host, 3, a)
    assert len(a.output) == before + 3 and a.status == Status.DECODE


def test_max_tokens_and_eos_finish_streams():
    host, backend, _ = make()
    s = seq(10, max_tokens=3, tag=3)
    host.submit(s)
    run_turns(host, 5, s)
    assert s.status == Status.FINISHED and len(s.output) == 3 and s.events[-1] == ("done", "length")
    assert host.free == [1, 2, 3, 0]


def test_blocks_instead_of_spinning_when_idle():
    host, backend, _ = make()
    assert host.turn() is False


# ---- the prefill budget alone ----------------------------------------------------------------
def test_budget_charges_a_step_at_the_share_and_rounds_pay_it_down():
    b = PrefillBudget(0.25)
    assert not b.owes
    b.charge(1.0)  # a 1 s step at p = 1/4 owes 3 s of rounds
    assert b.debt == pytest.approx(3.0) and b.owes
    b.pay(1.0)
    assert b.debt == pytest.approx(2.0)
    b.pay(5.0)
    assert b.debt == 0.0 and not b.owes  # paid off, never negative


def test_budget_reads_the_clock_only_for_steps_that_can_owe():
    assert PrefillBudget(0.5).times_step(decoders_waiting=True)
    assert not PrefillBudget(0.5).times_step(decoders_waiting=False)  # no one to owe
    assert not PrefillBudget(1.0).times_step(decoders_waiting=True)  # p = 1 never owes


@pytest.mark.parametrize("prompts,decoders,kept", [(True, True, True), (True, False, False),
                                                   (False, True, False), (False, False, False)])
def test_budget_forgives_when_either_side_is_gone(prompts, decoders, kept):
    b = PrefillBudget(0.5)
    b.charge(2.0)
    b.settle(prompts_waiting=prompts, decoders_waiting=decoders)
    assert b.debt == (pytest.approx(2.0) if kept else 0.0)


def test_budget_saturates_and_a_bad_share_means_one():
    b = PrefillBudget(0.01)
    b.charge(1e6)
    assert b.debt == DEBT_CAP_S
    assert PrefillBudget(math.nan).share == 1.0


def test_one_pause_rule_for_the_host_and_the_server():
    host, backend, _ = make()  # out_queue 4
    a = start_decoder(host, backend)
    a.undrained = 4
    assert host.policy.is_paused(a) and not host.policy.runnable(a) and host.paused == 1
    a.drained()  # the server: the client took one token
    assert host.resumes(a) and host.policy.runnable(a) and host.paused == 0
    a.drained()
    assert not host.resumes(a)  # only the drain that crosses the threshold wakes the loop
    a.cancel()
    assert not host.policy.runnable(a)


def test_failed_decode_round_ends_its_streams_and_frees_their_lanes_without_cache():
    host, backend, _ = make(parallel=3)
    a, b = seq(10, tag=1), seq(12, tag=2)
    host.backend = FaultyBackend(backend, Faults(fail_round=2))
    host.submit(a)
    host.submit(b)
    run_turns(host, 1, a, b)
    lanes = {a.lane, b.lane}
    host.turn()  # round 2 fails
    for s in (a, b):
        assert s.status == Status.FAILED and s.events[-1][0] == "error" and "decode round 2" in s.events[-1][1]
    assert sorted(host.free) == [0, 1, 2] and all(host.lane_rows[lane] == [] for lane in lanes)
    c = seq(10, tag=1, max_tokens=3)
    host.submit(c)
    run_turns(host, 3, c)
    assert c.status == Status.FINISHED and c.cached == 0 and host.counters.failed == 2


def test_pick_lane_prefers_the_prefix_then_the_lowest_lane_with_no_cut_to_lose():
    host, _, _ = make(parallel=8)
    pick = host.policy.pick_lane
    cached = [(3 * i) % 500 for i in range(600)]  # two complete cuts and more
    free = [6, 7, 0, 1, 2, 3, 4, 5]  # the order they were freed
    assert pick(free, {}, [1] * 10) == (0, 0)  # not 6: streams then sit in adjacent lanes
    rows = {0: cached, 1: [1] * 5}  # lane 1's 5 rows are no complete cut: nothing to lose there
    assert pick(free, rows, [2] * 10) == (1, 0)
    assert pick(free, rows, cached[:300] + [9] * 50) == (0, R)  # the prefix still wins
    every = {lane: [lane + 1] * R for lane in free}
    assert pick(free, every, [1000] * 10) == (6, 0)  # all hold a cut: the one freed longest ago


def test_four_streams_after_a_sweep_and_a_long_prompt_take_adjacent_lanes():
    """serve_compare's order: 2 short streams, a long prompt, then 4 streams."""
    host, _, _ = make(share=1.0, parallel=8)
    warm = [seq(10, max_tokens=2, tag=t) for t in (1, 2)]
    for s in warm:
        host.submit(s)
    run_turns(host, 4, *warm)
    long_ = seq(600, max_tokens=1, tag=3)
    host.submit(long_)
    run_turns(host, 4, long_)
    four = [seq(10, max_tokens=50, tag=t) for t in (4, 5, 6, 7)]
    for s in four:
        host.submit(s)
    host.turn()
    lanes = sorted(s.lane for s in four)
    assert lanes == list(range(lanes[0], lanes[0] + 4)) and lanes[0] > 0  # adjacent; the cut in 0 kept
    assert host.lane_rows[0] == long_.prompt


def test_short_prompts_run_the_same_schedule_whole_or_stepped():
    """The default sweep's prompts (200 tokens) are short: whole and stepped at any share issue the
    same backend calls in the same order, so a sweep's stepped-against-whole difference on them can
    only be the machine's noise (or the server's start), never the schedule."""
    def calls(mode, share):
        host, backend, _ = make(share=share, mode=mode, parallel=8)
        a = start_decoder(host, backend)
        streams = [a]
        for i in range(7):  # streams arriving while others decode, as a sweep's burst lands
            s = seq(200, max_tokens=30, tag=20 + i)
            host.submit(s)
            streams.append(s)
            run_turns(host, 3, *streams)
        run_turns(host, 40, *streams)
        return backend.calls
    whole = calls("whole", 1.0)
    assert kinds(whole).count("P") == 7 and calls("stepped", 0.5) == whole == calls("stepped", 1.0)
