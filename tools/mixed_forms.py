"""The mixed graphs' forms side by side in one process: same bits, and each shape's replay time.

    PYTHONPATH=. python3 -m tools.mixed_forms --model qwen3-8b --out $OUT/mixed_forms.json

One runner (--prefill-mode mixed, --cut-attention tiles) and its decode graphs; then one set of mixed
graphs per form (engine/runner/mixed_graph.py MixedGraphs: hold_down, chunks, tiles), each captured as the runner
captures its own; --max-model-len sizes the graphs' grids as the engine's does.
Per form, at every cut size and context: one forward of a prompt in lane 3 beside a round of lanes 0-2,
its cut's K/V rows, last hidden row and the round's ids compared bitwise with the first form's; then
the graphs' replays timed with CUDA events (the pinned inputs filled once), the forms interleaved rep
by rep so that a drift of the device's clocks falls on all.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from engine.config import EngineConfig, KernelConfig
from engine.runner.mixed_graph import TILES, MixedGraphs
from engine.runner.build import build_runner
from tools.results import write_results

# the graphs before the chunked products (one F.linear a product), before the cut attention's lower tiles,
# as they run now, with the cut attention's lower tiles checked and timed per capacity (mixed_graph.TILES), and
# with K and V by pointer loads instead of tensor descriptors (the same bits; the runner's default before Hopper)
FORMS = {"plain": {"hold_down": False, "chunks": (), "tiles": ()},
         "hold down": {"hold_down": True, "chunks": (), "tiles": ()},
         "chunks": {"hold_down": True, "chunks": (2, 4, 8), "tiles": ()},
         "tiles": {"hold_down": True, "chunks": (2, 4, 8), "tiles": TILES},
         "pointer loads": {"hold_down": True, "chunks": (2, 4, 8), "base_fields": {"tma": False}}}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen3-8b")
    ap.add_argument("--contexts", default="0,8192")
    ap.add_argument("--forms", default=",".join(FORMS))
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--max-model-len", type=int, default=32256,
                    help="the runner's context (sizes the cut attention's grid in a graph: long-prompt runs B of 32,000 "
                         "tokens at 32,256)")
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    contexts = [int(c) for c in a.contexts.split(",")]
    forms = a.forms.split(",")
    unknown = [f for f in forms if f not in FORMS]
    if unknown:
        ap.error(f"--forms: unknown {unknown}; choose from {list(FORMS)}")
    t0 = time.perf_counter()
    prompt_len = max(contexts) + 1024 + 64
    if a.max_model_len < prompt_len + 64:
        ap.error(f"--max-model-len: at least {prompt_len + 64} for --contexts {a.contexts}")
    r = build_runner(EngineConfig(model=a.model, device="cuda", dtype="bfloat16", parallel=4,
                                  max_model_len=a.max_model_len, prefill_rows=1024, prefill_mode="mixed",
                                  kernels=KernelConfig(cut_tiles=True)))
    r.cuts_warmed.result()
    g = torch.Generator().manual_seed(7)
    toks = torch.randint(0, r.vocab_size, (prompt_len,), generator=g).tolist()
    shorts = [torch.randint(0, r.vocab_size, (n,), generator=g).tolist() for n in (100, 700, 1500)]
    firsts = [r.prefill(i, p) for i, p in enumerate(shorts)]
    r.prefill(3, toks)  # the keys every cut's attention reads (a cut rewrites its own rows, the same bits)
    rows, _ = r.padded_round([0, 1, 2], firsts, [len(p) for p in shorts])

    graphs = {}
    for f in forms:
        mg = MixedGraphs(r, **FORMS[f])
        with torch.inference_mode():
            ok = r.in_cut_thread(mg.capture)
        if not ok:
            raise SystemExit(f"{f}: {mg.fallback_reason}")
        graphs[f] = mg
    p = len(rows[0])
    res = {"model": a.model, "device": torch.cuda.get_device_name(), "forms": {f: FORMS[f] for f in forms},
           "plans": {f: graphs[f].describe() for f in forms}, "bits": {}, "ms": {}}

    def forward(mg, n, ctx):
        s = mg.shapes[(n, p)]
        last, ids = mg.run(s, 3, toks[ctx:ctx + n], ctx, rows)
        torch.cuda.synchronize()
        return last.clone(), ids, r.kv.k[:, 3, ctx:ctx + n].clone(), r.kv.v[:, 3, ctx:ctx + n].clone()

    sizes = graphs[forms[0]].sizes
    for ctx in contexts:
        for n in sizes:
            with torch.inference_mode():
                outs = {f: r.in_cut_thread(lambda mg=graphs[f]: forward(mg, n, ctx)) for f in forms}
            ref = outs[forms[0]]
            res["bits"][f"{n}@{ctx}"] = {f: all(torch.equal(x, y) if torch.is_tensor(x) else x == y
                                                for x, y in zip(o, ref)) for f, o in outs.items()}
            times = {f: [] for f in forms}

            def timed(mg):
                s = mg.shapes[(n, p)]
                mg.fill(s, 3, toks[ctx:ctx + n], ctx, rows)
                torch.cuda.synchronize()
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                s.graph.replay()
                e1.record()
                e1.synchronize()
                return e0.elapsed_time(e1)
            with torch.inference_mode():
                for _ in range(a.reps):
                    for f in forms:
                        times[f].append(r.in_cut_thread(lambda mg=graphs[f]: timed(mg)))
            med = {f: round(statistics.median(t), 3) for f, t in times.items()}
            res["ms"][f"{n}@{ctx}"] = med
            print(f"{n:5d} rows @ {ctx:5d} keys:", "  ".join(f"{f} {m:.3f}" for f, m in med.items()),
                  " bits", res["bits"][f"{n}@{ctx}"], flush=True)
    write_results(res, t0, a.out)


if __name__ == "__main__":
    main()
