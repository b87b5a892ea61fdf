"""Split mode's policy, turn by turn with a fake backend: while streams decode, a long prompt's cut
is launched (start_step) and the rounds go on beside it until it is done; one cut in flight at a
time; no stream decoding, the cuts run in turn as before; short prompts, cancels and failures."""
import pytest

from engine.cli import check_config, split_refused
from engine.config import ConfigError, EngineConfig, KernelConfig
from engine.cuda.partitions import check_decode_sms
from engine.scheduler.backend import Capabilities
from engine.scheduler.host import LaneHost
from engine.scheduler.sampling import SamplingParams
from engine.scheduler.sequence import Sequence, Status
from lanes import seq, start_decoder

R = 256


class SplitBackend:
    """Cuts launched with start_step run one after another, as on a stream: the oldest is done
    after `rounds_a_cut` decode rounds beside it."""

    def __init__(self, rounds_a_cut=3, fail_finish=False):
        self.parallel, self.max_model_len, self.vocab_size, self.eos_token_ids = 4, 100_000, 1000, (999,)
        self.caps = Capabilities(split=True)
        self.rounds_a_cut, self.fail_finish = rounds_a_cut, fail_finish
        self.calls: list[tuple] = []
        self.flights = []  # [lane, tokens, end, rounds beside it], oldest first

    def _first(self, tokens, end):
        return (sum(tokens) + end) % 997 if end == len(tokens) else None

    def prefill_step(self, lane, tokens, start, end, **kw):
        self.calls.append(("prefill", lane, start, end))
        return self._first(tokens, end)

    def decode(self, lanes, tokens, positions, **kw):
        self.calls.append(("decode", tuple(lanes)))
        if self.flights:
            self.flights[0][3] += 1
        return [(t * 31 + p) % 997 for t, p in zip(tokens, positions)]

    def start_step(self, lane, tokens, start, end):
        self.calls.append(("start", lane, start, end))
        self.flights.append([lane, tokens, end, 0])

    def step_done(self):
        return not self.flights or self.flights[0][3] >= self.rounds_a_cut

    def finish_step(self):
        lane, tokens, end, _ = self.flights.pop(0)
        self.calls.append(("finish", lane, end))
        if self.fail_finish:
            raise RuntimeError("injected")
        return self._first(tokens, end)


def make(**kw):
    backend = SplitBackend(**kw)
    cfg = EngineConfig(parallel=4, prefill_rows=R, prefill_mode="split", out_queue=10**9)
    return LaneHost(backend, cfg), backend


def turns_until(host, cond, limit=1000):
    for _ in range(limit):
        if cond():
            return
        host.turn()
    raise AssertionError("never happened")


def test_a_long_prompts_cuts_run_beside_the_rounds_one_at_a_time():
    host, backend = make(rounds_a_cut=3)
    a = start_decoder(host, backend)
    b = seq(4 * R, tag=2)
    host.submit(b)
    turns_until(host, lambda: b.status == Status.DECODE)
    kinds = [c[0] for c in backend.calls]
    assert "prefill" not in kinds  # every cut of B went beside the rounds
    assert [c[2:] for c in backend.calls if c[0] == "start"] == [(0, R), (R, 2 * R), (2 * R, 3 * R), (3 * R, 4 * R)]
    assert [c[2] for c in backend.calls if c[0] == "finish"] == [R, 2 * R, 3 * R, 4 * R]  # landed in order
    starts = [i for i, k in enumerate(kinds) if k == "start"]
    finishes = [i for i, k in enumerate(kinds) if k == "finish"]
    # the next cut is launched while one runs, never more than two in flight
    assert all(s < f for s, f in zip(starts[1:], finishes))
    assert all(f < s for f, s in zip(finishes, starts[2:]))
    # A's rounds go on beside the cuts: three a cut here, none waiting for a landing
    assert kinds[:finishes[0]].count("decode") == 3
    assert all(kinds[f + 1:g].count("decode") == 3 for f, g in zip(finishes, finishes[1:]))
    assert b.output[0] == backend._first(b.prompt, len(b.prompt)) and len(a.output) > 12


def test_with_no_stream_decoding_the_cuts_run_in_turn():
    host, backend = make()
    b = seq(3 * R, tag=2)
    host.submit(b)
    turns_until(host, lambda: b.status == Status.DECODE)
    assert [c for c in backend.calls if c[0] != "decode"] == [("prefill", 0, s, s + R) for s in range(0, 3 * R, R)]


