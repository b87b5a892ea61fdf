"""Streams for the lane host's policy tests, which drive it turn by turn with fake backends."""
from engine.scheduler.sequence import Sequence


def seq(n, tag=0, **kw):
    """An n-token prompt (its ids from `tag`) for an endless greedy reply."""
    return Sequence(prompt=[(tag * 7 + i) % 500 for i in range(n)], max_tokens=10**6, ignore_eos=True, **kw)


def start_decoder(host, backend):
    """A stream decoding after one turn; the backend's call log cleared."""
    a = seq(10, tag=1)
    host.submit(a)
    host.turn()
    backend.calls.clear()
    return a
