"""One decode round's kernels on the GPU's clock: qwen3-8b at --parallel 8,
one stream at context 128 (since row buckets: a one-row round), rounds run ahead; torch.profiler's
CUDA activity for 10 rounds. Writes, per kernel of the round in order, its name, duration and the
idle gap before it, a summary by kernel name, and the critical path a layer (`layer_path`): where
the round's time beyond the weights' stream goes.

    PYTHONPATH=. python3 -m tools.timeline --out $OUT [--parallel 64 --streams 64]
"""
from __future__ import annotations

import json
import os
import statistics
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from engine.config import EngineConfig
from engine.runner.build import build_runner


def main(argv):
    out = argv[argv.index("--out") + 1] if "--out" in argv else "/tmp/out"
    parallel = int(argv[argv.index("--parallel") + 1]) if "--parallel" in argv else 8
    streams = int(argv[argv.index("--streams") + 1]) if "--streams" in argv else 1
    r = build_runner(EngineConfig(model="qwen3-8b", device="cuda", dtype="bfloat16", parallel=parallel,
                                  max_model_len=1024, prefill_rows=256))
    lanes = list(range(streams))
    toks, pos = [r.prefill(ln, [(i * 37 + 5 + ln) % 1000 for i in range(128)]) for ln in lanes], 128
    for _ in range(5):
        toks, pos = r.decode(lanes, toks, [pos] * streams, ahead=True), pos + 1
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            toks, pos = r.decode(lanes, toks, [pos] * streams, ahead=True), pos + 1
    torch.cuda.synchronize()
    ev = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                key=lambda e: e.time_range.start)
    kern = [(e.name, e.time_range.start, e.time_range.end) for e in ev if "memcpy" not in e.name.lower()
            and "memset" not in e.name.lower()]
    # a round ends at its argmax (a reduction with ArgMaxOps); it starts after the one before
    ends = [i for i, (n, _, _) in enumerate(kern) if "argmax" in n.lower()]
    res = {"kernels": len(kern), "rounds": len(ends)}
    rounds = [kern[a + 1:b + 1] for a, b in zip(ends, ends[1:])]
    if rounds:
        mid = rounds[len(rounds) // 2]
        t0 = mid[0][1]
        res["round_us"] = [(ks[-1][2] - ks[0][1]) for ks in rounds]
        res["one_round"] = [{"name": n[:70], "start_us": round(s - t0, 2), "dur_us": round(e - s, 2),
                             "gap_us": round(s - mid[i - 1][2], 2) if i else 0.0}
                            for i, (n, s, e) in enumerate(mid)]
        by: dict = {}
        for ks in rounds:
            per: dict = {}
            for i, (n, s, e) in enumerate(ks):
                d = per.setdefault(n[:70], [0, 0.0, 0.0])
                d[0] += 1
                d[1] += e - s
                d[2] += (s - ks[i - 1][2]) if i else 0.0
            for n, (c, busy, gap) in per.items():
                by.setdefault(n, []).append((c, busy, gap))
        res["by_name"] = {n: {"count": v[0][0], "busy_us": round(statistics.median(x[1] for x in v), 1),
                              "gaps_before_us": round(statistics.median(x[2] for x in v), 1)}
                          for n, v in sorted(by.items(), key=lambda kv: -kv[1][0][1])}
        res["busy_us"] = statistics.median(sum(e - s for _, s, e in ks) for ks in rounds)
        res["layer_path_us"] = layer_path(mid)
        res["span_us"] = statistics.median(res["round_us"])
    print(json.dumps({k: v for k, v in res.items() if k != "one_round"}, indent=1), flush=True)
    os.makedirs(out, exist_ok=True)
    with open(f"{out}/timeline.json", "w") as f:
        json.dump(res, f, indent=1)


def layer_path(kernels) -> dict:
    """The round's critical path a layer, medians over its middle layers: each kernel's end after the
    end of the kernel before, from the q/k/v product (the kernel before each split attention) to the
    layer's closing norm, named by kernel (at one row: ring q/k/v, split attention, ring o, norm, ring
    gate/up, ring down, norm; at 64 rows cuBLAS and Triton kernels, and silu_mul)."""
    splits = [i for i, (n, _, _) in enumerate(kernels) if n.startswith("_split_kernel")]
    if len(splits) < 6:
        return {}
    period = splits[1] - splits[0]
    ends = [e for _, _, e in kernels]
    names = [n[:40] for n, _, _ in kernels[splits[0] - 1:splits[0] - 1 + period]]
    layers = [[ends[j] for j in range(i - 2, i - 1 + period)] for i in splits[2:-2]]
    steps = {f"{j} {name}": round(statistics.median(lay[j + 1] - lay[j] for lay in layers), 2)
             for j, name in enumerate(names)}
    return steps | {"layer": round(statistics.median(lay[-1] - lay[0] for lay in layers), 2)}


if __name__ == "__main__":
    main(sys.argv[1:])
