"""Does a CUDA mixed forward keep every row's bits? One runner, in process, on the device.

    PYTHONPATH=. python3 -m tools.mixed_check --model qwen3-8b --out $OUT/mixed_check.json
        [--prompt 12000] [--tokens 48]

A runner with --prefill-mode mixed and --cut-attention tiles (its decode graphs, its start-up
check of cuBLAS's row counts). The reference: each prompt generated alone (whole prefill on the
1,024-row grid, then plain rounds). Then three short prompts decode in lanes 0-2 while the long one
fills lane 3 in budget-like cuts off the grid (ModelRunner.mixed, each beside a round of the
three), then its last grid cut, then every lane decodes in plain rounds. Compared: each stream's
token ids with its reference, and the long prompt's K/V rows bit for bit per layer (layer 0's
rows depend only on the embedding, the norm and the q/k/v product: where the first differing
layer is says which products or attention moved). Prints one line per comparison.
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from engine.config import EngineConfig, KernelConfig
from engine.runner.build import build_runner
from tools.results import write_results

SIZES = (200, 77, 640, 513, 1000, 64, 384, 128, 1024, 300)  # budget-like cut sizes, in turn


def prompt(n: int, salt: int, vocab: int) -> list[int]:
    g = torch.Generator().manual_seed(2000 + salt)
    return torch.randint(0, vocab, (n,), generator=g).tolist()


def kv_rows(r, lane: int, n: int):
    return r.kv.k[:, lane, :n].clone(), r.kv.v[:, lane, :n].clone()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen3-8b")
    ap.add_argument("--prompt", type=int, default=12000)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--out")
    ap.add_argument("--time", default="0,8192,16384,30720",
                    help="after the check: time mixed forwards at every cut size at these contexts (empty: none)")
    ap.add_argument("--profile", default="",
                    help="N@CTX,...: after the check, each shape's kernels by time (torch.profiler over its graph's replays; N 0: a round alone)")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    r = build_runner(EngineConfig(model=a.model, device="cuda", dtype="bfloat16", parallel=4,
                                  max_model_len=a.prompt + a.tokens + 64, prefill_rows=1024, prefill_mode="mixed",
                                  kernels=KernelConfig(cut_tiles=True)))
    r.cuts_warmed.result()
    res = {"model": a.model, "batch_rows": list(r.batch_rows), "engine": {k: r.describe()[k] for k in
           ("cut_attention", "cuda_mixed", "prefill_attention", "decode_rows", "cuda_graph")},
           "start_s": round(time.perf_counter() - t0, 1)}
    print("runner:", res)
    v, T = r.vocab_size, a.tokens
    shorts = [prompt(n, i, v) for i, n in enumerate((100, 700, 1500))]
    long_ = prompt(a.prompt, 9, v)

    # the reference: each alone, whole on the grid, plain rounds
    ref = [r.generate(p, T, lane=i) for i, p in enumerate(shorts)]
    ref_long = r.generate(long_, T, lane=3)
    ref_kv = kv_rows(r, 3, len(long_))  # (the rounds wrote past the prompt's rows only)
    r.kv.k[:, 3].zero_(), r.kv.v[:, 3].zero_()

    # mixed: the shorts decode while the long prompt fills lane 3 in cuts off the grid
    outs = [[r.prefill(i, p)] for i, p in enumerate(shorts)]
    last = (len(long_) - 1) // r.prefill_rows * r.prefill_rows
    bounds, s, j = [0], 0, 0
    while s < last:
        s = min(last, s + SIZES[j % len(SIZES)])
        bounds.append(s)
        j += 1
    bounds.append(len(long_))
    first = None
    t1 = time.perf_counter()
    for s, e in zip(bounds, bounds[1:]):
        pos = [len(p) + len(o) - 1 for p, o in zip(shorts, outs)]
        (tok,), ids = r.mixed([(3, long_, s, e)], [0, 1, 2], [o[-1] for o in outs], pos)
        for o, t in zip(outs, ids):
            o.append(t)
        first = tok
    res["mixed_forwards"], res["mixed_s"] = len(bounds) - 1, round(time.perf_counter() - t1, 2)
    got_kv = kv_rows(r, 3, len(long_))
    long_out = [first]
    lanes = [0, 1, 2, 3]
    while len(long_out) < T:
        seqs = [*zip(shorts, outs), (long_, long_out)]
        toks = [o[-1] for _, o in seqs]
        pos = [len(p) + len(o) - 1 for p, o in seqs]
        live = [k for k, (_, o) in enumerate(seqs) if len(o) < T]
        ids = r.decode([lanes[k] for k in live], [toks[k] for k in live], [pos[k] for k in live])
        for k, t in zip(live, ids):
            seqs[k][1].append(t)
    torch.cuda.synchronize()

    def first_diff(x, y):
        return next((k for k, (p, q) in enumerate(zip(x, y)) if p != q), None)

    res["short_streams"] = [{"equal": o[:T] == rf, "first_diff": first_diff(o, rf)} for o, rf in zip(outs, ref)]
    res["long_first_token_equal"] = long_out[0] == ref_long[0]
    res["long_ids_equal"] = long_out == ref_long
    res["long_first_diff"] = first_diff(long_out, ref_long)
    layers = []
    for name, g, w in (("k", got_kv[0], ref_kv[0]), ("v", got_kv[1], ref_kv[1])):
        for L in range(g.shape[0]):
            rows = (g[L] != w[L]).flatten(1).any(1).nonzero().flatten()
            if rows.numel():
                layers.append({"kv": name, "layer": L, "rows_differing": int(rows.numel()), "first_row": int(rows[0]),
                               "max_abs": float((g[L].float() - w[L].float()).abs().max())})
    res["long_kv_bitwise"] = not layers
    res["long_kv_differences"] = layers[:12]
    res["cut_bounds"] = bounds
    res["all_equal"] = (all(s["equal"] for s in res["short_streams"]) and res["long_ids_equal"] and res["long_kv_bitwise"])
    if a.time:
        res["timing"] = timing(r, long_, shorts, outs, [int(c) for c in a.time.split(",")])
    if a.profile:
        res["profile"] = profile(r, long_, shorts, outs, [tuple(map(int, x.split("@"))) for x in a.profile.split(",")])
    write_results(res, t0, a.out)
    print(json.dumps({k: res[k] for k in res if k != "cut_bounds"}, indent=1))


def timing(r, long_, shorts, outs, contexts, reps: int = 5) -> dict:
    """Median ms of a mixed forward (the long prompt's lane, the three shorts' round) at each cut
    size and context: through its graph, and eagerly at the smallest size; a plain round of the three."""
    pos = [len(p) + len(o) - 1 for p, o in zip(shorts, outs)]
    toks = [o[-1] for o in outs]

    def med(fn):
        ts = []
        for _ in range(reps):
            torch.cuda.synchronize()
            t = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            ts.append((time.perf_counter() - t) * 1000)
        return round(sorted(ts)[reps // 2], 2)
    g = r.mixed_graphs
    sizes = g.sizes if g is not None else (128,)
    out = {"round_ms": med(lambda: r.decode([0, 1, 2], toks, pos)), "graphs": bool(g and g.shapes), "mixed_ms": {}}
    for ctx in contexts:
        if ctx + sizes[-1] >= len(long_):
            continue
        out["mixed_ms"][ctx] = {n: med(lambda: r.mixed([(3, long_, ctx, ctx + n)], [0, 1, 2], toks, pos)) for n in sizes}
    if g is not None and g.shapes:
        shapes, g.shapes = g.shapes, {}
        out["eager_ms"] = {n: med(lambda: r.mixed([(3, long_, 0, n)], [0, 1, 2], toks, pos)) for n in (sizes[0], sizes[-1])}
        g.shapes = shapes
    print("timing:", json.dumps(out))
    return out


def profile(r, long_, shorts, outs, cells, reps: int = 5) -> dict:
    """Per (rows, context): the GPU time of each kernel kind in one mixed forward (graph replays,
    summed over `reps` and divided), the largest, in us. Rows 0: a decode round of the same lanes
    alone (its graph), the forward a mixed one is measured against."""
    from torch.profiler import ProfilerActivity, profile as prof
    pos = [len(p) + len(o) - 1 for p, o in zip(shorts, outs)]
    toks = [o[-1] for o in outs]
    out = {}
    for n, ctx in cells:
        def once(n=n, ctx=ctx):
            if n == 0:
                return r.decode([0, 1, 2], toks, pos)
            return r.mixed([(3, long_, ctx, ctx + n)], [0, 1, 2], toks, pos)
        once()
        torch.cuda.synchronize()
        with prof(activities=[ProfilerActivity.CUDA]) as p:
            for _ in range(reps):
                once()
            torch.cuda.synchronize()
        by = {}
        for e in p.key_averages():
            t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
            if t:
                by[e.key[:60]] = by.get(e.key[:60], 0) + t / reps
        top = sorted(by.items(), key=lambda kv: -kv[1])
        out[f"{n}@{ctx}"] = {"total_us": round(sum(by.values())), "top": [(k, round(v)) for k, v in top[:20]]}
        print("profile", n, ctx, json.dumps(out[f"{n}@{ctx}"]))
    return out


if __name__ == "__main__":
    main()
