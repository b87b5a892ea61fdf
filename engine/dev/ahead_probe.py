"""Issue 14, run 41 (engine/dev/PERF.md): where a round run ahead still idles the GPU. qwen3-8b at
--parallel 8, one stream at context 128; ms a round (median of 3 x 32 rounds) for:
  A replay   the host-fed graph replayed N times between two CUDA events (the GPU's clock)
  B replay   the chained graph likewise (its inputs advanced on the device), from position 129
  ahead      decode(ahead=True) as the bench times it: first call to the N-th return (host clock)
  plain      decode() not ahead, likewise
and the host's time in each step of decode(ahead=True), and the GPU's idle between rounds.

    PYTHONPATH=. python3 -m engine.dev.ahead_probe --out $OUT [--lengths]

--lengths (run 42): the same rounds at two --max-model-len (the split attention's grid grows with it).
--grids (runs 44-45): the split attention's grid cap, at contexts 128 and 4,000.
--variants base,o12,o16 (run 46): decode-graph variants (VARIANTS) side by side; --ctxs 128,4000 their contexts.
--recaptured nopf,base (run 54): variants in one runner, its graphs captured again for each in turn
[--parallel 64 (run 64): 8 and 64 streams] [--model qwen3-32b --max-len 8192 (run 99)].
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time

import torch

from engine import decode_graph
from engine.config import EngineConfig, KernelConfig
from engine.dev.variants import VARIANTS, applied, recapture
from engine.runner import build_runner

N = 32


def launches_ms(launch) -> float:
    """ms a launch on the GPU's clock: N launches between two events, no host wait between."""
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(N):
        launch()
    e1.record()
    e1.synchronize()
    return e0.elapsed_time(e1) / N


def chained_ms(r, firsts, k: int, ctx: int) -> float:
    """A fresh round of streams 0..k-1 fed `firsts` at `ctx`, then the chained graph's ms a round."""
    r.ahead.drop()
    r.decode(list(range(k)), firsts[:k], [ctx] * k)
    return launches_ms(r.ahead.chained)


def report(samples: dict, res: dict, path: str) -> None:
    """Each sample list's median (and the list) into res, printed, and res written to path."""
    for key, v in samples.items():
        res[key] = statistics.median(v)
        res[key + " samples"] = [round(x, 4) for x in v]
        print(f"{key:48s} {res[key]:.3f} ms  {[round(x, 3) for x in v]}", flush=True)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(res, f, indent=1)


def lengths(out, turns=5):
    """The split attention's grid is (rows, KV heads, max_model_len / 256): the rounds at
    --max-model-len 2,048 and 32,784 (the bench's default) with 1 and 8 streams at context 128,
    on the GPU's clock (chained graph) and as the bench times them, interleaved."""
    from dataclasses import replace

    from engine.runner import ModelRunner
    base = build_runner(EngineConfig(model="qwen3-8b", device="cuda", dtype="bfloat16", parallel=8,
                                     max_model_len=2048, prefill_rows=4096))
    runners = {2048: base, 32784: ModelRunner(replace(base.cfg, max_model_len=32784), model=base.model)}
    for r in runners.values():
        r.cuts_warmed.result()
    firsts = {n: [r.prefill(ln, [(i * 37 + 5 + ln) % 1000 for i in range(128)]) for ln in range(8)]
              for n, r in runners.items()}
    samples: dict = {}
    with torch.inference_mode():
        for _ in range(turns):
            for n, r in runners.items():
                for k in (1, 8):
                    lanes = list(range(k))
                    samples.setdefault(f"max_len {n}, {k} streams, chained replay (gpu)", []).append(
                        chained_ms(r, firsts[n], k, 128))
                    r.ahead.drop()
                    toks, pos = r.decode(lanes, firsts[n][:k], [128] * k), 129
                    t = time.perf_counter()
                    for _ in range(N):
                        toks, pos = r.decode(lanes, toks, [pos] * k, ahead=True), pos + 1
                    samples.setdefault(f"max_len {n}, {k} streams, ahead (host)", []).append(
                        (time.perf_counter() - t) / N * 1e3)
    res = {}
    report(samples, res, f"{out}/lengths.json")


