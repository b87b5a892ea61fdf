"""engine.dev.bench.side_by_side: the prompt ratio's matrix rate is taken in bursts between the
prompts, each about as long as one prompt, so both figures see the same load (a power-capped card
clocks ~1,500 MHz under it, 1,980 after idle: engine/dev/PERF.md run 76)."""
import time

import torch

from engine.dev.bench import side_by_side


class SlowPrompts:
    """A runner whose whole prompt takes `seconds` of host time; it records when each ran."""
    device, vocab_size = torch.device("cpu"), 1000

    def __init__(self, seconds):
        self.seconds, self.spans = seconds, []

    def prefill(self, lane, toks):
        t = time.perf_counter()
        time.sleep(self.seconds)
        self.spans.append((t, time.perf_counter()))


def test_bursts_of_products_as_long_as_a_prompt_sit_between_the_prompts():
    r = SlowPrompts(0.06)
    seconds, rate = side_by_side(r, 16, reps=3, size=128)
    assert len(r.spans) == 4  # the warm-up and three timed prompts
    assert 0.06 <= seconds < 0.2
    gaps = [b[0] - a[1] for a, b in zip(r.spans[1:], r.spans[2:])]  # between timed prompts: a burst
    assert all(0.03 < g < 0.5 for g in gaps), gaps
    a = torch.randn(128, 128)
    t = time.perf_counter()
    for _ in range(200):
        a @ a
    alone = 2 * 128 ** 3 * 200 / (time.perf_counter() - t)
    assert alone / 10 < rate < alone * 10
