"""Tensor parallel on the GPU: the engine at N = 1 against the same engine at N ranks, one phase a
process (scripts/h200_tp.sh runs them in turn).

    PYTHONPATH=. python3 -m tools.tp_check --phase one --model qwen3-32b --out $OUT
    PYTHONPATH=. python3 -m tools.tp_check --phase tp --world 2 --model qwen3-32b --out $OUT

- phase one: the plain one-rank runner: greedy tokens of two prompts (alone), decode ms a round at
  one stream, and a long prompt's fill time; written to $OUT/tp_one.json.
- phase tp, world >= 2: `start_tensor_parallel` (rank 0 here, the workers started by it), the same
  figures, the tokens against phase one's, and exactness within the TP size: two prompts decoded
  in the same rounds == each alone; the decode graph captured with the collectives inside.
- phase tp, world 1: one NCCL rank with the collectives forced on (TensorParallel.collectives), so
  the decode graph captures an all-reduce and an all-gather; tokens must equal phase one's bitwise
  (the shard is the whole model, a one-rank sum and gather change no bit).
Runs on the CPU too (--device cpu --model tiny: gloo), to check the script before a device call.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from engine.scheduler.backend import cuts
from engine.config import EngineConfig, KernelConfig


def generate(be, lane: int, prompt: list[int], n: int, rows: int) -> list[int]:
    """Greedy tokens through the backend's own calls (a TPBackend sends each as a plan)."""
    for s, e in cuts(0, len(prompt), rows):
        tok = be.prefill_step(lane, prompt, s, e)
    out, pos = [tok], len(prompt)
    while len(out) < n:
        out.append(be.decode([lane], [out[-1]], [pos])[0])
        pos += 1
    return out


def together(be, prompts: list[list[int]], n: int, rows: int) -> list[list[int]]:
    """Each prompt filled in its lane, then all decoded in the same rounds."""
    outs = [[generate(be, lane, p, 1, rows)[0]] for lane, p in enumerate(prompts)]
    pos = [len(p) for p in prompts]
    while len(outs[0]) < n:
        new = be.decode(list(range(len(prompts))), [o[-1] for o in outs], pos)
        for o, t in zip(outs, new):
            o.append(t)
        pos = [q + 1 for q in pos]
    return outs


def figures(be, cfg: EngineConfig, vocab: int, long_tokens: int, rounds: int) -> dict:
    prompts = [[(i * 7919 + k * 104729) % min(vocab, 50_000) for i in range(300 + 37 * k)] for k in range(2)]
    alone = [generate(be, k, p, 32, cfg.prefill_rows) for k, p in enumerate(prompts)]
    both = together(be, prompts, 32, cfg.prefill_rows)
    ms = decode_ms(be, alone[0][-1], len(prompts[0]) + 31, rounds)
    fill = None
    if long_tokens:
        lp = [(i * 31 + 7) % min(vocab, 50_000) for i in range(long_tokens)]
        generate(be, 2, lp[:cfg.prefill_rows + 5], 1, cfg.prefill_rows)  # warm: a cut with a prefix
        t0 = time.perf_counter()
        generate(be, 3, lp, 1, cfg.prefill_rows)
        fill = time.perf_counter() - t0
    d = be.describe()
    return {"alone": alone, "together_equal_alone": both == alone, "decode_ms_median": ms,
            "decode_tok_s": 1e3 / ms, "long_prompt_tokens": long_tokens,
            "long_prompt_s": fill, "long_prompt_tok_s": long_tokens / fill if fill else None,
            "cuda_graph": d.get("cuda_graph"), "devices": d.get("devices"), "tensor_parallel": d.get("tensor_parallel"),
            "describe": d}


def decode_ms(be, tok: int, pos: int, rounds: int) -> float:
    """Median ms of a decode round at one stream (the first 5 rounds left out)."""
    ms = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        tok = be.decode([0], [tok], [pos])[0]
        ms.append((time.perf_counter() - t0) * 1e3)
        pos += 1
    return statistics.median(ms[5:])


