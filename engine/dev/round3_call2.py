"""Issue 14, round 3, second device call: PDL wait-only and (when it ran) smaller L2 prefetches
beside the round (run 12 measured both full forms slower; the prefetch knob went in round 4); the short-prompt forward through cuBLAS at the row
counts the runner's start-up check adopts (padded once a forward), eight 200-token prompts at the
lane host in one forward and in forwards of up to 1,024 or 800 rows.

    PYTHONPATH=. python3 -m engine.dev.round3_call2 --out $OUT
"""
from __future__ import annotations

import json
import sys
from dataclasses import replace

import torch

import engine.dev.round2 as R2
import engine.dev.round3_call1 as C1
import engine.host as H
import engine.kernels_batch as B
from engine.config import EngineConfig, KernelConfig

RES, say, save = R2.RES, R2.say, R2.save


def sec_decode(base):
    # run 13 also timed L2 prefetches of o (34 / 8 MB): that knob was removed in round 4
    C1.sec_decode(base, {"base": {}, "pdl wait only": {"pdl": 1}, "pdl": {"pdl": 2}})


def sec_host(base):
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
        out[name], replies[name] = C1.host_figures(r, replace(cfg, kernels=KernelConfig(batch_cuts=r.batch_cuts)),
                                                   prompts)
        say(f"{name:30s}: alone {out[name]['alone_median_s'] * 1e3:6.1f} ms; eight median "
            f"{out[name]['eight_median_s'] * 1e3:6.1f} ms ({out[name]['ratio']:.2f}x), last "
            f"{out[name]['eight_last_s'] * 1e3:6.1f} ms; together == alone {out[name]['together == each alone']}")
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
