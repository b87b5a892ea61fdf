"""Decode-round matmuls: cuBLAS against engine.kernels_skinny, per weight shape and in the round.

    PYTHONPATH=. python3 -m engine.dev.bench_skinny --model qwen3-8b --device cuda --json out.json

1. Each weight shape of one decode round (q/k/v, o, gate/up, down after silu*up, and lm_head) at the round's fixed row count: cuBLAS at that count and at one row, and each
   candidate config of the skinny kernel. On CUDA every product runs over enough distinct weight
   copies (>= 1 GiB) that L2 holds none of them, inside one CUDA graph, as a replayed round runs
   them. Prints bytes of weights read per second and their share of the measured copy bandwidth.
2. The best config per shape, its agreement with cuBLAS and its bitwise row invariance (a row
   alone == the same row among others); a shape where no config beats cuBLAS stays cuBLAS.
3. The whole decode round of the preset, both ways, same weights: ms per round at 1 and 4
   streams, and the skinny round's tokens alone == beside three other streams.
Best configs go to --json; engine/kernels_skinny.py's CONFIGS holds the ones adopted.
"""
from __future__ import annotations

import json
import math
import statistics
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Annotated, Callable, Optional

import torch
import torch.nn.functional as F
import typer

import engine.kernels_skinny as S
from engine.config import EngineConfig, KernelConfig
from engine.presets import resolve_model

app = typer.Typer(add_completion=False, help=__doc__)

CANDIDATES = [S.SkinnyConfig(16, 256), S.SkinnyConfig(32, 256), S.SkinnyConfig(64, 256),
              S.SkinnyConfig(16, 512), S.SkinnyConfig(32, 512, 4, 3), S.SkinnyConfig(32, 256, 8, 4),
              S.SkinnyConfig(32, 128, 4, 6), S.SkinnyConfig(64, 128, 4, 6)]


def shapes(model: str) -> dict[str, tuple[int, int, bool, int]]:
    """name -> (N, K, silu*up first, uses per round)."""
    m, _, _ = resolve_model(model)
    h, q, kv, i, L = (m.hidden_size, m.num_attention_heads * m.head_dim, m.num_key_value_heads * m.head_dim,
                      m.intermediate_size, m.num_hidden_layers)
    return {"qkv": (q + 2 * kv, h, False, L), "o": (h, q, False, L), "gate_up": (2 * i, h, False, L),
            "silu+down": (h, i, True, L), "lm_head": (m.vocab_size, h, False, 1)}


def timed(fn: Callable[[int], None], copies: int, dev: torch.device, reps: int = 5) -> float:
    """Seconds per call of fn(copy index), the calls replayed in one CUDA graph (CPU: a loop)."""
    run = lambda: [fn(c) for c in range(copies)]  # noqa: E731
    if dev.type == "cuda":
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            run()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            run()
        g.replay()
        torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(); g.replay(); b.record(); b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
    else:
        run()
        times = []
        for _ in range(reps):
            t = time.perf_counter(); run(); times.append(time.perf_counter() - t)
    return statistics.median(times) / copies


def bench_shapes(model: str, dev, dtype, rows: int, bw: float | None, candidates, out: dict, say) -> None:
    from engine.kernels_fused import silu_mul
    gen = torch.Generator(device=dev).manual_seed(0)
    out["shapes"], best = {}, {}
    for name, (n, k, silu, uses) in shapes(model).items():
        nbytes = n * k * torch.finfo(dtype).bits // 8
        copies = max(2, math.ceil((1 << 30) / nbytes)) if dev.type == "cuda" else 1
        ws = [(torch.randn(n, k, device=dev, generator=gen, dtype=torch.float32) * 0.02).to(dtype) for _ in range(copies)]
        kin = 2 * k if silu else k
        xs = {m: torch.randn(m, kin, device=dev, generator=gen, dtype=torch.float32).to(dtype) for m in (1, rows)}
        first = silu_mul if silu else (lambda x: x)

        def cublas(m):
            x = xs[m]
            return lambda c: F.linear(first(x), ws[c])
        rec = {"N": n, "K": k, "silu": silu, "uses": uses, "bytes": nbytes, "copies": copies, "variants": {}}
        configs = {f"skinny {c.block_n}x{c.block_k} w{c.num_warps} s{c.num_stages}": c
                   for c in candidates if k % c.block_k == 0}
        variants = {f"cublas {rows} rows": cublas(rows), "cublas 1 row": cublas(1),
                    **{vn: (lambda cfg: (lambda i: S.skinny(first(xs[rows]), ws[i], config=cfg)))(c)
                       for vn, c in configs.items()}}
        for vname, fn in variants.items():
            try:
                s = timed(fn, copies, dev)
            except Exception as e:  # a config the device cannot build (shared memory): skip it
                rec["variants"][vname] = {"error": repr(e)[:200]}
                say(f"{name:10s} {vname:28s} failed: {e!r:.120}")
                continue
            v = {"us": s * 1e6, "GBps": nbytes / s / 1e9}
            if bw:
                v["of_copy_bw"] = nbytes / s / bw
            rec["variants"][vname] = v
            say(f"{name:10s} {vname:28s} {s * 1e6:9.1f} us {nbytes / s / 1e9:8.0f} GB/s"
                + (f" {nbytes / s / bw:6.1%}" if bw else ""))
        ok = {vn: v for vn, v in rec["variants"].items() if vn in configs and "us" in v}
        if ok:
            vn = min(ok, key=lambda x: ok[x]["us"])
            cfg = configs[vn]
            cub = rec["variants"][f"cublas {rows} rows"].get("us", math.inf)
            best[(n, k)] = cfg if ok[vn]["us"] < cub else None
            rec["best"] = {"variant": vn, "config": asdict(cfg), "adopted": best[(n, k)] is not None}
            # agreement with cuBLAS (float32 reference) and bitwise row invariance
            x = first(xs[rows])
            ref = F.linear(x.float(), ws[0].float())
            got = S.skinny(x, ws[0], config=cfg).float()
            rec["rel_err_vs_fp32"] = float((got - ref).norm() / ref.norm())
            lone = S.skinny(x[:1], ws[0], config=cfg)
            other = torch.randn_like(x.float()).to(dtype); other[0] = x[0]
            rec["row_invariant"] = bool(torch.equal(lone[0], S.skinny(other, ws[0], config=cfg)[0])
                                        and torch.equal(lone[0], got.to(dtype)[0]))
            say(f"{name:10s} best {vn} ({'adopted' if best[(n, k)] else 'cuBLAS is as fast: kept'}): rel err vs "
                f"fp32 {rec['rel_err_vs_fp32']:.2e}, row invariant {rec['row_invariant']}")
        out["shapes"][name] = rec
        del ws
    chain = {}
    for label, pick in ((f"cublas {rows} rows", lambda r: r["variants"].get(f"cublas {rows} rows")),
                        ("cublas 1 row", lambda r: r["variants"].get("cublas 1 row")),
                        ("skinny best", lambda r: r["variants"].get(r.get("best", {}).get("variant", ""), None))):
        parts = [pick(r) for r in out["shapes"].values()]
        if all(p and "us" in p for p in parts):
            chain[label] = sum(p["us"] * r["uses"] for p, r in zip(parts, out["shapes"].values())) / 1e3
    out["chain_ms"] = chain
    say("matmul chain per round: " + ", ".join(f"{k} {v:.3f} ms" for k, v in chain.items()))
    out["best_configs"] = {f"{n}x{k}": (asdict(c) if c else None) for (n, k), c in best.items()}
    S.CONFIGS.update(best)


