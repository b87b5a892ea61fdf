"""Whether a decode round and a prompt cut share the GPU by SM partitions: green contexts, disjoint.

    PYTHONPATH=. python3 -m tools.partition_probe --model qwen3-8b [--sms 16,32,48] [--contexts 8192,24576] [--out F.json]

A round reads every weight once and is bound by the memory; a long prompt's cut is bound by the
tensor cores. On two streams the device runs them one after the other (tools/overlap_probe.py: a
round and a cut's attention take 0.94-0.96 of their serial sum), since each kernel asks for every
SM. Green contexts give each its own SMs. A round streams the weights near the copy rate from a
third of the SMs; if it kept that pace beside a cut on the other SMs, A would keep most of its
rate while B slows only by the SMs it gave up, which no schedule of whole forwards can do.

Two green contexts from one split of the device's SMs (cuDevSmResourceSplitByCount: n SMs and
the remainder, disjoint), each with a stream of its own, then
- the round: the padded shape's decode graph, replayed (lanes 0-2 after short prompts);
- the cut: a 1,024-row prompt cut of lane 3 at each context, the runner's eager forward
  (`--cut-attention tiles`: products, attention, norms, everything a cut runs);
each alone on the whole device and on its partition, then both at once from two host threads:
the round while cuts run, the cut while rounds run. Bits: the round's ids and logits and the
cut's last logits and K/V rows on the partitions against the whole device's. A control makes the
two contexts from two separate splits of the whole device, as `GreenContext.create(n)` does,
which may overlap. CUDA events, medians.
"""
from __future__ import annotations

import argparse
import statistics
import threading
import time

import torch

from engine.cuda.partitions import device_sms, green_stream, ok, split_sms
from tools.overlap_probe import decoding_beside_a_prompt, spans, timed
from tools.results import write_results

CUT = 1024  # the rows of decoding_beside_a_prompt's cuts


def alone(n: int, device_index: int, keep: list):
    """A green context of n SMs split from the whole device on its own, as `GreenContext.create(n)`
    makes one (two such may share SMs), and its stream: (stream, SMs)."""
    d, dev, whole = device_sms(device_index)
    groups, _, _ = ok(d.cuDevSmResourceSplitByCount(1, whole, 0, n))
    return green_stream(d, dev, groups[0], device_index, keep), groups[0].sm.smCount


def run_on(stream, fn, n: int) -> list[float]:
    """fn n times on stream, each timed (ms)."""
    ev = timed(fn, stream, n)
    torch.cuda.synchronize()
    return spans(ev)


