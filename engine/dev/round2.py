"""Issue 14 on one H200, one device call: prompt-cut attention, skinny configs up to 64 rows,
the decode round at 8-64 lanes, exactness on qwen3-8b. Writes $OUT/round2.json as it goes.

    PYTHONPATH=. python3 -m engine.dev.round2 --out $OUT [--sections attn,prefill,skinny,lanes]
"""
from __future__ import annotations

import json
import math
import statistics
import sys
import time
import traceback
from dataclasses import asdict, replace

import torch
import torch.nn.functional as F

import engine.kernels_prefill as KP
import engine.kernels_skinny as S
from engine.config import EngineConfig, KernelConfig

RES: dict = {}
OUT = "/tmp/out"


def save():
    with open(f"{OUT}/round2.json", "w") as f:
        json.dump(RES, f, indent=1, default=str)


def say(*a):
    print(*a, flush=True)


def ev_time(fn, reps=5, warm=2) -> float:
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); b.synchronize()
        ts.append(a.elapsed_time(b) / 1e3)
    return statistics.median(ts)


def old_cut(q, k, v, start):
    """The path before this round: PyTorch's flash kernel, causal bottom-right on the cut."""
    t, h, d = q.shape
    o = torch.ops.aten._scaled_dot_product_flash_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                                           v.transpose(0, 1)[None], 0.0, True)[0]
    return o[0].transpose(0, 1).reshape(t, h * d)


def ref_rows(q, k, v, start, rows):
    """float64-free fp32 reference for some query rows of a cut: explicit causal mask."""
    qs = q[rows].float().transpose(0, 1)  # [H, r, d]
    g = q.shape[1] // k.shape[1]
    kk = k.float().repeat_interleave(g, dim=1).transpose(0, 1)
    vv = v.float().repeat_interleave(g, dim=1).transpose(0, 1)
    s = qs @ kk.transpose(1, 2) / math.sqrt(q.shape[2])
    pos = start + rows
    mask = torch.arange(k.shape[0], device=q.device)[None, :] <= pos[:, None]
    s = s.masked_fill(~mask[None], float("-inf"))
    return (s.softmax(-1) @ vv).transpose(0, 1).reshape(len(rows), -1)


def rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


def sec_attn():
    H, KVH, d, N, R = 32, 8, 128, 32768, 4096
    g = torch.Generator(device="cuda").manual_seed(0)
    kvbuf = torch.randn(2, N, KVH, d, device="cuda", generator=g, dtype=torch.bfloat16)
    k, v = kvbuf[0], kvbuf[1]
    q = torch.randn(N, H, d, device="cuda", generator=g, dtype=torch.bfloat16)
    out = RES.setdefault("attn", {})
    rows = torch.arange(0, R, 37, device="cuda")
    for backend in ("cudnn", "flash"):
        KP.BACKEND = backend
        for start in (0, 28672, 4096):
            qc = q[start:start + R].contiguous()
            o = KP.cut_attention(qc, k[:start + R], v[:start + R], start)
            o2 = KP.cut_attention(qc, k[:start + R], v[:start + R], start)
            out[f"{backend} start {start} rel_err_vs_fp32"] = rel(o[rows], ref_rows(qc, k, v, start, rows))
            out[f"{backend} start {start} repeatable"] = bool(torch.equal(o, o2))
        save()
    # short last cut (flash below CUDNN_MIN_ROWS) and a mid-size one through cuDNN
    KP.BACKEND = "cudnn"
    for start, t in ((8192, 500), (8192, 1500)):
        qc = q[start:start + t].contiguous()
        o = KP.cut_attention(qc, k[:start + t], v[:start + t], start)
        rr = torch.arange(0, t, 7, device="cuda")
        out[f"cut {start}+{t} ({KP.backend_for(t)}) rel_err"] = rel(o[rr], ref_rows(qc, k, v, start, rr))
    say(json.dumps(out))
    flops32 = 4 * H * d * N * N / 2
    qh, kh, vh = q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None]
    times = {"whole sdpa call (gqa)": ev_time(lambda: F.scaled_dot_product_attention(qh, kh, vh, is_causal=True,
                                                                                       enable_gqa=True))}
    cuts = [(s, s + R) for s in range(0, N, R)]

    def run_cuts(fn):
        return lambda: [fn(q[s:e], k[:e], v[:e], s) for s, e in cuts]
    times["8 cuts old flash bottom-right"] = ev_time(run_cuts(old_cut))
    for backend in ("cudnn", "flash"):
        KP.BACKEND = backend
        times[f"8 cuts halves {backend}"] = ev_time(run_cuts(KP.cut_attention))
    f4 = 4 * H * d * R * R / 2
    KP.BACKEND = "cudnn"
    t4 = {"4096 old flash": ev_time(lambda: old_cut(q[:R], k[:R], v[:R], 0)),
          "4096 cudnn": ev_time(lambda: KP.cut_attention(q[:R], k[:R], v[:R], 0))}
    for name, s in times.items():
        out[f"time {name}"] = {"ms": s * 1e3, "TFLOPs": flops32 / s / 1e12}
        say(f"attn 32k {name:34s} {s * 1e3:7.2f} ms {flops32 / s / 1e12:6.0f} TFLOP/s")
    for name, s in t4.items():
        out[f"time {name}"] = {"ms": s * 1e3, "TFLOPs": f4 / s / 1e12}
        say(f"attn {name:38s} {s * 1e3:7.3f} ms {f4 / s / 1e12:6.0f} TFLOP/s")
    # cold shapes: what the first cut of a new length waits for
    for backend, t, start in (("cudnn", 3001, 0), ("cudnn", 3001, 4096), ("cudnn", 2999, 8192), ("flash", 3003, 4096)):
        KP.BACKEND = backend
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        KP.cut_attention(q[start:start + t].contiguous(), k[:start + t], v[:start + t], start)
        torch.cuda.synchronize()
        out[f"cold {backend} T={t} start={start} s"] = time.perf_counter() - t0
    KP.BACKEND = "cudnn"
    say(json.dumps({k_: v_ for k_, v_ in out.items() if k_.startswith("cold")}))
    del kvbuf, q
    save()


