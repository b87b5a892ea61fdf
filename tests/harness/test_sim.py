"""The simulator: cost profiles and their fits, the simulated backend's clock, the engine's real lane
host on it (the schedule facts it must reproduce), the virtual-time player, and profiles fitted back
from traces. No GPU, no torch, no server."""
import json
import math
import random
import statistics

import pytest

from engine.config import EngineConfig
from engine.scheduler.backend import Capabilities
from engine.scheduler.costs import Costs, Profile, ProfileError, RoundFit
from engine.scheduler.host import LaneHost
from engine.scheduler.simulated import SimulatedBackend, VirtualClock
from engine.scheduler.trace_profile import TracedRun, TracedStream, profile_of, samples_of
from tensorfold_bench.analysis import figures
from tensorfold_bench.client.virtual import SimError, SimRequest, play
from tensorfold_bench.scenarios.long_prompt import LongPromptScript, timeline

ABC = timeline(LongPromptScript(b_at=1.0, c_after=0.5, b_tokens=32000))  # the figures read events only


def long_prompt(a, b, c):
    """The long-prompt figures of one A/B/C run, by the A/B/C script's figure definitions."""
    return figures.long_prompt(ABC, {"A": a, "B": b, "C": c})


PA, PB, PC = 0.002, 2e-5, 1e-9  # a cut: PA + PB rows + PC rows (start + rows / 2)
DA, DB = {1: 0.006, 2: 0.0065, 4: 0.007, 8: 0.008}, 2e-8  # a round: DA[n] + DB keys


def cut_s(rows, start):
    return PA + PB * rows + PC * rows * (start + rows / 2)


def round_s(n, keys):
    return DA[n] + DB * keys


def longest(n, keys):
    """The longest of n streams whose contexts are equal and a position apart, holding `keys` in all."""
    return keys / n + (n - 1) / 2


def samples(**extra):
    """/2 rows: a round's [n, keys, longest, s] (these rounds' cost follows all keys, not the longest)."""
    s = {"prefill": [[r, st, cut_s(r, st)] for r in (16, 34, 64, 256, 512, 1024) for st in (0, 4096, 16384, 31744)],
         "decode": [[n, k, longest(n, k), round_s(n, k)] for n in DA for k in (n * 20, n * 5000, n * 30000)],
         "host": [["turn", 5e-5], ["token", 1e-5]]}
    s.update(extra)
    return s


def profile(device="cuda", rounds="streams", engine=None, **extra) -> Costs:
    return Costs(Profile.from_dict({"schema": "tfbench.profile/2", "rounds": rounds, "device": {"type": device},
                                    "model": {}, "engine": engine or {}, "samples": samples(**extra)}, "test.json"))


MANY = [[p, p * 200, 0.004 + 1.5e-5 * p * 200] for p in (2, 3, 5, 8) for _ in range(2)]
SPLIT = [[32, 1024, st, 1, 100 + st, 100 + st, 1.6 * cut_s(1024, st), 1.3 * round_s(1, 100 + st)]
         for st in range(0, 32768, 1024)]
MIXED = [[r, st, 1, 500, 500, round_s(1, 500) + 0.001 + 1.8e-5 * r + PC * r * (st + r / 2)]
         for r in (128, 256, 512, 1024) for st in (0, 8192, 24576)]


# ---- profiles and fits --------------------------------------------------------------------------

def test_fits_recover_the_costs_they_were_measured_from():
    c = profile()
    for rows, start in ((1024, 0), (1024, 30000), (100, 5000), (34, 0)):
        assert c.prefill(rows, start) == pytest.approx(cut_s(rows, start), rel=0.02)
    for n in DA:
        assert c.decode(n, n * 1000, longest(n, n * 1000)) == pytest.approx(round_s(n, n * 1000), rel=0.01)
    assert c.spread("prefill") < 0.02 and c.spread("decode") < 0.01
    assert c.host_turn == 5e-5 and c.host_token == 1e-5


def test_a_round_between_measured_counts_costs_the_next_graph_on_cuda_and_the_line_elsewhere():
    assert profile("cuda").decode(3, 0, 0) == pytest.approx(DA[4], rel=0.01)
    assert profile("cpu").decode(3, 0, 0) == pytest.approx((DA[2] + DA[4]) / 2, rel=0.01)
    assert profile("cuda").decode(16, 0, 0) > DA[8]  # past the largest: the line through the two largest
    # counted by the rows they ran at, a count between two measured ones is the line between, on CUDA too
    assert profile("cuda", rounds="rows").decode(3, 0, 0) == pytest.approx((DA[2] + DA[4]) / 2, rel=0.01)


def test_a_fit_drops_a_disturbed_sample_and_says_how_far_calls_land():
    rng = random.Random(1)
    noisy = [[n, k, lg, round_s(n, k) * (1 + rng.uniform(-0.05, 0.05))] for n, k, lg, _ in samples()["decode"] * 4]
    noisy.append([1, 20, 20, 0.0001])  # a round that returned a result computed ahead
    c = profile(decode=noisy)
    assert c.decode(1, 20, 20) == pytest.approx(round_s(1, 20), rel=0.03)
    assert 0.02 < c.spread("decode") <= 0.06
    assert c.summary()["decode"]["dropped"] >= 1


def test_a_kind_the_profile_lacks_is_refused_by_name():
    c = profile()
    with pytest.raises(ProfileError, match="test.json has no 'mixed' samples"):
        c.mixed(256, 0, 1, 100, 100)
    with pytest.raises(ProfileError, match="no 'split' samples"):
        c.split(32, 1024, 0)
    with pytest.raises(ProfileError, match="decode_sms=48"):
        profile(split=SPLIT).split(48, 1024, 0)