def together(round_fn, cut_fn, s_round, s_cut, n_round: int, n_cut: int) -> dict:
    """Both at once, each stream fed by its own host thread from one start event: the rounds that
    ended while cuts still ran, the cuts, and the span."""
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    start.record()
    s_round.wait_event(start)
    s_cut.wait_event(start)
    out = {}

    def feed(name, fn, stream, n):
        with torch.inference_mode():
            out[name] = timed(fn, stream, n)
    th = threading.Thread(target=feed, args=("cut", cut_fn, s_cut, n_cut))
    th.start()
    feed("round", round_fn, s_round, n_round)
    th.join()
    torch.cuda.synchronize()
    r, c = spans(out["round"]), spans(out["cut"])
    cut_end = start.elapsed_time(out["cut"][-1])
    inside = [t for t, e in zip(r, out["round"][1:]) if start.elapsed_time(e) <= cut_end] or r
    return {"round_ms": round(statistics.median(inside), 3), "rounds_inside": len(inside),
            "cut_ms": round(statistics.median(c), 3),
            "span_ms": round(max(start.elapsed_time(out["round"][-1]), cut_end), 3)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen3-8b")
    ap.add_argument("--sms", default="16,32,48", help="the round's partitions (SMs); the cut gets the rest")
    ap.add_argument("--contexts", default="8192,24576", help="the cut's start (its keys before it)")
    ap.add_argument("--control", type=int, default=48, help="the round's SMs in the overlapping control (0: none)")
    ap.add_argument("--rounds", type=int, default=60, help="decode rounds a measure")
    ap.add_argument("--max-model-len", type=int, default=32256)
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("partition_probe: needs a CUDA device (green contexts)")
    sms, contexts = [int(s) for s in a.sms.split(",")], [int(c) for c in a.contexts.split(",")]
    if max(contexts) + CUT > a.max_model_len:
        ap.error(f"--contexts: the deepest plus {CUT} rows must fit --max-model-len {a.max_model_len}")
    t0 = time.perf_counter()
    r, rows, prompt = decoding_beside_a_prompt("partition_probe", a.model, a.max_model_len, max(contexts) + CUT)
    b = r.graphs.rounds[len(rows[0])]
    dev_index, keep = torch.cuda.current_device(), []
    whole = torch.cuda.Stream()
    res = {"model": a.model, "device": torch.cuda.get_device_name(), "round_rows": len(rows[0]), "cut_rows": CUT,
           "sms": torch.cuda.get_device_properties(0).multi_processor_count, "contexts": {}}

    def round_bits(stream, replay=b.graph.replay, ids=b.s_out, logits=b.s_logits):
        run_on(stream, replay, 1)
        return ids.clone(), logits.clone()

    def bound_round(stream):
        """The padded round captured on `stream`: its kernel nodes take the stream's green context,
        so the graph runs on that partition's SMs wherever it is launched. (A graph captured on the
        whole device and replayed into a green context's stream is not confined: each kernel
        keeps the context it was captured in.)"""
        mode = r.graphs.mode_at(b.rows)
        with torch.cuda.stream(stream):
            for _ in range(2):
                r.graphs.argmax(r.round_logits(b.s_in, mode), mode)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            b.s_in.copy_(b.h_in, non_blocking=True)
            logits = r.round_logits(b.s_in, mode)
            ids = r.graphs.argmax(logits, mode)
        return graph, ids, logits

    with torch.inference_mode():
        run_on(whole, b.graph.replay, 3)
        ref_ids, ref_logits = round_bits(whole)
        res["round_alone_ms"] = round(statistics.median(run_on(whole, b.graph.replay, a.rounds)), 3)
        splits = {}
        for n in sms:
            sp = split_sms(n, dev_index)
            keep.append(sp)
            splits[n] = ((sp.decode, sp.decode_sms), (sp.prompt, sp.prompt_sms))
        res["partitions"] = {n: [sa[1], sb[1]] for n, (sa, sb) in splits.items()}
        res["round_on"], bound = {}, {}
        for n, ((sa, got), _) in splits.items():
            graph, ids_t, logits_t = bound_round(sa)
            bound[n] = graph.replay, graph
            ids, logits = round_bits(sa, graph.replay, ids_t, logits_t)
            res["round_on"][n] = {"sms": got, "ms": round(statistics.median(run_on(sa, graph.replay, a.rounds)), 3),
                                  "bits_equal": bool(torch.equal(ids, ref_ids) and torch.equal(logits, ref_logits)),
                                  "whole_graph_ms": round(statistics.median(run_on(sa, b.graph.replay, a.rounds)), 3)}
            print(f"round on {got} SMs: {res['round_on'][n]['ms']:.3f} ms captured there, "
                  f"{res['round_on'][n]['whole_graph_ms']:.3f} ms the whole device's graph launched there "
                  f"(whole device {res['round_alone_ms']:.3f}); bits equal {res['round_on'][n]['bits_equal']}", flush=True)
        for ctx in contexts:
            ids = prompt[ctx:ctx + CUT].to(r.device)

            def cut():
                return r._forward_cut(ids, 3, ctx)

            def cut_bits(stream):
                with torch.cuda.stream(stream):
                    last = cut()
                torch.cuda.synchronize()
                kv = torch.stack([r.kv.k[i][3, ctx:ctx + CUT] for i in (0, len(r.kv.k) - 1)])
                return last.clone(), kv.clone()
            ref_last, ref_kv = cut_bits(whole)
            cut_alone = statistics.median(run_on(whole, cut, 5))
            n_cut = 6
            out = {"cut_alone_ms": round(cut_alone, 3), "splits": {}}
            for n, ((sa, got_a), (sb, got_b)) in splits.items():
                last, kv = cut_bits(sb)
                on_b = statistics.median(run_on(sb, cut, 5))
                n_round = max(4, round(n_cut * on_b / res["round_on"][n]["ms"]))
                row = {"round_sms": got_a, "cut_sms": got_b, "cut_on_rest_ms": round(on_b, 3),
                       "cut_bits_equal": bool(torch.equal(last, ref_last) and torch.equal(kv, ref_kv))}
                for name, replay in (("bound", bound[n][0]), ("whole graph", b.graph.replay)):
                    both = together(replay, cut, sa, sb, n_round, n_cut)
                    kept = res["round_alone_ms"] / both["round_ms"]
                    row[name] = {"together": both, "a_kept": round(kept, 3),
                                 "b_slowdown": round(both["cut_ms"] / cut_alone, 3)}
                    print(f"{ctx:6d} keys, round on {got_a} ({name}) / cut on {got_b} SMs: cut alone {cut_alone:.2f} ms, "
                          f"on its partition {on_b:.2f}; together round {both['round_ms']:.3f} ms (A keeps "
                          f"{100 * kept:.0f} %), cut {both['cut_ms']:.2f} ms ({both['cut_ms'] / cut_alone:.2f}x); "
                          f"cut bits equal {row['cut_bits_equal']}", flush=True)
                out["splits"][n] = row
            if a.control:
                (sa, got_a), (sb, got_b) = alone(a.control, dev_index, keep), alone(res["sms"] - a.control, dev_index, keep)
                both = together(b.graph.replay, cut, sa, sb, max(4, round(n_cut * cut_alone / res["round_alone_ms"])), n_cut)
                out["control"] = {"round_sms": got_a, "cut_sms": got_b, "together": both}
                print(f"{ctx:6d} keys, control (two splits of the whole device, {got_a} and {got_b} SMs): round "
                      f"{both['round_ms']:.3f} ms, cut {both['cut_ms']:.2f} ms", flush=True)
            res["contexts"][ctx] = out
    write_results(res, t0, a.out)


if __name__ == "__main__":
    main()
