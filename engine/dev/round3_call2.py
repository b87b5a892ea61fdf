"""Issue 14, round 3, second device call: PDL wait-only and smaller L2 prefetches beside the round
(run 12 measured both full forms slower); the short-prompt forward through cuBLAS at the row
counts the runner's start-up check adopts (padded once a forward), eight 200-token prompts at the
lane host in one forward and in forwards of up to 1,024 or 800 rows.

    PYTHONPATH=. python3 -m engine.dev.round3_call2 --out $OUT
"""
from __future__ import annotations

import json
import statistics
import sys
from dataclasses import replace

import torch

import engine.dev.round2 as R2
import engine.dev.round3_call1 as C1
import engine.host as H
import engine.kernels_batch as B
from engine.config import EngineConfig, KernelConfig

RES, say, save = R2.RES, R2.say, R2.save
MB = 1 << 20


def sec_decode(base):
    o = (4096, 4096)
    C1.sec_decode(base, {"base": {}, "pdl wait only": {"pdl": 1}, "pdl": {"pdl": 2},
                         "prefetch o, 34 MB": {"l2_prefetch": True}, "prefetch o, 8 MB": {"l2_prefetch": True}},
                  evict_variant=False, plans={"prefetch o, 34 MB": {o: 64 * MB}, "prefetch o, 8 MB": {o: 8 * MB}})


def sec_host(base):
    from engine.dev.round2_call4 import first_tokens
    from engine.runner import ModelRunner
    out = RES.setdefault("host", {})
    cfg = EngineConfig(model="qwen3-8b", device="cuda", dtype="bfloat16", parallel=8, max_model_len=1024,
                       prefill_rows=1024)
    one = ModelRunner(cfg, model=base.model)
    tiles = ModelRunner(replace(cfg, kernels=KernelConfig(batch_cuts=True, batch_cublas=False)), model=base.model)
    B.BUCKETS.clear()
    cub = ModelRunner(replace(cfg, kernels=KernelConfig(batch_cuts=True)), model=base.model)
    adopted = dict(B.BUCKETS)
    out["start-up check: rows"] = cub.batch_rows
    say(f"start-up check adopted rows {cub.batch_rows}")
    prompts = [R2.prompt(200, 300 + i) for i in range(8)]
    replies = {}
    for name, r, buckets, batch_rows in (("cublas, one by one", one, {}, 4096), ("tiles, batched", tiles, {}, 4096),
                                         ("cublas rows, batched", cub, adopted, 4096),
                                         ("cublas rows, batched by 1024", cub, adopted, 1024),
                                         ("cublas rows, batched by 800", cub, adopted, 800),
                                         ("tiles, batched by 1024", tiles, {}, 1024)):
        B.BUCKETS.clear(); B.BUCKETS.update(buckets)
        H.BATCH_ROWS = batch_rows
        c = replace(cfg, kernels=KernelConfig(batch_cuts=r.batch_cuts))
        for _ in range(2):
            first_tokens(r, c, prompts[:1]); first_tokens(r, c, prompts)  # warm-up, compiles
        alone = [first_tokens(r, c, [q])[0][0] for q in prompts[:5]]
        eight, reps = zip(*[first_tokens(r, c, prompts) for _ in range(3)])
        med8 = statistics.median(statistics.median(e) for e in eight)
        last8 = statistics.median(max(e) for e in eight)
        each = [first_tokens(r, c, [q])[1][0] for q in prompts]
        replies[name] = reps[0]
        out[name] = {"alone_median_s": statistics.median(alone), "alone_all": alone, "eight_median_s": med8,
                     "eight_last_s": last8, "ratio": med8 / statistics.median(alone), "eight_all": eight,
                     "together == each alone": list(reps[0]) == each,
                     "replies same across reps": all(x == reps[0] for x in reps)}
        say(f"{name:30s}: alone {statistics.median(alone) * 1e3:6.1f} ms; eight median {med8 * 1e3:6.1f} ms "
            f"({med8 / statistics.median(alone):.2f}x), last {last8 * 1e3:6.1f} ms; "
            f"together == alone {out[name]['together == each alone']}")
        save()
    H.BATCH_ROWS = 4096
    names = list(replies)
    out["replies equal to one-by-one cublas"] = {n: sum(a == b for a, b in zip(replies[n], replies[names[0]]))
                                                 for n in names}
    say(json.dumps(out["replies equal to one-by-one cublas"]))


def main(argv):
    from engine.runner import ModelRunner
    t0 = R2.begin(argv)
    say(json.dumps(RES))
    base = ModelRunner(EngineConfig(model="qwen3-8b", device="cuda", dtype="bfloat16", parallel=8,
                                    max_model_len=2304, prefill_rows=4096))
    for name, fn in (("decode", sec_decode), ("host", sec_host)):
        R2._guard(name, lambda fn=fn: fn(base))
        torch.cuda.empty_cache()
    R2.finish(t0)


if __name__ == "__main__":
    main(sys.argv[1:])
