"""Where the split attention's time goes, phase by phase (issue 14 round 9, run 73): the decode round's
graphs captured with engine/cuda/clock.py's stamps in the split kernel, then rounds of `--streams`
streams at context 128 (not ahead: each round's stamps are read after it). Per program of a row's first
split: after its PDL wait, the positions read, q ready (its norm, RoPE and the K/V row written), the
keys walked, the output stored; medians over rounds, middle layers and programs, in ns (the SM's cycles
over the global timer's ns between the same two stamps). Beside them, per middle layer (run 78): the
kernel's span on the global timer over the programs with an item, how late the last of them entered,
how far the last end trails the median, and how many of them the busiest and least busy SM ran.

    PYTHONPATH=. python3 -m tools.attn_clock --out $OUT [--parallel 64 --streams 64 --max-len 1024] [--variant st3]

--variant: the graphs captured under one of tools/variants.py's (default base).
"""
from __future__ import annotations

import json
import statistics
import sys

import torch

from engine.cuda import clock as kernels_clock
from engine.config import EngineConfig
from tools.variants import recapture
from engine.runner.model_runner import build_runner


def phases(clock: torch.Tensor, programs: int) -> dict:
    """One round's stamps [layers, programs, SLOTS] -> {phase: [ns, ...]} over its middle layers."""
    c = clock[2:-2, :programs].double()
    rate = (c[..., 5] - c[..., 1]) / (c[..., 7] - c[..., 6]).clamp(min=1)  # cycles a ns
    out = {name: ((c[..., j + 1] - c[..., j]) / rate).flatten().tolist()
           for j, name in enumerate(kernels_clock.PHASES)}
    out["after the wait"] = ((c[..., 5] - c[..., 1]) / rate).flatten().tolist()
    out["GHz"] = rate.flatten().tolist()
    return out


def spans(clock: torch.Tensor, programs: int) -> dict:
    """One round's stamps -> per middle layer, on the global timer (ns): the kernel's span over the
    programs with an item (first entry to last end), the last entry after the first, the last end
    after the median end; and the most and fewest of those programs an SM ran."""
    c = clock[2:-2, :programs]
    entry, end, sm = c[..., 8].double(), c[..., 7].double(), c[..., 9]
    first = entry.min(1).values
    most, fewest = [], []
    for row in sm:
        n = torch.bincount(row)
        most.append(int(n.max()))
        fewest.append(int(n[n > 0].min()))
    return {"span": (end.max(1).values - first).tolist(), "last entry": (entry.max(1).values - first).tolist(),
            "last end after the median": (end.max(1).values - end.median(1).values).tolist(),
            "items on the busiest SM": most, "items on the least busy SM": fewest}


def main(argv):
    def arg(name, default):
        return int(argv[argv.index(name) + 1]) if name in argv else default
    out = argv[argv.index("--out") + 1] if "--out" in argv else "/tmp/out"
    parallel, streams, max_len = arg("--parallel", 8), arg("--streams", 1), arg("--max-len", 32784)
    variant = argv[argv.index("--variant") + 1] if "--variant" in argv else "base"
    r = build_runner(EngineConfig(model="qwen3-8b", device="cuda", dtype="bfloat16", parallel=parallel,
                                  max_model_len=max_len, prefill_rows=min(4096, max_len)))
    r.cuts_warmed.result()
    layers, kvh = len(r.model.model.layers), r.model.config.num_key_value_heads
    clock = r.kernels.clock = torch.zeros(layers, parallel * kvh, kernels_clock.SLOTS, dtype=torch.int64, device="cuda")
    recapture(r, r.cfg, variant)  # again, now with the stamps compiled in
    lanes = list(range(streams))
    toks, pos = [r.prefill(ln, [(i * 37 + 5 + ln) % 1000 for i in range(128)]) for ln in lanes], 128
    samples: dict = {}
    with torch.inference_mode():
        for n in range(25):
            toks, pos = r.decode(lanes, toks, [pos] * streams, ahead=False), pos + 1
            torch.cuda.synchronize()
            if n >= 5:
                c = clock.cpu()
                for k, v in (*phases(c, streams * kvh).items(), *spans(c, streams * kvh).items()):
                    samples.setdefault(k, []).extend(v)
    res = {"parallel": parallel, "streams": streams, "variant": variant, "decode_rows": list(r.buckets),
           "last_round_layer_18": clock[18, :streams * kvh].cpu().tolist(),  # [program][slot]
           "median_ns": {k: round(statistics.median(v), 1) for k, v in samples.items()},
           "p90_ns": {k: round(statistics.quantiles(v, n=10)[-1], 1) for k, v in samples.items()}}
    print(json.dumps({k: v for k, v in res.items() if not k.startswith("last_round")}), flush=True)
    with open(f"{out}/attn_clock_{parallel}_{streams}_{variant}.json", "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
