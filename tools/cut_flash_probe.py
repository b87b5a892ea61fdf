"""What a mixed forward on CUDA can be built from: the cut attention at absolute tiles
(engine/cuda/cut_flash.py) against the current cut path (engine/cuda/prefill.py), and cuBLAS's row
invariance for each weight product.

    PYTHONPATH=. python3 -m tools.cut_flash_probe --model qwen3-8b [--prompt 32000]
        [--rows 128,256,512,1024] [--rounds 3] [--bands 2048] [--out FILE.md]

- bits: the prompt's attention (one layer, random bf16 q, k, v in a two-lane cache) run in the
  grid's 1,024-row cuts and in budget-like cuts of changing sizes; equal bit for bit? And its
  distance to one whole causal call through PyTorch's SDPA.
- rate: the whole prompt's causal attention (TFLOP/s, `causal_flops`) run cut by cut at each row
  count, each variant once a round in turns (the H200 runs at its power cap under load), medians:
  cut_flash's variants as one CUDA graph of every cut (`cut_attention_at`, the grid sized by the
  prompt, as a mixed forward's graph carries it), the current path eagerly (its launches from the
  host weigh in at small cuts; so they did for every variant before the graphs), and the current
  path as one CUDA graph too (the library's kernels, cuDNN's and flash's, without the host).
- bands (--bands N): the runner's config in the smallest cuts, band by band of N positions: a small
  cut's programs (heads x key splits) fill the SMs' waves unevenly, and how unevenly moves with depth.
- products: for each of the model's weight products and row counts n (every multiple of 8 to 264,
  then coarser), whether cuBLAS gives rows [0, n) the bits of the 1,024-row grid cut, and its last
  8 rows the bits the decode round's kernels (engine/cuda/skinny.py) give those 8 rows alone.
"""
from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F

from engine.cuda import cut_flash, prefill
from engine.cuda.cut_flash import CutFlashConfig, causal_flops
from engine.models.presets import resolve_model
from tools.mixed_products import graph_ms

VARIANTS = {  # name: config (the first is the runner's on the H200, cut_flash.for_device; earlier variants' figures:
    # receipts/mixed-products/20261202-0459-h200-attention.md, 20261203-1839-h200-cut-tiles64-probe.md,
    # 20261203-1912-h200-cut-tma.md, 20261204-0319-h200-cut-ws.md)
    "m128 n128 w8 s3 tma": CutFlashConfig(tma=True),
    "m128 n128 w8 s3": CutFlashConfig(),  # K and V by pointer loads: the same bits
    "m128 n128 w8 s3 tma, split 8192": CutFlashConfig(tma=True, split=8192),  # other bits: what the 2,048 split costs
    "m128 n128 w8 s3 tma, split 1024": CutFlashConfig(tma=True, split=1024),  # other bits: twice the programs
}
GRAPHED = "current (prefill.py), graphed"
COUNTS = list(range(8, 265, 8)) + [320, 384, 448, 512, 640, 768, 896, 1024, 1032]


def budget_cuts(n: int) -> list[int]:
    """Cut boundaries of changing sizes, none on the 1,024 grid but by chance (a budget's cuts)."""
    sizes, b, i = [128, 384, 200, 1000, 77, 640, 513, 256], [0], 0
    while b[-1] < n:
        b.append(min(n, b[-1] + sizes[i % len(sizes)]))
        i += 1
    return b


def grid_cuts(n: int, rows: int) -> list[int]:
    return list(range(0, n, rows)) + [n]


