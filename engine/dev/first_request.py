"""Issue 14, run 103 (engine/dev/PERF.md): a fresh server's first requests, one after another.

Starts `engine serve --trace` from a source tree (this one, or another commit's: --root), sends
--n streamed completions of a --prompt-tokens prompt (seeded token ids, a new prompt each, so no
prompt cache) one at a time, and prints for each the first token's time at the client and the
server's own prefill and decode steps for it (/v1/trace). The first rows against the later ones
say what a fresh server still does on its first request; two trees side by side, whether a
prompt got slower between them.

    PYTHONPATH=. python3 -m engine.dev.first_request --out $OUT/fr.json [--root /tmp/base] \\
        [--n 10] [--prompt-tokens 200] [-- extra serve flags]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

SERVE = ["--model", "qwen3-8b", "--device", "cuda", "--parallel", "64", "--max-model-len", "1024",
         "--prefill-rows", "1024", "--seed", "0", "--trace"]


def start(root: Path, extra: list[str]) -> tuple[subprocess.Popen, str, Path]:
    port_file = Path(tempfile.mkdtemp()) / "port"
    log = port_file.with_name("serve.log")
    cmd = [sys.executable, "-m", "engine", "serve", "--host", "127.0.0.1", "--port", "0", "--port-file",
           str(port_file), *SERVE, *extra]
    p = subprocess.Popen(cmd, cwd=root, env=dict(os.environ, PYTHONPATH=str(root)), stdout=log.open("w"),
                         stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while not (port_file.exists() and port_file.read_text().strip()):
        if p.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the server did not start: {log.read_text()[-2000:]}")
        time.sleep(0.1)
    return p, f"http://127.0.0.1:{int(port_file.read_text())}", log


def one(client: httpx.Client, url: str, model: str, prompt: list[int]) -> float:
    """Seconds from the send to the first streamed token."""
    body = {"model": model, "prompt": prompt, "max_tokens": 4, "temperature": 0, "stream": True,
            "ignore_eos": True}
    t = time.perf_counter()
    with client.stream("POST", f"{url}/v1/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: ") and '"text"' in line:
                return time.perf_counter() - t
    raise SystemExit("no token came")


def main(argv: list[str]) -> None:
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", type=Path, default=Path("."))
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--prompt-tokens", type=int, default=200)
    ap.add_argument("--out", type=Path, default=Path("/tmp/first_request.json"))
    a = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    p, url, log = start(a.root.resolve(), extra)
    rows = []
    try:
        with httpx.Client(timeout=60) as client:
            card = client.get(f"{url}/v1/models").json()["data"][0]
            model, vocab = card["id"], card["vocab_size"]
            for i in range(a.n):
                rng = random.Random(i)
                since = time.monotonic()  # the server's clock is this host's monotonic clock
                ttft = one(client, url, model, [rng.randrange(vocab) for _ in range(a.prompt_tokens)])
                steps = client.get(f"{url}/v1/trace").json()["steps"]
                mine = [s for s in steps if s["t"] >= since]
                pre = [s["dur"] for s in mine if s["kind"] == "prefill"]
                dec = [s["dur"] for s in mine if s["kind"] == "decode"]
                rows.append({"i": i, "ttft_ms": ttft * 1e3, "prefill_ms": [d * 1e3 for d in pre],
                             "first_round_ms": dec[0] * 1e3 if dec else None})
                print(f"{i:2d}  first token {ttft * 1e3:7.1f} ms  prefill {sum(pre) * 1e3:6.1f} ms "
                      f"({len(pre)} steps)  first round {rows[-1]['first_round_ms'] or 0:6.2f} ms", flush=True)
    finally:
        p.terminate()
        p.wait(30)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({"root": str(a.root), "serve": SERVE + extra, "rows": rows,
                                 "log_tail": log.read_text()[-1500:]}, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
