"""Issue 14, round 4: the qwen3-8b decode round under each programmatic-dependent-launch mode
(engine/kernels.py PDL) side by side with PDL off, timed as graph replays and through the engine
bench's timer; the same tokens and logits in every variant; chains of one product (o, q/k/v, down,
gated gate/up) on the 36 layers' matrices in one CUDA graph, alone and each after an add+RMSNorm,
to see what a launch costs; copy bandwidth in the same run; qwen3-32b at one stream, PDL off
against the fastest variant.
Runs 15 and 16 (engine/dev/PERF.md) ran this at commits cb2dd50 and 1530bab (round4_call2.py) with
two more knobs, weights loaded before the wait (`preload`) and PDL 3; both measured no faster and
were removed: those commits have the variants.

    PYTHONPATH=. python3 -m engine.dev.round4_call1 --out $OUT [--sections decode,chain,32b] [--budget-s 300]
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from dataclasses import replace

import torch
import triton

import engine.dev.round2 as R2
import engine.kernels_skinny as S
from engine.config import EngineConfig, KernelConfig

RES, say, save = R2.RES, R2.say, R2.save
# what runs where (a CPU dry run of this script sets tiny / cpu / float32)
MODEL_8B, MODEL_32B, DEVICE, DTYPE = "qwen3-8b", "qwen3-32b", "cuda", "bfloat16"
VARIANTS = {  # name -> KernelConfig launch knobs
    "pdl off (default)": {},
    "pdl 1 (wait only)": {"pdl": 1},
    "pdl 2 (wait, launch next)": {"pdl": 2},
}


def replay_ms(r, k: int, chunks: int = 4, n: int = 30) -> list[float]:
    """ms per decode round: graph replays back to back (k lanes at ctx 128), the mean of each chunk of n."""
    lanes = list(range(k))
    toks = [r.prefill(lane, R2.prompt(128, 100 + lane)) for lane in lanes]
    r.decode(lanes, toks, [128] * k)  # the graph's inputs now hold this round
    step = r.graph.replay if r.graph is not None else (lambda: r.decode(lanes, toks, [128] * k))
    for _ in range(5):
        step()
    out = []
    for _ in range(chunks):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(n):
            step()
        b.record(); b.synchronize()
        out.append(a.elapsed_time(b) / n)
    return out


def tokens_of(r) -> dict:
    """Greedy tokens of three prompts alone (lane 0) and of eight lanes decoding together, and the
    last round's logits."""
    alone = [r.generate(R2.prompt(64 + 40 * i, 20 + i), 8, lane=0) for i in range(3)]
    logits = r._s_logits[0].clone() if r.graph is not None else torch.zeros(1)
    lanes = list(range(8))
    toks = [r.prefill(lane, R2.prompt(50 + 9 * lane, 40 + lane)) for lane in lanes]
    pos, together = [50 + 9 * lane for lane in lanes], [list(toks)]
    for _ in range(6):
        toks = r.decode(lanes, toks, pos)
        pos = [p + 1 for p in pos]
        together.append(toks)
    return {"alone": alone, "together": together, "logits": logits}


def check_bits(runners: dict, out: dict, label: str = "") -> None:
    """Each runner's tokens_of against the first runner's, into out["<name> bits"]."""
    ref = None
    for name, r in runners.items():
        t = tokens_of(r)
        ref = ref or t
        out[f"{name} bits"] = {"alone tokens == base": t["alone"] == ref["alone"],
                               "8 lanes tokens == base": t["together"] == ref["together"],
                               "logits bitwise == base": bool(torch.equal(t["logits"], ref["logits"]))}
        say(label, name, json.dumps(out[f"{name} bits"]))


def sec_decode(base, variants: dict | None = None):
    from engine.runner import ModelRunner
    out = RES.setdefault("decode", {})
    runners = {}
    variants = variants or VARIANTS
    for name, kw in variants.items():
        runners[name] = base if not kw else ModelRunner(replace(base.cfg, kernels=KernelConfig(**kw)), model=base.model)
        out[f"{name} graph"] = runners[name].graph is not None
    check_bits(runners, out)
    save()
    rep_t = time_rounds(runners, out)
    best = min((n for n in runners if variants[n]), key=lambda n: statistics.median(rep_t[(n, 1)]))
    RES["best variant"] = best
    for name in (next(iter(runners)), best):  # the base (first) and the fastest
        RES[f"profile {name}"] = profile_sum(runners[name])
    return variants[best]


