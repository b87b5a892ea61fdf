"""Issue 14, run 41 (engine/dev/PERF.md): where a round run ahead still idles the GPU. qwen3-8b at
--parallel 8, one stream at context 128; ms a round (median of 3 x 32 rounds) for:
  plain      decode() not ahead (host writes rows, graph A, ids read back synchronously)
  ahead      decode(ahead=True) as the lane host calls it (engine/ahead.py)
  raw        the chained graph, its ids' copy and an event, waiting on the round before (no Python logic)
  raw-noout  the same without the ids' copy
  replay     the chained graph replayed 32 times, then one sync (the GPU's own time)
and the host's time in each step of decode(ahead=True), and the GPU's idle between rounds.

    PYTHONPATH=. python3 -m engine.dev.ahead_probe --out $OUT
"""
from __future__ import annotations

import json
import statistics
import sys
import time

import torch

from engine.config import EngineConfig
from engine.runner import build_runner

N = 32


def per_round(fn, reps=3) -> float:
    ts = []
    for _ in range(reps + 1):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append((time.perf_counter() - t) / N * 1e3)
    return statistics.median(ts[1:])


def main(argv):
    out = argv[argv.index("--out") + 1] if "--out" in argv else "/tmp/out"
    r = build_runner(EngineConfig(model="qwen3-8b", device="cuda", dtype="bfloat16", parallel=8,
                                  max_model_len=2048, prefill_rows=256))
    a = r.ahead
    first = r.prefill(0, [(i * 37 + 5) % 1000 for i in range(128)])
    state = {"tok": first, "pos": 128}

    def decode(ahead):
        def go():
            for _ in range(N):
                state["tok"] = r.decode([0], [state["tok"]], [state["pos"]], ahead=ahead)[0]
                state["pos"] += 1
        return go
    chained = a.chained

    def raw(copy):
        def go():
            evs = []
            for _ in range(N):
                chained()
                if copy:
                    a.h_out[0].copy_(a.s_out, non_blocking=True)
                e = torch.cuda.Event()
                e.record()
                if evs:
                    evs[-1].synchronize()
                evs.append(e)
        return go

    def replay():
        for _ in range(N):
            chained()
    res = {}
    for name, fn in [("plain", decode(False)), ("ahead", decode(True)), ("raw", raw(True)),
                     ("raw-noout", raw(False)), ("replay", replay)]:
        state["pos"] = 128  # every variant rewrites the same rows
        a.drop()
        res[name] = per_round(fn)
        print(f"{name:10s} {res[name]:.3f} ms a round", flush=True)
    # host time a step inside decode(ahead=True)
    spans: dict = {}

    def timed(name, f):
        def w(*args, **kw):
            t = time.perf_counter()
            v = f(*args, **kw)
            spans.setdefault(name, []).append((time.perf_counter() - t) * 1e6)
            return v
        return w
    a.chained, a._read_back, a._ids, a._take = (timed("chained", a.chained), timed("read_back", a._read_back),
                                                timed("ids wait", a._ids), timed("take", a._take))
    r._padded = timed("padded", r._padded)
    state["pos"] = 128
    t = time.perf_counter()
    decode(True)()
    torch.cuda.synchronize()
    res["host_us"] = {k: round(statistics.median(v), 1) for k, v in spans.items()}
    res["host_call_ms"] = (time.perf_counter() - t) / N * 1e3
    print(json.dumps(res["host_us"]), flush=True)
    a.chained = chained
    # the GPU's idle between rounds, ahead
    from torch.profiler import ProfilerActivity, profile
    state["pos"] = 128
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        decode(True)()
        torch.cuda.synchronize()
    ev = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                key=lambda e: e.time_range.start)
    ends = [i for i, e in enumerate(ev) if "argmax" in e.name.lower()]
    gaps = []
    for i in ends[:-1]:
        nxt = [e for e in ev[i + 1:] if "memcpy" not in e.name.lower()][0]
        gaps.append({"after_argmax_us": round(nxt.time_range.start - ev[i].time_range.end, 1),
                     "between": [e.name[:40] for e in ev[i + 1:i + 4]]})
    res["gaps"] = gaps[:6]
    res["gap_median_us"] = statistics.median(g["after_argmax_us"] for g in gaps) if gaps else None
    print(json.dumps(res, indent=1), flush=True)
    with open(f"{out}/ahead_probe.json", "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
