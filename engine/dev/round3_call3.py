"""Issue 14, round 3, third device call: the new defaults (short cuts through cuBLAS at checked
row counts, forwards of <= 1,024 rows) against the old path (one prompt at a time), more
repetitions than run 13, interleaved; exactness of a prompt whose last cut is short (stepped ==
whole == resumed, tokens and KV rows); the decode round with the defaults.

    PYTHONPATH=. python3 -m engine.dev.round3_call3 --out $OUT
"""
from __future__ import annotations

import json
import statistics
import sys
from dataclasses import replace

import torch

import engine.dev.round2 as R2
from engine.config import EngineConfig, KernelConfig

RES, say, save = R2.RES, R2.say, R2.save


def sec_host(model):
    from engine.dev.round2_call4 import first_tokens
    from engine.runner import ModelRunner
    out = RES.setdefault("host", {})
    cfg = EngineConfig(model="qwen3-8b", device="cuda", dtype="bfloat16", parallel=8, max_model_len=1024,
                       prefill_rows=1024)
    old = ModelRunner(replace(cfg, kernels=KernelConfig(batch_cuts=False)), model=model)
    new = ModelRunner(cfg, model=model)  # the defaults
    out["new: start-up check rows"] = new.batch_rows
    prompts = [R2.prompt(200, 300 + i) for i in range(8)]
    runs = {"old: one at a time": (old, replace(cfg, kernels=KernelConfig(batch_cuts=False))), "new defaults": (new, cfg)}
    for r, c in runs.values():
        for _ in range(2):
            first_tokens(r, c, prompts[:1]); first_tokens(r, c, prompts)
    res = {n: {"alone": [], "median": [], "last": []} for n in runs}
    replies = {}
    for block in range(3):  # interleaved blocks
        for name, (r, c) in runs.items():
            res[name]["alone"] += [first_tokens(r, c, [q])[0][0] for q in prompts[block:block + 3]]
            for _ in range(3):
                f, rep = first_tokens(r, c, prompts)
                res[name]["median"].append(statistics.median(f)); res[name]["last"].append(max(f))
                replies.setdefault(name, rep)
                out.setdefault(f"{name} replies same across reps", True)
                out[f"{name} replies same across reps"] &= rep == replies[name]
    for name, (r, c) in runs.items():
        a, m, l_ = (statistics.median(res[name][k]) for k in ("alone", "median", "last"))
        each = [first_tokens(r, c, [q])[1][0] for q in prompts]
        out[name] = {"alone_ms": a * 1e3, "eight_median_ms": m * 1e3, "eight_last_ms": l_ * 1e3, "ratio": m / a,
                     "all": {k: [x * 1e3 for x in v] for k, v in res[name].items()},
                     "together == each alone": list(replies[name]) == each}
        say(f"{name:20s}: alone {a * 1e3:6.1f} ms (9); eight: median {m * 1e3:6.1f} ms, last {l_ * 1e3:6.1f} ms (9 reps); "
            f"ratio {m / a:.2f}x; together == alone {out[name]['together == each alone']}")
    n_old, n_new = (out[n]["alone_ms"] for n in runs)
    out["new median / old alone"] = out["new defaults"]["eight_median_ms"] / n_old
    say(f"new eight median / old alone: {out['new median / old alone']:.2f}x")
    save()
    del old, new


def sec_exact(model):
    from engine.backend import cuts
    from engine.runner import ModelRunner
    r = ModelRunner(EngineConfig(model="qwen3-8b", device="cuda", dtype="bfloat16", parallel=8, max_model_len=5120,
                                 prefill_rows=1024), model=model)
    p = R2.prompt(4500, 7)  # cuts 4 x 1,024 then 404 rows: the last one through the short-cut path
    whole = r.generate(p, 12, lane=0)
    side, sp, first = r.prefill(1, R2.prompt(300, 2)), 300, None
    for s, e in cuts(0, len(p), r.prefill_rows):
        first = r.prefill_step(3, p, s, e)
        side = r.decode([1], [side], [sp])[0]; sp += 1
    stepped, pos = [first], len(p)
    while len(stepped) < 12:
        stepped.append(r.decode([3], [stepped[-1]], [pos])[0]); pos += 1
    r.kv.k[:, 5, :3072], r.kv.v[:, 5, :3072] = r.kv.k[:, 0, :3072], r.kv.v[:, 0, :3072]
    together = r.prefill_many([(5, p, 3072, 4096), (6, R2.prompt(200, 301), 0, 200)])  # a long cut: one at a time
    last = r.prefill_many([(5, p, 4096, 4500), (6, R2.prompt(300, 303), 0, 300), (7, R2.prompt(200, 304), 0, 200)])
    resumed, pos = [last[0]], len(p)
    while len(resumed) < 12:
        resumed.append(r.decode([5], [resumed[-1]], [pos])[0]); pos += 1
    out = RES.setdefault("exact", {})
    out.update({"batch rows": r.batch_rows, "stepped == whole": stepped == whole, "resumed beside others == whole":
                resumed == whole, "first tokens": [whole[0], stepped[0], resumed[0], together],
                "kv bitwise whole/stepped/resumed": all(torch.equal(r.kv.k[:, 0, :4500], r.kv.k[:, j, :4500])
                                                        and torch.equal(r.kv.v[:, 0, :4500], r.kv.v[:, j, :4500])
                                                        for j in (3, 5))})
    say(json.dumps(out, default=str))
    from engine.dev.bench import bench_decode
    for k in (1, 8):
        s = bench_decode(r, k, 32, 3, 128)
        RES[f"decode defaults streams {k}"] = s * 1e3
        say(f"decode, defaults, {k} streams: {s * 1e3:.3f} ms")
    save()


def main(argv):
    from engine.runner import ModelRunner
    t0 = R2.begin(argv)
    say(json.dumps(RES))
    model = ModelRunner(EngineConfig(model="qwen3-8b", device="cuda", dtype="bfloat16", parallel=1, max_model_len=64,
                                     kernels=KernelConfig(cuda_graph=False, batch_cuts=False))).model
    for name, fn in (("host", sec_host), ("exact", sec_exact)):
        R2._guard(name, lambda fn=fn: fn(model))
        torch.cuda.empty_cache()
    R2.finish(t0)


if __name__ == "__main__":
    main(sys.argv[1:])
