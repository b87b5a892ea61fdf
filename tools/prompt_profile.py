"""Where a whole prompt's time goes: qwen3-8b, one cut of `--rows` (default 4,096)
rows as tools.bench times it, then torch.profiler's CUDA activity for one such prefill: kernel
time by name, the span from the first kernel to the last and the GPU's idle inside it. Beside it,
each of the trunk's products alone through torch (cuBLAS) at that row count and the n^3 product the
bench's roofline divides by, so the gap to the roofline splits into the products' own rate, the
attention, the rest and the idle.

    PYTHONPATH=. python3 -m tools.prompt_profile --out $OUT [--rows 4096] [--rates]

--rates: instead, the n^3 product's rate three ways, each phase's start and end on the wall
clock (time.time(), to read beside a clock trace such as `nvidia-smi -lms 20`): a 10-product burst
after 3 s idle (the bench's matmul_rate), bursts alternated with whole prompts (bench.side_by_side),
and 2 s of products back to back (the rate of each 0.25 s).
"""
from __future__ import annotations

import json
import sys
import time

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from engine.config import EngineConfig
from tools.bench import bench_prefill, matmul_rate, prompt, prompt_flops, side_by_side
from engine.runner.build import build_runner


def product_rate(rows: int, n: int, k: int, reps: int = 20) -> float:
    """bf16 FLOP/s of x [rows, k] @ w[n, k].T through F.linear, as the trunk calls it."""
    x = torch.randn(rows, k, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda")
    for _ in range(3):
        F.linear(x, w)
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(reps):
        F.linear(x, w)
    e.record()
    e.synchronize()
    return 2 * rows * n * k / (s.elapsed_time(e) / 1e3 / reps)


def idle_us(spans: list[tuple[float, float]]) -> float:
    """Time inside [first start, last end] that no kernel covers (spans may overlap)."""
    spans = sorted(spans)
    idle, reach = 0.0, spans[0][1]
    for a, b in spans[1:]:
        if a > reach:
            idle += a - reach
        reach = max(reach, b)
    return idle


def rates(r, rows: int, out: str) -> None:
    phases, res = {}, {}

    def phase(name, f):
        t = time.time()
        res[name] = f()
        phases[name] = (t, time.time())
    time.sleep(3)
    phase("burst after idle (tflops)", lambda: matmul_rate("cuda") / 1e12)
    time.sleep(3)
    phase("side by side (s, tflops)", lambda: (lambda s, f: (s, f / 1e12))(*side_by_side(r, rows, 9)))
    time.sleep(3)

    def back_to_back():
        a, b = (torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda") for _ in range(2))
        spans = []
        for _ in range(8):
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
            ev[0].record()
            for _ in range(170):  # ~0.25 s
                a @ b
            ev[1].record()
            spans.append(ev)
        spans[-1][1].synchronize()
        return [round(2 * 8192 ** 3 * 170 / (e0.elapsed_time(e1) / 1e3) / 1e12, 1) for e0, e1 in spans]
    phase("back to back, each 0.25 s (tflops)", back_to_back)
    res["prompt roofline ratio against each"] = {
        k: rows / res["side by side (s, tflops)"][0] / (rows / (prompt_flops(r, rows) / (v * 1e12)))
        for k, v in (("burst after idle", res["burst after idle (tflops)"]),
                     ("side by side", res["side by side (s, tflops)"][1]),
                     ("back to back, last", res["back to back, each 0.25 s (tflops)"][-1]))}
    res["phases_wall"] = phases
    print(json.dumps(res, indent=1), flush=True)
    with open(f"{out}/prompt_rates.json", "w") as f:
        json.dump(res, f, indent=1)


def main(argv):
    out = argv[argv.index("--out") + 1] if "--out" in argv else "/tmp/out"
    rows = int(argv[argv.index("--rows") + 1]) if "--rows" in argv else 4096
    r = build_runner(EngineConfig(model="qwen3-8b", device="cuda", dtype="bfloat16", parallel=8,
                                  max_model_len=32784, prefill_rows=4096))
    r.cuts_warmed.result()
    if "--rates" in argv:
        return rates(r, rows, out)
    seconds = bench_prefill(r, rows, 7)
    rate = matmul_rate("cuda")
    toks = prompt(rows, 1, r.vocab_size)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        r.prefill(0, toks)
        torch.cuda.synchronize()
    kern = [(e.name, e.time_range.start, e.time_range.end) for e in prof.events()
            if e.device_type == torch.autograd.DeviceType.CUDA and "memcpy" not in e.name.lower()]
    by_name: dict = {}
    for name, a, b in kern:
        t = by_name.setdefault(name[:90], [0, 0.0])
        t[0] += 1
        t[1] += b - a
    span = max(b for _, _, b in kern) - min(a for _, a, _ in kern)
    m = r.model_config
    h, i = m.hidden_size, m.intermediate_size
    q, kv = m.num_attention_heads * m.head_dim, m.num_key_value_heads * m.head_dim
    shapes = {"qkv": (q + 2 * kv, h), "o": (h, q), "gate_up": (2 * i, h), "down": (h, i)}
    products = {k: product_rate(rows, n, kk) / 1e12 for k, (n, kk) in shapes.items()}
    layers = m.num_hidden_layers
    products_ms = sum(2 * rows * n * kk * layers / (products[k] * 1e12) for k, (n, kk) in shapes.items()) * 1e3
    res = {"rows": rows, "seconds": seconds, "matrix_rate_tflops": rate / 1e12,
           "roofline_ratio": rows / seconds / (rows / (prompt_flops(r, rows) / rate)),
           "kernel_ms": sum(b - a for _, a, b in kern) / 1e3, "span_ms": span / 1e3,
           "idle_ms": idle_us([(a, b) for _, a, b in kern]) / 1e3,
           "products_tflops": {k: round(v, 1) for k, v in products.items()},
           "products_alone_ms": products_ms,
           "by_name_ms": {k: [c, round(t / 1e3, 3)] for k, (c, t) in
                          sorted(by_name.items(), key=lambda kv: -kv[1][1])[:30]}}
    print(json.dumps(res, indent=1), flush=True)
    with open(f"{out}/prompt_profile.json", "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