def sec_prefill(r):
    from engine.dev.bench import bench_prefill, prompt_flops
    out = RES.setdefault("prefill", {})
    rate = RES["ceilings"]["matmul_flops"]
    orig = KP.cut_attention
    variants = [("halves cudnn", "cudnn", orig), ("halves flash", "flash", orig), ("old flash", "cudnn", old_cut)]
    for n in (4096, 32768):
        roof = n / (prompt_flops(r, n) / rate)
        for name, backend, fn in variants:
            KP.BACKEND, KP.cut_attention = backend, fn
            try:
                s = bench_prefill(r, n, 3)
            finally:
                KP.cut_attention, KP.BACKEND = orig, "cudnn"
            out[f"{n} {name}"] = {"s": s, "tok_s": n / s, "ratio": n / s / roof}
            say(f"prefill {n:6d} {name:14s} {s:.4f} s {n / s:9,.0f} tok/s {n / s / roof:6.1%} of {roof:,.0f}")
            save()


def prompt(n, salt):
    g = torch.Generator().manual_seed(1000 + salt)
    return torch.randint(0, 256, (n,), generator=g).tolist()


def sec_exact(r):
    from engine.backend import cuts
    out = RES.setdefault("exact", {})
    p = prompt(9000, 1)
    whole = r.generate(p, 16, lane=0)
    side = r.prefill(1, prompt(300, 2))
    sp, first = 300, None
    for s, e in cuts(0, len(p), r.prefill_rows):  # stepped, a decode round of lane 1 between cuts
        first = r.prefill_step(3, p, s, e)
        side = r.decode([1], [side], [sp])[0]
        sp += 1
    stepped, pos = [first], len(p)
    while len(stepped) < 16:
        stepped.append(r.decode([3], [stepped[-1]], [pos])[0]); pos += 1
    r.kv.k[:, 5, :8192], r.kv.v[:, 5, :8192] = r.kv.k[:, 0, :8192], r.kv.v[:, 0, :8192]
    resumed = [r.prefill(5, p, start=8192)]
    pos = len(p)
    while len(resumed) < 16:
        resumed.append(r.decode([5], [resumed[-1]], [pos])[0]); pos += 1
    out["stepped == whole"] = stepped == whole
    out["resumed == whole"] = resumed == whole
    out["kv rows bitwise whole/stepped/resumed"] = bool(torch.equal(r.kv.k[:, 0, :9000], r.kv.k[:, 3, :9000])
                                                        and torch.equal(r.kv.k[:, 0, :9000], r.kv.k[:, 5, :9000]))
    say(json.dumps(out))
    save()


