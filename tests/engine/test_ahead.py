"""Decode rounds run one ahead (engine/runner/ahead.py), on the CPU: the eager rounds run the logic the
CUDA graphs capture (the device-side advance, the match, the guards); ids equal to plain rounds."""
import pytest
import torch

from engine.runner.ahead import advance
from engine.config import SHORT_ROWS, EngineConfig, KernelConfig
from engine.scheduler.host import LaneHost
from engine.runner.build import build_runner
from engine.scheduler.sampling import SamplingParams
from engine.scheduler.sequence import Sequence

LEN = 96


def make(overlap):
    return build_runner(EngineConfig(model="tiny", parallel=4, max_model_len=LEN, prefill_rows=16, seed=1,
                                     kernels=KernelConfig(overlap=overlap)))


@pytest.fixture(scope="module")
def pair():
    return make(True), make(False)


def prompt(n, salt):
    return [(i * 37 + salt * 11 + 5) % 256 for i in range(n)]


def test_defaults_run_ahead_only_with_a_graph(pair):
    ahead, plain = pair
    assert ahead.runs_ahead and not plain.runs_ahead  # CPU: off unless asked
    assert ahead.describe()["decode_ahead"] and not plain.describe()["decode_ahead"]  # /v1/engine


def test_advance_matches_the_device_step():
    rows = [[5, 6, 0, 0], [10, 3, 0, 0], [0, 1, 4, 4]]
    assert advance(rows, [7, 8, 9, 1], spare=4) == [[7, 8, 9, 1], [11, 4, 0, 0], [0, 1, 4, 4]]


def test_rounds_ahead_equal_plain_rounds(pair):
    """Lanes 0-2 decode with ahead; lane 1 drops out (the round in flight still serves), lane 3
    joins (it does not: a fresh round), a sampled round (never ahead), a round not asked ahead."""
    ahead, plain = pair
    got = {}
    for r in (ahead, plain):
        lanes = [0, 1, 2]
        toks = [r.prefill(ln, prompt(9 + 5 * ln, ln)) for ln in lanes]
        pos = [9 + 5 * ln for ln in lanes]
        log = []
        for k in range(14):
            if k == 5:  # lane 1's stream ends
                i = lanes.index(1)
                del lanes[i], toks[i], pos[i]
            if k == 8:  # lane 3 joins
                lanes.append(3)
                toks.append(r.prefill(3, prompt(20, 3)))
                pos.append(20)
            sampling = [SamplingParams(temperature=0.7, seed=3)] * len(lanes) if k == 11 else None
            out = r.decode(lanes, toks, pos, sampling=sampling, ahead=k != 12)
            log.append(out)
            toks, pos = out, [p + 1 for p in pos]
        got[r is ahead] = log
    assert got[True] == got[False]
    a = ahead.ahead
    # in flight after rounds 0-10, 12-13 minus 11 (sampled) and 12 (not asked): taken at 1-7, 9, 10;
    # wasted at 8 (lane 3 joined) and 11 (sampled); round 13's is still in flight
    assert (a.taken, a.wasted) == (9, 2)
    assert a.pending is not None


def test_never_ahead_past_the_last_position(pair):
    ahead, plain = pair
    toks = prompt(LEN - 3, 7)
    first = ahead.prefill(2, toks)
    before = ahead.kv.k[:, 3, 0].clone()  # the next lane's first row
    out, pos = [first], LEN - 3
    while pos < LEN:
        out.append(ahead.decode([2], [out[-1]], [pos], ahead=True)[0])
        pos += 1
    assert ahead.ahead.pending is None  # at LEN - 1 nothing was launched
    assert torch.equal(ahead.kv.k[:, 3, 0], before)
    assert out == plain.generate(toks, len(out), lane=2)


class Recorder:
    """The real runner, recording which decode calls the host asked to run ahead."""

    def __init__(self, inner):
        self.inner, self.asked = inner, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def decode(self, *args, ahead=False, **kw):
        self.asked.append(ahead)
        return self.inner.decode(*args, ahead=ahead, **kw)


def serve(backend, prompts, max_tokens, late):
    """The prompts from the start, then `late` (longer than a short cut: it steps beside the
    decode rounds) after three turns."""
    host = LaneHost(backend, EngineConfig(parallel=4, prefill_rows=16), clock=lambda: 0.0)
    seqs = [Sequence(prompt=p, max_tokens=max_tokens, ignore_eos=True) for p in [*prompts, late]]
    for s in seqs[:-1]:
        host.submit(s)
    for _ in range(3):
        host.turn()
    host.submit(seqs[-1])
    while any(not s.done for s in seqs):
        host.turn()
    return [list(s.output) for s in seqs]


def test_lane_host_asks_ahead_only_with_no_prompt_waiting():
    def runner(overlap):
        return build_runner(EngineConfig(model="tiny", parallel=4, max_model_len=1024, prefill_rows=16, seed=1,
                                         kernels=KernelConfig(overlap=overlap)))
    rec = Recorder(runner(True))
    prompts, late = [prompt(40, 1), prompt(12, 2)], prompt(SHORT_ROWS + 40, 3)
    got = serve(rec, prompts, 12, late)
    assert got == serve(runner(False), prompts, 12, late)
    assert rec.asked[:3] == [True] * 3 and False in rec.asked  # rounds beside the late prompt's cuts: not ahead
    assert rec.inner.ahead.taken > 0


def test_a_dropped_row_run_on_ahead_never_passes_the_last_position(pair):
    """A stream ends while the others go on: the chained rounds still carry its row (the device's
    inputs advance every lane's row), so the guard must watch that row too, or it walks past its
    lane's last position into the next lane's cache."""
    ahead, plain = pair
    short, long_ = prompt(LEN - 8, 4), prompt(10, 5)
    got = {}
    for r in (ahead, plain):
        toks = [r.prefill(1, short), r.prefill(2, long_)]
        lanes, pos = [1, 2], [LEN - 8, 10]
        before = r.kv.k[:, 2, 0].clone()  # lane 2's first row, the row after lane 1's cache
        log = []
        for k in range(30):
            if k == 3:  # lane 1's stream ends, 5 positions short of its last
                del lanes[0], toks[0], pos[0]
            out = r.decode(lanes, toks, pos, ahead=True)
            log.append(out[-1])
            toks, pos = out, [p + 1 for p in pos]
        assert torch.equal(r.kv.k[:, 2, 0], before)
        got[r is ahead] = log
    assert got[True] == got[False]
