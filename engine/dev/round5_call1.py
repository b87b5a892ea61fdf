"""Issue 14, round 5, first device call (run 17, engine/dev/PERF.md): the split attention's
combine folded into its last split program (engine/kernels.py FOLD_COMBINE, KernelConfig.fold_combine),
side by side with the round without it. Run 17 ran this at commit febd0e7 with four more variants
(the split kernel's K/V loads moved ahead, with and without the fold and PDL 2); they measured no
faster and were removed: that commit has them.

Bits first: the folded attention against the two kernels on random data at positions of 1 to 9
splits; every variant's tokens (three prompts alone, one of 600 tokens so its rows span three
splits, eight lanes decoding together, one of them past 512) and logits bitwise equal to the base.
Then the replay timer and the host-driven timer at 1 and 8 streams (qwen3-8b, interleaved), a
per-kernel profile of the base and the best variant, and qwen3-32b (one H200) with the same checks
at 1 and 8 streams. Writes $OUT/round2.json (engine.dev.round2's writer) as it goes.

    PYTHONPATH=. python3 -m engine.dev.round5_call1 --out $OUT
    TRITON_INTERPRET=1 PYTHONPATH=. python3 -m engine.dev.round5_call1 --out /tmp/r5 --dry-run   # CPU, tiny
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from dataclasses import replace

import torch

import engine.dev.round2 as R2
import engine.dev.round4_call1 as C1
from engine.config import EngineConfig, KernelConfig

RES, say, save = R2.RES, R2.say, R2.save
VARIANTS = {  # the combine fold alone, as run 17 measured it
    "fold off": {"fold_combine": False, "fold_qk_norm": False},
    "fold combine": {"fold_qk_norm": False},
}


def tokens_of(r) -> dict:
    """C1.tokens_of plus rows of several splits: a 600-token prompt alone, and eight lanes together
    with lane 7 at 520 tokens; the logits of every row of the last round."""
    alone = [r.generate(R2.prompt(64 + 40 * i, 20 + i), 8, lane=0) for i in range(3)]
    alone.append(r.generate(R2.prompt(600, 7), 6, lane=1))
    lanes = list(range(8))
    lens = [50 + 9 * lane if lane < 7 else 520 for lane in lanes]
    toks = [r.prefill(lane, R2.prompt(n, 40 + lane)) for lane, n in zip(lanes, lens)]
    pos, together = list(lens), [list(toks)]
    for _ in range(6):
        toks = r.decode(lanes, toks, pos)
        pos = [p + 1 for p in pos]
        together.append(toks)
    logits = r._s_logits.clone() if r.graph is not None else torch.zeros(1)
    return {"alone": alone, "together": together, "logits": logits}


def sec_kernel(device, dtype):
    """The folded attention against the two kernels, bitwise, on random q and caches; every arrival
    counter back at 0 after each launch."""
    import engine.kernels as K
    out = RES.setdefault("kernel", {})
    g = torch.Generator(device=device).manual_seed(0)
    small = device == "cpu"
    lanes_n, max_len, kvh, d, h = (3, 600, 2, 16, 6) if small else (9, 2304, 8, 128, 32)

    class KV:
        k = torch.randn(1, lanes_n + 1, max_len, kvh, d, generator=g, device=device).to(dtype)
        v = torch.randn(1, lanes_n + 1, max_len, kvh, d, generator=g, device=device).to(dtype)

    pos = [0, 255, 256, 511, 599] if small else [0, 128, 255, 256, 511, 700, 1500, 2303]
    lanes = torch.tensor([i % lanes_n for i in range(len(pos))], device=device)
    pos_t = torch.tensor(pos, device=device)
    same = []
    for trial in range(1 if small else 4):
        q = (torch.randn(len(pos), h, d, generator=g, device=device) * (1 + trial)).to(dtype)
        a = K.decode_attention(KV, 0, q, lanes, pos_t, fold=False)
        same.append(bool(torch.equal(a, K.decode_attention(KV, 0, q, lanes, pos_t, fold=True))))
    counters = all(int(s[2].abs().sum()) == 0 for s in K._scratch.values())
    out.update({"positions": pos, "fold == two kernels, bitwise": same, "counters at 0": counters})
    say("kernel", json.dumps(out))
    save()


def sec_32b(best_kw: dict, model: str, device: str, dtype: str, base_kw: dict | None = None):
    """qwen3-32b (one H200, --parallel 8): base (base_kw; None: the defaults), the defaults and the
    best variant, tokens and logits against the base, replay at 1 and 8 streams, host-driven at 1."""
    from engine.dev.bench import bench_decode, weight_bytes
    from engine.runner import ModelRunner
    out = RES.setdefault("qwen3-32b", {})
    cfg = EngineConfig(model=model, device=device, dtype=dtype, parallel=8, max_model_len=1024, prefill_rows=1024)
    dflt = ModelRunner(cfg)
    runners, seen = {}, []
    for name, kw in ((f"base {base_kw or {}}", base_kw or {}), ("defaults", {}), (f"best {best_kw}", best_kw)):
        if kw not in seen:
            seen.append(kw)
            runners[name] = dflt if not kw else ModelRunner(replace(cfg, kernels=KernelConfig(**kw)), model=dflt.model)
    base = dflt
    C1.check_bits(runners, out, "qwen3-32b")  # with C1.tokens_of = tokens_of (main sets it)
    save()
    bw = RES["ceilings"]["copy_bandwidth_Bps"]
    rep_t: dict = {}
    for _ in range(2):
        for name, r in runners.items():
            for k in (1, 8):
                rep_t.setdefault((name, k), []).extend(C1.replay_ms(r, k, chunks=3, n=20))
            rep_t.setdefault((name, "host"), []).append(bench_decode(r, 1, 16, 1, 128) * 1e3)
    for name in runners:
        for k in (1, 8):
            roof_ms = (weight_bytes(base) + k * 129 * base.kv.row_bytes()) / bw * 1e3
            ms = statistics.median(rep_t[(name, k)])
            out[f"{name} streams {k}"] = {"replay_ms": ms, "ratio": roof_ms / ms, "roof_ms": roof_ms}
            say(f"qwen3-32b {name:34s} {k} streams: replay {ms:.3f} ms ({roof_ms / ms:6.1%} of {roof_ms:.2f} ms)")
        out[f"{name} host 1 stream ms"] = statistics.median(rep_t[(name, "host")])
    save()


class _CpuEvent:
    """torch.cuda.Event's timing calls on the host clock (the CPU dry run)."""

    def __init__(self, **_):
        self.t = 0.0

    def record(self):
        self.t = time.perf_counter()

    def synchronize(self):
        pass

    def elapsed_time(self, other) -> float:
        return (other.t - self.t) * 1e3


