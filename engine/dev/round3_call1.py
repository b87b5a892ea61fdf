"""Issue 14, round 3, first device call: (a) the decode round with programmatic dependent launch
(and, when it ran, with L2 prefetch of the next matrix: a knob removed in round 4), side by side with the current round (same weights, same
CUDA graph shape, bitwise logits check); (b) cuBLAS at fixed padded row counts: which counts give
each row the same bits whatever its place, their time against the row-invariant tiles, and eight
200-token prompts at the lane host through them.

    PYTHONPATH=. python3 -m engine.dev.round3_call1 --out $OUT [--sections decode,buckets,host]
"""
from __future__ import annotations

import json
import statistics
import sys
from dataclasses import replace

import torch
import torch.nn.functional as F

import engine.dev.round2 as R2
import engine.kernels_batch as B
from engine.config import EngineConfig, KernelConfig

RES = R2.RES
say, save = R2.say, R2.save
# name -> KernelConfig changes (run 12; its L2-prefetch variants went with that knob in round 4)
VARIANTS = {"base": {}, "pdl": {"pdl": 2}}


def sec_decode(base, variants=None):
    """variants: name -> KernelConfig changes."""
    from engine.dev.bench import bench_decode, weight_bytes
    from engine.runner import ModelRunner
    out = RES.setdefault("decode", {})
    cfg = base.cfg
    runners = {"base": base}
    for name, kw in (variants or VARIANTS).items():
        if name != "base":
            runners[name] = ModelRunner(replace(cfg, kernels=KernelConfig(**kw)), model=base.model)
        out[f"{name} graph"] = runners[name].graph is not None
    p = R2.prompt(128, 9)
    ref = None
    for name, r in runners.items():  # same prompt, same lane, own KV cache: logits bitwise equal?
        toks = r.generate(p, 6, lane=0)
        logits = r._s_logits[0].clone()
        if ref is None:
            ref = (toks, logits)
        out[f"{name} tokens == base"] = toks == ref[0]
        out[f"{name} logits bitwise == base"] = bool(torch.equal(logits, ref[1]))
    say(json.dumps({k: v for k, v in out.items()}))
    bw = RES["ceilings"]["copy_bandwidth_Bps"]
    times: dict = {}
    for rep in range(3):  # interleaved, so drift hits every variant alike
        for name, r in runners.items():
            for k in (1, 8):
                times.setdefault((name, k), []).append(bench_decode(r, k, 32, 2, 128))
    for (name, k), ts in times.items():
        s = statistics.median(ts)
        r = runners[name]
        roof = k / ((weight_bytes(r) + k * 129 * r.kv.row_bytes()) / bw)
        out[f"{name} streams {k}"] = {"ms": s * 1e3, "tok_s": k / s, "ratio": k / s / roof, "all_ms": [t * 1e3 for t in ts]}
        say(f"decode {name:30s} {k} streams: {s * 1e3:.3f} ms {k / s:8.1f} tok/s {k / s / roof:6.1%} of {roof:.1f}")
    save()
    best = min(runners, key=lambda n: statistics.median(times[(n, 1)]))
    if best != "base":
        R2.profile_round(runners[best])
        RES[f"profile {best}"] = RES.pop("profile_table")
    for name in list(runners):
        if name != "base":
            del runners[name]
    torch.cuda.empty_cache()


BUCKETS = (128, 256, 384, 512, 768, 1024, 1536, 2048)


def sec_buckets(model):
    from engine.dev.bench_skinny import timed
    out = RES.setdefault("buckets", {})
    a, m = model.model.layers[0].self_attn, model.model.layers[0].mlp
    shapes = {"qkv": a.wqkv, "o": a.o_proj.weight, "gate_up": m.w_gate_up, "down": m.down_proj.weight}
    dev = torch.device("cuda")
    for name, w in shapes.items():
        ok = B.bucket_check(w, BUCKETS)
        out[f"{name} invariant buckets"] = ok
        for rows in (200, 256, 512, 1600, 2048):
            x = torch.randn(rows, w.shape[1], device="cuda").to(w.dtype)
            t_cub = timed(lambda i: F.linear(x, w), 4, dev)
            t_tile = timed(lambda i: B.matmul(x, w), 4, dev)
            out[f"{name} {rows} rows us cublas/tiles"] = (t_cub * 1e6, t_tile * 1e6)
        say(f"{name}: invariant at {ok}; " + ", ".join(
            f"{r}: {out[f'{name} {r} rows us cublas/tiles'][0]:.0f}/{out[f'{name} {r} rows us cublas/tiles'][1]:.0f} us"
            for r in (200, 256, 512, 1600, 2048)))
        # the set used: every passing bucket, when the largest passes (chunks of it stay exact)
        if ok and ok[-1] == BUCKETS[-1]:
            B.BUCKETS[tuple(w.shape)] = ok
    RES["buckets adopted"] = {str(k): v for k, v in B.BUCKETS.items()}
    save()