def bench_round(model: str, device: str, dtype: str, rows: int, out: dict, say, rounds: int, reps: int) -> None:
    from engine.dev.bench import bench_decode, prompt
    from engine.runner import ModelRunner
    cfg = EngineConfig(model=model, device=device, dtype=dtype, parallel=rows, max_model_len=512,
                       prefill_rows=4096 if device.startswith("cuda") else 64, seed=0)
    base = ModelRunner(replace(cfg, kernels=KernelConfig(skinny=False)))
    sk = ModelRunner(replace(cfg, kernels=KernelConfig(skinny=True)), model=base.model)
    if device == "cpu":  # the dry run: Triton's interpreter in place of CUDA
        sk.fused = sk.skinny = True
    out["round"] = {"graph": [base.graph is not None, sk.graph is not None],
                    "decode_matmuls": [base.describe()["decode_matmuls"], sk.describe()["decode_matmuls"]]}
    for k in (1, 4):
        for label, r in (("cublas", base), ("skinny", sk)):
            s = bench_decode(r, k, rounds, reps, 128)
            out["round"][f"{label} {k}"] = {"round_ms": s * 1e3, "tok_s": k / s}
            say(f"decode {k} stream(s), {label:6s}: {s * 1e3:.3f} ms a round, {k / s:,.1f} tok/s")
    # the skinny round's tokens: alone == beside three other streams; vs cuBLAS's (rounding may differ)
    p = prompt(100, 7, sk.vocab_size)
    alone = sk.generate(p, 24, lane=0)
    together = sk.generate_together([p] + [prompt(60 + 17 * lane, lane, sk.vocab_size) for lane in (1, 2, 3)],
                                    [0, 1, 2, 3], 24)[0]
    cub = base.generate(p, 24, lane=0)
    same = next((i for i, (a, b) in enumerate(zip(alone, cub)) if a != b), len(alone))
    out["round"]["skinny_alone_eq_four"] = alone == together
    out["round"]["skinny_vs_cublas_equal_prefix"] = same
    say(f"skinny tokens alone == beside three streams: {alone == together}; "
        f"first {same} of 24 tokens equal to cuBLAS's")


@app.command()
def main(model: Annotated[str, typer.Option(help="preset")] = "qwen3-8b",
         device: Annotated[str, typer.Option(help="cuda (cpu: a dry run under TRITON_INTERPRET=1)")] = "cuda",
         rows: Annotated[int, typer.Option(help="the round's fixed row count (--parallel)")] = 8,
         rounds: int = 32, reps: int = 3,
         json_path: Annotated[Optional[Path], typer.Option("--json", help="write the figures here")] = None):
    cuda = device.startswith("cuda")
    dt = torch.bfloat16 if cuda else torch.float32
    out: dict = {"model": model, "rows": rows, "torch": torch.__version__}

    def say(msg):
        print(msg, flush=True)
        if json_path:
            json_path.write_text(json.dumps(out, indent=2, default=str))
    bw = None
    if cuda:
        from engine.dev.bench import copy_bandwidth
        bw = out["copy_bandwidth_Bps"] = copy_bandwidth(device)
        say(f"copy bandwidth {bw / 1e12:.2f} TB/s; {torch.cuda.get_device_name(0)}")
    cands = CANDIDATES if cuda else [S.SkinnyConfig(16, 32), S.SkinnyConfig(32, 32)]
    t = time.perf_counter()
    bench_shapes(model, torch.device(device), dt, rows, bw, cands, out, say)
    say(f"shapes done in {time.perf_counter() - t:.0f} s")
    if not cuda:
        S.DEFAULT = cands[0]
    bench_round(model, device, "bfloat16" if cuda else "float32", rows, out, say, rounds, reps)
    say("done")


if __name__ == "__main__":
    app()
