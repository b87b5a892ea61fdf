"""Decode-round matmuls: cuBLAS against engine.cuda.skinny, per weight shape and in the round.

    PYTHONPATH=. python3 -m tools.bench_skinny --model qwen3-8b --device cuda --json out.json
    PYTHONPATH=. python3 -m tools.bench_skinny --model qwen3-32b --tensor-parallel 2 --rows 4 --json out.json

1. Each weight shape of one decode round (q/k/v, o, gate/up, down after silu*up, and lm_head) at the round's fixed row count: cuBLAS at that count and at one row, and each
   candidate config of the skinny kernel. On CUDA every product runs over enough distinct weight
   copies (>= 1 GiB) that L2 holds none of them, inside one CUDA graph, as a replayed round runs
   them. Prints bytes of weights read per second and their share of the measured copy bandwidth.
2. The best config per shape, its agreement with cuBLAS and its bitwise row invariance (a row
   alone == the same row among others); a shape where no config beats cuBLAS stays cuBLAS.
3. The gate/up product with silu*up folded in (kernels_skinny.gate_up_silu, one kernel) against
   the two kernels (the plain product as just adopted, then silu_mul): its candidates, the best's
   agreement with fp32, row invariance, bits against the two kernels.
4. The whole decode round of the preset, both ways, same weights: ms per round at 1 and 4
   streams, and the skinny round's tokens alone == beside three other streams (not at
   --tensor-parallel > 1, whose shapes are one rank's: tools/tp_check.py times that round).
--tensor-parallel N: one rank's shapes, sliced as engine/parallel/weights.py slices the weights.
Best configs go to --json ("adopt": the CONFIGS / GATED entries, keyed by padded rows, that
tools/tp_check.py --skinny can try in the engine); kernels_skinny.py holds the ones adopted.
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

import engine.cuda.skinny as S
from engine.config import EngineConfig, KernelConfig
from engine.models.presets import resolve_model

app = typer.Typer(add_completion=False, help=__doc__)

CANDIDATES = [S.SkinnyConfig(16, 256), S.SkinnyConfig(32, 256), S.SkinnyConfig(64, 256),
              S.SkinnyConfig(16, 512), S.SkinnyConfig(32, 512, 4, 3), S.SkinnyConfig(32, 256, 8, 4),
              S.SkinnyConfig(32, 128, 4, 6), S.SkinnyConfig(64, 128, 4, 6),
              # K in ranges: more programs in flight on the narrow matrices (down)
              S.SkinnyConfig(32, 128, 4, 6, 2), S.SkinnyConfig(32, 256, 4, 4, 2), S.SkinnyConfig(16, 256, 4, 4, 2),
              S.SkinnyConfig(32, 128, 4, 6, 4),
              # 64 and 128 columns in 2 K ranges: the 5,120-column shapes of tensor parallel 2
              S.SkinnyConfig(64, 256, 4, 4, 2), S.SkinnyConfig(64, 128, 4, 6, 2), S.SkinnyConfig(64, 256, 4, 3, 2),
              S.SkinnyConfig(128, 128, 4, 4), S.SkinnyConfig(128, 128, 4, 4, 2), S.SkinnyConfig(128, 128, 8, 4, 2)]
# the gated kernel's: four measured on the H200 and two with 64 columns
GATED_CANDIDATES = [S.SkinnyConfig(32, 256, 4, 4), S.SkinnyConfig(16, 256, 4, 4), S.SkinnyConfig(32, 128, 4, 6),
                    S.SkinnyConfig(16, 128, 4, 6), S.SkinnyConfig(64, 128, 4, 6), S.SkinnyConfig(64, 128, 4, 4)]


def rank_shape(name: str, shape: tuple[int, int], world: int) -> tuple[int, int]:
    """Rank 0's part of the full weight `shape` (engine/parallel/weights.py shard_slice; the lm_head's
    vocabulary rows: vocab_shard, the size every rank's padded shard has)."""
    from engine.parallel.weights import shard_slice
    cut = shard_slice(name, shape, 0, world)
    if cut is None:
        return shape
    dim, a, b = cut
    return (b - a, shape[1]) if dim == 0 else (shape[0], b - a)