def host_figures(r, c, prompts):
    """Eight prompts submitted together at a lane host on runner r (config c) against one alone:
    warm-up, 5 single fills, 3 repetitions of the eight, each reply alone. (record, replies)."""
    from engine.dev.round2_call4 import first_tokens
    for _ in range(2):
        first_tokens(r, c, prompts[:1]); first_tokens(r, c, prompts)  # warm-up, compiles
    alone = [first_tokens(r, c, [q])[0][0] for q in prompts[:5]]
    eight, reps = zip(*[first_tokens(r, c, prompts) for _ in range(3)])
    med8 = statistics.median(statistics.median(e) for e in eight)
    each = [first_tokens(r, c, [q])[1][0] for q in prompts]
    return {"alone_median_s": statistics.median(alone), "alone_all": alone, "eight_median_s": med8,
            "eight_last_s": statistics.median(max(e) for e in eight), "ratio": med8 / statistics.median(alone),
            "eight_all": eight, "together == each alone": list(reps[0]) == each,
            "replies same across reps": all(x == reps[0] for x in reps)}, reps[0]


def sec_host(base):
    from engine.runner import ModelRunner
    out = RES.setdefault("host", {})
    cfg = EngineConfig(model="qwen3-8b", device="cuda", dtype="bfloat16", parallel=8, max_model_len=1024,
                       prefill_rows=1024)
    batched = ModelRunner(replace(cfg, kernels=KernelConfig(batch_cuts=True)), model=base.model)
    one = ModelRunner(cfg, model=base.model)
    prompts = [R2.prompt(200, 300 + i) for i in range(8)]
    adopted = dict(B.BUCKETS)
    variants = [("cublas, one by one", one, {}), ("tiles, batched", batched, {})]
    if adopted:
        variants.append(("cublas buckets, batched", batched, adopted))
    replies = {}
    for name, r, buckets in variants:
        B.BUCKETS.clear(); B.BUCKETS.update(buckets)
        out[name], replies[name] = host_figures(r, replace(cfg, kernels=KernelConfig(batch_cuts=r.batch_cuts)), prompts)
        say(f"{name:30s}: alone {out[name]['alone_median_s'] * 1e3:6.1f} ms; eight median "
            f"{out[name]['eight_median_s'] * 1e3:6.1f} ms ({out[name]['ratio']:.2f}x), last "
            f"{out[name]['eight_last_s'] * 1e3:6.1f} ms; together == alone {out[name]['together == each alone']}")
        save()
    B.BUCKETS.clear(); B.BUCKETS.update(adopted)
    names = list(replies)
    out["replies equal to one-by-one cublas"] = {n: sum(a == b for a, b in zip(replies[n], replies[names[0]]))
                                                 for n in names}
    say(json.dumps(out["replies equal to one-by-one cublas"]))


def main(argv):
    secs = (argv[argv.index("--sections") + 1] if "--sections" in argv else "decode,buckets,host").split(",")
    from engine.runner import ModelRunner
    t0 = R2.begin(argv)
    say(json.dumps(RES))
    base = ModelRunner(EngineConfig(model="qwen3-8b", device="cuda", dtype="bfloat16", parallel=8,
                                    max_model_len=2304, prefill_rows=4096))
    for name, fn in (("decode", sec_decode), ("buckets", lambda b: sec_buckets(b.model)), ("host", sec_host)):
        if name in secs:
            R2._guard(name, lambda fn=fn: fn(base))
            torch.cuda.empty_cache()
    R2.finish(t0)


if __name__ == "__main__":
    main(sys.argv[1:])