def time_rounds(runners: dict, out: dict, label: str = "decode") -> dict:
    """Replay and host-driven ms a round at 1 and 8 streams, 3 interleaved turns (drift hits every runner
    alike), into out["<name> streams <k>"]; returns the replay samples by (name, streams)."""
    from engine.dev.bench import bench_decode, weight_bytes
    bw = RES["ceilings"]["copy_bandwidth_Bps"]
    rep_t: dict = {}
    host_t: dict = {}
    for _ in range(3):
        for name, r in runners.items():
            for k in (1, 8):
                rep_t.setdefault((name, k), []).extend(replay_ms(r, k))
                host_t.setdefault((name, k), []).append(bench_decode(r, k, 32, 1, 128) * 1e3)
    for (name, k), ts in rep_t.items():
        r = runners[name]
        roof_ms = (weight_bytes(r) + k * 129 * r.kv.row_bytes()) / bw * 1e3
        ms, hs = statistics.median(ts), statistics.median(host_t[(name, k)])
        out[f"{name} streams {k}"] = {"replay_ms": ms, "ratio": roof_ms / ms, "host_round_ms": hs,
                                      "host_ratio": roof_ms / hs, "roof_ms": roof_ms, "replay_all": ts,
                                      "host_all": host_t[(name, k)]}
        say(f"{label} {name:36s} {k} streams: replay {ms:.3f} ms ({roof_ms / ms:6.1%}), "
            f"host-driven {hs:.3f} ms ({roof_ms / hs:6.1%}) of roofline {roof_ms:.3f} ms")
    save()
    return rep_t


def profile_sum(r) -> dict:
    """Kernel time per round by kernel name over 10 rounds (one stream), and its sum: the round's
    time minus that sum is what the launches and gaps cost."""
    from torch.profiler import ProfilerActivity, profile
    lanes, toks, pos = [0], [r.prefill(0, R2.prompt(128, 9))], [128]
    for _ in range(3):
        toks = r.decode(lanes, toks, pos)
    with profile(activities=[ProfilerActivity.CUDA if torch.cuda.is_available() else ProfilerActivity.CPU]) as prof:
        for i in range(10):
            toks = r.decode(lanes, toks, [128 + i])
    per = {}
    for e in prof.key_averages():
        t = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
        if t:
            per[e.key[:60]] = t / 10 / 1e3  # ms a round
    per = dict(sorted(per.items(), key=lambda kv: -kv[1])[:14])
    out = {"kernels_ms": per, "sum_ms": sum(per.values())}
    say(json.dumps(out))
    return out


