"""Correctness checks of the CUDA path, run on the device before the bench (tools/gpu_check.sh).

    PYTHONPATH=. python3 -m tools.gpu_check --out $OUT/check.json

1. the Triton decode kernel against the per-row SDPA loop (bf16, lengths across split edges),
   and bitwise row invariance (same row, other neighbours);
2. a bf16 runner (CUDA graph) against a float32 runner with the same weights (prompt logits,
   relative error) on a small Qwen3 shape;
3. on the big shape: stepped vs whole prompts, one lane alone vs four lanes: token ids equal;
   prompt cuts of R rows vs one whole cut: relative error of the logits (same function); the decode
   graph's defaults (TMA ring, PDL) against the Triton products without PDL: token ids equal.
"""
from __future__ import annotations

import json
import sys
import time

import torch

from engine.scheduler.backend import cuts
from engine.config import EngineConfig, KernelConfig
from engine.models.qwen3 import decode_attention_loop
from engine.runner.build import build_runner


def rel(a, b) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


def prompt(n, salt):
    g = torch.Generator().manual_seed(1000 + salt)
    return torch.randint(0, 256, (n,), generator=g).tolist()


def check_kernel(res):
    from engine.cuda.decode_attention import decode_attention
    r = build_runner(EngineConfig(model="qwen3-0.6b", device="cuda", dtype="bfloat16", parallel=4,
                                  max_model_len=4096, prefill_rows=1024, kernels=KernelConfig(cuda_graph=False)))
    lens = [1, 255, 257, 3000]
    torch.manual_seed(0)
    for i in range(r.model_config.num_hidden_layers):  # random KV rows, not zeros
        r.kv.k[i].normal_()
        r.kv.v[i].normal_()
    q = torch.randn(4, 16, 128, device="cuda", dtype=torch.bfloat16)
    lanes = torch.tensor([0, 1, 2, 3], device="cuda")
    pos = torch.tensor([n - 1 for n in lens], device="cuda")
    a = decode_attention(r.kv, 3, q, lanes, pos)
    kv32 = type("KV", (), {})()
    kv32.k, kv32.v = r.kv.k[3:4].float(), r.kv.v[3:4].float()
    b = decode_attention_loop(kv32, 0, q.float(), lanes, pos)
    res["kernel_rel_err_vs_fp32"] = rel(a.float(), b)
    q2 = q.clone()
    q2[0].normal_()
    c = decode_attention(r.kv, 3, q2, torch.tensor([3, 1, 0, 2], device="cuda"), torch.tensor([5, 254, 100, 7], device="cuda"))
    res["kernel_row_invariant"] = bool(torch.equal(a[1], c[1]))
    # the capped grid (programs walking several items) against one program an item, folded or not
    items = 4 * r.model_config.num_key_value_heads * -(-4096 // 256)
    res["kernel_grid_walk_bitwise"] = all(
        torch.equal(decode_attention(r.kv, 3, q, lanes, pos, fold=f, programs=n),
                    decode_attention(r.kv, 3, q, lanes, pos, fold=f, programs=items))
        for f in (False, True) for n in (None, 7, 132))
    del r
    torch.cuda.empty_cache()


def check_vs_fp32(res):
    common = dict(model="qwen3-0.6b", device="cuda", parallel=4, max_model_len=2048, prefill_rows=256)
    bf = build_runner(EngineConfig(dtype="bfloat16", **common))
    ref = build_runner(EngineConfig(dtype="float32", kernels=KernelConfig(cuda_graph=False, fused=False), **common))
    with torch.no_grad():  # the reference holds the bf16 weights exactly, upcast
        for p32, p16 in zip(ref.model.parameters(), bf.model.parameters()):
            p32.copy_(p16.float())
    toks = prompt(700, 1)
    ids = torch.tensor(toks, device="cuda")
    with torch.inference_mode():
        a = bf.cut_logits(ids, 0, 0).float()
        b = ref.cut_logits(ids, 0, 0)
    res["bf16_vs_fp32_prompt_logits_rel_err"] = rel(a, b)
    ga, gb = bf.generate(toks, 32), ref.generate(toks, 32)
    res["bf16_vs_fp32_greedy_prefix_equal"] = next((i for i, (x, y) in enumerate(zip(ga, gb)) if x != y), len(ga))
    res["graph_used"] = bf.graph is not None
    res["graph_fallback_reason"] = bf.graph_fallback_reason
    del bf, ref
    torch.cuda.empty_cache()


def check_exactness(res, model):
    r = build_runner(EngineConfig(model=model, device="cuda", dtype="bfloat16", parallel=8, max_model_len=4096,
                                  prefill_rows=256))
    res["exact_model"] = model
    res["exact_graph_used"] = r.graph is not None
    res["decode_rows"] = list(r.buckets)  # alone (lane 0) runs at 1 row, stepped (lane 5) and four at 8
    target, others = prompt(777, 2), [prompt(n, 3 + i) for i, n in enumerate([100, 1500, 333])]
    # whole: back to back in lane 0, then decode alone
    alone = r.generate(target, 24, lane=0)
    # stepped: one cut at a time, with decode rounds of another stream in between, target in lane 5
    side = r.prefill(1, others[0])
    side_pos = len(others[0])
    first = None
    for s, e in cuts(0, len(target), r.prefill_rows):
        first = r.prefill_step(5, target, s, e)
        side = r.decode([1], [side], [side_pos])[0]
        side_pos += 1
    stepped = [first]
    pos = len(target)
    while len(stepped) < 24:
        stepped.append(r.decode([5], [stepped[-1]], [pos])[0])
        pos += 1
    # four lanes together, target in lane 6
    lanes = [6, 2, 3, 7]
    ps = [target] + others
    outs = r.generate_together(ps, lanes, 24)
    res["exact_stepped_equals_whole"] = stepped == alone
    res["exact_alone_equals_four"] = outs[0] == alone
    res["exact_tokens_alone"] = alone[:8]
    # cut size: R-row cuts vs one whole cut, same function
    ids = torch.tensor(target, device="cuda")
    with torch.inference_mode():
        whole = r.cut_logits(ids, 0, 0).float()
        parts = torch.cat([r.cut_logits(ids[s:e], 4, s).float()
                           for s, e in cuts(0, len(target), 256)])
    res["cuts_vs_one_cut_rel_err"] = rel(parts, whole)
    # the decode graph's TMA ring and PDL (the defaults) against the Triton products without PDL
    from dataclasses import replace

    d = r.describe()
    res["decode_ring"], res["decode_pdl"] = d.get("decode_ring"), d.get("decode_pdl")
    plain = build_runner(replace(r.cfg, kernels=KernelConfig(ring=False, pdl=0, overlap=False)), model=r.model)
    res["exact_ring_pdl_equals_plain_kernels"] = plain.generate(target, 24, lane=0) == alone
    # rounds run ahead (generate asks for them): four streams, two of them ending early, then the
    # same rounds without; ids equal, and the rounds in flight served the next call
    res["ahead_runs"] = r.runs_ahead
    if r.runs_ahead:
        taken = r.ahead.taken
        runs = {}
        for who in (r, plain):
            outs = [[who.prefill(ln, p)] for ln, p in zip(lanes, ps)]
            live, pos = list(range(4)), [len(p) for p in ps]
            for k in range(20):
                if k in (6, 11):
                    live.pop()
                new = who.decode([lanes[i] for i in live], [outs[i][-1] for i in live], [pos[i] for i in live],
                                 ahead=True)
                for i, t in zip(live, new):
                    outs[i].append(t)
                    pos[i] += 1
            runs[who is r] = outs
        res["exact_ahead_equals_plain"] = runs[True] == runs[False]
        res["exact_ahead_equals_alone"] = runs[True][0] == alone[:21]  # the target, in lane 6
        res["ahead_taken"], res["ahead_wasted"] = r.ahead.taken - taken, r.ahead.wasted
    del r, plain
    torch.cuda.empty_cache()


def main(argv):
    out = argv[argv.index("--out") + 1] if "--out" in argv else None
    model = argv[argv.index("--model") + 1] if "--model" in argv else "qwen3-8b"
    res = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0)}
    for name, fn in [("kernel", lambda: check_kernel(res)), ("fp32", lambda: check_vs_fp32(res)),
                     ("exact", lambda: check_exactness(res, model))]:
        t = time.perf_counter()
        try:
            fn()
        except Exception as e:  # report and go on to the next check and the bench
            import traceback
            res[f"{name}_error"] = traceback.format_exc()[-3000:]
        res[f"{name}_s"] = round(time.perf_counter() - t, 1)
        print(json.dumps({k: v for k, v in res.items()}, default=str), flush=True)
    if out:
        with open(out, "w") as f:
            json.dump(res, f, indent=2, default=str)


if __name__ == "__main__":
    main(sys.argv[1:])