def sums_split(be, cfg: EngineConfig, vocab: int, rounds: int, order: list[str]) -> dict:
    """The decode round with its o/down sums through each way in `order` (TPRank.set_sums, on
    every rank), in turn: ms a round, and (but "skip", whose logits are wrong) the exactness
    checks. Also whether the symmetric-memory sum has NCCL's bits at a few row counts, and the
    fused sum + add + RMSNorm the bits of the sum then add_rmsnorm."""
    prompts = [[(i * 7919 + k * 104729) % min(vocab, 50_000) for i in range(300 + 37 * k)] for k in range(2)]
    out = {"agrees": {r: be._both("symm_agrees", (r,), {}) for r in (1, 4, 64)},
           "fused_agrees": {r: be._both("fused_agrees", (r,), {}) for r in (1, 4, 64)}, "runs": []}
    for how in order:
        if not be._both("set_sums", (how,), {}):
            out["runs"].append({"how": how, "set": False})
            continue
        run = {"how": how, "set": True, "cuda_graph": be.runner.graph is not None}
        alone = [generate(be, k, p, 32, cfg.prefill_rows) for k, p in enumerate(prompts)]
        if how != "skip":
            run["alone"] = alone
            run["together_equal_alone"] = together(be, prompts, 32, cfg.prefill_rows) == alone
        run["decode_ms_median"] = decode_ms(be, alone[0][-1], len(prompts[0]) + 31, rounds)
        out["runs"].append(run)
    ran = [r for r in out["runs"] if r.get("alone")]
    out["tokens_equal_among_sums"] = all(r["alone"] == ran[0]["alone"] for r in ran)
    fused, symm = ([r["alone"] for r in ran if r["how"] == how] for how in ("fused", "symm"))
    out["fused_tokens_equal_symm"] = bool(fused and symm) and all(f == symm[0] for f in fused)
    for how in ("nccl", "skip", "symm", "fused"):
        ms = [r["decode_ms_median"] for r in out["runs"] if r["how"] == how and r["set"]]
        out[f"{how}_ms"] = statistics.median(ms) if ms else None
    return out


def skinny_turns(be, cfg: EngineConfig, vocab: int, rounds: int, turns: list[str], entries: dict) -> dict:
    """The decode round with the skinny tables as shipped ("old") or plus bench_skinny's adopted
    entries ("new"), in turn, captured again each time (TP: on every rank, with the sums of
    "old:fused", "new:symm", ...): ms a round, tokens alone, two prompts together == alone.
    Then: tokens equal among a table's turns, fused == symm under the same table."""
    prompts = [[(i * 7919 + k * 104729) % min(vocab, 50_000) for i in range(300 + 37 * k)] for k in range(2)]
    tp = hasattr(be, "_both")
    out: dict = {"entries": entries, "runs": []}
    for turn in turns:
        table, _, how = turn.partition(":")
        args = (entries["configs"], entries["gated"]) if table == "new" else ([], [])
        if tp:
            be._both("set_skinny", args, {})
            ok = be._both("set_sums", (how or "fused",), {})
        else:
            from engine.cuda.skinny import tables_for
            be.kernels.skinny = tables_for(be.device).with_entries(*args)
            ok = be.capture_graph() if be.graph is not None else True
        run = {"turn": turn, "set": ok, "cuda_graph": getattr(be, "runner", be).graph is not None}
        if ok:
            run["alone"] = [generate(be, k, p, 32, cfg.prefill_rows) for k, p in enumerate(prompts)]
            run["together_equal_alone"] = together(be, prompts, 32, cfg.prefill_rows) == run["alone"]
            run["decode_ms_median"] = decode_ms(be, run["alone"][0][-1], len(prompts[0]) + 31, rounds)
        out["runs"].append(run)
    for turn in dict.fromkeys(turns):
        ms = [r["decode_ms_median"] for r in out["runs"] if r["turn"] == turn and r["set"]]
        out[f"{turn}_ms"] = statistics.median(ms) if ms else None
    for table in ("old", "new"):
        alone = [r["alone"] for r in out["runs"] if r["turn"].partition(":")[0] == table and r["set"]]
        out[f"{table}_tokens_equal_among_turns"] = all(a == alone[0] for a in alone)
        f, sy = ([r["alone"] for r in out["runs"] if r["turn"] == f"{table}:{h}" and r["set"]]
                 for h in ("fused", "symm"))
        if f and sy:
            out[f"{table}_fused_tokens_equal_symm"] = all(a == sy[0] for a in f + sy)
    out["together_equal_alone_all"] = all(r.get("together_equal_alone", True) for r in out["runs"])
    old = [r["alone"] for r in out["runs"] if r["turn"].startswith("old") and r["set"]]
    new = [r["alone"] for r in out["runs"] if r["turn"].startswith("new") and r["set"]]
    if old and new:
        out["equal_prefix_new_vs_old"] = [next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), len(x))
                                          for x, y in zip(new[0], old[0])]
    return out


def read_entries(paths: str) -> dict:
    """bench_skinny --json files' "adopt" entries, merged (a later file's entry for a shape wins)."""
    configs, gated = {}, {}
    for path in filter(None, paths.split(",")):
        adopt = json.loads(Path(path).read_text()).get("adopt", {})
        configs.update({tuple(e[:3]): e for e in adopt.get("configs", [])})
        gated.update({tuple(e[:3]): e for e in adopt.get("gated", [])})
    return {"configs": list(configs.values()), "gated": list(gated.values())}


