"""Do two engines agree? vLLM's and tfengine's greedy token ids on the same prompts, per dtype.

    python scripts/greedy_ids.py --model DIR --vllm-python VENV/bin/python --out receipts/vllm-cpu/greedy-ids
        [--dtypes float32,bfloat16] [--prompts 4] [--prompt-tokens 64] [--tokens 64] [--vocab 8192]

For each dtype, each engine is launched once (tfbench's launcher: a process group, its log kept
beside the output), sent the same seeded token-id prompts one at a time (temperature 0,
ignore_eos, `return_token_ids`), and the replies are compared: the index of the first token
that differs (or "equal"). Writes OUT.json (every id) and OUT.md (the table).
"""
from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
from pathlib import Path

from tensorfold_bench.analysis.exactness import first_divergence
from tensorfold_bench.client.play import play_alone
from tensorfold_bench.client.stream import Request
from tensorfold_bench.servers.identity import identify
from tensorfold_bench.servers.launcher import launch
from tensorfold_bench.workload.ids import prompt_ids

VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1"}


def commands(a, dtype: str) -> dict[str, dict]:
    mml = str(max(1024, a.prompt_tokens + a.tokens + 64))
    return {
        "vllm": {"flags": [], "command": [a.vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", a.model,
                                          "--host", "{host}", "--port", "{port}", "--dtype", dtype,
                                          "--max-model-len", mml, "--seed", "0"], "env": VLLM_ENV, "start_timeout": 900},
        "tfengine": {"flags": ["--model", a.model, "--load-format", "safetensors", "--device", "cpu", "--dtype", dtype,
                               "--max-model-len", mml, "--parallel", "1", "--seed", "0"]},
    }


def replies(url: str, model: str, prompts: list[list[int]], tokens: int) -> list[dict]:
    out = []
    for p in prompts:
        rec = asyncio.run(play_alone(url, Request("g", p, max_tokens=tokens, ignore_eos=True), model))
        out.append({"ids": rec.known_ids, "error": rec.error, "counted_by": rec.counted_by})
    return out


def markdown(doc: dict) -> str:
    lines = [f"## Greedy token ids: vLLM against tfengine ({doc['created']})", "",
             f"Model `{doc['model']}`; {doc['prompts']} prompts of {doc['prompt_tokens']} seeded random token ids "
             f"(vocabulary {doc['vocab']:,}), {doc['tokens']} tokens each, temperature 0, ignore_eos, one request "
             "at a time on a fresh server per engine and dtype. First divergence: the index of the first reply "
             "token where the engines differ.", "",
             "| dtype | prompt | first divergence | vLLM first ids | tfengine first ids |", "|---|---|---|---|---|"]
    for dtype, d in doc["dtypes"].items():
        if d.get("error"):
            lines.append(f"| {dtype} | - | not run: {d['error']} | | |")
            continue
        for i, (v, t) in enumerate(zip(d["vllm"], d["tfengine"])):
            at = d["first_divergence"][i]
            what = "equal" if at == "equal" else "unknown (an error)" if at is None else f"token {at}"
            lines.append(f"| {dtype} | {i} | {what} | {(v['ids'] or [])[:6]} | {(t['ids'] or [])[:6]} |")
    lines += ["", "Servers: " + "; ".join(f"{dtype} {k}: {v}" for dtype, d in doc["dtypes"].items()
                                          for k, v in d.get("servers", {}).items()) + "."]
    return "\n".join(lines) + "\n"


def run_dtype(a, dtype: str, prompts: list[list[int]], logs: Path) -> dict:
    out: dict = {"servers": {}}
    for name, c in commands(a, dtype).items():
        print(f"{dtype}: {name} ...", flush=True)
        with launch(c["flags"], logs / f"{dtype}-{name}.log", command=c.get("command"), env=c.get("env"),
                    start_timeout=c.get("start_timeout")) as srv:
            ident = identify(srv.url, srv)
            out["servers"][name] = f"{ident.label}, `{srv.command_line}`"
            out[name] = replies(srv.url, ident.model or "default", prompts, a.tokens)
    out["first_divergence"] = [divergence(v, t) for v, t in zip(out["vllm"], out["tfengine"])]
    return out


def divergence(v: dict, t: dict) -> int | str | None:
    """The first differing index, "equal", or None when a reply is missing."""
    if v["ids"] is None or t["ids"] is None:
        return None
    at = first_divergence(v["ids"], t["ids"])
    return "equal" if at is None else at


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--vllm-python", default=os.environ.get("VLLM_PYTHON"))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=8192)
    a = ap.parse_args()
    prompts = [prompt_ids(0, f"greedy{i}", a.prompt_tokens, a.vocab) for i in range(a.prompts)]
    logs = a.out.with_name(a.out.name + "-logs")
    doc = {"created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "model": a.model,
           "prompts": a.prompts, "prompt_tokens": a.prompt_tokens, "tokens": a.tokens, "vocab": a.vocab,
           "prompt_ids": prompts, "dtypes": {}}
    for dtype in a.dtypes.split(","):
        try:
            doc["dtypes"][dtype] = run_dtype(a, dtype, prompts, logs)
        except Exception as e:  # one dtype's failure (a server that will not start) is reported, not fatal
            doc["dtypes"][dtype] = {"error": str(e).splitlines()[0]}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")
    a.out.with_suffix(".md").write_text(markdown(doc))
    print(markdown(doc))


if __name__ == "__main__":
    main()