def main(argv):
    from engine.runner import ModelRunner
    dry = "--dry-run" in argv
    m8, m32, dev, dt = ("tiny", "tiny", "cpu", "float32") if dry else (C1.MODEL_8B, C1.MODEL_32B, "cuda", "bfloat16")
    if dry:  # the plumbing on the CPU: host clocks for device events, a nominal copy rate
        R2.OUT = argv[argv.index("--out") + 1]
        torch.cuda.Event = _CpuEvent
        RES["ceilings"] = {"copy_bandwidth_Bps": 1e11}
        t0 = time.perf_counter()
    else:
        t0 = R2.begin(argv)
    import triton
    RES["triton"], RES["variants"] = triton.__version__, {k: str(v) for k, v in VARIANTS.items()}
    say(json.dumps(RES))
    R2._guard("kernel", lambda: sec_kernel(dev, torch.float32 if dry else torch.bfloat16))
    C1.tokens_of = tokens_of  # sec_decode's bit check, with rows of several splits
    base = ModelRunner(EngineConfig(model=m8, device=dev, dtype=dt, parallel=8, max_model_len=2304,
                                    prefill_rows=4096))
    best = R2._guard("decode", lambda: C1.sec_decode(base, VARIANTS)) or {"fold_qk_norm": False}
    base = None  # the 8b runners go before the 32b model loads
    if not dry:
        torch.cuda.empty_cache()
    R2._guard("32b", lambda: sec_32b(best, m32, dev, dt, base_kw=VARIANTS["fold off"]))
    R2.finish(t0)


if __name__ == "__main__":
    main(sys.argv[1:])
