"""Mixed mode's policy, driven turn by turn with a fake backend and an injected clock: the order
of cuts and rounds, the budget shrinking the cut as the prompt's context grows, short prompts
first, a decoder's longest pause one forward."""
import pytest

from engine.scheduler.backend import Capabilities
from engine.config import SHORT_ROWS, ConfigError, EngineConfig
from engine.scheduler.forward_cost import ForwardCost
from engine.scheduler.host import LaneHost
from engine.scheduler.sampling import SamplingParams
from engine.scheduler.sequence import Status
from lanes import seq, start_decoder

R = 256
BASE, ROW, KEY = 0.010, 0.0002, 2e-8  # a forward: 10 ms for the decode rows, 0.2 ms a cut row, per key read


class Clock:
    def __init__(self):
        self.now, self.reads = 0.0, 0

    def __call__(self):
        self.reads += 1
        return self.now


class MixedBackend:
    """Advances the clock as the cost model's own form (base + rows + keys read) and logs calls."""

    def __init__(self, clock, cut_free=True, fail_mixed=False, key=KEY, cut_sizes=None, fixed=0.0, row=ROW,
                 granule=16, batch_cuts=False):
        self.clock, self.parallel, self.max_model_len = clock, 4, 100_000
        self.fixed, self.row = fixed, row
        self.vocab_size, self.eos_token_ids = 1000, (999,)
        self.fail_mixed, self.key = fail_mixed, key
        self.cut_sizes = cut_sizes
        self.caps = Capabilities(cut_granule=granule, cut_sizes=cut_sizes, cut_free=cut_free, batch_cuts=batch_cuts,
                                 mixed=True)
        self.calls: list[tuple] = []

    def _first(self, tokens, end):
        return (sum(tokens) + end) % 997 if end == len(tokens) else None

    def prefill_step(self, lane, tokens, start, end):
        self.calls.append(("prefill", lane, start, end))
        self.clock.now += BASE + (end - start) * ROW + self.key * (end - start) * (start + (end - start) / 2)
        return self._first(tokens, end)

    def decode(self, lanes, tokens, positions):
        self.calls.append(("decode", tuple(lanes)))
        self.clock.now += BASE
        return [(t * 31 + p) % 997 for t, p in zip(tokens, positions)]

    def mixed(self, cuts, lanes, tokens, positions):
        (lane, toks, start, end), = cuts
        self.calls.append(("mixed", lane, start, end, tuple(lanes)))
        if self.fail_mixed:
            raise RuntimeError("injected")
        n = end - start
        if self.cut_sizes:  # a forward at the size holding the cut (a graph of that size)
            n = next((z for z in self.cut_sizes if z >= n), n)
        self.clock.now += BASE + self.fixed + n * self.row + self.key * n * (start + n / 2)
        return [self._first(toks, end)], [(t * 31 + p) % 997 for t, p in zip(tokens, positions)]


def make(budget_ms=40.0, **kw):
    clock = Clock()
    backend = MixedBackend(clock, **kw)
    cfg = EngineConfig(parallel=4, prefill_rows=R, prefill_mode="mixed", mixed_budget_ms=budget_ms, out_queue=10**9)
    return LaneHost(backend, cfg, clock=clock), backend, clock


def run_until_filled(host, *prompts, limit=10_000):
    for _ in range(limit):
        if all(p.status == Status.DECODE for p in prompts):
            return
        host.turn()
    raise AssertionError("prompts never filled")