def chain_graph(fn, n_layers: int):
    """A CUDA graph of fn(i) for i in 0..n_layers-1 (captured under the current launch mode)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(n_layers):
            fn(i)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(n_layers):
            fn(i)
    return g


def graph_us(g, reps: int = 15) -> float:
    for _ in range(3):
        g.replay()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); g.replay(); b.record(); b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3)
    return statistics.median(ts)


CHAIN_MODES = {"pdl off": 0, "pdl 2": 2}  # name -> PDL


def sec_chain(model, modes: dict | None = None):
    """Per product: 36 launches on the 36 layers' matrices in one graph, alone and each after an
    add+RMSNorm of its input (the round's pattern), under each launch mode: us a launch."""
    from engine.kernels_fused import add_rmsnorm
    out = RES.setdefault("chain", {})
    bw = RES["ceilings"]["copy_bandwidth_Bps"]
    layers = model.model.layers
    mats = {"q/k/v": [l.self_attn.wqkv for l in layers], "o": [l.self_attn.o_proj.weight for l in layers],
            "gate/up gated": [l.mlp.w_gate_up for l in layers], "down": [l.mlp.down_proj.weight for l in layers]}
    modes = modes or CHAIN_MODES
    for pname, ws in mats.items():
        k = ws[0].shape[1]
        x = torch.randn(8, k, device=ws[0].device).to(ws[0].dtype)
        r = torch.randn_like(x)
        nw = torch.ones(k, device=ws[0].device, dtype=ws[0].dtype)
        prod = S.gate_up_silu if pname.startswith("gate") else S.linear
        nbytes = ws[0].numel() * ws[0].element_size()
        for mname, pdl in modes.items():
            with S.launch_mode(pdl=pdl):
                alone = graph_us(chain_graph(lambda i: prod(x, ws[i]), len(ws))) / len(ws)
                normed = graph_us(chain_graph(lambda i: prod(add_rmsnorm(x, r, nw, 1e-6)[1], ws[i]), len(ws))) / len(ws)
                norm = graph_us(chain_graph(lambda i: add_rmsnorm(x, r, nw, 1e-6), len(ws))) / len(ws)
            out[f"{pname} {mname}"] = {"alone_us": alone, "alone_of_bw": nbytes / (alone * 1e-6) / bw,
                                       "after_norm_us": normed, "norm_alone_us": norm,
                                       "gap_us": normed - alone - norm, "stream_us": nbytes / bw * 1e6}
            say(f"chain {pname:14s} {mname:22s}: alone {alone:6.1f} us ({nbytes / (alone * 1e-6) / bw:5.1%} of copy), "
                f"after norm {normed:6.1f} us (norm alone {norm:4.1f}; cost of the pair over the two: "
                f"{normed - alone - norm:+5.1f} us); bytes at copy rate {nbytes / bw * 1e6:5.1f} us")
        save()


def sec_32b(best_kw: dict):
    """qwen3-32b at one stream (issue 15's N = 1 shape: --parallel 4), base and the best variant."""
    from engine.runner import ModelRunner
    cfg = EngineConfig(model=MODEL_32B, device=DEVICE, dtype=DTYPE, parallel=4, max_model_len=1024,
                       prefill_rows=1024)
    base = ModelRunner(cfg)
    runners = {"pdl off (default)": base, f"best {best_kw}": ModelRunner(replace(cfg, kernels=KernelConfig(**best_kw)),
                                                                         model=base.model)}
    time_32b(runners, base)


def time_32b(runners: dict, base) -> None:
    """Tokens of one prompt equal across the runners, then replay and host-driven ms a round at one stream
    (2 interleaved turns), into RES["qwen3-32b"]."""
    from engine.dev.bench import bench_decode, weight_bytes
    out = RES.setdefault("qwen3-32b", {})
    toks = {n: r.generate(R2.prompt(100, 5), 6, lane=0) for n, r in runners.items()}
    out["tokens equal"] = len({tuple(t) for t in toks.values()}) == 1
    bw = RES["ceilings"]["copy_bandwidth_Bps"]
    rep_t: dict = {}
    for _ in range(2):
        for name, r in runners.items():
            rep_t.setdefault(name, []).extend(replay_ms(r, 1, chunks=3, n=20))
            rep_t.setdefault(name + " host", []).append(bench_decode(r, 1, 16, 1, 128) * 1e3)
    roof_ms = (weight_bytes(base) + 129 * base.kv.row_bytes()) / bw * 1e3
    for name in runners:
        ms, hs = statistics.median(rep_t[name]), statistics.median(rep_t[name + " host"])
        out[name] = {"replay_ms": ms, "ratio": roof_ms / ms, "host_round_ms": hs, "host_ratio": roof_ms / hs}
        say(f"qwen3-32b {name:30s}: replay {ms:.2f} ms ({roof_ms / ms:6.1%}), host-driven {hs:.2f} ms "
            f"({roof_ms / hs:6.1%}) of {roof_ms:.2f} ms; tokens equal {out['tokens equal']}")
    save()


def main(argv):
    from engine.runner import ModelRunner
    t0 = R2.begin(argv)
    secs = (argv[argv.index("--sections") + 1] if "--sections" in argv else "decode,chain,32b").split(",")
    budget = float(argv[argv.index("--budget-s") + 1]) if "--budget-s" in argv else 300.0
    RES["triton"], RES["variants"] = triton.__version__, {k: str(v) for k, v in VARIANTS.items()}
    say(json.dumps(RES))
    best = {"pdl": 2}
    if {"decode", "chain"} & set(secs):
        base = ModelRunner(EngineConfig(model=MODEL_8B, device=DEVICE, dtype=DTYPE, parallel=8,
                                        max_model_len=2304, prefill_rows=4096))
        if "decode" in secs:
            best = R2._guard("decode", lambda: sec_decode(base)) or best
        torch.cuda.empty_cache()
        if "chain" in secs:
            R2._guard("chain", lambda: sec_chain(base.model))
        del base
        torch.cuda.empty_cache()
    if "32b" in secs and time.perf_counter() - t0 < budget:
        R2._guard("32b", lambda: sec_32b(best))
    elif "32b" in secs:
        RES["32b skipped"] = f"{time.perf_counter() - t0:.0f} s used of the {budget:.0f} s budget"
    R2.finish(t0)


if __name__ == "__main__":
    main(sys.argv[1:])