def grids(out, turns=5, caps=(4, 8, 1 << 20), max_len=16400, ctxs=(128, 4000)):
    """Run 44: the split attention's grid cap (engine.kernels.GRID_PER_SM; 1 << 20: one program an
    item, the old grid's count) at --max-model-len 16,400, contexts 128 and 4,000, 1 and 8 streams,
    the chained graph replayed on the GPU's clock, interleaved."""
    from dataclasses import replace

    import engine.kernels as K
    from engine.runner import ModelRunner
    cfg = EngineConfig(model="qwen3-8b", device="cuda", dtype="bfloat16", parallel=8, max_model_len=max_len,
                       prefill_rows=4096)  # (three KV caches of 22 GB fit beside the weights at 16,400)
    runners, model = {}, None
    saved = K.GRID_PER_SM
    for cap in caps:  # each graph captures the grid of its cap (runs 48-49 also ran the preload, a3ccbab)
        K.GRID_PER_SM = int(cap)
        runners[cap] = r = ModelRunner(replace(cfg), model=model)
        model = r.model
        r.cuts_warmed.result()
    K.GRID_PER_SM = saved
    firsts = {(cap, c): [r.prefill(ln, [(i * 37 + 5 + ln) % 1000 for i in range(c)]) for ln in range(8)]
              for cap, r in runners.items() for c in ctxs}
    samples: dict = {}
    with torch.inference_mode():
        for _ in range(turns):
            for cap, r in runners.items():
                for c in ctxs:
                    for k in (1, 8):
                        samples.setdefault(f"cap {cap}, ctx {c}, {k} streams", []).append(
                            chained_ms(r, firsts[(cap, c)], k, c))
    res = {}
    report(samples, res, f"{out}/grids.json")


def _firsts(r, ctxs) -> dict:
    """Each context's first ids of r's lanes, prompts of that many tokens."""
    return {c: [r.prefill(ln, [(i * 37 + 5 + ln) % 1000 for i in range(c)]) for ln in range(r.parallel)]
            for c in ctxs}


def _stream0_ids(r, firsts, ctx, rounds=16) -> list[int]:
    """Stream 0's ids over `rounds` rounds of every lane decoding together, rounds ahead."""
    r.ahead.drop()
    lanes, toks, pos, got = list(range(r.parallel)), firsts, ctx, []
    for _ in range(rounds):
        toks, pos = r.decode(lanes, toks, [pos] * len(lanes), ahead=True), pos + 1
        got.append(toks[0])
    return got


def variants(out, names, turns=5, ctxs=(128,)):
    """Runs 46 and 52-53: decode-graph variants (VARIANTS), each its own runner at --max-model-len
    4,200: the chained graph on the GPU's clock at each context, 1 and 8 streams, interleaved; and
    every variant's stream 0 ids over 16 rounds against the first's."""
    from dataclasses import replace

    from engine.runner import ModelRunner
    cfg = EngineConfig(model="qwen3-8b", device="cuda", dtype="bfloat16", parallel=8, max_model_len=4200,
                       prefill_rows=4096)
    runners, model = {}, None
    for name in names:
        with applied(name) as knobs:
            parallel = VARIANTS[name].parallel
            runners[name] = r = ModelRunner(replace(cfg, parallel=parallel, kernels=replace(cfg.kernels, **knobs)),
                                            model=model)
        model = r.model
        r.cuts_warmed.result()
    firsts = {n: _firsts(r, ctxs) for n, r in runners.items()}
    samples = {}
    with torch.inference_mode():
        ids = {n: _stream0_ids(r, firsts[n][ctxs[0]], ctxs[0]) for n, r in runners.items()}
        for _ in range(turns):
            for n, r in runners.items():
                for c in ctxs:
                    for k in (1, 8):
                        if k <= r.parallel:
                            samples.setdefault(f"{n}, ctx {c}, {k} streams", []).append(
                                chained_ms(r, firsts[n][c], k, c))
    res = {"stream0_ids_equal_to_first": {n: ids[n] == ids[names[0]] for n in names},
           "decode_ring": {n: r.describe()["decode_ring"] for n, r in runners.items()}}
    print(json.dumps(res), flush=True)
    report(samples, res, f"{out}/variants.json")


def recaptured(out, names, turns=4, ctxs=(128, 4000), max_len=32784, parallel=8, model="qwen3-8b"):
    """Run 54: variants of VARIANTS' module settings (at --parallel 8) in ONE runner, its graphs
    captured again for each variant in turn, so the KV cache and the weights stay where they are
    (run 53: separate runners differed by up to 0.15 ms a round with nothing but their memory
    between them). The chained graph on the GPU's clock at each context, 1 and 8 streams, at the
    bench's --max-model-len; stream 0's ids over 16 rounds against the first variant's. At --parallel
    above 8 (run 64): 8 and all streams. `--model qwen3-32b` wants a shorter --max-len (its KV cache)."""
    r = build_runner(EngineConfig(model=model, device="cuda", dtype="bfloat16", parallel=parallel,
                                  max_model_len=max_len, prefill_rows=4096))
    r.cuts_warmed.result()
    firsts, cfg = _firsts(r, ctxs), r.cfg
    samples, ids = {}, {}
    with torch.inference_mode():
        for turn in range(turns):
            for name in names:
                recapture(r, cfg, name)
                if turn == 0:
                    ids[name] = _stream0_ids(r, firsts[ctxs[0]], ctxs[0])
                for c in ctxs:
                    for k in ((1, 8) if parallel == 8 else (8, parallel)):
                        samples.setdefault(f"{name}, ctx {c}, {k} streams", []).append(chained_ms(r, firsts[c], k, c))
    res = {"stream0_ids_equal_to_first": {n: ids[n] == ids[names[0]] for n in names}, "decode_rows": list(r.buckets)}
    print(json.dumps(res), flush=True)
    report(samples, res, f"{out}/recaptured.json")