def test_a_cut_in_flight_whose_decoders_end_is_waited_for():
    host, backend = make(rounds_a_cut=10**9)  # never done by rounds: only a wait lands it
    a = Sequence(prompt=[1, 2, 3], max_tokens=3, ignore_eos=True)
    host.submit(a)
    host.turn()
    backend.calls.clear()
    b = seq(4 * R, tag=2)
    host.submit(b)
    host.turn()
    lane = b.lane
    turns_until(host, lambda: b.status == Status.DECODE)
    assert a.status == Status.FINISHED and len(a.output) == 3
    # A ended during B's first cuts: the host waited for them, then filled the rest in turn
    assert [c for c in backend.calls if c[0] in ("start", "finish", "prefill")] == [
        ("start", lane, 0, R), ("start", lane, R, 2 * R), ("finish", lane, R), ("finish", lane, 2 * R),
        *[("prefill", lane, s, s + R) for s in (2 * R, 3 * R)]]


def test_a_short_prompt_goes_out_while_a_cut_is_in_flight():
    host, backend = make(rounds_a_cut=50)
    start_decoder(host, backend)
    b = seq(4 * R, tag=2)
    host.submit(b)
    host.turn()
    assert backend.flights
    c = seq(34, tag=3)
    host.submit(c)
    host.turn()
    assert c.status == Status.DECODE and c.output  # before B's cut landed
    assert backend.flights and ("prefill", c.lane, 0, 34) in backend.calls


def test_a_cancel_waits_for_the_cut_before_its_lane_serves_again():
    host, backend = make(rounds_a_cut=10**9)
    start_decoder(host, backend)
    b = seq(4 * R, tag=2)
    host.submit(b)
    host.turn()
    host.turn()
    lane = b.lane
    assert [f[0] for f in backend.flights] == [lane, lane]  # two cuts in flight
    b.cancel_requested = True
    host.turn()
    assert b.status == Status.CANCELLED and not backend.flights and not host.inflight
    assert ("finish", lane, R) in backend.calls and ("finish", lane, 2 * R) in backend.calls and lane in host.free
    assert host.lane_rows[lane] == b.prompt[:2 * R]  # the landed cuts' rows stay: the prompt cache


def test_a_failed_cut_ends_its_stream_and_the_decoders_go_on():
    host, backend = make(rounds_a_cut=2, fail_finish=True)
    a = start_decoder(host, backend)
    b = seq(4 * R, tag=2)
    host.submit(b)
    turns_until(host, lambda: b.status == Status.FAILED)
    n = len(a.output)
    host.turn()
    assert a.status == Status.DECODE and len(a.output) == n + 1 and not host.inflight and not backend.flights


def test_a_sampled_prompts_cuts_run_in_turn_on_the_whole_device():
    host, backend = make()
    start_decoder(host, backend)
    b = seq(4 * R, tag=2, sampling=SamplingParams(temperature=0.7, seed=3))
    host.submit(b)
    turns_until(host, lambda: b.status == Status.DECODE)
    assert not [c for c in backend.calls if c[0] == "start"]
    assert [c[2:] for c in backend.calls if c[0] == "prefill"] == [(s, s + R) for s in range(0, 4 * R, R)]


def test_split_is_refused_where_it_cannot_run_naming_the_flag():
    assert "--device cuda" in split_refused(EngineConfig(prefill_mode="split"))
    assert "one rank" in split_refused(EngineConfig(prefill_mode="split", device="cuda", tensor_parallel=2))
    assert "decode graph" in split_refused(EngineConfig(prefill_mode="split", device="cuda",
                                                        kernels=KernelConfig(cuda_graph=False)))
    assert split_refused(EngineConfig(prefill_mode="split", device="cuda")) is None
    with pytest.raises(ConfigError, match="--prefill-mode split is for --device cuda"):
        check_config(EngineConfig(prefill_mode="split"))
    with pytest.raises(ConfigError, match="--decode-sms must be a positive multiple of 8"):
        EngineConfig(prefill_mode="split", decode_sms=12)


def test_the_decode_partition_leaves_the_prompt_a_group_of_sms():
    assert check_decode_sms(32, 132) is None and check_decode_sms(8, 132) is None and check_decode_sms(120, 132) is None
    assert "from 8 to 124" in check_decode_sms(128, 132)
    assert "not 20" in check_decode_sms(20, 132)
