"""The weight products of one forward carrying a prompt cut and a decode round, on CUDA: which form
keeps a decode row's bits (those the round's own kernels give it), and what each costs.

    PYTHONPATH=. python3 -m tools.mixed_products --model qwen3-8b [--rows 128,256,512,1024] [--decode 8]
        [--reps 20] [--out FILE.md]

Every layer's four products (q/k/v, o, gate/up with silu * up, down) over the model's layers, random
bf16 weights (enough bytes that L2 holds none), static random inputs, each chain one CUDA graph,
replayed --reps times (median ms). Per prompt rows n beside --decode rows:

| chain | what |
|---|---|
| round | the decode rows alone through the round's kernels (engine/cuda/skinny.py `linear` and `gate_up_silu`, the eager round's bits; the graph's ring gives the same bits) |
| cut | the n rows alone through cuBLAS (then silu_mul), as a prompt cut multiplies them |
| cut, then round | both chains one after the other in one graph (alternation's products) |
| (a) | one forward, each product launched twice: the cut's rows through cuBLAS, the round's through its kernels (exact by construction) |
| (b) | one product over all rows through engine/cuda/batch.py's row-invariant tiles (silu_mul after) |
| (c) | one product over all rows through cuBLAS: the bound |

and the bits, on layer 0's weights: whether a decode row's result in (b) and (c) equals the round
kernel's (per product, with the largest difference), whether a prompt row's result at n (and at
n + decode, as (c) has it) equals its result in a whole grid cut of --grid rows through cuBLAS (the
prompt's bits under budget-sized cuts), and whether the tiles give a row the same bits at every
row count. Without CUDA (TRITON_INTERPRET=1 on the CPU, a small --model) only the bits are checked.
"""
from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F

from engine.models.presets import resolve_model


class Said:
    """A probe's lines: printed as they come, kept, and written to --out at the end (`write`)."""

    def __init__(self):
        self.lines: list[str] = []

    def __call__(self, s: str = "") -> None:
        print(s, flush=True)
        self.lines.append(s)

    def write(self, path: str | None) -> None:
        if path:
            with open(path, "w") as f:
                f.write("\n".join(self.lines) + "\n")