@pytest.mark.parametrize("doc, msg", [
    ({"schema": "tfbench.profile/0"}, "schema is 'tfbench.profile/0'"),
    ({"schema": "tfbench.profile/1", "device": {}, "model": {}, "engine": {}, "samples": {"decode": [[1, 2]]}},
     r"samples.decode\[0\] must be a list of 3 values"),
    ({"schema": "tfbench.profile/1", "device": {}, "model": {}, "engine": {}, "samples": {"decode": [[1, 2, -1]]}},
     "is not a finite number"),
    ({"schema": "tfbench.profile/1", "device": {}, "model": {}, "engine": {}, "samples": {"warp": []}},
     "unknown kinds"),
    ({"schema": "tfbench.profile/1", "device": {}, "model": {}, "engine": {}, "samples": {"host": [["nap", 1]]}},
     "one of turn, token, prompt_token, not 'nap'"),
    ({"schema": "tfbench.profile/2", "device": {}, "model": {}, "engine": {}, "samples": {"decode": [[1, 2, 0.1]]}},
     r"samples.decode\[0\] must be a list of 4 values"),
    ({"schema": "tfbench.profile/2", "device": {}, "model": {}, "engine": {},
      "samples": {"mixed": [[256, 0, 1, 100, 0.1]]}}, r"samples.mixed\[0\] must be a list of 6 values"),
    ({"schema": "tfbench.profile/2", "rounds": "lanes", "device": {}, "model": {}, "engine": {}, "samples": {}},
     "rounds is 'lanes', not one of rows, streams"),
])
def test_a_bad_profile_is_one_clear_error_naming_file_and_field(tmp_path, doc, msg):
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(ProfileError, match=msg) as e:
        Costs.load(p)
    assert str(p) in str(e.value)


def test_a_profile_reads_back_what_it_wrote(tmp_path):
    for rounds in ("rows", "streams"):
        prof = Profile.from_dict({"schema": "tfbench.profile/2", "rounds": rounds, "created": "x", "source": "measured",
                                  "device": {"type": "cpu"}, "model": {"name": "cpu"}, "engine": {},
                                  "samples": samples(mixed=MIXED, split=SPLIT)})
        again = Profile.load(prof.write(tmp_path / "p.json"))
        assert again.to_dict() == prof.to_dict() and again.rounds == rounds
    with pytest.raises(ProfileError, match="cannot read profile"):
        Profile.load(tmp_path / "missing.json")


# ---- the simulated backend's clock --------------------------------------------------------------

def test_each_call_advances_the_clock_by_its_cost():
    clock = VirtualClock()
    b = SimulatedBackend(profile(), 4, 40000, 1000, clock=clock)
    prompt = list(range(300))
    assert b.prefill_step(0, prompt, 0, 256) is None
    assert clock() == pytest.approx(profile().prefill(256, 0))
    first = b.prefill_step(0, prompt, 256, 300)
    assert isinstance(first, int) and 0 <= first < 1000
    t = clock()
    b.decode([0, 1], [first, 5], [300, 99])
    assert clock() - t == pytest.approx(profile().decode(2, 301 + 100, 301))  # keys: positions + 1, summed


def split_backend_with_two_cuts():
    """A split backend on a virtual clock with a 2,048-token prompt's two cuts queued on its partition."""
    c = profile(split=SPLIT)
    clock = VirtualClock()
    b = SimulatedBackend(c, 4, 40000, 1000, Capabilities(split=True), clock=clock, decode_sms=32)
    prompt = list(range(2048))
    b.start_step(0, prompt, 0, 1024)
    b.start_step(0, prompt, 1024, 2048)
    return c, clock, b


def test_split_cuts_queue_on_their_partition_and_rounds_beside_them_cost_the_split_round():
    c, clock, b = split_backend_with_two_cuts()
    one, two = c.split(32, 1024, 0), c.split(32, 1024, 1024)
    assert clock() == 0.0 and not b.step_done()
    b.decode([1], [7], [10])
    assert clock() == pytest.approx(c.split_round(32, 1, 11, 11, True))
    clock.to(one)
    assert b.step_done()
    assert b.finish_step() is None and clock() == pytest.approx(one)
    assert b.finish_step() is not None and clock() == pytest.approx(one + two)  # waited for: the clock moved


def test_a_whole_device_forward_beside_a_running_cut_starts_at_once_and_pushes_the_cuts_back():
    c, clock, b = split_backend_with_two_cuts()
    one, two, short = c.split(32, 1024, 0), c.split(32, 1024, 1024), c.prefill(34, 0)
    clock.to(one / 2)
    b.prefill_step(1, list(range(34)), 0, 34)
    assert clock() == pytest.approx(one / 2 + short)  # it did not wait for the running cut
    b.finish_step()
    assert clock() == pytest.approx(one + short)  # the running cut ends its time later
    b.finish_step()
    assert clock() == pytest.approx(one + short + two)  # and the cut queued behind it too


