"""A mixed forward's products asked of cuBLAS in other forms: does one fill the H200 at a cut's rows
beside a round's and still give every row the grid cut's bits?

    PYTHONPATH=. python3 -m tools.chunk_probe --model qwen3-8b,qwen3-32b --out $OUT/chunk_probe.md

At 128 cut rows + 8 round rows cuBLAS gives down a row's grid bits only padded to 192 rows, where its
kernel (one K chain) covers 57 of 132 SMs (tools/mixed_check.py's profile): 2.0 ms against the
round's 1.0 on qwen3-8b. An output element summed over K in one float32 chain from 0 has the same bits
in every kernel that walks it so, and splitting N changes no element's chain, so these forms may keep
the bits while cuBLAS picks another kernel:

- linear: F.linear over the rows padded to the fewest count giving both kinds the grid's bits (what
  mixed forwards run);
- K-major: the same product with the weight stored transposed ([K, N], a second copy), torch.mm;
- bmm c: the weight's N rows as c chunks, one strided-batched launch (the rows broadcast, stride 0),
  the chunks' outputs put side by side (a copy, timed with it);
- bmm c K-major: the chunks of the transposed copy.

Per model and weight (q/k/v, o, gate/up, down), random bf16 weights (one a layer, so that L2 holds
none), each form's fewest rows from n + p up to 320 (multiples of 8) giving the cut's rows and the
round's the bits of F.linear in 1,024-row grid cuts, and its time: the model's layers as one CUDA
graph, median of --reps replays.
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from engine.models.presets import resolve_model
from engine.runner.mixed_graph import chunked, pad
from tools.mixed_products import Said, graph_ms


def forms(chunks: tuple[int, ...]):
    """name -> (prepare(w) -> operand, product(x, operand) -> [rows, N]); "bmm c" is the mixed graphs' own
    form (mixed_graph.chunked)."""
    out = {"linear": (lambda w: w, F.linear),
           "K-major": (lambda w: w.t().contiguous(), torch.mm)}
    for c in chunks:
        def split_t(w, c=c):
            t = w.t().contiguous()
            return t.view(t.shape[0], c, t.shape[1] // c).permute(1, 0, 2)  # [c, K, N/c], ld N

        def bmm_t(x, b, c=c):
            y = torch.bmm(x.expand(c, *x.shape), b)  # [c, rows, N/c]
            return y.transpose(0, 1).reshape(x.shape[0], -1)
        out[f"bmm {c}"] = (lambda w: w, lambda x, w, c=c: chunked(x, w, c))
        out[f"bmm {c} K-major"] = (split_t, bmm_t)
    return out


def weights_of(model: str) -> dict:
    m, _, _ = resolve_model(model)
    hd = m.head_dim
    return {"qkv": ((m.num_attention_heads + 2 * m.num_key_value_heads) * hd, m.hidden_size),
            "o": (m.hidden_size, m.num_attention_heads * hd),
            "gate_up": (2 * m.intermediate_size, m.hidden_size),
            "down": (m.hidden_size, m.intermediate_size)}, m.num_hidden_layers


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3-8b")
    ap.add_argument("--cuts", default="128,256")
    ap.add_argument("--round", type=int, default=8)
    ap.add_argument("--chunks", default="2,4,8")
    ap.add_argument("--weights", default="qkv,o,gate_up,down")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    dev = torch.device("cuda")
    say = Said()
    fs = forms(tuple(int(c) for c in a.chunks.split(",")))
    p = a.round
    for model in a.model.split(","):
        shapes, layers = weights_of(model)
        say(f"## {model}, {layers} layers, {torch.cuda.get_device_name()}")
        say()
        say("| weight (N x K) | cut + round rows | form | fewest rows with the bits | ms (all layers) |")
        say("|---|---|---|---|---|")
        for name in a.weights.split(","):
            n_out, k = shapes[name]
            g = torch.Generator(device=dev).manual_seed(0)
            ws = [torch.randn(n_out, k, generator=g, device=dev, dtype=torch.bfloat16).mul_(k ** -0.5)
                  for _ in range(layers)]
            x = torch.randn(1100, k, generator=g, device=dev, dtype=torch.bfloat16)
            w0 = ws[0]
            grid = F.linear(x[:1024], w0)  # rows [0, 1024): a whole grid cut
            grid_hi = F.linear(x[76:1100], w0)[948:]  # rows [1024, 1100) in a grid cut of their own
            for form, (prepare, product) in fs.items():
                if form.startswith("bmm") and n_out % int(form.split()[1]):
                    continue
                ops = [prepare(w) for w in ws]
                for n in (int(v) for v in a.cuts.split(",")):
                    both = torch.cat([x[:n], x[1024:1024 + p]])
                    ref = torch.cat([grid[:n], grid_hi[:p]])
                    rows = next((m for m in dict.fromkeys([n + p, *range(-(-(n + p) // 8) * 8, 321, 8)])
                                 if torch.equal(product(pad(both, m), ops[0])[:n + p], ref)), None)
                    if rows is None:
                        say(f"| {name} ({n_out} x {k}) | {n} + {p} | {form} | none up to 320 | - |")
                        continue
                    xb = pad(both, rows)
                    t = graph_ms(lambda: [product(xb, o) for o in ops], a.reps)
                    say(f"| {name} ({n_out} x {k}) | {n} + {p} | {form} | {rows} | {t:.3f} |")
                del ops
                torch.cuda.empty_cache()
            del ws
            torch.cuda.empty_cache()
        say()
    say.write(a.out)


if __name__ == "__main__":
    main()
