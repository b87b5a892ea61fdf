"""Issue 14, third device call: the row-invariant tile matmul for short prompt cuts (configs per
weight shape, against cuBLAS at the same rows), then short prompts filled alone and eight at
once through ModelRunner.prefill_many on qwen3-8b: time, and bits equal to each alone.

    PYTHONPATH=. python3 -m engine.dev.round2_call3 --out $OUT
"""
from __future__ import annotations

import statistics
import sys
import time
from dataclasses import asdict, replace

import torch
import torch.nn.functional as F

import engine.dev.round2 as R2
import engine.kernels_batch as B
from engine.config import EngineConfig, KernelConfig

RES = R2.RES
say, save, prompt, rel = R2.say, R2.save, R2.prompt, R2.rel
SHAPES = {(6144, 4096): "qkv", (4096, 4096): "o", (24576, 4096): "gate_up", (4096, 12288): "down"}
CANDS = [B.TileConfig(64, 64, 256, 4, 3), B.TileConfig(64, 128, 128, 4, 4), B.TileConfig(128, 128, 128, 8, 3),
         B.TileConfig(64, 64, 256, 4, 3, True), B.TileConfig(64, 128, 128, 4, 4, True),
         B.TileConfig(128, 128, 128, 8, 3, True), B.TileConfig(128, 128, 64, 4, 4, True)]


def lab(c):
    return f"{c.block_m}x{c.block_n}x{c.block_k} w{c.num_warps} s{c.num_stages}" + (" tma" if c.tma else "")


def sec_tiles(rows=(200, 1600)):
    out = RES.setdefault("tiles", {})
    rate = RES["ceilings"]["matmul_flops"]
    gen = torch.Generator(device="cuda").manual_seed(0)
    for (n, k), name in SHAPES.items():
        w = (torch.randn(n, k, device="cuda", generator=gen) * 0.02).to(torch.bfloat16)
        total = {c: 0.0 for c in CANDS}
        for m in rows:
            x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
            res = {"cublas": R2.ev_time(lambda: F.linear(x, w), reps=20)}
            for c in CANDS:
                B.CONFIGS[(n, k)] = c
                try:
                    res[c] = R2.ev_time(lambda: B.matmul(x, w), reps=20)
                except Exception as e:
                    res[c] = float("inf")
                    say(f"{name} {lab(c)} failed {e!r:.100}")
                total[c] += res[c] / res["cublas"]
            for c, s in res.items():
                tf = 2 * m * n * k / s / 1e12
                out[f"{name} m{m} {c if isinstance(c, str) else lab(c)}"] = {"us": s * 1e6, "TFLOPs": tf}
                say(f"{name:8s} m{m:<5d} {c if isinstance(c, str) else lab(c):24s} {s * 1e6:8.1f} us {tf:6.0f} TFLOP/s "
                    f"({2 * m * n * k / s / rate:5.1%})")
        best = min(total, key=total.get)
        B.CONFIGS[(n, k)] = best
        x = torch.randn(300, k, device="cuda", generator=gen).to(torch.bfloat16)
        y = B.matmul(x, w)
        ok = rel(y, F.linear(x.float(), w.float())) < 1e-2 and all(
            torch.equal(B.matmul(x[a:b].contiguous(), w), y[a:b]) for a, b in ((0, 1), (7, 200), (130, 300)))
        out[f"{name} best"] = {"config": asdict(best), "vs_cublas_sum": total[best], "row_invariant": ok}
        say(f"{name} best {lab(best)} ({total[best] / len(rows):.2f}x cuBLAS's time), row invariant {ok}")
        del w
        save()
    RES["tiles_adopted"] = {str(k_): asdict(v_) for k_, v_ in B.CONFIGS.items()}


def timed(fn, reps=5):
    fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        t = time.perf_counter(); fn(); torch.cuda.synchronize(); ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def sec_many():
    from engine.runner import ModelRunner
    out = RES.setdefault("many", {})
    cfg = EngineConfig(model="qwen3-8b", device="cuda", dtype="bfloat16", parallel=8, max_model_len=4096,
                       prefill_rows=1024)
    r = ModelRunner(replace(cfg, kernels=KernelConfig(batch_cuts=True)))
    rc = ModelRunner(cfg, model=r.model)
    ps = [prompt(200, 70 + i) for i in range(8)]
    for n in (200, 512):
        p = prompt(n, 60)
        for label, rr in (("tiles", r), ("cublas", rc)):
            s = timed(lambda: rr.prefill(0, p))
            out[f"one {n}-token prompt, {label}"] = s
            say(f"one {n}-token prompt alone, {label:6s}: {s * 1e3:7.2f} ms")
    items = [(lane, p, 0, len(p)) for lane, p in enumerate(ps)]
    out["8 x 200 in one forward"] = s8 = timed(lambda: r.prefill_many(items))
    out["8 x 200 one after another, tiles"] = timed(lambda: [r.prefill(lane, p) for lane, p in enumerate(ps)])
    out["8 x 200 one after another, cublas"] = timed(lambda: [rc.prefill(lane, p) for lane, p in enumerate(ps)])
    for k_ in ("8 x 200 one after another, tiles", "8 x 200 one after another, cublas"):
        say(f"{k_}: {out[k_] * 1e3:.2f} ms")
    say(f"8 x 200 in one forward: {s8 * 1e3:.2f} ms")
    # bits: each alone (lane 0..7) vs all together (same lanes), first tokens, KV rows, replies
    alone = [r.prefill(lane, p) for lane, p in enumerate(ps)]
    kv = r.kv.k[:, :8, :200].clone()
    r.kv.k.zero_()
    together = r.prefill_many(items)
    out["first tokens together == alone"] = together == alone
    out["kv rows together == alone"] = bool(torch.equal(r.kv.k[:, :8, :200], kv))
    rep_alone = r.generate(ps[5], 12, lane=5)
    r.prefill_many(items)
    rep_tog = [together[5]]
    pos = 200
    while len(rep_tog) < 12:
        rep_tog.append(r.decode([5], [rep_tog[-1]], [pos])[0]); pos += 1
    out["reply after a batched fill == alone"] = rep_tog == rep_alone
    cub = rc.generate(ps[5], 12, lane=6)
    out["tiles vs cublas reply, equal prefix"] = next((i for i, (a, b) in enumerate(zip(cub, rep_alone)) if a != b), 12)
    say({k_: v_ for k_, v_ in out.items() if not isinstance(v_, float)})
    save()


def main(argv):
    t0 = R2.begin(argv)
    R2._guard("tiles", sec_tiles)
    R2._guard("many", sec_many)
    R2.finish(t0)

if __name__ == "__main__":
    main(sys.argv[1:])
