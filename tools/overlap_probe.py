"""Whether a prompt cut's attention hides under a decode round: both as CUDA graphs on two streams.

    PYTHONPATH=. python3 -m tools.overlap_probe --model qwen3-8b [--contexts 8192,24576] [--out FILE.json]

A decode round reads every weight once and is bound by the memory's bandwidth; a cut's attention
deep in a prompt is bound by the tensor cores. A mixed forward runs the two one after the other in
each layer. If the device ran them side by side at little cost to either, a schedule could hide the
cut's attention under the rounds, and B's attention would not be the floor of what mixed costs B.
This measures it: one runner (--cut-attention tiles, its decode graphs), then
- the round: the padded shape's decode graph (lanes 0-2 after short prompts), replayed;
- the cut's attention: 128 rows at each context (lane 3 filled by a real prompt), every layer's
  `cut_flash.cut_attention_at` in the runner's config, one CUDA graph;
each alone, then together on two streams (the round's at high priority, then both at one): how long
the round takes while the attention runs, the attention while rounds run, and the span of both
against their sum (no overlap) and their max (full overlap). CUDA events, medians.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from engine.config import EngineConfig, KernelConfig
from engine.cuda import cut_flash
from engine.runner.build import build_runner
from tools.results import write_results

ROWS = 128


def timed(replay, stream, n: int) -> list:
    """n replays queued back to back on `stream`: the n + 1 events between them (spans reads them)."""
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)]
    with torch.cuda.stream(stream):
        ev[0].record()
        for i in range(n):
            replay()
            ev[i + 1].record()
    return ev


def spans(ev) -> list[float]:
    return [a.elapsed_time(b) for a, b in zip(ev, ev[1:])]


def together(round_replay, attn_replay, s_round, s_attn, n_round: int, n_attn: int) -> dict:
    """Both queued at once from one start event; each stream's replays timed, and the span of both."""
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    start.record()
    s_round.wait_event(start)
    s_attn.wait_event(start)
    # alternate the host's launches so that neither stream's queue waits on the other's
    ev_r = [torch.cuda.Event(enable_timing=True) for _ in range(n_round + 1)]
    ev_a = [torch.cuda.Event(enable_timing=True) for _ in range(n_attn + 1)]
    with torch.cuda.stream(s_round):
        ev_r[0].record()
    with torch.cuda.stream(s_attn):
        ev_a[0].record()
    i = j = 0
    while i < n_round or j < n_attn:
        if i < n_round and (j >= n_attn or i * n_attn <= j * n_round):
            with torch.cuda.stream(s_round):
                round_replay()
                ev_r[i + 1].record()
            i += 1
        else:
            with torch.cuda.stream(s_attn):
                attn_replay()
                ev_a[j + 1].record()
            j += 1
    torch.cuda.synchronize()
    r, a = spans(ev_r), spans(ev_a)
    end = max(start.elapsed_time(ev_r[-1]), start.elapsed_time(ev_a[-1]))
    # the rounds that ran while attention was still running: those ending before the attention's last
    a_end = start.elapsed_time(ev_a[-1])
    inside = [t for t, e in zip(r, ev_r[1:]) if start.elapsed_time(e) <= a_end] or r
    return {"round_ms": round(statistics.median(inside), 3), "rounds_inside": len(inside),
            "attention_ms": round(statistics.median(a), 3), "span_ms": round(end, 3)}


