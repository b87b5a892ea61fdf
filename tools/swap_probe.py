"""A mixed forward's products with the operands swapped: y^T = W x^T, against y = x W^T padded.

    PYTHONPATH=. python3 -m tools.swap_probe --model qwen3-8b,qwen3-32b --out $OUT/swap_probe.md

cuBLAS splits K at some row counts (a sum in another order), so a mixed forward pads a product's
rows to the fewest count where a row keeps the grid cut's bits: qwen3-8b's down 136 -> 192 rows,
qwen3-32b's 136 and 264 -> 312. Asked for W x^T instead, cuBLAS sees the weight's rows as M and
the forward's rows as N, a problem of many output tiles, where it may not split at all. An output
element is the same dot product over K; whether the tensor cores sum it in the same order either way
is the device's to say. Per weight shape of the model (random bf16 weights, one copy a layer, each
chain one CUDA graph, median of --reps): the fewest count and its time in each form (swapped: the
product, then its transpose copied back to rows), and each kind's bits against the grid's.
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from engine.models.presets import resolve_model
from engine.runner.mixed_graph import pad
from tools.mixed_products import Said, graph_ms


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3-8b")
    ap.add_argument("--cuts", default="128,256")
    ap.add_argument("--round", type=int, default=8)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    dev = torch.device("cuda")
    say = Said()

    def swapped(x, w):
        return torch.mm(w, x.t()).t().contiguous()

    for model in a.model.split(","):
        m, _, _ = resolve_model(model)
        hd, d = m.head_dim, m.hidden_size
        shapes = {"qkv": ((m.num_attention_heads + 2 * m.num_key_value_heads) * hd, d),
                  "o": (d, m.num_attention_heads * hd), "gate_up": (2 * m.intermediate_size, d),
                  "down": (d, m.intermediate_size)}
        say(f"## {model}, {m.num_hidden_layers} layers, {torch.cuda.get_device_name()}")
        say()
        say("| weight | cut + round rows | form | fewest count | ms (all layers) | cut rows == grid | round rows == grid |")
        say("|---|---|---|---|---|---|---|")
        for name, (n_out, k) in shapes.items():
            g = torch.Generator(device=dev).manual_seed(0)
            ws = [torch.randn(n_out, k, generator=g, device=dev, dtype=torch.bfloat16).mul_(k ** -0.5)
                  for _ in range(m.num_hidden_layers)]
            x = torch.randn(1100, k, generator=g, device=dev, dtype=torch.bfloat16)
            w0 = ws[0]
            grid = F.linear(x[:1024], w0)
            grid_hi = F.linear(x[76:1100], w0)[948:]
            for n in (int(v) for v in a.cuts.split(",")):
                p = a.round
                both = torch.cat([x[:n], x[1024:1024 + p]])
                for form, fn in (("x W^T", F.linear), ("(W x^T)^T", swapped)):
                    for cnt in range(n + p, 1025, 8):
                        xb = pad(both, cnt)
                        y = fn(xb, w0)
                        ok = torch.equal(y[:n], grid[:n]), torch.equal(y[n:n + p], grid_hi[:p])
                        if all(ok) or cnt == 1024:
                            break
                    t = graph_ms(lambda: [fn(xb, w) for w in ws], a.reps)
                    say(f"| {name} {n_out} x {k} | {n} + {p} | {form} | {cnt} | {t:.3f} | {ok[0]} | {ok[1]} |")
                    if form != "x W^T" and cnt != n + p:
                        y = fn(both, w0)
                        t = graph_ms(lambda: [fn(both, w) for w in ws], a.reps)
                        say(f"| {name} {n_out} x {k} | {n} + {p} | {form} unpadded | {n + p} | {t:.3f} | "
                            f"{torch.equal(y[:n], grid[:n])} | {torch.equal(y[n:n + p], grid_hi[:p])} |")
            del ws
            torch.cuda.empty_cache()
        say()
    say.write(a.out)


if __name__ == "__main__":
    main()