SHAPE_CANDS = {  # (N, K): candidates beyond the adopted config
    (6144, 4096): [S.SkinnyConfig(32, 256, 4, 4), S.SkinnyConfig(16, 256, 4, 4), S.SkinnyConfig(32, 128, 4, 6, 2),
                   S.SkinnyConfig(64, 128, 4, 6, 2), S.SkinnyConfig(64, 256, 4, 4, 2)],
    (4096, 4096): [S.SkinnyConfig(16, 128, 4, 6), S.SkinnyConfig(16, 256, 4, 4), S.SkinnyConfig(32, 128, 4, 6, 2),
                   S.SkinnyConfig(32, 128, 4, 6, 4), S.SkinnyConfig(64, 128, 4, 6, 4)],
    (4096, 12288): [S.SkinnyConfig(16, 256, 4, 4), S.SkinnyConfig(32, 128, 4, 6, 2), S.SkinnyConfig(32, 128, 4, 6, 3),
                    S.SkinnyConfig(64, 128, 4, 6, 4), S.SkinnyConfig(32, 256, 4, 4, 4)],
    (24576, 4096): [S.SkinnyConfig(64, 128, 4, 6), S.SkinnyConfig(32, 256, 4, 4)],
    (151936, 4096): [S.SkinnyConfig(128, 128, 4, 4)],
}
NAMES = {(6144, 4096): "qkv", (4096, 4096): "o", (4096, 12288): "down", (24576, 4096): "gate_up", (151936, 4096): "lm_head"}


