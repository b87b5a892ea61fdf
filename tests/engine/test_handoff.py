"""The host's hand-off of emitted events to the event loop (engine/server/handoff.py): one wake-up
of the loop a step or a round, not one a token, with every stream's events delivered in order."""
import asyncio

from engine.server.handoff import Outbox
from engine.config import EngineConfig
from engine.scheduler.host import LaneHost
from engine.scheduler.sequence import Sequence

from tests.engine.test_host_policy import Clock, FakeBackend


class CountingLoop:
    """A real event loop whose thread-safe wake-ups are counted."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.wakeups = 0
        real = self.loop.call_soon_threadsafe

        def counted(*args):
            self.wakeups += 1
            return real(*args)
        self.loop.call_soon_threadsafe = counted

    def deliver(self):
        self.loop.run_until_complete(asyncio.sleep(0))


def run_streams(n_streams, max_tokens):
    clock = Clock()
    backend = FakeBackend(clock, parallel=4)
    host = LaneHost(backend, EngineConfig(parallel=4, prefill_rows=256, out_queue=4), clock=clock)
    cl = CountingLoop()
    box = Outbox.of(cl.loop)
    got = []
    seqs = []
    for i in range(n_streams):
        n = max_tokens[i] if isinstance(max_tokens, list) else max_tokens
        s = Sequence(prompt=[(7 * i + j) % 500 for j in range(10 + i)], max_tokens=n, ignore_eos=True)
        s.emit = lambda kind, payload, i=i: box.put(got.append, (i, kind, payload))
        s.flush = box.flush
        host.submit(s)
        seqs.append(s)
    while not all(s.done for s in seqs):
        host.turn()
        for s in seqs:
            s.undrained = 0  # the client keeps up
    cl.deliver()
    return seqs, got, cl, backend


def test_a_round_of_four_streams_wakes_the_loop_once():
    seqs, got, cl, backend = run_streams(4, max_tokens=6)
    rounds = sum(1 for c in backend.calls if c[0] == "decode")
    prompts = sum(1 for c in backend.calls if c[0] == "prefill")
    assert rounds == 5 and prompts == 4  # each prompt's first token, then five rounds of four
    # one wake-up a step that emitted (4 prompt steps, 5 rounds); one a token would be 24
    assert cl.wakeups == prompts + rounds
    cl.loop.close()


def test_every_stream_gets_its_tokens_in_order_then_done_while_others_go_on():
    seqs, got, cl, _ = run_streams(3, max_tokens=[3, 7, 5])  # two end mid-sweep, in rounds the others share
    for i, s in enumerate(seqs):
        mine = [(kind, payload) for j, kind, payload in got if j == i]
        assert mine == [("token", t) for t in s.output] + [("done", "length")]
        assert len(s.output) == [3, 7, 5][i]
    cl.loop.close()


def test_events_wait_for_the_flush_and_batches_keep_their_order():
    cl = CountingLoop()
    box = Outbox.of(cl.loop)
    assert Outbox.of(cl.loop) is box  # one per loop, so one flush wakes it for every stream
    got = []
    for r in range(3):  # three rounds of two streams
        box.put(got.append, (0, "token", 10 + r))
        box.put(got.append, (1, "token", 20 + r))
        cl.deliver()
        assert len(got) == 2 * r  # nothing reaches the loop before the host flushes
        box.flush()
        box.flush()  # a second flush with nothing queued wakes nobody
    cl.deliver()
    assert got == [(0, "token", 10), (1, "token", 20), (0, "token", 11), (1, "token", 21),
                   (0, "token", 12), (1, "token", 22)]
    assert cl.wakeups == 3
    cl.loop.close()
    box.put(got.append, (0, "done", "stop"))
    box.flush()  # a closed loop (the server shut down): dropped, no raise on the host thread
