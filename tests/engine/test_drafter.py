"""Speculative drafts: checked in a round's padding rows, replies token-exact."""
import pytest

from engine.config import EngineConfig
from engine.scheduler.drafter import NgramDrafter, make_drafter
from engine.config import ConfigError
from engine.scheduler.host import LaneHost
from engine.runner.build import build_runner
from engine.scheduler.sequence import Sequence, Status


def test_ngram_proposes_what_followed_the_last_occurrence():
    d = NgramDrafter(k=4)
    prompt, output = [5, 6, 7, 8, 9, 1], [2, 5, 6, 7]
    assert d.propose(1, prompt, output, 4) == [8, 9, 1, 2]
    assert d.propose(1, prompt, output + [8], 2) == [9, 1]  # incremental index, capped by k
    assert d.propose(3, [5, 6, 7, 8], [9, 5, 6, 7], 4) == [8, 9, 5, 6]  # a span across prompt and output
    assert d.propose(2, [1, 2, 3], [], 4) == []
    with pytest.raises(ConfigError, match="--drafter"):
        make_drafter("eagle")


def run(runner, prompts, drafter, max_tokens=40, parallel_share=None):
    host = LaneHost(runner, runner.cfg, drafter=drafter)
    seqs = [Sequence(prompt=p, max_tokens=max_tokens, ignore_eos=True) for p in prompts]
    for s in seqs:
        host.submit(s)
    for _ in range(1000):
        host.turn()
        for s in seqs:
            s.undrained = 0
        if all(s.status == Status.FINISHED for s in seqs):
            break
    return [s.output for s in seqs], host.counters


@pytest.fixture(scope="module")
def runner():
    return build_runner(EngineConfig(model="tiny", parallel=4, max_model_len=512, prefill_rows=16))


def test_drafted_replies_equal_plain_replies(runner):
    # Repetitive prompts give the prompt-lookup drafter something to find.
    prompts = [[(i % 9) * 11 + 3 for i in range(60)], [(i % 5) * 17 + 1 for i in range(45)]]
    plain, _ = run(runner, prompts, None)
    drafted, counters = run(runner, prompts, NgramDrafter(k=3))
    assert drafted == plain
    assert counters.drafted > 0 and counters.accepted > 0  # drafts were checked and some stood
    assert counters.decode_rounds < 2 * 39  # fewer rounds than one token a round
    alone, _ = run(runner, prompts[:1], NgramDrafter(k=3))
    assert alone[0] == plain[0]


def test_no_drafts_and_a_full_round_leave_no_room(runner):
    prompts = [[(i % 9) * 11 + 3 for i in range(60)] for _ in range(4)]
    _, full = run(runner, prompts, NgramDrafter(k=3), max_tokens=10)
    assert full.drafted == 0  # four streams fill the four rows: nothing to pad, nothing drafted
    runner.cfg.drafts = False
    try:
        _, off = run(runner, prompts[:1], NgramDrafter(k=3), max_tokens=10)
    finally:
        runner.cfg.drafts = True
    assert off.drafted == 0
