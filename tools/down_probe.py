"""The down product of a mixed forward: which kernels give a row the bits of a whole prompt's grid cut,
and what one launch over a cut's rows and a round's costs against two.

    PYTHONPATH=. python3 -m tools.down_probe --model qwen3-8b,qwen3-32b --out $OUT/down_probe.md

A mixed forward must give a prompt's rows the bits cuBLAS gives them in a whole grid cut (1,024 rows,
no split of K) and the round's rows those of the round's own kernels. An output element summed over
K in one float32 chain from k = 0 up has the same bits in every kernel that does so (the tensor cores
add k16 steps in order), which is why the q/k/v, o and gate/up products already run as one cuBLAS
launch over both kinds of rows. The round's down product summed K in two ranges (split-K 2: more
programs in flight for a narrow matrix), so no launch over both kinds reproduced it and the mixed
forward multiplied down twice; this probe is why it sums in one chain now. Here, per model's down shape, random bf16 weights (one copy a layer,
enough bytes that L2 holds none), each chain of the model's layers one CUDA graph, median of --reps:

1. The round's kernels at 1, 8, 16 and 32 rows (engine/cuda/skinny.py, and the TMA ring at 8 rows
   where it takes the shape), the adopted config and configs of one K chain: time, and whether a row
   gets the grid cut's bits.
2. A cut of n rows beside 8 (or 16) round rows: the form mixed forwards run now (the cut's rows
   through cuBLAS padded to the fewest rows giving the grid's bits, the round's through its kernel),
   and one launch over both kinds: cuBLAS padded to the fewest rows giving both the grid's bits,
   engine/cuda/batch.py's tiles, the skinny kernel over all rows; each with its bits.
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from engine.models.presets import resolve_model
from engine.runner.mixed_graph import fewest_rows, pad
from tools.mixed_products import Said, graph_ms


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3-8b")
    ap.add_argument("--cuts", default="64,128,192,256")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--sections", default="round,cut", help="round, cut, tma (the TMA tiles over both kinds of rows)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    from engine.cuda import batch, ring as R, skinny as S

    dev = torch.device("cuda")
    say = Said()

    def timed(run) -> float:
        return graph_ms(run, a.reps)

    ring = R.Ring()
    sections = set(a.sections.split(","))

    def tma_tiles(n_out, k, x, grid, grid_hi, ws, w0):
        """engine/cuda/batch.py's tiles through TMA over a cut's rows and a round's, one launch, against
        cuBLAS at the fewest padded count giving both kinds the grid's bits (what mixed forwards run)."""
        say("| cut rows + round rows | form | ms (all layers) | cut rows == grid | round rows == grid |")
        say("|---|---|---|---|---|")
        forms = [batch.TileConfig(bm, bn, bk, wp, st, tma=True) for bm, bn, bk, wp, st in (
            (256, 64, 64, 8, 4), (256, 64, 64, 8, 3), (256, 32, 64, 8, 5), (256, 32, 128, 8, 3), (256, 128, 64, 8, 3),
            (128, 64, 64, 4, 5), (128, 64, 128, 8, 3), (128, 128, 64, 8, 4), (128, 32, 128, 4, 4),
            (64, 64, 128, 4, 4), (64, 128, 64, 4, 5))] + [batch.TileConfig(256, 64, 64, 8, 4)]
        for n in (int(v) for v in a.cuts.split(",")):
            p = 8
            both = torch.cat([x[:n], x[1024:1024 + p]])

            def check(y):
                return torch.equal(y[:n], grid[:n]), torch.equal(y[n:n + p], grid_hi[:p])
            mb = fewest_rows(w0, [(both, torch.cat([grid[:n], grid_hi[:p]]))])
            if mb is not None:
                xb = pad(both, mb)
                t = timed(lambda: [F.linear(xb, w) for w in ws])
                say(f"| {n} + {p} | cuBLAS padded to {mb} | {t:.3f} | True | True |")
            for tc in forms:
                name = f"{'TMA ' if tc.tma else ''}tiles {tc.block_m}x{tc.block_n}x{tc.block_k} w{tc.num_warps} s{tc.num_stages}"
                if (tc.block_m + tc.block_n) * tc.block_k * 2 * tc.num_stages > 232448:
                    continue
                try:
                    y = batch.tiles(both, w0, tc)
                    t = timed(lambda: [batch.tiles(both, w, tc) for w in ws])
                except Exception as e:  # a config the device refuses (shared memory, registers)
                    say(f"| {n} + {p} | {name} | {type(e).__name__} | - | - |")
                    continue
                say(f"| {n} + {p} | {name} | {t:.3f} | {check(y)[0]} | {check(y)[1]} |")
        say()

    def probe(model):
        m, _, _ = resolve_model(model)
        n_out, k = m.hidden_size, m.intermediate_size
        layers = m.num_hidden_layers
        g = torch.Generator(device=dev).manual_seed(0)
        ws = [torch.randn(n_out, k, generator=g, device=dev, dtype=torch.bfloat16).mul_(k ** -0.5) for _ in range(layers)]
        x = torch.randn(1100, k, generator=g, device=dev, dtype=torch.bfloat16)
        w0 = ws[0]
        grid = F.linear(x[:1024], w0)  # rows [0, 1024): a whole grid cut
        grid_hi = F.linear(x[76:1100], w0)[948:]  # rows [1024, 1100) in a grid cut of their own
        tables = S.tables_for(dev)
        adopted = S.config_for(n_out, k, 16, tables)
        say(f"## {model}: down {n_out} x {k}, {layers} layers, {torch.cuda.get_device_name()}")
        say()
        say(f"Adopted round config at 16 rows: {adopted}")
        say()
        if "tma" in sections:
            tma_tiles(n_out, k, x, grid, grid_hi, ws, w0)
        if "round" in sections:
            say("| round kernel | rows | ms (all layers) | a row's bits == the grid cut's |")
            say("|---|---|---|---|")
            configs = [c for c in (adopted, S.SkinnyConfig(32, 128, 4, 6), S.SkinnyConfig(64, 128, 4, 6),
                                   S.SkinnyConfig(32, 256, 4, 4), S.SkinnyConfig(16, 256, 4, 4), S.SkinnyConfig(64, 256, 4, 4),
                                   S.SkinnyConfig(128, 128, 4, 4), S.SkinnyConfig(32, 128, 4, 4, 2))
                       if c is not None]
            seen = set()
            for rows in (1, 8, 16, 32):
                xr = x[1024:1024 + rows]
                for c in configs:
                    if (c, rows) in seen or S.smem(c, S.block_m(rows)) > tables.smem or k % (c.block_k * c.split_k):
                        continue
                    seen.add((c, rows))
                    ok = torch.equal(S._launch(xr, w0, c), grid_hi[:rows])
                    t = timed(lambda: [S._launch(xr, w, c) for w in ws])
                    say(f"| skinny {c.block_n}x{c.block_k} w{c.num_warps} s{c.num_stages} split {c.split_k} | {rows} | {t:.3f} | {ok} |")
                if rows <= R.MAX_ROWS and ring.available():
                    for split in (1, 2):
                        if R.takes(xr, w0, split):
                            y = ring.try_product(xr, w0, split)
                            if y is None:
                                say(f"| ring split {split} | {rows} | failed: {ring.broken[-1][:120]} | - |")
                                continue
                            ok = torch.equal(y, grid_hi[:rows])
                            t = timed(lambda: [R.product(xr, w, split) for w in ws])
                            say(f"| ring split {split} | {rows} | {t:.3f} | {ok} |")
            t = timed(lambda: [F.linear(x[1024:1032], w) for w in ws])
            say(f"| cuBLAS | 8 | {t:.3f} | {torch.equal(F.linear(x[1024:1032], w0), grid_hi[:8])} |")
            say()
        # ---- a cut beside a round ------------------------------------------------------------------
        if "cut" not in sections:
            del ws
            return
        say("| cut rows + round rows | form | ms (all layers) | cut rows == grid | round rows == grid |")
        say("|---|---|---|---|---|")
        one_chain = S.SkinnyConfig(32, 128, 4, 6)

        for p in (8, 16):
            for n in (int(v) for v in a.cuts.split(",")):
                both = torch.cat([x[:n], x[1024:1024 + p]])
                ref = torch.cat([grid[:n], grid_hi[:p]])
                cut_only = x[:n]

                def check(y):
                    return torch.equal(y[:n], ref[:n]), torch.equal(y[n:n + p], ref[n:])
                mc = fewest_rows(w0, [(cut_only, grid[:n])])
                rc = S.config_for(n_out, k, p, tables) or one_chain
                xr = both[n:]

                def two(w, mc=mc, rc=rc, xr=xr):
                    yc = F.linear(pad(cut_only, mc), w)[:n]
                    return torch.cat([yc, S._launch(xr, w, rc)])
                y = two(w0)
                t = timed(lambda: [two(w) for w in ws])
                say(f"| {n} + {p} | now: cut via cuBLAS at {mc}, round via skinny split {rc.split_k} | {t:.3f} | {check(y)[0]} | {check(y)[1]} |")
                mb = fewest_rows(w0, [(both, ref)])
                if mb is not None:
                    xb = pad(both, mb)
                    y = F.linear(xb, w0)
                    t = timed(lambda: [F.linear(xb, w) for w in ws])
                    say(f"| {n} + {p} | one cuBLAS launch at {mb} rows | {t:.3f} | {check(y)[0]} | {check(y)[1]} |")
                else:
                    say(f"| {n} + {p} | one cuBLAS launch: no count up to 1024 gives the bits | - | - | - |")
                for tc in (batch.TileConfig(64, 32, 128, 4, 4), batch.TileConfig(64, 64, 64, 4, 4),
                           batch.TileConfig(64, 128, 64, 4, 4), batch.TileConfig(128, 64, 64, 8, 4),
                           batch.TileConfig(64, 64, 128, 4, 3), batch.TileConfig(128, 32, 128, 8, 3)):
                    try:
                        y = batch.tiles(both, w0, tc)
                        t = timed(lambda: [batch.tiles(both, w, tc) for w in ws])
                    except Exception as e:  # a config the device refuses (shared memory)
                        say(f"| {n} + {p} | tiles {tc.block_m}x{tc.block_n}x{tc.block_k} w{tc.num_warps} s{tc.num_stages} | {type(e).__name__} | - | - |")
                        continue
                    say(f"| {n} + {p} | tiles {tc.block_m}x{tc.block_n}x{tc.block_k} w{tc.num_warps} s{tc.num_stages} | {t:.3f} | {check(y)[0]} | {check(y)[1]} |")
                if n + p <= 256:
                    for sc in (S.SkinnyConfig(32, 128, 4, 4), S.SkinnyConfig(32, 64, 4, 4), S.SkinnyConfig(64, 64, 4, 3)):
                        if S.smem(sc, S.block_m(n + p)) > tables.smem:
                            continue
                        y = S._launch(both, w0, sc)
                        t = timed(lambda: [S._launch(both, w, sc) for w in ws])
                        say(f"| {n} + {p} | skinny over all rows {sc.block_n}x{sc.block_k} s{sc.num_stages} | {t:.3f} | {check(y)[0]} | {check(y)[1]} |")
        say()
        del ws

    for model in a.model.split(","):
        try:
            probe(model)
        except Exception:  # one model's failure leaves the others' figures
            import traceback
            say(f"{model}: failed\n```\n{traceback.format_exc()}```")
        torch.cuda.empty_cache()
    say.write(a.out)


if __name__ == "__main__":
    main()
