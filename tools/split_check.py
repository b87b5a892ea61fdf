"""Split mode in process: a stream decoding on the decode partition while a long prompt's cuts run
on the prompt partition (`CudaRunner.start_step`), against each alone on the whole device.

    PYTHONPATH=. python3 -m tools.split_check --model qwen3-0.6b [--decode-sms 32] [--prompt 6000]

One runner with `--prefill-mode split`. First the plain references: A (a short prompt) generated
alone, B's first token after its whole prompt alone. Then A decodes in another lane while B's cuts
are launched two deep and landed as they finish, the host's order; A's tokens and B's first token
must equal the references bit for bit, and the rounds beside the cuts must have run on the decode
partition's graphs. Prints the figures and exits 1 on a difference.
"""
from __future__ import annotations

import argparse
import sys
import time

import torch

from engine.config import EngineConfig
from engine.runner.build import build_runner
from engine.scheduler.backend import cuts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen3-0.6b")
    ap.add_argument("--decode-sms", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=6000, help="B's tokens")
    ap.add_argument("--tokens", type=int, default=48, help="A's tokens")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("split_check: needs a CUDA device")
    t0 = time.perf_counter()
    r = build_runner(EngineConfig(model=a.model, device="cuda", dtype="bfloat16", parallel=4,
                                  max_model_len=a.prompt + 1024, prefill_rows=1024, prefill_mode="split",
                                  decode_sms=a.decode_sms))
    r.cuts_warmed.result()
    print(f"runner up in {time.perf_counter() - t0:.1f} s: {r.describe()['cuda_split']}", flush=True)
    g = torch.Generator().manual_seed(11)
    prompt_a = torch.randint(0, r.vocab_size, (100,), generator=g).tolist()
    prompt_b = torch.randint(0, r.vocab_size, (a.prompt,), generator=g).tolist()
    ref_a = r.generate(prompt_a, a.tokens, lane=0)
    ref_b = r.prefill(1, prompt_b)

    out = [r.prefill(2, prompt_a)]
    todo, landed, first_b, beside = cuts(0, len(prompt_b), r.prefill_rows), 0, None, 0
    launched = 0
    t1 = time.perf_counter()
    while landed < len(todo) or len(out) < a.tokens:
        while launched < len(todo) and launched - landed < 2:
            r.start_step(3, prompt_b, *todo[launched])
            launched += 1
        if len(out) < a.tokens:
            beside += landed < len(todo)
            out.append(r.decode([2], [out[-1]], [len(prompt_a) + len(out) - 1])[0])
        while landed < len(todo) and (r.step_done() or len(out) >= a.tokens):
            tok = r.finish_step()
            landed += 1
            if landed == len(todo):
                first_b = tok
    took = time.perf_counter() - t1
    ok_a, ok_b = out == ref_a, first_b == ref_b
    print(f"A: {len(out)} tokens, {beside} rounds beside B's {len(todo)} cuts, equal to alone: {ok_a}; "
          f"B's first token {first_b} against {ref_b} alone: {ok_b}; {took:.2f} s", flush=True)
    return 0 if ok_a and ok_b else 1


if __name__ == "__main__":
    sys.exit(main())
