"""Does a change move a token? The same greedy prompts through tfengine built from several source
trees (this one and, say, an older commit's `git archive`), alone and several at once, compared.

    python -m tools.tree_tokens --root . --root OLD_TREE --model qwen3-8b --device cuda --out T.json
        [--prompts 4] [--prompt-tokens 700] [--tokens 32] [--flags "--prefill-mode whole"]

Each tree gets a fresh server (tfbench's launcher, its log beside --out) per flag set; every reply's
token ids are hashed (tfbench's convention: sha256 of the comma-joined ids, 12 hex characters).
Prints one line per tree and flag set and whether every hash equals the first tree's.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import shlex
from pathlib import Path

from tensorfold_bench.analysis.exactness import token_hash
from tensorfold_bench.client.stream import Request, StreamClient, new_record, stream
from tensorfold_bench.servers.identity import identify
from tensorfold_bench.servers.launcher import launch
from tensorfold_bench.workload.ids import prompt_ids


async def replies(url: str, model: str, reqs: list[Request]) -> list[list[int]]:
    recs = [new_record(r) for r in reqs]
    async with StreamClient() as client:
        await asyncio.gather(*(stream(client, url, r, rec, model) for r, rec in zip(reqs, recs)))
    for rec in recs:
        if rec.error:
            raise SystemExit(f"{rec.name}: {rec.error}")
    return [rec.known_ids for rec in recs]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", action="append", required=True, help="a source tree holding engine/ (repeat)")
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--flags", action="append", default=None, help="extra engine flags, one set per use")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--prompt-tokens", type=int, default=700)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    reqs = [Request(f"p{i}", prompt_ids(0, f"tree{i}", a.prompt_tokens + 37 * i, a.vocab), max_tokens=a.tokens)
            for i in range(a.prompts)]
    doc: dict = {}
    for flags in a.flags or [""]:
        for root in a.root:
            argv = ["--model", a.model, "--device", a.device, *shlex.split(flags)]
            log = a.out.with_name(f"{a.out.stem}-{len(doc)}.log")
            with launch(argv, log, root=Path(root).resolve()) as srv:
                model = identify(srv.url, srv).model
                alone = [asyncio.run(replies(srv.url, model, [r]))[0] for r in reqs]
                together = asyncio.run(replies(srv.url, model, reqs))
            key = f"{root} {flags}".strip()
            doc[key] = {"alone": [token_hash(i)[:12] for i in alone], "together": [token_hash(i)[:12] for i in together]}
            first = next(iter(doc.values()))
            same = doc[key] == first and doc[key]["alone"] == doc[key]["together"]
            print(f"{key}: {' '.join(doc[key]['alone'])} | together equal: {doc[key]['alone'] == doc[key]['together']}"
                  f" | equal to {next(iter(doc))}: {same}", flush=True)
    a.out.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