def decoding_beside_a_prompt(tool: str, model: str, max_model_len: int, prompt_len: int):
    """A runner (4 lanes, 1,024-row cuts, decode graphs) with three short prompts decoding in lanes
    0-2 and lane 3 filled with a random prompt of `prompt_len` tokens: the runner, the round's rows
    (written to the graph's pinned inputs: each replay copies them in again) and the prompt."""
    r = build_runner(EngineConfig(model=model, device="cuda", dtype="bfloat16", parallel=4,
                                  max_model_len=max_model_len, prefill_rows=1024,
                                  kernels=KernelConfig(cut_tiles=True)))
    r.cuts_warmed.result()
    if r.graphs.full is None:
        raise SystemExit(f"{tool}: no decode graphs ({r.graphs.fallback_reason})")
    g = torch.Generator().manual_seed(7)
    shorts = [torch.randint(0, r.vocab_size, (n,), generator=g).tolist() for n in (100, 700, 1500)]
    firsts = [r.prefill(i, p) for i, p in enumerate(shorts)]
    prompt = torch.randint(0, r.vocab_size, (prompt_len,), generator=g)
    r.prefill(3, prompt.tolist())
    rows, _ = r.padded_round([0, 1, 2], firsts, [len(p) for p in shorts])
    r.graphs.fresh(rows)
    torch.cuda.synchronize()
    return r, rows, prompt


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen3-8b")
    ap.add_argument("--contexts", default="8192,24576")
    ap.add_argument("--rounds", type=int, default=40, help="decode rounds a measure")
    ap.add_argument("--max-model-len", type=int, default=32256)
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("overlap_probe: needs a CUDA device (two streams of CUDA graphs)")
    contexts = [int(c) for c in a.contexts.split(",")]
    if max(contexts) + ROWS + 64 > a.max_model_len:
        ap.error(f"--contexts: the deepest plus {ROWS} rows must fit --max-model-len {a.max_model_len}")
    t0 = time.perf_counter()
    r, rows, _ = decoding_beside_a_prompt("overlap_probe", a.model, a.max_model_len, max(contexts) + ROWS)
    b = r.graphs.rounds[len(rows[0])]
    a_cfg = r.model.model.layers[0].self_attn
    heads, d, layers = a_cfg.n_heads, a_cfg.head_dim, len(r.model.model.layers)
    conf = r.kernels.cut_flash
    q = torch.randn(ROWS, heads, d, device=r.device, dtype=r.dtype)
    hi, lo = torch.cuda.Stream(priority=-1), torch.cuda.Stream(priority=0)
    res = {"model": a.model, "device": torch.cuda.get_device_name(), "round_rows": len(rows[0]),
           "cut_rows": ROWS, "cut_flash": repr(conf), "contexts": {}}
    with torch.inference_mode():
        timed(b.graph.replay, hi, 3)  # a first replay
        ev = timed(b.graph.replay, hi, a.rounds)
        torch.cuda.synchronize()
        round_alone = statistics.median(spans(ev))
        for ctx in contexts:
            meta = torch.tensor([ctx, ROWS, 3], dtype=torch.int32, device=r.device)

            def attention():
                for i in range(layers):
                    cut_flash.cut_attention_at(q, r.kv.k[i], r.kv.v[i], meta, r.max_model_len, conf)
            attention()
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                attention()
            ev = timed(graph.replay, lo, 10)
            torch.cuda.synchronize()
            attn_alone = statistics.median(spans(ev))
            n_attn = max(2, round(a.rounds * round_alone / attn_alone))
            out = {"round_alone_ms": round(round_alone, 3), "attention_alone_ms": round(attn_alone, 3),
                   "n_rounds": a.rounds, "n_attention": n_attn,
                   "serial_ms": round(a.rounds * round_alone + n_attn * attn_alone, 3),
                   "max_ms": round(max(a.rounds * round_alone, n_attn * attn_alone), 3)}
            out["round high"] = together(b.graph.replay, graph.replay, hi, lo, a.rounds, n_attn)
            eq = torch.cuda.Stream(priority=0)
            out["one priority"] = together(b.graph.replay, graph.replay, eq, lo, a.rounds, n_attn)
            res["contexts"][ctx] = out
            print(f"{ctx:6d} keys: round {round_alone:.3f} ms, attention {attn_alone:.3f} ms alone; "
                  f"serial {out['serial_ms']:.1f}, max {out['max_ms']:.1f}; "
                  + "; ".join(f"{k}: span {v['span_ms']:.1f}, round {v['round_ms']:.3f}, attention {v['attention_ms']:.3f}"
                              for k, v in out.items() if isinstance(v, dict)), flush=True)
            del graph
    write_results(res, t0, a.out)


if __name__ == "__main__":
    main()