def main(argv):
    out = argv[argv.index("--out") + 1] if "--out" in argv else "/tmp/out"
    if "--lengths" in argv:
        return lengths(out)
    def arg(name, default):
        return [int(x) for x in argv[argv.index(name) + 1].split(",")] if name in argv else default
    if "--recaptured" in argv:
        return recaptured(out, argv[argv.index("--recaptured") + 1].split(","), ctxs=tuple(arg("--ctxs", (128, 4000))),
                          parallel=arg("--parallel", [8])[0], max_len=arg("--max-len", [32784])[0],
                          model=argv[argv.index("--model") + 1] if "--model" in argv else "qwen3-8b")
    if "--variants" in argv:
        return variants(out, argv[argv.index("--variants") + 1].split(","), ctxs=tuple(arg("--ctxs", (128,))))
    if "--grids" in argv:  # [--caps 4,8,1048576 --max-len 16400 --ctxs 128,4000]
        caps = argv[argv.index("--caps") + 1].split(",") if "--caps" in argv else (4, 8, 1 << 20)
        return grids(out, caps=caps, max_len=arg("--max-len", [16400])[0], ctxs=arg("--ctxs", (128, 4000)))
    r = build_runner(EngineConfig(model="qwen3-8b", device="cuda", dtype="bfloat16", parallel=8,
                                  max_model_len=2048, prefill_rows=256,
                                  kernels=KernelConfig(row_buckets=False)))  # (run 41: the 8-row round)
    r.cuts_warmed.result()  # cuDNN's cut graphs are built on the GPU in the background first
    a = r.ahead
    first = r.prefill(0, [(i * 37 + 5) % 1000 for i in range(128)])
    state = {"tok": first, "pos": 128}

    def decode(ahead):
        def go():
            for _ in range(N):
                state["tok"] = r.decode([0], [state["tok"]], [state["pos"]], ahead=ahead)[0]
                state["pos"] += 1
        return go
    b = r.rounds[r.round_rows]
    chains = list(b.chains)

    def one_exec():
        b.chains = chains[:1]

    def two_execs():
        b.chains = chains

    res = {}

    def reset():  # a fresh round at position 128: every variant decodes the same context
        a.drop()
        state["tok"], state["pos"] = r.decode([0], [first], [128])[0], 129

    def gpu_ms(launch) -> float:
        reset()
        return launches_ms(launch)

    def host_ms(ahead) -> float:
        """ms a round as the bench times it: from the first call to the N-th call's return."""
        reset()
        t = time.perf_counter()
        decode(ahead)()
        return (time.perf_counter() - t) / N * 1e3

    def a_replay():
        r.graph.replay()

    def fill_a():
        decode_graph.fresh(r, [[first] + [0] * 7, [144] + [0] * 7, [0] + [r.spare] * 7])
    samples: dict = {}
    with torch.inference_mode():
        for _ in range(5):
            fill_a()
            samples.setdefault("A replay (gpu)", []).append(gpu_ms(a_replay))
            for execs, setup in (("1 exec", one_exec), ("2 execs", two_execs)):
                setup()
                samples.setdefault(f"B replay, {execs} (gpu)", []).append(gpu_ms(a.chained))
                samples.setdefault(f"ahead, {execs} (host)", []).append(host_ms(True))
            samples.setdefault("plain (host)", []).append(host_ms(False))
    for k, v in samples.items():
        res[k] = statistics.median(v)
        res[k + " samples"] = v
        print(f"{k:28s} {res[k]:.3f} ms a round  {[round(x, 3) for x in v]}", flush=True)
    two_execs()
    # host time a step inside decode(ahead=True)
    spans: dict = {}

    def timed(name, f):
        def w(*args, **kw):
            t = time.perf_counter()
            v = f(*args, **kw)
            spans.setdefault(name, []).append((time.perf_counter() - t) * 1e6)
            return v
        return w
    chained = a.chained
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
    res["span_us"] = statistics.median(ev[j].time_range.end - ev[i + 1].time_range.start
                                       for i, j in zip(ends, ends[1:]))  # first kernel after an argmax to the next argmax
    res["gap_median_us"] = statistics.median(g["after_argmax_us"] for g in gaps) if gaps else None
    print(json.dumps(res, indent=1), flush=True)
    with open(f"{out}/ahead_probe.json", "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