def test_each_forward_carries_a_cut_and_every_decoder_and_the_cuts_tile_the_prompt():
    host, backend, _ = make()
    a = start_decoder(host, backend)
    b = seq(8000, tag=2)
    host.submit(b)
    before = len(a.output)
    run_until_filled(host, b)
    calls = backend.calls
    assert calls[0] == ("decode", (a.lane,))  # the decode rows alone, timed once: the cost's base
    assert all(c[0] == "mixed" and c[4] == (a.lane,) for c in calls[1:])
    cuts = [(c[2], c[3]) for c in calls[1:]]
    assert cuts[0][0] == 0 and cuts[-1][1] == len(b.prompt)
    assert all(e == s2 for (_, e), (s2, _) in zip(cuts, cuts[1:]))  # contiguous, in order
    # A's longest pause is one forward: one token from every call
    assert len(a.output) - before == len(calls)
    # the budget chose sizes off the grid; the prompt's last grid cut ran whole, on the grid
    assert any(e % R for _, e in cuts[:-1])
    assert cuts[-1] == ((len(b.prompt) - 1) // R * R, len(b.prompt))
    assert b.output  # B got its first token from its last cut


def test_the_budget_holds_the_forward_and_shrinks_the_cut_as_the_context_grows():
    host, backend, clock = make(budget_ms=40.0)
    start_decoder(host, backend)
    b = seq(30_000, tag=2)
    host.submit(b)
    times, sizes, last = [], [], clock.now
    while b.status != Status.DECODE:
        host.turn()
        c = backend.calls[-1]
        if c[0] == "mixed" and c[3] <= (len(b.prompt) - 1) // R * R and b.rows_left > SHORT_ROWS:
            times.append(clock.now - last)
            sizes.append(c[3] - c[2])
        last = clock.now
    learned = times[3:]  # after the probe and two fits
    assert max(learned) <= 0.040 * 1.05
    assert sum(learned) / len(learned) >= 0.040 * 0.85  # and uses most of it
    early, late = sizes[3:8], sizes[-5:]
    assert min(early) > max(late)  # the same budget buys fewer rows deep into the prompt
    assert all(s % 16 == 0 for s in sizes)


def test_a_backends_cut_sizes_are_the_sizes_the_budget_picks():
    """A backend whose forwards run at fixed sizes (CUDA graphs): every sized cut is one of them,
    the budget still holds, and the cuts shrink through the sizes as the context grows."""
    sizes = (64, 128, 192, 256)
    host, backend, clock = make(budget_ms=40.0, cut_sizes=sizes, key=KEY / 4)  # the smallest always fits
    start_decoder(host, backend)
    b = seq(30_000, tag=2)
    host.submit(b)
    last, seen = clock.now, []
    while b.status != Status.DECODE:
        host.turn()
        c = backend.calls[-1]
        if c[0] == "mixed" and c[3] <= (len(b.prompt) - 1) // R * R:
            seen.append((c[3] - c[2], clock.now - last))
        last = clock.now
    assert all(n in sizes for n, _ in seen[:-1])  # (the last before the final grid cut: what was left)
    assert max(t for _, t in seen[3:]) <= 0.040 * 1.05
    assert seen[3][0] > seen[-2][0]


def test_with_a_fixed_cost_and_sizes_the_budget_still_finds_the_size_that_fits():
    """A mixed forward 15 ms over a round whatever its cut, 0.05 ms a row: at 40 ms the 256-row size
    fits (37.8 ms) and 512 does not (50.6). Timed at the 64-row probe alone, the cost looks like rows
    (0.28 ms each); the second probe at 128 tells them apart, and the cuts grow to 256, a size at a time."""
    sizes = (64, 128, 192, 256, 384, 512)
    host, backend, clock = make(budget_ms=40.0, cut_sizes=sizes, key=0.0, fixed=0.015, row=0.00005)
    start_decoder(host, backend)
    b = seq(20_000, tag=2)
    host.submit(b)
    run_until_filled(host, b)
    cut = [c[3] - c[2] for c in backend.calls if c[0] == "mixed"][:-1]
    assert cut[:3] == [64, 128, 192] and set(cut[3:-1]) == {256}


def test_the_cuts_grow_a_size_at_a_time_past_the_largest_timed():
    """Two probes at a prompt's start fit the cost from two cut sizes at almost no context, and the
    fit extrapolates to the largest size: a budget that predicts 1,024 rows fit still climbs
    64, 128, 256, 512, 1,024, each size timed before the next is asked for (a jump to an untimed
    size a real forward overran: 122 ms in a 64 ms budget on qwen3-32b, A's longest pause)."""
    sizes = (64, 128, 256, 512, 1024)
    host, backend, clock = make(budget_ms=400.0, cut_sizes=sizes, key=0.0, fixed=0.015, row=0.00005)
    start_decoder(host, backend)
    b = seq(20_000, tag=2)
    host.submit(b)
    run_until_filled(host, b)
    cut = [c[3] - c[2] for c in backend.calls if c[0] == "mixed"]
    assert cut[:5] == [64, 128, 256, 512, 1024]


def test_a_larger_budget_fills_the_prompt_in_fewer_longer_forwards():
    spans = {}
    for budget in (20.0, 80.0):
        host, backend, clock = make(budget_ms=budget)
        a = start_decoder(host, backend)
        b = seq(6000, tag=2)
        host.submit(b)
        t0, n0 = clock.now, len(a.output)
        run_until_filled(host, b)
        spans[budget] = (clock.now - t0, (len(a.output) - n0) / (clock.now - t0))
    (fill20, rate20), (fill80, rate80) = spans[20.0], spans[80.0]
    assert fill80 < fill20 and rate80 < rate20  # the knob trades B's time for A's rate


def test_short_prompts_go_first_and_carry_the_decoders_too():
    host, backend, _ = make()
    a = start_decoder(host, backend)
    b = seq(8000, tag=2)
    host.submit(b)
    for _ in range(5):
        host.turn()
    at = b.filled
    c = seq(40, tag=3)
    host.submit(c)
    backend.calls.clear()
    host.turn()
    assert backend.calls == [("mixed", c.lane, 0, 40, (a.lane,))]
    assert c.status == Status.DECODE and b.filled == at
    host.turn()  # then B again, now with C decoding beside A
    kind, lane, start, _, lanes = backend.calls[-1]
    assert (kind, lane, start) == ("mixed", b.lane, at) and set(lanes) == {a.lane, c.lane}



def test_several_short_prompts_fill_together_then_the_long_one_rides_with_the_decoders():
    """Prompts arriving together beside a decoder (a sweep's streams) fill in one forward where
    the backend batches cuts, not one mixed forward each; the long prompt's cuts still ride."""
    host, backend, _ = make(batch_cuts=True)
    backend.prefill_many = lambda items: (backend.calls.append(("many", tuple(i[0] for i in items))),
                                          [backend._first(t, e) for _, t, _, e in items])[1]
    a = start_decoder(host, backend)
    b = seq(8000, tag=2)
    host.submit(b)
    for _ in range(3):
        host.turn()
    shorts = [seq(40 + i, tag=4 + i) for i in range(2)]
    for c in shorts:
        host.submit(c)
    backend.calls.clear()
    host.turn()
    assert backend.calls == [("many", tuple(c.lane for c in shorts))]
    assert all(c.status == Status.DECODE for c in shorts)
    host.turn()
    kind, lane, _, _, lanes = backend.calls[-1]
    assert (kind, lane) == ("mixed", b.lane) and set(lanes) == {a.lane, *(c.lane for c in shorts)}

def test_grid_cuts_where_the_backend_is_not_cut_free():
    host, backend, _ = make(cut_free=False)
    start_decoder(host, backend)
    b = seq(3000, tag=2)
    host.submit(b)
    run_until_filled(host, b)
    cuts = [(c[2], c[3]) for c in backend.calls if c[0] == "mixed"]
    assert cuts == [(s, min(s + R, 3000)) for s in range(0, 3000, R)]
    assert all(c[0] == "mixed" for c in backend.calls)  # no base needed: nothing is sized


def test_no_prompt_waiting_is_the_plain_decode_loop_without_clock_reads():
    host, backend, clock = make()
    a = start_decoder(host, backend)
    reads = clock.reads
    for _ in range(20):
        host.turn()
    assert clock.reads == reads
    assert backend.calls == [("decode", (a.lane,))] * 20


def test_with_no_decoder_a_prompt_steps_on_the_grid():
    host, backend, _ = make()
    b = seq(1000, tag=2)
    host.submit(b)
    run_until_filled(host, b)
    steps = [c for c in backend.calls if c[0] != "decode"]  # (B's own first round follows its last cut)
    assert steps == [("prefill", b.lane, s, min(s + R, 1000)) for s in range(0, 1000, R)]


def test_a_sampled_stream_turns_the_forward_back_into_a_step_and_a_round():
    host, backend, _ = make()
    a = seq(10, tag=1, sampling=SamplingParams(temperature=0.7, seed=3))
    backend.decode = lambda lanes, tokens, positions, sampling=None, logprobs=None: (
        backend.calls.append(("decode", tuple(lanes))) or [1] * len(lanes))
    backend.prefill_step = lambda lane, tokens, start, end, sampling=None, logprobs=None: (
        backend.calls.append(("prefill", lane, start, end)) or (7 if end == len(tokens) else None))
    host.submit(a)
    host.turn()
    b = seq(3000, tag=2)
    host.submit(b)
    backend.calls.clear()
    for _ in range(4):
        host.turn()
    assert [c[0] for c in backend.calls] == ["prefill", "decode"] * 4


def test_a_failed_mixed_forward_ends_its_streams_and_frees_their_lanes():
    host, backend, _ = make(fail_mixed=True, cut_free=False)
    a = start_decoder(host, backend)
    b = seq(3000, tag=2)
    host.submit(b)
    host.turn()
    assert a.status == b.status == Status.FAILED
    assert sorted(host.free) == [0, 1, 2, 3]
    host.submit(c := seq(5, tag=4))
    host.turn()
    assert c.status == Status.DECODE


def test_the_cost_model_learns_rows_and_keys_apart():
    cost = ForwardCost(budget_s=0.05)
    assert cost.rows(0, 5000) == 16  # nothing known: one granule
    cost.add_round(BASE)
    for n, ctx in [(64, 0), (128, 2000), (256, 8000), (96, 20000)]:
        cost.add_mixed(n, ctx, BASE + n * ROW + KEY * n * (ctx + n / 2))
    a, u, k = cost.coefficients()
    assert u == pytest.approx(ROW, rel=1e-6) and k == pytest.approx(KEY, rel=1e-6) and a == pytest.approx(0, abs=1e-9)
    n = cost.rows(10_000, 50_000)
    assert cost.predict(n, 10_000) <= 0.05 < cost.predict(n + 16, 10_000)


def test_the_cost_model_learns_a_mixed_forwards_fixed_cost():
    """A forward that costs 15 ms more than a round whatever its cut (eager launches): the fit
    finds the intercept, so a 40 ms budget buys the rows left after it, not rows at the intercept's rate."""
    fixed = 0.015
    cost = ForwardCost(budget_s=0.04)
    cost.add_round(BASE)
    cost.add_mixed(16, 0, BASE + fixed + 16 * ROW)  # one sample: charged to the rows
    assert cost.coefficients()[0] == 0
    for n, ctx in [(64, 0), (128, 2000), (256, 8000), (96, 20000)]:
        cost.add_mixed(n, ctx, BASE + fixed + n * ROW + KEY * n * (ctx + n / 2))
    a, u, k = cost.coefficients()
    assert a == pytest.approx(fixed, rel=1e-3) and u == pytest.approx(ROW, rel=1e-3)
    n = cost.rows(0, 50_000)
    assert cost.predict(n, 0) <= 0.04 < cost.predict(n + 16, 0)
    assert 60 <= n <= 80  # (40 - 10 - 15) ms at 0.2 ms a row, less the keys


def test_with_sizes_the_budget_picks_a_size_and_a_cut_costs_its_size():
    sizes = (64, 128, 256, 512, 1024)
    cost = ForwardCost(budget_s=0.08, granule=64, sizes=sizes)
    assert cost.rows(0, 50_000) == 64  # the probe: the smallest size
    cost.add_round(BASE)
    for n in (64, 128, 256):
        cost.add_mixed(n, 0, BASE + 0.002 + n * ROW)
    assert cost.charged(65) == 128 and cost.predict(65, 0) == cost.predict(128, 0)
    assert cost.rows(0, 50_000) == 256  # 512 rows would take 114 ms
    assert cost.rows(0, 100) == 100  # never past the prompt's rows left
    tight = ForwardCost(budget_s=0.001, granule=64, sizes=sizes, base=BASE)
    tight.add_mixed(64, 0, BASE + 0.01)
    assert tight.rows(0, 50_000) == 64  # nothing fits: the smallest, so the prompt still moves


@pytest.mark.parametrize("bad", [0.0, -5.0, float("nan"), float("inf")])
def test_a_bad_budget_is_a_config_error(bad):
    with pytest.raises(ConfigError, match="--mixed-budget"):
        EngineConfig(prefill_mode="mixed", mixed_budget_ms=bad)


def test_a_fault_hook_sees_a_mixed_forward_as_a_step_and_a_round():
    from engine.faults import Faults, FaultyBackend

    host, backend, _ = make(cut_free=False)
    host.backend = FaultyBackend(backend, Faults(fail_step=3, fail_round=None, decode_sleep_s=0.0))
    a = start_decoder(host, host.backend)
    b = seq(3000, tag=2)
    host.submit(b)
    host.turn()  # B's first cut beside A: step 2 (A's own prompt was step 1)
    assert b.status == Status.PREFILL
    host.turn()  # step 3 fails: the forward's streams end
    assert a.status == b.status == Status.FAILED


def test_cuts_end_on_the_backend_s_granule():
    """A backend whose cut attention computes whole tiles (cut_granule): every sized cut ends at a
    multiple of the tile, so no forward pays for a tile it fills in part."""
    clock = Clock()
    backend = MixedBackend(clock, granule=64)
    cfg = EngineConfig(parallel=4, prefill_rows=R, prefill_mode="mixed", mixed_budget_ms=40.0, out_queue=10**9)
    host = LaneHost(backend, cfg, clock=clock)
    start_decoder(host, backend)
    b = seq(8000, tag=2)
    host.submit(b)
    run_until_filled(host, b)
    ends = [c[3] for c in backend.calls if c[0] == "mixed"][:-1]
    assert ends and all(e % 64 == 0 for e in ends)
    assert len({e % R for e in ends}) > 1  # and the budget still sizes them between grid ends


def test_mixed_mode_is_refused_where_its_bits_are_not_kept():
    """Tensor parallel has no mixed forward that keeps a row's bits (CUDA without the tiles neither:
    test_cuda_mixed.py): one line, before any load."""
    from engine.cli import check_config
    with pytest.raises(ConfigError, match="--prefill-mode mixed runs at one rank"):
        check_config(EngineConfig(model="tiny", prefill_mode="mixed", tensor_parallel=2))
    assert check_config(EngineConfig(model="tiny", prefill_mode="mixed")).startswith("ok")