def test_rounds_asked_to_run_ahead_cost_what_the_profile_measured_of_them():
    ahead = [[n, k, lg, 0.9 * t] for n, k, lg, t in samples()["decode"]]
    c = profile(decode_ahead=ahead)
    assert c.decode(1, 500, 500, ahead=True) == pytest.approx(0.9 * c.decode(1, 500, 500), rel=0.01)
    assert profile().decode(1, 500, 500, ahead=True) == profile().decode(1, 500, 500)  # none measured: a plain round's
    clock = VirtualClock()
    SimulatedBackend(c, 4, 4000, 100, Capabilities(runs_ahead=True), clock=clock).decode([0], [1], [499], ahead=True)
    assert clock() == pytest.approx(c.decode(1, 500, 500, ahead=True))


K_HEAT, TAU_HEAT = 0.15, 0.75  # a fill's cut: prefill's fit times 1 + K (1 - exp(-since / TAU))


def fill_rows(cuts=32, rows=1024, fills=2):
    """Fill samples as a device that heats would give them: `fills` fills from cold of the longest
    prompt, `cuts` cuts of `rows` back to back, each cut prefill's fit times 1 + K h(since)."""
    base = profile()
    out = []
    for _ in range(fills):
        since = 0.0
        for i in range(cuts):
            t = base.prefill(rows, i * rows) * (1 + K_HEAT * (1 - math.exp(-since / TAU_HEAT)))
            out.append([rows, i * rows, since, t])
            since += t
    return out


def test_the_heat_is_fitted_from_the_fill_over_prefills_fit():
    k, tau = profile(fill=fill_rows()).heat
    assert k == pytest.approx(K_HEAT, rel=0.10) and tau == TAU_HEAT
    assert profile().heat == (0.0, 1.0)  # no fill measured: no heat
    # a fill no slower than prefill's fit: k at its bound, never negative
    cool = [[r, st, since, profile().prefill(r, st) * 0.97] for r, st, since, _ in fill_rows()]
    assert profile(fill=cool).heat[0] == 0.0


def fill_on(c, gap=0.0, cuts=32, rows=1024):
    """A backend's clock after `cuts` whole-device cuts of `rows` (successive starts), `gap` idle
    seconds before each; returns (the time the cuts were charged, the plain sum of their costs)."""
    clock = VirtualClock()
    b = SimulatedBackend(c, 4, 40000, 1000, clock=clock)
    prompt = list(range(cuts * rows + 1))
    charged = 0.0
    for i in range(cuts):
        clock.advance(gap)
        t = clock()
        assert b.prefill_step(0, prompt, i * rows, (i + 1) * rows) is None
        charged += clock() - t
    return charged, sum(c.prefill(rows, i * rows) for i in range(cuts))


def test_cuts_back_to_back_heat_the_device_and_cuts_apart_do_not():
    c = profile(fill=fill_rows())
    charged, plain = fill_on(c)
    assert charged > 1.05 * plain  # the fill heats the device: later than the cuts' plain costs
    assert charged < (1 + K_HEAT) * plain  # never more than fully hot all along
    apart, plain_apart = fill_on(c, gap=20.0)  # the device cools between cuts
    assert plain_apart == plain and apart == pytest.approx(plain, rel=0.01)
    cold, plain_cold = fill_on(profile())  # no fill samples: the plain costs exactly
    assert cold == pytest.approx(plain_cold)


def test_only_whole_device_prompt_cuts_are_heated():
    c = profile(fill=fill_rows())
    clock = VirtualClock()
    b = SimulatedBackend(c, 4, 40000, 1000, clock=clock)
    prompt = list(range(8 * 1024 + 1))
    for i in range(8):  # heat the device
        b.prefill_step(0, prompt, i * 1024, (i + 1) * 1024)
    t = clock()
    b.decode([1], [7], [10])  # a round right after the fill costs what the profile says, hot or not
    assert clock() - t == pytest.approx(c.decode(1, 11, 11))


def test_a_long_prompt_reaches_the_host_once_the_server_has_read_it():
    res = long_prompt_twin(1.0, c=profile(host=[["turn", 5e-5], ["prompt_token", 1e-6]]))
    b_seq_first = min(s["t"] for s in res.trace if s["kind"] == "prefill" and s["rows"] == 1024)
    assert 1.0 + 0.032 <= b_seq_first < 1.0 + 0.032 + 0.01  # 32,000 tokens at 1 us, then the round in hand
    assert res.records["B"].sent == 1.0


def test_token_ids_do_not_depend_on_how_the_prompt_was_cut_and_are_never_eos():
    prompt = list(range(3, 1003))
    a = SimulatedBackend(profile(), 4, 4000, 50, eos_token_ids=(0, 1))
    b = SimulatedBackend(profile(), 4, 4000, 50, eos_token_ids=(0, 1))
    ta = a.prefill_step(0, prompt, 0, 1000)
    b.prefill_step(2, prompt, 0, 512)
    tb = b.prefill_step(2, prompt, 512, 1000)
    assert ta == tb
    ra, rb = a.decode([0], [ta], [1000]), b.decode([2], [tb], [1000])
    assert ra == rb
    assert all(a.decode([0], [t % 50], [p])[0] not in (0, 1) for p, t in enumerate(range(2000)))
    asked = SimulatedBackend(profile(), 4, 4000, 50, eos_token_ids=(0, 1), eos_every=100)
    asked.prefill_step(0, prompt, 0, 1000)
    assert [asked.decode([0], [7], [p])[0] == 0 for p in (1098, 1099)] == [False, True]


# ---- the real lane host on it: the schedule facts -----------------------------------------------

