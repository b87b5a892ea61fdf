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
[--parallel 64 (run 64): 8 and 64 streams].
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from contextlib import contextmanager

import torch

from engine import decode_graph
from engine.config import EngineConfig, KernelConfig
from engine.kernels_skinny import SkinnyConfig as S_CFG
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


def _stage_o(n):
    def setup():
        from engine import kernels_ring as R
        R.STAGED[(4096, 4096)] = n
    return setup


def _ends(new: bool):
    """The round's first and last kernels: the embedding gathered in the first norm and the chunked
    argmax (engine/kernels_fused.py), or (new False) an embedding kernel, add_rmsnorm and torch.argmax."""
    def setup():
        import torch.nn.functional as F

        from engine import kernels_fused as KF
        KF.embed_rmsnorm = _NEW_ENDS[0] if new else (
            lambda table, ids, w, eps: KF.add_rmsnorm(F.embedding(ids, table), None, w, eps))
        decode_graph.argmax = _NEW_ENDS[1] if new else (
            lambda r, logits, out=None: logits.argmax(-1) if out is None else torch.argmax(logits, -1, out=out))
    return setup


def _programs(key, n):
    def setup():
        from engine import kernels_ring as R
        R.PROGRAMS[key] = n
    return setup


def _table(configs=(), gated=()):
    """kernels_skinny CONFIGS / GATED entries ((N, K, padded rows), SkinnyConfig) set (restored by _variant)."""
    def setup():
        from engine import kernels_skinny as S
        S.CONFIGS.update(configs)
        S.GATED.update(gated)
    return setup


def _new_ends():
    from engine import kernels_fused as KF
    return KF.embed_rmsnorm, decode_graph.argmax


_NEW_ENDS = _new_ends()

# run 47 also ran "nopre": the split attention's first block loaded before its PDL wait or not (the
# preload, commit a3ccbab, measured -0.02 ms at context 128 and +0.18-0.32 at 4,000: removed).
# name -> (setup before the capture, --parallel, KernelConfig changes); "p1": the round at one row.
# (Runs 52-53's nopf / norm / pf0 / pf256 were module settings of engine/kernels.py at d0d79cf.)
VARIANTS = {"base": (lambda: None, 8, {}), "o12": (_stage_o(12), 8, {}), "o16": (_stage_o(16), 8, {}),
            "p1": (lambda: None, 1, {}), "nopf": (lambda: None, 8, {"prefetch_rows": 0}),
            "pf8": (lambda: None, 8, {"prefetch_rows": 8}), "oldends": (_ends(False), 8, {}),
            "qkv132": (_programs((6144, 4096), 132), 8, {}), "gu132": (_programs((24576, 4096, "gated"), 132), 8, {})}
# run 64, at --parallel 64: o and the gated gate/up on the Triton kernels at 64 rows (PDL) instead of cuBLAS
_O64 = ((4096, 4096, 64), S_CFG(32, 128, 4, 6))
VARIANTS.update({"o64": (_table([_O64]), 64, {}),
                 "g64a": (_table(gated=[((24576, 4096, 64), S_CFG(32, 128, 4, 6))]), 64, {}),
                 "g64b": (_table(gated=[((24576, 4096, 64), S_CFG(16, 256, 4, 4))]), 64, {}),
                 "og64": (_table([_O64], [((24576, 4096, 64), S_CFG(32, 128, 4, 6))]), 64, {})})
# run 65: o64 with down, o or the plain gate/up on other Triton tiles at 64 rows
VARIANTS.update({f"o64{n}": (_table([_O64, e]), 64, {}) for n, e in (
    ("d2", ((4096, 12288, 64), S_CFG(32, 128, 4, 6, 2))), ("d64", ((4096, 12288, 64), S_CFG(64, 128, 4, 6))),
    ("d256", ((4096, 12288, 64), S_CFG(32, 256, 4, 4, 2))), ("k2", ((4096, 4096, 64), S_CFG(32, 128, 4, 6, 2))),
    ("gu", ((24576, 4096, 64), S_CFG(32, 256, 4, 4))))})