def phase_tp(cfg: EngineConfig, world: int):
    from engine.models.presets import resolve_model
    if world > 1:
        from engine.parallel.launch import start_tensor_parallel
        return start_tensor_parallel(EngineConfig(**{**cfg.__dict__, "tensor_parallel": world}),
                                     torch.get_num_threads())
    from engine.parallel.group import TensorParallel, join, tcp_store
    from engine.parallel.runner import build_tp_runner
    dev = "cuda:0" if cfg.device.startswith("cuda") else "cpu"
    join(dev, 0, 1, tcp_store(1))
    tp = TensorParallel(0, 1, resolve_model(cfg.model)[0].vocab_size, collectives=True)
    return build_tp_runner(cfg, tp)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--phase", choices=("one", "tp"), required=True)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--model", default="qwen3-32b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--long", type=int, default=32_768)
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--out", default="/tmp/out")
    ap.add_argument("--sums", default="", help="phase tp, world 2: ways to sum in turn, e.g. nccl,skip,symm,fused")
    ap.add_argument("--no-skinny", action="store_true", help="decode matmuls through cuBLAS, not the Triton skinny ones")
    ap.add_argument("--tag", default="", help="a suffix of the phase's json name")
    ap.add_argument("--parallel", type=int, default=4, help="lanes (rows of a decode round)")
    ap.add_argument("--pdl", type=int, default=0, help="KernelConfig.pdl: 0 off, 1 wait only, 2 wait then launch")
    ap.add_argument("--skinny", default="", help="bench_skinny --json files whose adopted entries the turns try")
    ap.add_argument("--turns", default="", help="with --skinny: old/new tables in turn, e.g. old,new,old,new "
                                                "(phase tp: old:fused,new:fused,new:symm,...)")
    a = ap.parse_args()
    cuda = a.device == "cuda"
    cfg = EngineConfig(model=a.model, device=a.device, dtype="bfloat16" if cuda else "float32", parallel=a.parallel,
                       max_model_len=max(2048, a.long + 1024), prefill_rows=1024 if cuda else 64,
                       kernels=KernelConfig(skinny=not a.no_skinny, pdl=a.pdl,
                                            tp_allreduce="fused" if "fused" in a.sums else KernelConfig.tp_allreduce))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if a.phase == "one":
        from engine.runner.build import build_runner
        be = build_runner(cfg)
    else:
        be = phase_tp(cfg, a.world)
    runner = getattr(be, "runner", be)
    if getattr(runner, "cuts_warmed", None) is not None:
        runner.cuts_warmed.result()
    res = {"phase": a.phase, "world": a.world if a.phase == "tp" else 1, "model": a.model,
           "start_s": time.perf_counter() - t0, "graph_fallback_reason": runner.graph_fallback_reason}
    res.update(figures(be, cfg, runner.vocab_size, a.long, a.rounds))
    if a.sums and a.phase == "tp" and a.world == 2:
        res["sums"] = sums_split(be, cfg, runner.vocab_size, a.rounds, a.sums.split(","))
    if a.skinny:
        res["skinny"] = skinny_turns(be, cfg, runner.vocab_size, a.rounds, a.turns.split(","), read_entries(a.skinny))
    one = out / "tp_one.json"
    if a.phase == "tp" and one.is_file():
        ref = json.loads(one.read_text())
        res["tokens_equal_one"] = [x == y for x, y in zip(res["alone"], ref["alone"])]
        res["equal_prefix_one"] = [next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), len(x))
                                   for x, y in zip(res["alone"], ref["alone"])]
        res["decode_speedup"] = ref["decode_ms_median"] / res["decode_ms_median"]
        if res["long_prompt_s"] and ref.get("long_prompt_s"):
            res["long_prompt_speedup"] = ref["long_prompt_s"] / res["long_prompt_s"]
    name = "tp_one.json" if a.phase == "one" else f"tp_{a.world}{a.tag}.json"
    (out / name).write_text(json.dumps(res, indent=1, default=str))
    brief = {k: v for k, v in res.items() if k not in ("alone", "describe", "sums", "skinny")}
    if "skinny" in res:
        brief["skinny"] = {k: v for k, v in res["skinny"].items() if k not in ("runs", "entries")}
        brief["skinny"]["runs"] = [{k: v for k, v in r.items() if k != "alone"} for r in res["skinny"]["runs"]]
    if "sums" in res:
        brief["sums"] = {k: v for k, v in res["sums"].items() if k != "runs"}
        brief["sums"]["runs"] = [{k: v for k, v in r.items() if k != "alone"} for r in res["sums"]["runs"]]
    print(json.dumps(brief, default=str), flush=True)
    if hasattr(be, "close"):
        be.close()


if __name__ == "__main__":
    main()