def long_prompt_twin(share=1.0, mode="stepped", c=None, caps=Capabilities(), b_tokens=32000, trace=True, **cfg):
    config = EngineConfig(parallel=4, prefill_rows=1024, max_model_len=40000, prefill_share=share,
                          prefill_mode=mode, **cfg)
    rng = random.Random(0)
    reqs = [SimRequest("A", [rng.randrange(1, 999) for _ in range(16)], 40000, 0.0, until=("B", "C")),
            SimRequest("B", [rng.randrange(1, 999) for _ in range(b_tokens)], 8, 1.0),
            SimRequest("C", [rng.randrange(1, 999) for _ in range(34)], 16, 1.5)]
    return play(reqs, config, c or profile(), caps, vocab_size=1000, trace=trace)


def fill_window(res):
    b = res.records["B"]
    return [s for s in res.trace if b.sent <= s["t"] < b.token_times[0]]


def test_at_share_one_a_long_prompt_alternates_one_cut_and_one_round():
    res = long_prompt_twin(1.0)
    w = fill_window(res)
    b_seq = next(s["seq"] for s in w if s["rows"] == 1024 and s["kind"] == "prefill")
    steps = "".join("p" if s["kind"] == "prefill" else "d" for s in w if s["kind"] == "decode" or s["seq"] == b_seq)
    assert steps.count("p") == 32  # B's 32 cuts, 31 of 1,024 rows and its last of 256
    assert steps.strip("d") == "pd" * 31 + "p"  # between B's cuts, exactly one round each


def test_at_share_one_half_the_decoders_get_about_as_much_time_as_the_cuts():
    res = long_prompt_twin(0.5)
    w = fill_window(res)
    cuts = sum(s["dur"] for s in w if s["kind"] == "prefill" and s["rows"] >= 256)
    rounds = sum(s["dur"] for s in w if s["kind"] == "decode")
    assert 0.85 < rounds / cuts < 1.2
    f = long_prompt(*res.records.values())
    assert f.valid and 40 < 100 * f.a_rate_during / f.a_rate_before < 60
    whole = long_prompt(*long_prompt_twin(1.0).records.values())
    assert f.b_first_token > 1.5 * whole.b_first_token  # the decoders' time is B's wait


def eight_shorts(host_cls=LaneHost):
    """Eight short prompts arriving together beside one decoding stream, on a backend that fills
    short cuts together: (the median first token, the rounds run before the last first token)."""
    reqs = [SimRequest("A", list(range(1, 17)), 400, 0.0)]
    reqs += [SimRequest(f"S{i}", [i + 1] * 200, 4, 0.5) for i in range(8)]
    res = play(reqs, EngineConfig(parallel=16, prefill_rows=1024, max_model_len=40000), profile(prefill_many=MANY),
               Capabilities(batch_cuts=True), vocab_size=1000, trace=True, host_cls=host_cls)
    firsts = [res.records[f"S{i}"].token_times[0] for i in range(8)]
    rounds = [s for s in res.trace if s["kind"] == "decode" and 0.5 <= s["t"] < max(firsts)]
    return statistics.median(f - 0.5 for f in firsts), len(rounds)


class OnePerTurn(LaneHost):
    """The seed's regression, planted: short prompts no longer filled back to back before the next
    round (one a turn, one cut at a time)."""

    def _fill_prompts(self):
        if not self.prompts:
            self.policy.budget.forgive()
            return False
        short = next((s for s in self.policy.fill_order(self.prompts) if self.policy.goes_whole(s)), None)
        if short is not None:
            self._prompt_step(short, timed=False)
            return True
        return super()._fill_prompts()


def test_eight_short_prompts_arriving_together_all_fill_before_the_next_round():
    median, rounds = eight_shorts()
    assert rounds == 0
    slow_median, slow_rounds = eight_shorts(OnePerTurn)
    assert slow_rounds >= 6
    assert slow_median > 1.5 * median  # what the gate's schedule layer sees


def test_split_rounds_go_on_while_a_cut_is_in_flight():
    c = profile(split=SPLIT)
    res = long_prompt_twin(mode="split", c=c, caps=Capabilities(split=True), decode_sms=32)
    cuts = [s for s in res.trace if s["kind"] == "prefill" and s["rows"] == 1024]
    rounds = [s for s in res.trace if s["kind"] == "decode"]
    inside = [r for r in rounds if any(k["t"] < r["t"] < k["t"] + k["dur"] for k in cuts)]
    assert len(cuts) == 31 and len(inside) > 5 * len(cuts)
    stepped = long_prompt(*long_prompt_twin(1.0, c=c).records.values())
    split = long_prompt(*res.records.values())
    assert split.a_rate_during > 2 * stepped.a_rate_during