def run_cuts(fn, q, k, v, bounds):
    return [fn(q[s:e], k[:e], v[:e], s) for s, e in zip(bounds, bounds[1:])]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3-8b")
    ap.add_argument("--prompt", type=int, default=32000)
    ap.add_argument("--rows", default="128,256,512,1024")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--skip", default="", help="comma list of parts to skip: bits,rate,products")
    ap.add_argument("--bands", type=int, default=0,
                    help="positions a band: the runner's config at the smallest --rows, timed band by band (0: not)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    skip = set(filter(None, a.skip.split(",")))
    cuda = torch.cuda.is_available()  # without it: a smoke run under TRITON_INTERPRET=1 (bits only)
    dev, dtype = torch.device("cuda" if cuda else "cpu"), torch.bfloat16 if cuda else torch.float32
    if not cuda:
        skip |= {"rate", "products"}
    m, _, _ = resolve_model(a.model)
    heads, kvh, hd, n = m.num_attention_heads, m.num_key_value_heads, m.head_dim, a.prompt
    g = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(n, heads, hd, generator=g, device=dev, dtype=dtype)
    cache = torch.randn(2, 2, n + 768, kvh, hd, generator=g, device=dev, dtype=dtype)  # [k/v, lanes, L, KVH, d]
    k, v = cache[0, 1], cache[1, 1]
    current = lambda qq, kk, vv, s: prefill.cut_attention(qq, kk, vv, s)
    lines = [f"{a.model} attention: {heads} query heads, {kvh} KV heads, head dim {hd}, {str(dtype)[6:]}, a {n}-token prompt, "
             f"on {torch.cuda.get_device_name() if cuda else 'cpu (interpreter)'}", ""]
    # ---- bits ------------------------------------------------------------------------------------
    if "bits" not in skip:
        th = lambda x: x.transpose(0, 1)[None]
        ref = F.scaled_dot_product_attention(th(q), th(k[:n]), th(v[:n]), is_causal=True, enable_gqa=True)
        ref = ref[0].transpose(0, 1).reshape(n, heads * hd).float()
        lines += ["| kernel | grid cuts (1,024) == budget cuts | rows differing | == the default's bits | "
                  "vs one causal SDPA call: max abs, rel. norm |", "|---|---|---|---|---|"]
        kernels = {name: (lambda c: lambda qq, kk, vv, s: cut_flash.cut_attention(qq, kk, vv, s, c))(c)
                   for name, c in VARIANTS.items()}
        kernels["current (prefill.py)"] = current
        first = None
        for name, fn in kernels.items():
            try:
                x = torch.cat(run_cuts(fn, q, k, v, grid_cuts(n, 1024)))
                y = torch.cat(run_cuts(fn, q, k, v, budget_cuts(n)))
            except Exception as e:  # a shape the device cannot run
                lines.append(f"| {name} | did not run: {type(e).__name__}: {str(e).splitlines()[0][:120]} | | | |")
                continue
            rows = int((x != y).any(1).sum())
            err = (x.float() - ref)
            if first is None:
                first = x
            same = f"{torch.equal(x, first)} ({int((x != first).any(1).sum())} rows differ)"
            lines.append(f"| {name} | {torch.equal(x, y)} | {rows} of {n} | {same} | {err.abs().max().item():.2e}, "
                         f"{(err.norm() / ref.norm()).item():.2e} |")
            del x, y, err
        del first
        del ref
        lines.append("")
    # ---- rate ------------------------------------------------------------------------------------
    if "rate" not in skip:
        rows = [int(r) for r in a.rows.split(",")]
        flops = causal_flops(n, heads, hd)
        kl, vl = cache[0], cache[1]  # [lanes, L, KVH, d]: the prompt in lane 1
        metas = {r: torch.tensor([[s, e - s, 1] for s, e in zip(b, b[1:])], dtype=torch.int32, device=dev)
                 for r, b in ((r, grid_cuts(n, r)) for r in rows)}

        def at_cuts(c, r):
            for i, s in enumerate(grid_cuts(n, r)[:-1]):
                cut_flash.cut_attention_at(q[s:s + r], kl, vl, metas[r][i], n, c)

        def graphed(c, r):
            at_cuts(c, r)  # compiles
            torch.cuda.synchronize()
            gr = torch.cuda.CUDAGraph()
            with torch.cuda.graph(gr):
                at_cuts(c, r)
            return gr.replay
        variants = {("current (prefill.py)", r): (lambda r: lambda: run_cuts(current, q, k, v, grid_cuts(n, r)))(r)
                    for r in rows}
        failed = {}
        for r in rows:  # the library's kernels without the host's launches: what they give small cuts
            try:
                fn = variants[("current (prefill.py)", r)]
                fn()  # cuDNN builds its graphs, flash compiles
                torch.cuda.synchronize()
                gr = torch.cuda.CUDAGraph()
                with torch.cuda.graph(gr):
                    fn()
                variants[(GRAPHED, r)] = gr.replay
            except Exception as e:
                failed[GRAPHED] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
        for name, c in VARIANTS.items():
            for r in rows:
                try:
                    variants[(name, r)] = graphed(c, r)
                except Exception as e:  # a shape the device cannot run: said, not a failed probe
                    failed[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
        for fn in variants.values():  # cuDNN's graphs, a first replay
            fn()
        torch.cuda.synchronize()
        times = {key: [] for key in variants}
        for _ in range(a.rounds):
            for key, fn in variants.items():
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                fn()
                e.record()
                e.synchronize()
                times[key].append(s.elapsed_time(e))
        lines += [f"The prompt's causal attention, one layer ({flops / 1e12:.2f} TFLOP), in cuts of R rows on the "
                  f"grid, cut_flash's variants one CUDA graph each, the current path eager, median of {a.rounds} "
                  "rounds in turns: ms (TFLOP/s)", "",
                  "| kernel | " + " | ".join(f"R = {r}" for r in rows) + " |", "|---|" + "---|" * len(rows)]
        for name in ["current (prefill.py)", GRAPHED] + list(VARIANTS):
            if name in failed:
                lines.append(f"| {name} | " + " | ".join("did not run" for _ in rows) + " |")
                continue
            cells = []
            for r in rows:
                t = statistics.median(times[(name, r)])
                cells.append(f"{t:.2f} ({flops / t / 1e9:.0f})")
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        lines += [""] + [f"{name} did not run: {why}" for name, why in failed.items()]
        lines += ["", "Every round's ms: " + "; ".join(f"{nm} R={r}: " + "/".join(f"{t:.2f}" for t in ts)
                                                     for (nm, r), ts in times.items()), ""]
    # ---- bands -----------------------------------------------------------------------------------
    if "rate" not in skip and a.bands:
        r = min(int(x) for x in a.rows.split(","))
        c = next(iter(VARIANTS.values()))
        sms = torch.cuda.get_device_properties(dev).multi_processor_count
        lines += [f"The runner's config ({next(iter(VARIANTS))}) in cuts of {r} rows, each band of {a.bands} "
                  f"positions one CUDA graph, median of {a.rounds}: programs a cut = heads x key splits at the band's "
                  f"start, in waves of {sms} SMs (one program an SM)", "",
                  "| positions | programs a cut | waves | ms | TFLOP/s |", "|---|---|---|---|---|"]
        kl, vl = cache[0], cache[1]
        for b0 in range(0, n, a.bands):
            b1 = min(n, b0 + a.bands)
            cuts = [(s, min(s + r, b1)) for s in range(b0, b1, r)]
            metas_b = [torch.tensor([s, e - s, 1], dtype=torch.int32, device=dev) for s, e in cuts]

            def band(cuts=cuts, metas_b=metas_b):
                for (s, _), mt in zip(cuts, metas_b):
                    cut_flash.cut_attention_at(q[s:s + r], kl, vl, mt, n, c)
            t = graph_ms(band, a.rounds)
            fl = 4.0 * heads * hd * sum(p + 1 for p in range(b0, b1))
            progs = heads * (b0 // c.split + 1)
            lines.append(f"| {b0}-{b1} | {progs} | {progs / sms:.2f} | {t:.3f} | {fl / t / 1e9:.0f} |")
        lines.append("")
    # ---- products --------------------------------------------------------------------------------
    if "products" not in skip:
        from engine.cuda import fused
        from engine.cuda.kernels import CudaKernels
        launch = CudaKernels(dev).at()
        h, inter = m.hidden_size, m.intermediate_size
        shapes = {"qkv": (heads * hd + 2 * kvh * hd, h), "o": (h, heads * hd), "gate_up": (2 * inter, h), "down": (h, inter)}

        def cublas(key, x, w):
            return fused.silu_mul(F.linear(x, w)) if key == "gate_up" else F.linear(x, w)

        def round_mm(key, x, w):
            return launch.gate_up_silu(x, w) if key == "gate_up" else launch.linear(x, w)

        top = max(COUNTS)
        res = {}
        for key, (nout, kin) in shapes.items():
            w = torch.randn(nout, kin, generator=g, device=dev, dtype=dtype).mul_(kin ** -0.5)
            x = torch.randn(top, kin, generator=g, device=dev, dtype=dtype)
            grid = cublas(key, x[:1024], w)
            for c in COUNTS:
                y = cublas(key, x[:c], w)
                lo = min(c, 1024)
                res[(key, c)] = (torch.equal(y[:lo], grid[:lo]), torch.equal(y[c - 8:], round_mm(key, x[c - 8:c], w)))
            del w, x, grid
        lines += ["cuBLAS (F.linear; gate_up then silu * up) over n rows: G = rows [0, min(n, 1024)) equal the "
                  "1,024-row grid cut's, R = the last 8 rows equal the decode round's kernels on those 8 rows alone "
                  "(- where not)", "", "| n | " + " | ".join(shapes) + " |", "|---|" + "---|" * len(shapes)]
        for c in COUNTS:
            lines.append(f"| {c} | " + " | ".join(("G" if res[(kk, c)][0] else "-") + ("R" if res[(kk, c)][1] else "-")
                                                  for kk in shapes) + " |")
        for kk in shapes:
            gs = [c for c in COUNTS if res[(kk, c)][0]]
            rs = [c for c in COUNTS if res[(kk, c)][1]]
            lines.append(f"\n{kk}: grid bits at {len(gs)} of {len(COUNTS)} counts ({_spans(gs)}); round bits at "
                         f"{len(rs)} ({_spans(rs)}).")
    text = "\n".join(lines)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")


def _spans(counts: list[int]) -> str:
    """8,16,24,40 -> '8-24, 40' over the probe's counts."""
    if not counts:
        return "none"
    out, run = [], [counts[0]]
    for c in counts[1:]:
        if COUNTS.index(c) == COUNTS.index(run[-1]) + 1:
            run.append(c)
        else:
            out.append(run)
            run = [c]
    out.append(run)
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else f"{r[0]}" for r in out)


if __name__ == "__main__":
    main()
