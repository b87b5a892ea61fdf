"""B alone, in process: one long prompt's whole fill (the grid's cuts, back to back, as a server with
nothing else running takes it) on each CUDA cut-attention path, side by side on one runner.

    PYTHONPATH=. python3 -m tools.prompt_alone --model qwen3-8b --prompt 32000 --out $OUT/prompt_alone.json

Paths: cuDNN's halves (the default --cut-attention), cut_flash's tiles as the engine runs them (K and
V through tensor descriptors from Hopper on), the tiles by pointer loads, and at splits of 8,192 keys
(other bits).
Each path once untimed (compiles, cuDNN's graphs), then --reps timed fills; printed: the median
seconds and each path's first token, and whether the last row's logits are bitwise those of the
engine's tiles (pointer loads must be; other splits and cuDNN need not).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from dataclasses import replace

from engine.config import EngineConfig, KernelConfig
from engine.runner.build import build_runner


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen3-8b")
    ap.add_argument("--prompt", type=int, default=32000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    r = build_runner(EngineConfig(model=a.model, device="cuda", dtype="bfloat16", parallel=2,
                                  max_model_len=a.prompt + 64, prefill_rows=1024,
                                  kernels=KernelConfig(cut_tiles=True)))
    r.cuts_warmed.result()
    g = torch.Generator().manual_seed(32)
    ids = torch.randint(0, r.vocab_size, (a.prompt,), generator=g).tolist()
    tiles = r.kernels.cut_flash
    paths = {"tiles": tiles, "tiles, pointer loads": replace(tiles, tma=False),
             "tiles, splits of 8192": replace(tiles, split=8192), "cudnn": None}
    res, logits = {}, {}
    for name, cfg in paths.items():
        r.kernels.cut_flash = cfg
        with torch.inference_mode():
            times, first = [], None
            for rep in range(a.reps + 1):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                first = r.prefill(0, ids)
                torch.cuda.synchronize()
                if rep:
                    times.append(time.perf_counter() - t0)
            start = (len(ids) - 1) // r.prefill_rows * r.prefill_rows
            x = torch.tensor(ids[start:], dtype=torch.long, device="cuda")
            logits[name] = r._forward_cut(x, 0, start).float().cpu()
        res[name] = {"seconds": round(statistics.median(times), 4), "each": [round(t, 4) for t in times],
                     "first_token": first,
                     "logits_bitwise_as_tiles": bool(torch.equal(logits[name], logits["tiles"]))}
        print(f"{name}: {res[name]}", flush=True)
    r.kernels.cut_flash = tiles
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"model": a.model, "prompt": a.prompt, "paths": res}, f, indent=1)


if __name__ == "__main__":
    main()
