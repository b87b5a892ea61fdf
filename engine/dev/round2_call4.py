"""Issue 14, fourth device call: eight 200-token prompts arriving together at the lane host,
first-token times against one prompt alone, with short cuts batched (KernelConfig.batch_cuts)
and without; replies equal to each alone.

    PYTHONPATH=. python3 -m engine.dev.round2_call4 --out $OUT
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from dataclasses import replace

import engine.dev.round2 as R2
from engine.config import EngineConfig, KernelConfig
from engine.host import LaneHost
from engine.sequence import Sequence

RES = R2.RES


def first_tokens(runner, cfg, prompts, max_tokens=8):
    """Submit all prompts at once to a host (turns driven here); seconds to each first token, and replies."""
    host = LaneHost(runner, cfg)
    seqs, firsts = [], {}
    t0 = time.perf_counter()
    for p in prompts:
        s = Sequence(prompt=p, max_tokens=max_tokens, ignore_eos=True)
        s.emit = (lambda k, v, s=s: firsts.setdefault(s.id, time.perf_counter() - t0) if k == "token" else None)
        host.submit(s)
        seqs.append(s)
    while not all(s.done for s in seqs):
        host.turn()
        for s in seqs:
            s.undrained = 0
    return [firsts[s.id] for s in seqs], [list(s.output) for s in seqs]


def main(argv):
    R2.OUT = argv[argv.index("--out") + 1] if "--out" in argv else R2.OUT
    from engine.runner import ModelRunner
    cfg = EngineConfig(model="qwen3-8b", device="cuda", dtype="bfloat16", parallel=8, max_model_len=1024,
                       prefill_rows=1024)
    base = ModelRunner(cfg)
    runners = {"cublas, one by one": base,
               "tiles, batched": ModelRunner(replace(cfg, kernels=KernelConfig(batch_cuts=True)), model=base.model)}
    prompts = [R2.prompt(200, 300 + i) for i in range(8)]
    out = RES.setdefault("host", {})
    for name, r in runners.items():
        c = replace(cfg, kernels=KernelConfig(batch_cuts=r.batch_cuts))
        first_tokens(r, c, prompts[:1])  # warm-up
        alone = [first_tokens(r, c, [p])[0][0] for p in prompts[:5]]
        eight, replies = zip(*[first_tokens(r, c, prompts) for _ in range(3)])
        med8 = statistics.median(statistics.median(e) for e in eight)
        out[name] = {"alone_median_s": statistics.median(alone), "eight_median_s": med8,
                     "ratio": med8 / statistics.median(alone), "eight_all": eight,
                     "replies_same_across_reps": all(r_ == replies[0] for r_ in replies)}
        out[name]["replies"] = replies[0]
        R2.say(f"{name:20s}: one alone {statistics.median(alone) * 1e3:6.1f} ms; eight together median "
               f"{med8 * 1e3:6.1f} ms ({med8 / statistics.median(alone):.2f}x)")
    a, b = out["cublas, one by one"], out["tiles, batched"]
    alone_tiles = [first_tokens(runners["tiles, batched"], cfg, [p], 8)[1][0] for p in prompts]
    out["tiles: together == each alone"] = list(b["replies"]) == alone_tiles
    out["tiles vs cublas replies equal"] = sum(x == y for x, y in zip(a["replies"], b["replies"]))
    R2.say(json.dumps({k: v for k, v in out.items() if not isinstance(v, dict)}))
    R2.save()


if __name__ == "__main__":
    main(sys.argv[1:])