def _pf_rows(n):
    """kernels_prefetch.PREFETCH_ROWS: K/V rows of each row's first split asked into L2 (restored by _variant)."""
    def setup():
        import engine.kernels_prefetch as P
        P.PREFETCH_ROWS = n
    return setup


# run 67, at --parallel 64: the L2 prefetch in the 64-row graph, with 64 or 256 K/V rows
VARIANTS.update({"pf64r": (lambda: None, 64, {"prefetch_rows": 64}),
                 "pf64r256": (_pf_rows(256), 64, {"prefetch_rows": 64})})


def _grid(n):
    """engine.kernels.GRID_PER_SM: the split attention's programs a SM at most (restored by _variant)."""
    def setup():
        import engine.kernels as K
        K.GRID_PER_SM = n
    return setup


# run 68, at --parallel 64: the q/k norm + RoPE in a kernel of its own, and the split attention's grid
VARIANTS.update({"noqkf": (lambda: None, 64, {"fold_qk_norm": False}), "g8": (_grid(8), 64, {}),
                 "g4": (_grid(4), 64, {})})

def _walk(n):
    """engine.kernels.WALK: the split kernel's key walk (restored by _variant)."""
    def setup():
        import engine.kernels as K
        K.WALK = n
    return setup


# run 74: K and V of a block together (kv), or a block's asked for before the block before is reduced (ahead)
VARIANTS.update({"kv": (_walk(1), 8, {}), "ahead": (_walk(2), 8, {})})
# run 72, at --parallel 8: the split attention's grid capped at 1 / 2 programs a SM
VARIANTS.update({"g1": (_grid(1), 8, {}), "g2": (_grid(2), 8, {})})
# run 70, at one row: the first split's 128 / 256 K/V rows asked into L2 before the wait (the shipped 64)
VARIANTS.update({"pf128": (_pf_rows(128), 8, {}), "pf256": (_pf_rows(256), 8, {})})


@contextmanager
def _variant(name):
    """VARIANTS[name]'s module settings around a capture, restored after; yields its KernelConfig changes."""
    import engine.kernels_prefetch as P
    from engine import kernels_ring as R
    from engine import kernels_skinny as S
    setup, _, knobs = VARIANTS[name]
    tables = (R.STAGED, R.PROGRAMS, S.CONFIGS, S.GATED)
    import engine.kernels as K
    saved, pf_rows, grid, walk = [dict(t) for t in tables], P.PREFETCH_ROWS, K.GRID_PER_SM, K.WALK
    setup()
    try:
        yield knobs
    finally:
        for table, was in zip(tables, saved):
            table.clear()
            table.update(was)
        _ends(True)()
        P.PREFETCH_ROWS, K.GRID_PER_SM, K.WALK = pf_rows, grid, walk


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
        with _variant(name) as knobs:
            parallel = VARIANTS[name][1]
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


def recaptured(out, names, turns=4, ctxs=(128, 4000), max_len=32784, parallel=8):
    """Run 54: variants of VARIANTS' module settings (at --parallel 8) in ONE runner, its graphs
    captured again for each variant in turn, so the KV cache and the weights stay where they are
    (run 53: separate runners differed by up to 0.15 ms a round with nothing but their memory
    between them). The chained graph on the GPU's clock at each context, 1 and 8 streams, at the
    bench's --max-model-len; stream 0's ids over 16 rounds against the first variant's. At --parallel
    above 8 (run 64): 8 and all streams."""
    from dataclasses import replace
    r = build_runner(EngineConfig(model="qwen3-8b", device="cuda", dtype="bfloat16", parallel=parallel,
                                  max_model_len=max_len, prefill_rows=4096))
    r.cuts_warmed.result()
    firsts, cfg = _firsts(r, ctxs), r.cfg
    samples, ids = {}, {}
    with torch.inference_mode():
        for turn in range(turns):
            for name in names:
                with _variant(name) as knobs:
                    r.cfg = replace(cfg, kernels=replace(cfg.kernels, **knobs))
                    r.capture_graph()
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
                          parallel=arg("--parallel", [8])[0], max_len=arg("--max-len", [32784])[0])
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
