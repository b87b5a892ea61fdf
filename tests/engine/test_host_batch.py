"""The lane host fills several short prompts in one forward when the backend can do so exactly
(`batch_cuts`, `prefill_many`); the streams' replies equal those of one-at-a-time fills."""
from engine.config import EngineConfig
from engine.scheduler.backend import Capabilities
from engine.scheduler.host import LaneHost
from engine.scheduler.sequence import Sequence

R = 64


class Backend:
    """Tokens are a pure function of each cut (what an exact backend guarantees)."""

    def __init__(self, batch: bool):
        self.parallel, self.max_model_len, self.vocab_size, self.eos_token_ids = 4, 10_000, 1000, (999,)
        self.caps = Capabilities(batch_cuts=batch)
        self.calls: list[tuple] = []

    def prefill_step(self, lane, tokens, start, end):
        self.calls.append(("step", lane, start, end))
        return (sum(tokens) + end) % 997 if end == len(tokens) else None

    def prefill_many(self, items):
        self.calls.append(("many", tuple((lane, s, e) for lane, _, s, e in items)))
        return [(sum(t) + e) % 997 if e == len(t) else None for _, t, _, e in items]

    def decode(self, lanes, tokens, positions):
        self.calls.append(("decode", tuple(lanes)))
        return [(t * 31 + p) % 997 for t, p in zip(tokens, positions)]


def serve(b: Backend, lengths, max_tokens: int, turns: int) -> list[Sequence]:
    """Submit one prompt per length at once, run the host's turns; each sequence keeps its events."""
    host = LaneHost(b, EngineConfig(parallel=4, prefill_rows=R), clock=lambda: 0.0)
    seqs = []
    for i, n in enumerate(lengths):
        events = []
        s = Sequence(prompt=[(i * 7 + j) % 500 for j in range(n)], max_tokens=max_tokens, ignore_eos=True,
                     emit=lambda k, p, events=events: events.append((k, p)))
        s.events = events
        host.submit(s)
        seqs.append(s)
    for _ in range(turns):
        host.turn()
        for s in seqs:
            s.undrained = 0
    return seqs


def run(batch: bool, lengths):
    b = Backend(batch)
    seqs = serve(b, lengths, 5, 20)  # the long prompt: a cut a turn
    return b.calls, [[p for k, p in s.events if k == "token"] for s in seqs]


def test_short_prompts_fill_together_with_the_same_replies():
    # three short prompts (one spans a cut boundary: 70 rows = 64 + 6) and one long (600 rows)
    calls_b, replies_b = run(True, [20, 70, 33, 600])
    calls_s, replies_s = run(False, [20, 70, 33, 600])
    assert replies_b == replies_s and all(len(r) == 5 for r in replies_b)
    assert not any(c[0] == "many" for c in calls_s)
    # one forward for the three first cuts, in fill order (fewest rows left first); the 6 rows
    # left of the 70-row prompt go alone; the long prompt steps cut by cut, never batched
    assert [c for c in calls_b if c[0] == "many"] == [("many", ((0, 0, 20), (2, 0, 33), (1, 0, 64)))]
    assert ("step", 1, 64, 70) in calls_b
    assert [c for c in calls_b if c[0] == "step" and c[1] == 3][0] == ("step", 3, 0, 64)


def test_a_failed_batched_forward_ends_its_streams_only():
    b = Backend(True)

    def boom(items):
        raise RuntimeError("injected")
    b.prefill_many = boom
    seqs = serve(b, [20, 33, 600], 3, 15)
    assert all(any(k == "error" for k, _ in s.events) for s in seqs[:2])
    assert [p for k, p in seqs[2].events if k == "token"] and not any(k == "error" for k, _ in seqs[2].events)