def shapes(model: str, world: int = 1) -> dict[str, tuple[int, int, bool, int]]:
    """name -> (N, K, silu*up first, uses per round): the fused q/k/v and gate/up matrices as the
    model concatenates them, each part sliced for rank 0 of `world`."""
    m, _, _ = resolve_model(model)
    h, q, kv, i, L = (m.hidden_size, m.num_attention_heads * m.head_dim, m.num_key_value_heads * m.head_dim,
                      m.intermediate_size, m.num_hidden_layers)
    r = lambda name, shape: rank_shape(name, shape, world)  # noqa: E731
    qkv = sum(r(f"self_attn.{p}_proj.weight", (n, h))[0] for p, n in (("q", q), ("k", kv), ("v", kv)))
    gate_up = sum(r(f"mlp.{p}_proj.weight", (i, h))[0] for p in ("gate", "up"))
    o, down = r("self_attn.o_proj.weight", (h, q)), r("mlp.down_proj.weight", (h, i))
    return {"qkv": (qkv, h, False, L), "o": (*o, False, L), "gate_up": (gate_up, h, False, L),
            "silu+down": (down[0], down[1], True, L), "lm_head": (*r("lm_head.weight", (m.vocab_size, h)), False, 1)}


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


def weights_for(n: int, k: int, dev, dtype, gen) -> list[torch.Tensor]:
    """Enough distinct [n, k] weight copies (>= 1 GiB on CUDA) that L2 holds none of them."""
    copies = max(2, math.ceil((1 << 30) / (n * k * torch.finfo(dtype).bits // 8))) if dev.type == "cuda" else 1
    return [(torch.randn(n, k, device=dev, generator=gen, dtype=torch.float32) * 0.02).to(dtype) for _ in range(copies)]


def row_checks(fn: Callable[[torch.Tensor], torch.Tensor], ref: Callable[[torch.Tensor], torch.Tensor],
               x: torch.Tensor) -> dict:
    """fn's agreement with the float32 reference, and its bitwise row invariance: row 0 alone ==
    row 0 among other rows == row 0 of x's own product."""
    got = fn(x)
    want = ref(x).float()
    lone = fn(x[:1])
    other = torch.randn_like(x.float()).to(x.dtype)
    other[0] = x[0]
    return {"rel_err_vs_fp32": float((got.float() - want).norm() / want.norm()),
            "row_invariant": bool(torch.equal(lone[0], fn(other)[0]) and torch.equal(lone[0], got[0]))}


def vary(name: str, variants: dict, copies: int, dev, nbytes: int, bw: float | None, say) -> dict:
    """Each variant timed: {name: {"us", "GBps"[, "of_copy_bw"]} or {"error"}}."""
    res = {}
    for vname, fn in variants.items():
        try:
            s = timed(fn, copies, dev)
        except Exception as e:  # a config the device cannot build (shared memory): skip it
            res[vname] = {"error": repr(e)[:200]}
            say(f"{name:10s} {vname:28s} failed: {e!r:.120}")
            continue
        res[vname] = {"us": s * 1e6, "GBps": nbytes / s / 1e9, **({"of_copy_bw": nbytes / s / bw} if bw else {})}
        say(f"{name:10s} {vname:28s} {s * 1e6:9.1f} us {nbytes / s / 1e9:8.0f} GB/s"
            + (f" {nbytes / s / bw:6.1%}" if bw else ""))
    return res


def label(c: S.SkinnyConfig) -> str:
    k = f" k{c.split_k}" if c.split_k > 1 else ""
    return f"skinny {c.block_n}x{c.block_k} w{c.num_warps} s{c.num_stages}{k}"


def bench_shapes(model: str, dev, dtype, rows: int, bw: float | None, candidates, out: dict, say,
                 world: int = 1, only: tuple[str, ...] = (), keep: bool = False) -> None:
    """Section 1-2: each shape's variants, the best config adopted (out["adopt"], at (N, K, padded
    rows); adopted_tables gives the device's tables with them) where it beats cuBLAS at `rows` rows
    and is row-invariant. keep: a shape the tables already have an entry for is timed with that
    entry only and keeps it."""
    from engine.cuda.fused import silu_mul
    gen = torch.Generator(device=dev).manual_seed(0)
    bm = S.block_m(rows)
    out["shapes"], adopt = {}, out.setdefault("adopt", {"configs": [], "gated": []})
    for name, (n, k, silu, uses) in shapes(model, world).items():
        if only and name not in only:
            continue
        nbytes = n * k * torch.finfo(dtype).bits // 8
        ws = weights_for(n, k, dev, dtype, gen)
        kin = 2 * k if silu else k
        xs = {m: torch.randn(m, kin, device=dev, generator=gen, dtype=torch.float32).to(dtype) for m in {1, rows, bm}}
        first = silu_mul if silu else (lambda x: x)
        cublas = lambda m: (lambda c: F.linear(first(xs[m]), ws[c]))  # noqa: E731
        tables = adopted_tables(dev, adopt)
        shipped = (n, k, bm) in tables.configs or (n, k) in tables.configs
        cands = [S.config_for(n, k, rows, tables)] if keep and shipped else candidates
        configs = {label(c): c for c in cands if c is not None and k % (c.block_k * c.split_k) == 0}
        variants = {f"cublas {rows} rows": cublas(rows), **({f"cublas {bm} rows": cublas(bm)} if bm != rows else {}),
                    "cublas 1 row": cublas(1),
                    **{vn: (lambda cfg: (lambda i: S.skinny(first(xs[rows]), ws[i], config=cfg)))(c)
                       for vn, c in configs.items()}}
        rec = {"N": n, "K": k, "silu": silu, "uses": uses, "bytes": nbytes, "copies": len(ws),
               "variants": vary(name, variants, len(ws), dev, nbytes, bw, say)}
        ok = {vn: v for vn, v in rec["variants"].items() if vn in configs and "us" in v}
        if ok:
            vn = min(ok, key=lambda x: ok[x]["us"])
            cfg = configs[vn]
            rec.update(row_checks(lambda x: S.skinny(first(x), ws[0], config=cfg),
                                  lambda x: F.linear(first(x).float(), ws[0].float()), xs[rows]))
            cub = rec["variants"][f"cublas {rows} rows"].get("us", math.inf)
            won = ok[vn]["us"] < cub and rec["row_invariant"]
            if not (keep and shipped):
                adopt["configs"].append([n, k, bm, asdict(cfg) if won else None, round(ok[vn]["us"], 1), round(cub, 1)])
            rec["best"] = {"variant": vn, "config": asdict(cfg), "adopted": won and not (keep and shipped)}
            what = "shipped: kept" if keep and shipped else "adopted" if won else "cuBLAS is as fast: kept"
            say(f"{name:10s} best {vn} ({what}): rel err vs "
                f"fp32 {rec['rel_err_vs_fp32']:.2e}, row invariant {rec['row_invariant']}")
        out["shapes"][name] = rec
        if name == "gate_up" and not silu:
            bench_gated(n, k, ws, xs[rows], bw, out, say)
        ws = variants = None  # the copies freed before the next shape
    chain = {}
    for lab, pick in ((f"cublas {rows} rows", lambda r: r["variants"].get(f"cublas {rows} rows")),
                      ("cublas 1 row", lambda r: r["variants"].get("cublas 1 row")),
                      ("skinny best", lambda r: r["variants"].get(r.get("best", {}).get("variant", ""), None))):
        parts = [pick(r) for r in out["shapes"].values()]
        if parts and all(p and "us" in p for p in parts):
            chain[lab] = sum(p["us"] * r["uses"] for p, r in zip(parts, out["shapes"].values())) / 1e3
    out["chain_ms"] = chain
    say("matmul chain per round: " + ", ".join(f"{k} {v:.3f} ms" for k, v in chain.items()))


def bench_gated(n: int, k: int, ws: list[torch.Tensor], x: torch.Tensor, bw: float | None, out: dict, say) -> None:
    """Section 3: gate/up with silu*up folded in, against the two kernels (the plain product with
    the config just adopted, then silu_mul); adopted (out["adopt"]["gated"]) where faster by > 0.5 us,
    right (rel err, row-invariant)."""
    from engine.cuda.fused import silu_mul
    dev, bm = x.device, S.block_m(x.shape[0])
    tables = adopted_tables(dev, out["adopt"])
    cands = ({label(c): c for c in GATED_CANDIDATES if S.gated_smem(c, bm) <= tables.smem}
             if dev.type == "cuda" else {label(c): c for c in (S.SkinnyConfig(16, 32), S.SkinnyConfig(32, 32))})
    variants = {"two kernels": lambda i: silu_mul(S.linear(x, ws[i], tables=tables)),
                **{vn: (lambda cfg: (lambda i: S.gate_up_silu(x, ws[i], config=cfg)))(c) for vn, c in cands.items()}}
    res = vary("gated", variants, len(ws), dev, n * k * torch.finfo(x.dtype).bits // 8, bw, say)
    rec = out["gated"] = {"N": n, "K": k, "rows": x.shape[0], "variants": res}
    ok = {vn: v for vn, v in res.items() if vn in cands and "us" in v}
    if not ok:
        return
    vn = min(ok, key=lambda v: ok[v]["us"])
    cfg, two = cands[vn], res["two kernels"].get("us", math.inf)
    ref = lambda xx: silu_mul(F.linear(xx.float(), ws[0].float()))  # noqa: E731
    rec.update(row_checks(lambda xx: S.gate_up_silu(xx, ws[0], config=cfg), ref, x))
    one = S.gate_up_silu(x, ws[0], config=cfg)
    rec["bitwise_eq_two_kernels"] = bool(torch.equal(one, silu_mul(S.linear(x, ws[0], tables=tables))))
    won = ok[vn]["us"] < two - 0.5 and rec["row_invariant"] and rec["rel_err_vs_fp32"] < 2e-2
    rec["best"] = {"variant": vn, "config": asdict(cfg), "adopted": won}
    if won:
        out["adopt"]["gated"].append([n, k, bm, asdict(cfg), round(ok[vn]["us"], 1), round(two, 1)])
    say(f"gated      best {vn} ({'adopted' if won else 'the two kernels kept'}) {ok[vn]['us']:.1f} us vs two "
        f"{two:.1f}: rel err {rec['rel_err_vs_fp32']:.2e}, row invariant {rec['row_invariant']}, "
        f"== two kernels {rec['bitwise_eq_two_kernels']}")


def adopted_tables(dev, adopt: dict, default: S.SkinnyConfig | None = None) -> S.SkinnyTables:
    """The device's skinny tables plus the entries adopted so far (and `default` for other shapes)."""
    t = S.tables_for(torch.device(dev)).with_entries(adopt["configs"], adopt["gated"])
    return replace(t, default=default) if default is not None else t


def bench_round(model: str, device: str, dtype: str, rows: int, out: dict, say, rounds: int, reps: int,
                tables: S.SkinnyTables) -> None:
    from tools.bench import bench_decode, prompt
    from engine.runner.build import build_runner
    cfg = EngineConfig(model=model, device=device, dtype=dtype, parallel=rows, max_model_len=512,
                       prefill_rows=4096 if device.startswith("cuda") else 64, seed=0)
    base = build_runner(replace(cfg, kernels=KernelConfig(skinny=False)))
    sk = build_runner(replace(cfg, kernels=KernelConfig(skinny=True)), model=base.model)
    if device == "cpu":  # the dry run: Triton's interpreter in place of CUDA
        sk.fused = sk.skinny = True
    sk.kernels.skinny = tables  # the adopted entries; the graph captured again with them
    if sk.graph is not None:
        sk.capture_graph()
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
         tensor_parallel: Annotated[int, typer.Option(help="one rank's shapes at this TP size (no round)")] = 1,
         only: Annotated[str, typer.Option(help="these shapes only, e.g. gate_up (no round)")] = "",
         keep: Annotated[bool, typer.Option("--keep", help="shapes with a table entry: time it, keep it")] = False,
         rounds: int = 32, reps: int = 3,
         json_path: Annotated[Optional[Path], typer.Option("--json", help="write the figures here")] = None):
    cuda = device.startswith("cuda")
    dt = torch.bfloat16 if cuda else torch.float32
    if tensor_parallel < 1:
        raise typer.BadParameter("must be >= 1", param_hint="--tensor-parallel")
    names = tuple(x for x in only.split(",") if x)
    bad = [x for x in names if x not in shapes(model)]
    if bad:
        raise typer.BadParameter(f"{bad} not among {list(shapes(model))}", param_hint="--only")
    out: dict = {"model": model, "rows": rows, "tensor_parallel": tensor_parallel, "torch": torch.__version__}

    def say(msg):
        print(msg, flush=True)
        if json_path:
            json_path.write_text(json.dumps(out, indent=2, default=str))
    bw = None
    if cuda:
        from tools.bench import copy_bandwidth
        bw = out["copy_bandwidth_Bps"] = copy_bandwidth(device)
        say(f"copy bandwidth {bw / 1e12:.2f} TB/s; {torch.cuda.get_device_name(0)}")
    cands = CANDIDATES if cuda else [S.SkinnyConfig(16, 32), S.SkinnyConfig(32, 32)]
    t = time.perf_counter()
    bench_shapes(model, torch.device(device), dt, rows, bw, cands, out, say, tensor_parallel, names, keep)
    say(f"shapes done in {time.perf_counter() - t:.0f} s; adopt: {json.dumps(out['adopt'])}")
    if tensor_parallel > 1 or names:
        say("done")
        return
    tables = adopted_tables(device, out["adopt"], None if cuda else cands[0])
    bench_round(model, device, "bfloat16" if cuda else "float32", rows, out, say, rounds, reps, tables)
    say("done")


if __name__ == "__main__":
    app()