def sec_skinny(row_counts=(8, 64)):
    from engine.dev.bench_skinny import timed
    out = RES.setdefault("skinny", {})
    bw = RES["ceilings"]["copy_bandwidth_Bps"]
    gen = torch.Generator(device="cuda").manual_seed(0)
    adopted = {}
    for (n, k), cands in SHAPE_CANDS.items():
        nbytes = n * k * 2
        copies = max(2, math.ceil((1 << 30) / nbytes))
        ws = [(torch.randn(n, k, device="cuda", generator=gen) * 0.02).to(torch.bfloat16) for _ in range(copies)]
        for m in row_counts:
            x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
            base = S.CONFIGS.get((n, k))
            configs = ([base] if base else []) + (cands if m <= 16 else cands[:3])
            res = {"cublas": timed(lambda c: F.linear(x, ws[c]), copies, torch.device("cuda"))}
            for c in configs:
                if k % (c.block_k * c.split_k):
                    continue
                try:
                    res[c] = timed(lambda i, c=c: S.skinny(x, ws[i], config=c), copies, torch.device("cuda"))
                except Exception as e:
                    say(f"{NAMES[(n, k)]} {c} failed {e!r:.100}")
            for c, s in res.items():
                lab = c if c == "cublas" else f"{c.block_n}x{c.block_k} w{c.num_warps} s{c.num_stages} k{c.split_k}"
                out[f"{NAMES[(n, k)]} m{m} {lab}"] = {"us": s * 1e6, "of_bw": nbytes / s / bw}
                say(f"{NAMES[(n, k)]:8s} m{m:<3d} {lab:26s} {s * 1e6:8.1f} us {nbytes / s / bw:6.1%}")
            best = min((c for c in res if c != "cublas"), key=lambda c: res[c], default=None)
            if best is not None:
                y = S.skinny(x, ws[0], config=best).float()
                ref = F.linear(x.float(), ws[0].float())
                other = torch.randn_like(x); other[m // 2] = x[m // 2]
                ok = rel(y, ref) < 1e-2 and torch.equal(S.skinny(other, ws[0], config=best)[m // 2], y.to(x.dtype)[m // 2])
                ok = ok and torch.equal(S.skinny(x, ws[0], config=best), y.to(x.dtype))
                if ok and res[best] < res["cublas"]:
                    adopted[(n, k, S.block_m(m))] = best
                out[f"{NAMES[(n, k)]} m{m} best"] = {"config": asdict(best), "checks_ok": ok,
                                                     "adopted": ok and res[best] < res["cublas"]}
            save()
        del ws
    RES["skinny_adopted"] = {str(k_): asdict(v_) for k_, v_ in adopted.items()}
    return adopted


def sec_lanes(model, adopted):
    from engine.dev.bench import bench_decode
    from engine.runner import ModelRunner
    out = RES.setdefault("lanes", {})
    cfg = EngineConfig(model="qwen3-8b", device="cuda", dtype="bfloat16", parallel=8, max_model_len=1024,
                       prefill_rows=4096)
    old = dict(S.CONFIGS)
    for label, confs in (("old configs", old), ("adopted", {**old, **adopted})):
        S.CONFIGS.clear(); S.CONFIGS.update(confs)
        for p in ((8, 64) if label == "old configs" else (8, 16, 32, 64)):
            r = ModelRunner(replace(cfg, parallel=p), model=model)
            for k in sorted({1, p}):
                s = bench_decode(r, k, 32, 3, 128)
                out[f"{label} parallel {p} streams {k}"] = {"ms": s * 1e3, "tok_s": k / s}
                say(f"decode {label:11s} parallel {p:2d} streams {k:2d}: {s * 1e3:.3f} ms  {k / s:8.1f} tok/s")
            if p == 8 and label == "adopted":
                _guard("profile", lambda: profile_round(r))
            if p == 64 and label == "adopted":
                ps = [prompt(40 + 3 * i, 50 + i) for i in range(64)]
                alone = r.generate(ps[37], 12, lane=37)
                together = r.generate_together(ps, list(range(64)), 12)
                out["64 lanes: alone == among 64"] = together[37] == alone
            del r
            save()
    r = ModelRunner(replace(cfg, parallel=64, kernels=KernelConfig(skinny=False)), model=model)
    s = bench_decode(r, 64, 32, 3, 128)
    out["cublas parallel 64 streams 64"] = {"ms": s * 1e3}
    say(f"decode cuBLAS parallel 64: {s * 1e3:.3f} ms")
    del r
    save()


def profile_round(r):
    """Per-kernel device time of 10 replays of the decode graph (one stream decoding)."""
    from torch.profiler import ProfilerActivity, profile
    lanes, toks, pos = [0], [r.prefill(0, prompt(128, 9))], [128]
    for _ in range(3):
        toks = r.decode(lanes, toks, pos)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(10):
            toks = r.decode(lanes, toks, [128 + i])
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=70)
    RES["profile_table"] = table
    say(table)


def main(argv):
    global OUT
    OUT = argv[argv.index("--out") + 1] if "--out" in argv else OUT
    secs = (argv[argv.index("--sections") + 1] if "--sections" in argv else "attn,prefill,skinny,lanes").split(",")
    from engine.dev.bench import copy_bandwidth, matmul_rate
    from engine.runner import ModelRunner
    RES["torch"], RES["device"] = torch.__version__, torch.cuda.get_device_name(0)
    RES["ceilings"] = {"copy_bandwidth_Bps": copy_bandwidth("cuda"), "matmul_flops": matmul_rate("cuda")}
    say(json.dumps(RES))
    t0 = time.perf_counter()
    for name, fn in (("attn", sec_attn),):
        if name in secs:
            _guard(name, fn)
    r = None
    if {"prefill", "lanes"} & set(secs):
        r = ModelRunner(EngineConfig(model="qwen3-8b", device="cuda", dtype="bfloat16", parallel=8,
                                     max_model_len=32768 + 64, prefill_rows=4096))
    if "prefill" in secs:
        _guard("prefill", lambda: sec_prefill(r))
        _guard("exact", lambda: sec_exact(r))
    adopted = {}
    if "skinny" in secs:
        adopted = _guard("skinny", sec_skinny) or {}
    if "lanes" in secs:
        model = r.model
        del r
        torch.cuda.empty_cache()
        _guard("lanes", lambda: sec_lanes(model, adopted))
    RES["total_s"] = time.perf_counter() - t0
    save()
    say("done", RES["total_s"])


def begin(argv) -> float:
    """The calls' common start: $OUT, the software, the two ceilings; returns the start time."""
    global OUT
    OUT = argv[argv.index("--out") + 1] if "--out" in argv else OUT
    from engine.dev.bench import copy_bandwidth, matmul_rate
    RES["torch"], RES["device"] = torch.__version__, torch.cuda.get_device_name(0)
    RES["ceilings"] = {"copy_bandwidth_Bps": copy_bandwidth("cuda"), "matmul_flops": matmul_rate("cuda")}
    return time.perf_counter()


def finish(t0: float) -> None:
    RES["total_s"] = time.perf_counter() - t0
    save()
    say("done", RES["total_s"])


def _guard(name, fn):
    t = time.perf_counter()
    try:
        return fn()
    except Exception:
        RES[f"{name}_error"] = traceback.format_exc()[-2500:]
        say(RES[f"{name}_error"])
    finally:
        RES[f"{name}_s"] = time.perf_counter() - t
        save()


if __name__ == "__main__":
    main(sys.argv[1:])