def graph_ms(run, reps: int) -> float:
    """Median ms of replaying `run` captured as one CUDA graph (run once before, to compile and allocate)."""
    run()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        graph.replay()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    del graph
    return statistics.median(times)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3-8b")
    ap.add_argument("--rows", default="128,256,512,1024")
    ap.add_argument("--decode", type=int, default=8)
    ap.add_argument("--grid", type=int, default=1024, help="the cuts a whole prefill runs (the cuda preset's)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--layers", type=int, default=None, help="default: the model's")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    from engine.cuda import batch, fused
    from engine.cuda.kernels import CudaKernels

    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    m, _, _ = resolve_model(a.model)
    h, inter = m.hidden_size, m.intermediate_size
    qkv = (m.num_attention_heads + 2 * m.num_key_value_heads) * m.head_dim
    shapes = {"qkv": (qkv, h), "o": (h, m.num_attention_heads * m.head_dim), "gate_up": (2 * inter, h),
              "down": (h, inter)}
    layers = a.layers or (m.num_hidden_layers if cuda else 1)
    g = torch.Generator(device=dev).manual_seed(0)

    def rand(*shape, scale=1.0):  # on the device, in its dtype: qwen3-32b's weights are 62 GB
        return torch.randn(*shape, generator=g, device=dev, dtype=dtype).mul_(scale)

    weights = [{k: rand(*s, scale=s[1] ** -0.5) for k, s in shapes.items()} for _ in range(layers)]
    rows = [int(x) for x in a.rows.split(",")]
    d = a.decode
    top = max(max(rows), a.grid) + d
    xs = {k: rand(top, s[1]) for k, s in shapes.items()}  # static inputs, rows [0, n) the cut's, then the round's
    launch = CudaKernels(dev).at()

    def round_mm(key, x, w):
        return launch.gate_up_silu(x, w) if key == "gate_up" else launch.linear(x, w)

    def cublas(key, x, w):
        return fused.silu_mul(F.linear(x, w)) if key == "gate_up" else F.linear(x, w)

    def tiles(key, x, w):
        y = batch.matmul(x, w)  # NO_BUCKETS: the Triton tiles for every shape
        return fused.silu_mul(y) if key == "gate_up" else y

    lines = [f"{a.model}: {layers} layers, {d} decode rows, {str(dtype)[6:]} on {torch.cuda.get_device_name() if cuda else 'cpu (interpreter)'}", ""]
    # ---- bits, layer 0 ----------------------------------------------------------------------------
    lines += ["| product | n | (b) decode rows == round's | (c) decode rows == round's (max diff) | cut rows at n == grid cut | at n + decode == grid cut | tiles: rows at n + decode == alone |",
              "|---|---|---|---|---|---|---|"]
    w0 = weights[0]
    for n in rows:
        for key in shapes:
            x, w = xs[key], w0[key]
            dec = x[top - d:]
            both = torch.cat([x[:n], dec])
            ref = round_mm(key, dec, w)
            b, c = tiles(key, both, w), cublas(key, both, w)
            grid = cublas(key, x[:a.grid], w)[:n] if n <= a.grid else None
            diff = (c[n:].float() - ref.float()).abs().max().item()
            lines.append(f"| {key} | {n} | {torch.equal(b[n:], ref)} | {torch.equal(c[n:], ref)} ({diff:.2e}) | "
                         f"{'-' if grid is None else torch.equal(cublas(key, x[:n], w), grid)} | "
                         f"{'-' if grid is None else torch.equal(c[:n], grid)} | "
                         f"{torch.equal(b[n:], tiles(key, dec, w)) and torch.equal(b[:n], tiles(key, x[:n], w))} |")
    # ---- the cut's attention: a prompt row's bits when the budget moves the cut -----------------
    from engine.cuda.prefill import cut_attention
    grid, at = a.grid, 4 * a.grid  # a grid cut [at, at + grid) against two budget cuts splitting it
    heads, kvh, hd = m.num_attention_heads, m.num_key_value_heads, m.head_dim
    q, k, v = rand(grid, heads, hd), rand(at + grid, kvh, hd), rand(at + grid, kvh, hd)
    whole = cut_attention(q, k[:at + grid], v[:at + grid], at)
    cut = grid // 4
    first = cut_attention(q[:cut], k[:at + cut], v[:at + cut], at)
    second = cut_attention(q[cut:], k, v, at + cut)
    lines += ["", f"Cut attention (engine/cuda/prefill.py), a {grid}-row grid cut at {at} against cuts of {cut} and "
              f"{grid - cut} rows: first rows equal {torch.equal(first, whole[:cut])}, the rest equal "
              f"{torch.equal(second, whole[cut:])} (max diff {(second.float() - whole[cut:].float()).abs().max().item():.2e})."]
    # ---- time ----------------------------------------------------------------------------------
    if cuda:
        def chain(parts):
            def run():
                for lw in weights:
                    for key in shapes:
                        for f, lo, hi in parts:
                            f(key, xs[key][lo:hi], lw[key])
            return run

        def timed(run) -> float:
            return graph_ms(run, a.reps)

        rd = timed(chain([(round_mm, top - d, top)]))
        lines += ["", f"The round's products alone ({d} rows, its kernels): {rd:.2f} ms.", "",
                  "| prompt rows | cut (cuBLAS) | cut, then round | (a) each product twice | (b) tiles over all rows | (c) cuBLAS over all rows | A keeps (products only): alternation / (a) / (b) / (c) |",
                  "|---|---|---|---|---|---|---|"]
        for n in rows:
            cut = timed(chain([(cublas, 0, n)]))
            alt = timed(lambda: (chain([(cublas, 0, n)])(), chain([(round_mm, top - d, top)])()))
            fa = timed(chain([(cublas, 0, n), (round_mm, top - d, top)]))
            xs_both = {k: torch.cat([v[:n], v[top - d:]]) for k, v in xs.items()}

            def over_all(f):
                def run():
                    for lw in weights:
                        for key in shapes:
                            f(key, xs_both[key], lw[key])
                return run
            fb, fc = timed(over_all(tiles)), timed(over_all(cublas))
            keep = " / ".join(f"{100 * rd / t:.0f} %" for t in (alt, fa, fb, fc))
            lines.append(f"| {n} | {cut:.2f} ms | {alt:.2f} | {fa:.2f} | {fb:.2f} | {fc:.2f} | {keep} |")
    text = "\n".join(lines)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
