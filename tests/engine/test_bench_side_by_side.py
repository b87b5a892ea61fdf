"""tools.bench.side_by_side: the prompt ratio's matrix rate is taken in bursts between the
prompts, each about as long as one prompt, so both figures see the same load (a power-capped card
clocks ~1,500 MHz under it, 1,980 after idle: an H200 at its 700 W cap). On a fake clock: a prompt
takes 60 ms, a product 1 ms, so what runs when is exact, whatever the machine's load."""
import itertools

import torch

from tools.bench import side_by_side


class Clock:
    """Time moves only when a prompt or a product runs; `log` is what ran, in order."""
    def __init__(self):
        self.now, self.log = 0.0, []

    def __call__(self):
        return self.now


def test_bursts_of_products_as_long_as_a_prompt_sit_between_the_prompts():
    clock = Clock()

    class Runner:
        device, vocab_size = torch.device("cpu"), 1000

        def prefill(self, lane, toks):
            clock.now += 0.060
            clock.log.append("prompt")

    def product():
        clock.now += 0.001
        clock.log.append("product")
    seconds, rate = side_by_side(Runner(), 16, reps=3, size=100, clock=clock, product=product)
    assert abs(seconds - 0.060) < 1e-9 and abs(rate - 2 * 100 ** 3 / 0.001) < 1e-6 * rate
    runs = [(k, len(list(g))) for k, g in itertools.groupby(clock.log)]
    # 15 products timing one, the warm-up prompt, then each timed prompt followed by 60 products
    assert runs == [("product", 15), ("prompt", 2)] + [("product", 60), ("prompt", 1)] * 2 + [("product", 60)]
