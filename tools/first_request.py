"""A fresh server's first requests, one after another.

Starts `engine serve --trace` from a source tree (this one, or another commit's: --root), sends
--n streamed completions of a --prompt-tokens prompt (seeded token ids, a new prompt each, so no
prompt cache) one at a time, and prints for each the first token's time at the client and the
server's own prefill steps for it (/v1/trace). The first rows against the later ones say what a
fresh server still does on its first request; two trees side by side, whether a prompt got
slower between them. The server and the streamed request are serve_compare's.

    PYTHONPATH=. python3 -m tools.first_request --out $OUT/fr.json [--root /tmp/base] \\
        [--n 10] [--prompt-tokens 200] [-- extra serve flags]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import httpx

from tools.serve_compare import Server, free_port, one_stream, prompt_ids

SERVE = ["--model", "qwen3-8b", "--device", "cuda", "--parallel", "64", "--max-model-len", "1024",
         "--prefill-rows", "1024", "--seed", "0", "--trace"]


def server(root: Path, extra: list[str]) -> Server:
    """tfengine from the tree `root` (`python -m` puts the cwd first, so it runs in that tree)."""
    port, root = free_port(), root.resolve()
    cmd = [sys.executable, "-m", "engine", "serve", "--port", str(port), *SERVE, *extra]
    return Server(f"tfengine {root.name}", cmd, dict(os.environ, PYTHONPATH=str(root)), port,
                  Path(tempfile.mkdtemp()) / "serve.log", cwd=root)


async def requests(srv: Server, n: int, prompt_tokens: int) -> list[dict]:
    rows = []
    async with httpx.AsyncClient(timeout=60) as client:
        vocab = (await client.get(srv.url + "/v1/models")).json()["data"][0]["vocab_size"]
        for i in range(n):
            since = time.monotonic()  # the server's trace is on this host's monotonic clock
            s = await one_stream(client, srv, prompt_ids(random.Random(i), prompt_tokens, vocab), 4)
            steps = (await client.get(srv.url + "/v1/trace")).json()["steps"]
            pre = [st["dur"] * 1e3 for st in steps if st["t"] >= since and st["kind"] == "prefill"]
            rows.append({"i": i, "ttft_ms": (s.first - s.sent) * 1e3, "prefill_ms": pre})
            print(f"{i:2d}  first token {rows[-1]['ttft_ms']:7.1f} ms  prefill {sum(pre):6.1f} ms ({len(pre)} steps)",
                  flush=True)
    return rows


def main(argv: list[str]) -> None:
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", type=Path, default=Path("."))
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--prompt-tokens", type=int, default=200)
    ap.add_argument("--out", type=Path, default=Path("/tmp/first_request.json"))
    a = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    srv = server(a.root, extra)
    srv.start(timeout=300)
    try:
        rows = asyncio.run(requests(srv, a.n, a.prompt_tokens))
    finally:
        srv.stop()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({"root": str(a.root), "serve": SERVE + extra, "rows": rows,
                                 "log_tail": srv.log.read_text()[-1500:]}, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
