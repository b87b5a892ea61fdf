"""One forward carrying both, on the CPU: a decode round alone, a prompt cut alone, the cut then
the round, and the cut with the round's rows inside it (ModelRunner.mixed), timed in turns
(round, cut, cut+round, mixed, mixed, cut+round, cut, round) in one process.

    python -m tools.mixed_forward [--model cpu] [--streams 1] [--prefill-rows 64] [--rows 64,128,256]
                                  [--ctx 0,2048] [--reps 5]

Prints medians per (rows, context): the times, what the mixed forward saves against the cut then
the round, and the share of its rate a stream would keep (round / mixed) against alternation's
(round / (cut + round)). The engine's defaults (dtype, threads) as `tfengine serve` picks them.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from engine.cli import device_defaults
from engine.config import EngineConfig
from engine.runner.build import build_runner


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="cpu")
    ap.add_argument("--streams", type=int, default=1)
    ap.add_argument("--prefill-rows", type=int, default=64, help="R: its attention tile (cuts should be multiples)")
    ap.add_argument("--rows", default="64,128,256")
    ap.add_argument("--ctx", default="0,2048")
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args(argv)
    dtype, parallel, chose = device_defaults("cpu", None, None, None)
    rows, ctxs = [int(x) for x in a.rows.split(",")], [int(x) for x in a.ctx.split(",")]
    top = max(ctxs) + max(rows)
    r = build_runner(EngineConfig(model=a.model, dtype=dtype, parallel=parallel, max_model_len=top + 64,
                                  prefill_rows=a.prefill_rows, prefill_mode="mixed"))
    print(f"{a.model} {dtype}, {torch.get_num_threads()} threads ({chose}); mixed floor {r.cpu.mix_floor}, "
          f"cut_free {r.cut_free}")
    prompt = [(i * 31 + 7) % r.vocab_size for i in range(top)]
    lanes = list(range(1, 1 + a.streams))
    for lane in lanes:
        r.prefill(lane, prompt[:40])
    toks, pos = [1] * len(lanes), [40] * len(lanes)
    r.prefill(0, prompt, 0) if max(ctxs) else None  # the cut's lane holds the context it attends over

    def clock(f) -> float:
        t0 = time.perf_counter()
        f()
        return time.perf_counter() - t0

    print("| cut rows | context | round | cut | cut, then round | mixed | mixed saves | A keeps: mixed / alternation |")
    print("|---|---|---|---|---|---|---|---|")
    for ctx in ctxs:
        for n in rows:
            cut = (0, prompt, ctx, ctx + n)
            t = {"round": [], "cut": [], "both": [], "mixed": []}
            runs = {"round": lambda: r.decode(lanes, toks, pos), "cut": lambda: r.prefill_step(*cut),
                    "both": lambda: (r.prefill_step(*cut), r.decode(lanes, toks, pos)),
                    "mixed": lambda: r.mixed([cut], lanes, toks, pos)}
            for f in runs.values():  # warm
                f()
            for _ in range(a.reps):
                for k in ("round", "cut", "both", "mixed", "mixed", "both", "cut", "round"):
                    t[k].append(clock(runs[k]))
            m = {k: statistics.median(v) * 1e3 for k, v in t.items()}
            print(f"| {n} | {ctx} | {m['round']:.1f} ms | {m['cut']:.1f} | {m['both']:.1f} | {m['mixed']:.1f} | "
                  f"{m['both'] - m['mixed']:.1f} ms ({100 * (m['both'] - m['mixed']) / m['round']:.0f} % of a round) | "
                  f"{100 * m['round'] / m['mixed']:.0f} % / {100 * m['round'] / m['both']:.0f} % |")


if __name__ == "__main__":
    main()
