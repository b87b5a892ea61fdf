"""One CPU decode round in-process: its time at 1/2/4/8 streams, torch calls a round, and where
the time goes (torch.profiler self time by op; Python time = round - op time).

    python -m tools.cpu_round_bench --model-dir runs/qwen3-random-512 [--profile] [--streams 1,4,8]

Both rounds, the C++ one (engine/cpu/round.py) and the Python one, are measured in turns in the
same process (so a burst of load from elsewhere lands on both), with the ratio. `--attention both`
measures the C++ round with the C decode attention (engine/cpu/decode_attention.c) and with the batched
matmuls in turns instead (a bench may switch; a server never does: the bits would move).

The engine is built with `tfengine serve`'s CPU defaults (engine.cli.device_defaults: dtype,
parallel 8, threads); each stream has a 64-token prompt and decodes as serve_compare's sweep does
(contexts 64..64+rounds). Figures are medians of --reps repetitions.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from engine.config import EngineConfig
from engine.runner.build import build_runner


class CountOps(TorchDispatchMode):
    """Counts the ATen calls that reach dispatch (what a compiled round would run without Python)."""

    def __init__(self):
        super().__init__()
        self.ops: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def runner_for(model_dir: str, parallel: int | None = None, dtype: str | None = None, **knobs):
    from dataclasses import replace

    from engine.cli import device_defaults
    dt, par, _ = device_defaults("cpu", dtype, parallel, None)
    cfg = EngineConfig(model=model_dir, load_format="safetensors", device="cpu", dtype=dt, parallel=par,
                       max_model_len=1024, prefill_rows=256)
    if knobs:
        cfg = replace(cfg, kernels=replace(cfg.kernels, **knobs))
    return build_runner(cfg)


def rounds_at(r, streams: int, rounds: int, ctx: int = 64):
    lanes = list(range(streams))
    toks = [r.prefill(lane, [(7 * lane + 3 * i) % 8000 + 2 for i in range(ctx)]) for lane in lanes]
    pos = [ctx] * streams
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        toks = r.decode(lanes, toks, pos)
        times.append(time.perf_counter() - t)
        pos = [p + 1 for p in pos]
    return times, (lanes, toks, pos)


def profile_round(r, lanes, toks, pos, n: int = 20):
    from torch.profiler import ProfilerActivity, profile
    with CountOps() as c:
        r.decode(lanes, toks, pos)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(n):
            r.decode(lanes, toks, pos)
    ev = prof.key_averages()
    return c.ops, ev


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", default="runs/qwen3-random-512")
    ap.add_argument("--streams", default="1,2,4,8")
    ap.add_argument("--rounds", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--attention", choices=["chosen", "both"], default="chosen")
    a = ap.parse_args()
    r = runner_for(a.model_dir, cpu_cpp=True)
    print(f"threads {torch.get_num_threads()} dtype {r.dtype} parallel {r.parallel} round_rows {r.round_rows} "
          f"C++ round: {r.cpu.round.status}; decode attention: {r.describe()['decode_attention']}")
    c = r.cpu.attention
    paths = {"C++": (True, c), "Python": (False, c)} if r.cpu.round.ready else {"Python": (False, c)}
    if a.attention == "both" and c is not None:
        p, (on, _) = next(iter(paths.items()))  # the C++ round where it loaded
        paths = {f"{p} {name}": (on, attn) for name, attn in (("c", c), ("bmm", None))}
    for k in [int(s) for s in a.streams.split(",")]:
        meds = {p: [] for p in paths}
        for _ in range(a.reps):
            for p, (on, attn) in paths.items():
                r.cpu.round.on, r.cpu.attention, r.cpu.round.attn = on, attn, attn.address if attn else 0
                times, state = rounds_at(r, k, a.rounds)
                meds[p].append(statistics.median(times[4:]))
        m = {p: statistics.median(v) for p, v in meds.items()}
        line = ", ".join(f"{p} {v * 1e3:.2f} ms ({k / v:.0f} tok/s)" for p, v in m.items())
        names = list(m)
        ratio = f"; {names[1]} / {names[0]} {m[names[1]] / m[names[0]]:.2f}x" if len(m) >= 2 else ""
        print(f"{k} streams: round {line}{ratio}; load {os.getloadavg()[0]:.1f}", flush=True)
        if a.profile:
            ops, ev = profile_round(r, *state)
            total = sum(ops.values())
            print(f"  torch calls a round: {total}; top: {ops.most_common(12)}")
            print(ev.table(sort_by="self_cpu_time_total", row_limit=18))


if __name__ == "__main__":
    main()
