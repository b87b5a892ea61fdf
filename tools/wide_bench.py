"""A decode round's weight products on the CPU, today's kernel against the widened-bf16 one
(engine/cpu/wide.c), in turns in one process (A B B A a repetition), at 1, 2, 4 and 8 rows:

    python -m tools.wide_bench --model cpu --rows 1,2,4,8 --reps 5
    python -m tools.wide_bench --model cpu --rows 1,2,4,8 --reps 5 --round   # whole C++ rounds, streams

"mkl": MKL's packed float32 sgemm on whole 8-row tiles (what a float32 round runs without the
wide kernel, whatever its row count); "wide": bf16 weights widened in the kernel, only the
round's rows. Each figure is the median time of every layer's four products and the lm_head,
the ratio is mkl / wide."""
from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import replace

import torch

from engine.config import EngineConfig, Toolchain
from engine.cpu.decode_attention import kernel
from engine.cpu.packed import ROW_TILE, PackedLinears
from engine.cpu.wide import WideKernel
from engine.runner.build import build_runner


def rounds(a) -> None:
    """Whole decode rounds (the C++ round, the server's path), float32 weights through MKL against
    bf16 weights through the wide kernel, two runners in one process, A B B A at each level."""
    from engine.cli import device_defaults
    dt, par, _ = device_defaults("cpu", None, None, None)
    made = {}
    for name, wide in (("mkl", False), ("wide", None)):
        cfg = EngineConfig(model=a.model, device="cpu", dtype=dt, parallel=par, max_model_len=1024, prefill_rows=256)
        made[name] = build_runner(replace(cfg, kernels=replace(cfg.kernels, cpu_cpp=True, cpu_wide=wide)))
        print(f"{name}: {made[name].describe()['cpu_matmuls']}; C++ round {made[name].cpu.round.status}", flush=True)
    clock = time.perf_counter if a.wall else time.thread_time
    for n in [int(s) for s in a.rows.split(",")]:
        state = {}
        for name, r in made.items():
            lanes = list(range(n))
            toks = [r.prefill(lane, [(7 * lane + 3 * i) % 500 + 2 for i in range(64)]) for lane in lanes]
            state[name] = (lanes, toks, [64] * n)

        def go(name: str) -> float:
            r, (lanes, toks, pos) = made[name], state[name]
            t = clock()
            for _ in range(a.inner):
                toks = r.decode(lanes, toks, pos)
                pos = [p + 1 for p in pos]
            state[name] = (lanes, toks, pos)
            return (clock() - t) / a.inner
        for name in made:
            go(name)
        t = {"mkl": [], "wide": []}
        for _ in range(a.reps):
            for name in ("mkl", "wide", "wide", "mkl"):
                t[name].append(go(name))
        m = {k: statistics.median(v) for k, v in t.items()}
        print(f"{n} streams: round mkl {m['mkl'] * 1e3:.2f} ms ({n / m['mkl']:.0f} tok/s) "
              f"[{' '.join(f'{v * 1e3:.1f}' for v in t['mkl'])}], wide {m['wide'] * 1e3:.2f} ms "
              f"({n / m['wide']:.0f} tok/s) [{' '.join(f'{v * 1e3:.1f}' for v in t['wide'])}]; "
              f"mkl / wide {m['mkl'] / m['wide']:.2f}x; load {os.getloadavg()[0]:.1f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="cpu")
    ap.add_argument("--rows", default="1,2,4,8")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--inner", type=int, default=5, help="rounds of products a timing")
    ap.add_argument("--wall", action="store_true", help="wall time instead of the thread's CPU time")
    ap.add_argument("--round", action="store_true", help="whole decode rounds (the C++ round) instead of products")
    a = ap.parse_args()
    if a.round:
        with torch.inference_mode():
            return rounds(a)
    torch.set_num_threads(1)
    cfg = EngineConfig(model=a.model, device="cpu", dtype="float32", parallel=8, max_model_len=512)
    packed = PackedLinears(build_runner(replace(cfg, kernels=replace(cfg.kernels, cpu_cpp=False))).model)
    wk = WideKernel(kernel(Toolchain()).lib)
    wide = {key: wk.pack(w) for key, w in packed.plain.items()}
    keys = list(packed.plain)
    mb_f32 = sum(w.numel() * 4 for w in packed.plain.values()) / 1e6
    print(f"{len(keys)} matrices, {mb_f32:.0f} MB float32 / {mb_f32 / 2:.0f} MB bf16; wide ISA {wk.isa}; "
          f"torch {torch.backends.cpu.get_cpu_capability()}; load {os.getloadavg()[0]:.1f}", flush=True)
    g = torch.Generator().manual_seed(0)
    xs = {key: torch.randn(ROW_TILE, w.shape[1], generator=g) for key, w in packed.plain.items()}

    def mkl(n: int) -> None:
        for key in keys:
            packed.mm(xs[key], key)  # always the whole 8-row tile

    def wid(n: int) -> None:
        rows = torch.arange(n)
        for key in keys:
            wk(xs[key][:n], wide[key], rows)

    def timed(f, n: int) -> float:
        """This thread's CPU seconds a round of products: on a shared machine wall time also
        counts the time other processes held the core (--wall: wall time)."""
        clock = time.perf_counter if a.wall else time.thread_time
        t = clock()
        for _ in range(a.inner):
            f(n)
        return (clock() - t) / a.inner

    with torch.inference_mode():
        for n in [int(s) for s in a.rows.split(",")]:
            for f in (mkl, wid):
                f(n)
            t = {"mkl": [], "wide": []}
            for _ in range(a.reps):
                for name, f in (("mkl", mkl), ("wide", wid), ("wide", wid), ("mkl", mkl)):
                    t[name].append(timed(f, n))
            m = {k: statistics.median(v) for k, v in t.items()}
            print(f"{n} rows: mkl {m['mkl'] * 1e3:.2f} ms [{' '.join(f'{v * 1e3:.1f}' for v in t['mkl'])}], "
                  f"wide {m['wide'] * 1e3:.2f} ms [{' '.join(f'{v * 1e3:.1f}' for v in t['wide'])}]; "
                  f"mkl / wide {m['mkl'] / m['wide']:.2f}x; wide {mb_f32 / 2 / 1e3 / m['wide']:.1f} GB/s; "
                  f"load {os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main()