def test_mixed_forwards_size_their_cuts_by_the_budget():
    c = profile(mixed=MIXED)
    caps = Capabilities(mixed=True, cut_free=True, cut_granule=128, cut_sizes=(128, 256, 384, 512, 768, 1024))
    res = long_prompt_twin(mode="mixed", c=c, caps=caps, mixed_budget_ms=25.0)
    mixed = [s for s in res.trace if s["kind"] == "mixed"]
    assert mixed
    settled = mixed[4:]
    assert max(s["dur"] for s in settled) <= 0.025 * 1.15
    early, late = settled[: len(settled) // 4], settled[-len(settled) // 4:]
    assert statistics.mean(s["rows"] for s in late) < statistics.mean(s["rows"] for s in early)


def test_the_player_is_deterministic_and_records_what_a_client_would():
    one, two = long_prompt_twin(0.5), long_prompt_twin(0.5)
    assert {k: v.to_dict() for k, v in one.records.items()} == {k: v.to_dict() for k, v in two.records.items()}
    a, b, c = (one.records[k] for k in "ABC")
    assert a.cancelled and a.finish_reason is None and a.ended >= max(b.ended, c.ended)
    assert b.finish_reason == "length" and len(b.token_ids) == 8 and b.counted_by == "ids"
    assert b.usage["prompt_tokens_details"]["cached_tokens"] == 0
    assert a.token_times == sorted(a.token_times) and b.sent == 1.0


def test_a_request_cancelled_at_a_time_ends_there_and_a_missing_name_is_refused():
    cfg = EngineConfig(parallel=2, prefill_rows=256, max_model_len=4000)
    res = play([SimRequest("A", [1] * 8, 1000, 0.0, cancel_at=0.5)], cfg, profile(), vocab_size=100)
    a = res.records["A"]
    assert a.cancelled and 0.5 <= a.ended < 0.52 and 0.45 < a.token_times[-1] <= a.ended
    with pytest.raises(ValueError, match="not played"):
        play([SimRequest("A", [1], 4, 0.0, until=("Z",))], cfg, profile())
    assert SimError.__doc__


# ---- profiles from traces -----------------------------------------------------------------------

def traced(res, mode="stepped", sms=None):
    return TracedRun(res.trace, [TracedStream(r.prompt_len, r.token_times, r.cached_tokens or 0)
                                 for r in res.records.values()], mode, sms)


def test_a_trace_gives_cuts_at_their_starts_and_rounds_at_their_keys():
    res = long_prompt_twin(0.5)
    s = samples_of(traced(res))
    starts = sorted(st for r, st, _ in s["prefill"] if r == 1024)
    assert starts == list(range(0, 31 * 1024, 1024))
    for rows, start, t in s["prefill"]:
        assert t == pytest.approx(profile().prefill(rows, start), rel=1e-6)
    for n, keys, t in s["decode"]:  # a trace's rounds say streams and keys, no longest (/1's widths)
        assert t == pytest.approx(profile().decode(n, keys, longest(n, keys)), rel=0.01)  # keys within a token a stream
    assert [k for k, _ in s["host"]].count("turn") > 100


def test_a_split_trace_gives_each_cut_its_own_time():
    c = profile(split=SPLIT)
    res = long_prompt_twin(mode="split", c=c, caps=Capabilities(split=True), decode_sms=32)
    s = samples_of(traced(res, "split", 32))
    assert len(s["split"]) >= 25
    ratios = []
    for sms, rows, start, n, keys, cut, rnd in s["split"]:
        assert rnd == pytest.approx(c.split_round(32, n, keys, longest(n, keys), True), rel=0.05)
        assert abs(cut - c.split(32, rows, start)) <= 1.5 * rnd  # a landing waits at most a round
        ratios.append(cut / c.split(32, rows, start))
    assert statistics.mean(ratios) == pytest.approx(1.0, abs=0.03)  # and the waits cancel


def test_prompts_filled_together_are_one_prefill_many_sample():
    trace = [{"t": 1.0, "dur": 0.01, "kind": "prefill", "rows": 200, "streams": 1, "seq": i} for i in range(3)]
    trace.append({"t": 1.011, "dur": 0.006, "kind": "decode", "rows": 3, "streams": 3, "seq": None})
    s = samples_of(TracedRun(trace, [TracedStream(200, [1.0101, 1.0171])] * 3))
    assert s["prefill_many"] == [[3, 600, 0.01]] and s["prefill"] == []
    assert s["decode"] == [[3, 603, 0.006]]


def test_a_profile_fitted_from_simulated_traces_plays_the_same_figures_again():
    """The builder's round trip: runs simulated on a known profile, a profile fitted from their
    traces, and a held-out run's twin on it gives that run's figures."""
    fit_from = [traced(long_prompt_twin(p)) for p in (1.0, 0.75)]
    fitted = Costs(profile_of(fit_from, {"type": "cuda"}, {}, {}, "test"))
    held = long_prompt_twin(0.5)
    again = long_prompt_twin(0.5, c=fitted)
    real, sim = long_prompt(*held.records.values()), long_prompt(*again.records.values())
    assert sim.b_first_token == pytest.approx(real.b_first_token, rel=0.02)
    assert sim.c_first_token == pytest.approx(real.c_first_token, rel=0.1)
    assert sim.a_longest_pause == pytest.approx(real.a_longest_pause, rel=0.05)


# ---- the accuracy check over a receipt ------------------------------------------------------------

def test_the_accuracy_check_reads_a_receipt_and_predicts_each_run_from_the_others(tmp_path, capsys):
    """A receipt of runs made on a known profile: each run's twin, on a profile fitted from the other
    runs' traces only, gives that run's figures; a receipt of two cards cannot make one profile."""
    from dataclasses import asdict
    from tensorfold_bench.report import store
    from tensorfold_bench.scenarios.long_prompt import LongPromptScript, make_prompts
    from tensorfold_bench.calibrate import sim_error as accuracy

    script = LongPromptScript(b_at=1.0, c_after=0.5, b_tokens=8192, a_max_tokens=5000)
    prompts = make_prompts(script, 1000)
    runs = []
    for i, (name, share) in enumerate((("p=1", 1.0), ("p=0.5", 0.5), ("p=0.5", 0.5), ("p=1", 1.0))):
        cfg = EngineConfig(device="cuda", parallel=4, prefill_rows=1024, max_model_len=20000, prefill_share=share,
                           trace=True)
        res = play([SimRequest("A", prompts["A"], 5000, 0.0, until=("B", "C")), SimRequest("B", prompts["B"], 8, 1.0),
                    SimRequest("C", prompts["C"], 16, 1.5)], cfg, profile(), vocab_size=1000, trace=True)
        recs = {k: v.to_dict() for k, v in res.records.items()}
        eng = {"device_name": "Test GPU", "model": "m", "shape": {"vocab": 1000}, "decode_ahead": False}
        runs.append({"index": i + 1, "variant": name, "records": recs, "trace": res.trace,
                     "figures": long_prompt(*res.records.values()).to_dict(),
                     "engine": {"engine": eng, "config": asdict(cfg), "commit": "abc1234"}})
    receipt = {"schema": "tfbench.receipt/1", "settings": {"script": script.to_dict()}, "runs": runs, "alone": {}}
    path = store.write(receipt, tmp_path, "r-long-prompt")
    got = accuracy.runs_of(path)
    assert [r.variant for r in got] == ["p=1", "p=0.5", "p=0.5", "p=1"] and got[0].group == ("Test GPU", "m", "abc1234")
    rows = accuracy.check(got)
    assert len(rows) == 4 and not any(r.why for r in rows)
    for row in rows:
        for n in accuracy.FIGURES:
            e = accuracy.error(n, row.real[n], row.sim[n])
            assert abs(e) < (1.0 if n == "a_kept" else 3.0), (row.run.variant, n, e)
    assert accuracy.main([str(path)]) == 0
    assert "| Test GPU, m | 4 |" in capsys.readouterr().out
    out = tmp_path / "p.json"
    assert accuracy.main(["--write-profile", str(out), str(path)]) == 0
    assert Costs.load(out).decode(1, 100, 100) == pytest.approx(round_s(1, 100), rel=0.01)
    # on the profile the runs were made on, measured once: every twin is its run again
    measured = profile().profile.write(tmp_path / "measured.json")
    rows = accuracy.check_on(got, Costs.load(measured))
    assert all(abs(accuracy.error(n, r.real[n], r.sim[n])) < 0.01 for r in rows for n in accuracy.FIGURES)
    capsys.readouterr()
    assert accuracy.main(["--profile", str(measured), str(path)]) == 0
    assert "on the measured profile" in capsys.readouterr().out
    assert accuracy.main(["--profile", str(tmp_path / "none.json"), str(path)]) == 2
    assert "--profile: cannot read profile" in capsys.readouterr().err


def test_the_simulated_backend_offers_what_the_profiled_runner_declared():
    """A measured profile's runners declare their capabilities; the simulation offers the host those
    (a mixed runner's graph sizes), and a profile without declarations what its samples show."""
    doc = {"schema": "tfbench.profile/2", "device": {"type": "cuda"}, "model": {}, "samples": samples(),
           "engine": {"runners": [
               {"prefill_mode": "stepped", "capabilities": {"batch_cuts": True, "runs_ahead": True, "mixed": True}},
               {"prefill_mode": "mixed", "capabilities": {"cut_granule": 64, "cut_sizes": [256, 512, 1024],
                                                          "cut_free": True, "batch_cuts": True, "mixed": True}}]}}
    declared = Costs(Profile.from_dict(doc, "declared.json"))
    assert declared.capabilities("mixed") == Capabilities(cut_granule=64, cut_sizes=(256, 512, 1024), cut_free=True,
                                                          batch_cuts=True, mixed=True)
    assert declared.capabilities("stepped").runs_ahead and not declared.capabilities("stepped").cut_free
    assert declared.capabilities("whole") == declared.capabilities("stepped")  # no runner of its own: stepped's
    # a receipt's engine description that lists them is read as is, not guessed from its words
    from tensorfold_bench.calibrate.sim_error import capabilities
    eng = {"capabilities": {"cut_granule": 64, "cut_sizes": [256, 512], "cut_free": True, "mixed": True},
           "cuda_mixed": "graphs at cuts of 128 rows"}
    assert capabilities(EngineConfig(prefill_mode="mixed"), eng) == Capabilities(cut_granule=64, cut_sizes=(256, 512),
                                                                                 cut_free=True, mixed=True)
    # and the rows its rounds ran at: declared, else the description's decode_rows
    assert capabilities(EngineConfig(), {"capabilities": {"round_sizes": [4, 8]}, "decode_rows": [8]}).round_sizes == (4, 8)
    assert capabilities(EngineConfig(), {"capabilities": {"mixed": True}, "decode_rows": [8, 16]}).round_sizes == (8, 16)
    assert capabilities(EngineConfig(), {"capabilities": {"mixed": True}}).round_sizes is None
    inferred = profile(prefill_many=MANY)
    assert inferred.capabilities("stepped") == Capabilities(batch_cuts=True)
    assert inferred.capabilities("mixed") == Capabilities(batch_cuts=True, mixed=True, cut_free=True)


def test_an_engine_description_without_capabilities_gives_its_decode_rows_as_round_sizes():
    from tensorfold_bench.calibrate.sim_error import capabilities
    assert capabilities(EngineConfig(), {"decode_rows": [8, 16]}).round_sizes == (8, 16)
    eng = {"decode_rows": [8], "cuda_mixed": "graphs at cuts of 128, 256 rows"}
    caps = capabilities(EngineConfig(prefill_mode="mixed"), eng)
    assert caps.cut_sizes == (128, 256) and caps.round_sizes == (8,)
    assert capabilities(EngineConfig(), {}).round_sizes is None


def test_requests_follow_each_others_events_and_cancel_after_seconds_or_tokens():
    cfg = EngineConfig(parallel=4, prefill_rows=256, max_model_len=8000)
    reqs = [SimRequest("X", [3] * 1000, 50, 0.0, cancel_tokens=5),
            SimRequest("R", [3] * 1000, 4, 0.2, after=("X", "cancelled")),
            SimRequest("Y", [4] * 10, 1000, 0.0, after=("R", "first_token"), cancel_after=0.1),
            SimRequest("Z", [5] * 10, 4, 0.0, after=("Y", "done"))]  # Y is cancelled: Z is never sent
    res = play(reqs, cfg, profile(), vocab_size=100)
    x, r, y = res.records["X"], res.records["R"], res.records["Y"]
    assert x.cancelled and 5 <= len(x.token_ids) <= 6  # closed after its 5th, reaped at the next turn
    assert r.sent == pytest.approx(res.events[("X", "cancelled")] + 0.2)
    assert r.cached_tokens == 768  # X's rows, to the last cut boundary before its prompt's last cut
    assert y.sent == pytest.approx(r.token_times[0]) and y.cancelled and y.ended - y.sent < 0.12
    assert "Z" not in res.records
    with pytest.raises(ValueError, match="not one of"):
        play([SimRequest("A", [1], 4, after=("A", "ended"))], cfg, profile())


def test_a_scenario_whose_forwards_the_profile_lacks_is_refused_not_failed():
    cfg = EngineConfig(parallel=4, prefill_rows=256, max_model_len=8000, prefill_mode="mixed")
    with pytest.raises(ProfileError, match="has no 'mixed' samples"):
        play([SimRequest("A", [1] * 300, 4)], cfg, profile(), Capabilities(mixed=True))
    shorts = [SimRequest(f"S{i}", [i + 1] * 100, 4) for i in range(3)]
    with pytest.raises(ProfileError, match="has no 'prefill_many' samples"):  # asked for mid-run
        play(shorts, EngineConfig(parallel=4, prefill_rows=256, max_model_len=8000), profile(),
             Capabilities(batch_cuts=True))


# ---- profile /2: rounds at the rows they ran at, and the longest stream ---------------------------

ROWS_AT = {4: 0.005, 64: 0.012}  # a round's fixed cost at the rows it ran at: the padded shape's


def rows_profile(**extra) -> Costs:
    """A /2 profile counted by rows: runners of 4 and 64 lanes, each running every round at its
    padded shape, so a one-stream round was measured at 4 rows on one and at 64 on the other."""
    dec = [[n, k, lg, ROWS_AT[n] + DB * k] for n in ROWS_AT for s in (1, 4) for k, lg in
           ((s * 100, 100), (s * 8000, 8000), (s * 30000, 30000))]
    engine = {"runners": [{"prefill_mode": "stepped", "parallel": p, "decode_rows": [p],
                           "capabilities": {"runs_ahead": False}} for p in ROWS_AT]}
    return profile("cuda", rounds="rows", engine=engine, decode=dec, **extra)


def test_a_round_costs_the_rows_its_engine_runs_it_at_not_its_streams():
    """On a profile counted by rows, an engine of 4 lanes charges a one-stream round the 4-row cost,
    one of 64 lanes the 64-row cost: the padded shape is what the forward runs at."""
    c = rows_profile()
    assert c.capabilities("stepped", 4).round_sizes == (4,) and c.capabilities("stepped", 64).round_sizes == (64,)
    spent = {}
    for parallel in ROWS_AT:
        clock = VirtualClock()
        b = SimulatedBackend(c, parallel, 40000, 1000, c.capabilities("stepped", parallel), clock=clock)
        b.decode([0], [1], [99])
        spent[parallel] = clock()
        assert spent[parallel] == pytest.approx(ROWS_AT[parallel] + DB * 100, rel=0.01)
    assert spent[64] - spent[4] == pytest.approx(ROWS_AT[64] - ROWS_AT[4], rel=0.02)
    # the player, on the capabilities the simulated engine is given: one stream's tokens a round apart
    gaps = {}
    for parallel in ROWS_AT:
        cfg = EngineConfig(parallel=parallel, prefill_rows=256, max_model_len=4000)
        res = play([SimRequest("A", [1] * 16, 40, 0.0)], cfg, c, c.capabilities("stepped", parallel), vocab_size=100)
        t = res.records["A"].token_times
        gaps[parallel] = statistics.median(b - a for a, b in zip(t, t[1:]))
    assert gaps[4] == pytest.approx(ROWS_AT[4], rel=0.05) and gaps[64] == pytest.approx(ROWS_AT[64], rel=0.05)
    # counted by streams (no round sizes), the same round costs the one-stream count on either engine
    streams = profile("cuda")
    assert streams.capabilities("stepped", 64).round_sizes is None
    clock = VirtualClock()
    SimulatedBackend(streams, 64, 40000, 1000, streams.capabilities("stepped", 64), clock=clock).decode([0], [1], [99])
    assert clock() == pytest.approx(round_s(1, 100), rel=0.01)


def test_a_round_runs_at_the_fewest_declared_rows_that_hold_its_highest_lane():
    """Declared round sizes below the padded shape: a round of lanes 0-1 runs at 2 rows, one whose
    stream sits in lane 5 at 8 (row r carries lane r), and the simulated round costs that count."""
    dec = [[n, k, lg, 0.004 + 0.001 * n + DB * k] for n in (1, 2, 4, 8, 16) for k, lg in ((100, 100), (9000, 9000))]
    c = profile("cpu", rounds="rows", decode=dec,
                engine={"runners": [{"prefill_mode": "stepped", "parallel": 16, "decode_rows": [1, 2, 4, 8, 16]}]})
    caps = c.capabilities("stepped", 16)
    assert caps.round_sizes == (1, 2, 4, 8, 16)
    for lanes, rows in (([0, 1], 2), ([5], 8), ([0, 15], 16)):
        clock = VirtualClock()
        SimulatedBackend(c, 16, 4000, 100, caps, clock=clock).decode(lanes, [1] * len(lanes), [99] * len(lanes))
        assert clock() == pytest.approx(c.decode(rows, 100 * len(lanes), 100)), lanes
        assert clock() == pytest.approx(0.004 + 0.001 * rows + DB * 100 * len(lanes), rel=0.01), lanes


def test_a_profile_of_schema_1_still_loads_with_its_rounds_widened(tmp_path):
    """A /1 file (a round's streams and keys, no longest) is read as /2 counted by streams, the
    longest stream's keys as if the streams' contexts were equal and a position apart."""
    v1 = {"prefill": [[r, st, cut_s(r, st)] for r in (16, 256, 1024) for st in (0, 4096, 16384)],
          "decode": [[n, k, round_s(n, k)] for n in DA for k in (n * 20, n * 5000, n * 30000)],
          "mixed": [[256, 0, 4, 4000, 0.02]],
          "split": [[32, 1024, 0, 2, 600, 0.03, 0.008]],
          "split_round": [[32, 4, 2000, 0.007]],
          "host": [["turn", 5e-5]]}
    p = tmp_path / "old.json"
    p.write_text(json.dumps({"schema": "tfbench.profile/1", "device": {"type": "cuda"}, "model": {}, "engine": {},
                             "samples": v1}))
    c = Costs.load(p)
    s = c.profile.samples
    assert c.profile.rounds == "streams" and not c.rows_run_at
    assert s["decode"][0] == [1, 20, 20, round_s(1, 20)]
    assert s["decode"][-1] == [8, 240000, 240000 / 8 + 3.5, round_s(8, 240000)]
    assert s["mixed"] == [[256, 0, 4, 4000, 1001.5, 0.02]]
    assert s["split"] == [[32, 1024, 0, 2, 600, 300.5, 0.03, 0.008]]
    assert s["split_round"] == [[32, 4, 2000, 501.5, 0.007]]
    assert s["prefill"] == v1["prefill"] and s["host"] == v1["host"]
    # its costs are the ones it measured; counted by streams on CUDA, a count between is the next graph's
    assert c.decode(2, 2000, 1000.5) == pytest.approx(round_s(2, 2000), rel=0.01)
    assert c.decode(3, 0, 0) == pytest.approx(DA[4], rel=0.01)
    assert c.capabilities("stepped", 4).round_sizes is None
    # written again, it is a /2 file counted by streams that reads back the same
    again = Profile.load(c.profile.write(tmp_path / "new.json"))
    assert json.loads((tmp_path / "new.json").read_text())["schema"] == "tfbench.profile/2"
    assert again.rounds == "streams" and again.samples == s
    # a /1 row is 3 wide, a /2 row 4: each schema's widths are its own
    bad = {"schema": "tfbench.profile/1", "device": {}, "model": {}, "engine": {},
           "samples": {"decode": [[1, 20, 20, 0.006]]}}
    with pytest.raises(ProfileError, match=r"samples.decode\[0\] must be a list of 3 values"):
        Profile.from_dict(bad, "old.json")


LA, LB, LL = {1: 0.006, 4: 0.0065}, 1e-8, 2e-7  # a round: LA[n] + LB keys + LL longest


def lone_s(n, keys, longest):
    return LA[n] + LB * keys + LL * longest


def test_a_lone_long_stream_costs_more_than_many_short_ones_of_the_same_keys():
    """The decode fit's slope over the longest stream: measured rounds where one stream's attention
    (on few SMs) costs more per key than the same keys spread over four streams."""
    dec = []
    for ctx in (64, 4096, 16384, 32768):
        dec.append([1, ctx, ctx, lone_s(1, ctx, ctx)])
        for ks in ((ctx, ctx, ctx, ctx), (ctx, 64, 64, 64), (ctx, ctx // 2, 64, 64)):  # equal and uneven
            dec.append([4, sum(ks), max(ks), lone_s(4, sum(ks), max(ks))])
    c = profile("cuda", decode=dec)
    fit = RoundFit.of(dec, next_up=True)
    assert fit.slope == pytest.approx(LB, rel=0.02) and fit.slope_longest == pytest.approx(LL, rel=0.02)
    lone, four = c.decode(1, 32768, 32768), c.decode(4, 32768, 8192 + 1.5)
    assert lone == pytest.approx(lone_s(1, 32768, 32768), rel=0.01)
    assert four == pytest.approx(lone_s(4, 32768, 8193.5), rel=0.01)
    assert lone > 1.5 * four  # though four streams' round has the larger fixed cost
    # the simulated backend charges a round its longest stream: one lane at 32,768 keys, then four at 8,192
    clock = VirtualClock()
    b = SimulatedBackend(c, 4, 40000, 1000, clock=clock)
    b.decode([0], [1], [32767])
    t = clock()
    b.decode([0, 1, 2, 3], [1] * 4, [8191] * 4)
    assert t == pytest.approx(lone) and clock() - t == pytest.approx(c.decode(4, 32768, 8192))
    assert t > 1.5 * (clock() - t)
