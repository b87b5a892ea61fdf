"""Where the wall time goes while a long prompt fills beside a decoding stream, from the server's
own trace: one fresh `tfengine serve --trace` a share, stream A decoding, B's cold prompt sent
`--b-at` seconds in. Prints, per share, A's rate before B and during B's fill (client clock), and
over B's fill window (server trace): the cuts' time, the rounds' time, the time between steps,
the debt-free ("whole") cuts at the end, and the share the decoders got of the window.

    python -m tools.share_probe --shares 0.5,0.75 --b-tokens 4096

A dev probe: the receipt's figures come from `tfbench run long-prompt`."""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path


def post_stream(url: str, body: dict, stamps: list, stop: threading.Event | None = None) -> None:
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        r = urllib.request.urlopen(req, timeout=600)
    except urllib.error.HTTPError as e:
        raise SystemExit(f"{e.code}: {e.read()[:300]!r}") from None
    with r:
        for line in r:
            if line.startswith(b"data: ") and not line.startswith(b"data: [DONE]"):
                stamps.append(time.monotonic())
            if stop is not None and stop.is_set():
                return


def get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=60) as r:
        return json.loads(r.read())


def probe(share: float, b_tokens: int, b_at: float, flags: list[str]) -> dict:
    tmp = Path(tempfile.mkdtemp())
    pf = tmp / "port"
    cmd = [sys.executable, "-m", "engine", "serve", "--model", "cpu", "--port", "0", "--port-file", str(pf),
           "--trace", "--prefill-share", str(share),
           "--max-model-len", str(-(-(b_tokens + 64) // 256) * 256), *flags]
    log = open(tmp / "log", "w")
    srv = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(1200):
            if pf.exists() and pf.read_text().strip():
                break
            if srv.poll() is not None:
                raise SystemExit(f"server exited: {(tmp / 'log').read_text()[-800:]}")
            time.sleep(0.1)
        url = f"http://127.0.0.1:{pf.read_text().strip()}"
        eng = get(url + "/v1/engine")["engine"]
        rng = random.Random(0)
        a_stamps: list[float] = []
        stop = threading.Event()
        a = threading.Thread(target=post_stream, args=(url, {"prompt": [rng.randrange(300) for _ in range(32)],
                             "max_tokens": 3000, "ignore_eos": True, "stream": True}, a_stamps, stop))
        a.start()
        time.sleep(b_at)
        b_stamps: list[float] = []
        b_sent = time.monotonic()
        post_stream(url, {"prompt": [rng.randrange(300) for _ in range(b_tokens)], "max_tokens": 1,
                          "stream": True}, b_stamps)
        b_first = b_stamps[0]
        time.sleep(1.0)
        stop.set()
        steps = get(url + "/v1/trace")["steps"]
        a.join(timeout=30)
    finally:
        srv.terminate()
        srv.wait(30)
    before = [t for t in a_stamps if b_sent - 2.0 <= t < b_sent]
    during = [t for t in a_stamps if b_sent <= t < b_first]
    win = [s for s in steps if s["t"] >= b_sent - 0.05 and s["t"] + s["dur"] <= b_first + 0.05]
    cuts = [s for s in win if s["kind"] == "prefill"]
    rounds = [s for s in win if s["kind"] == "decode"]
    span = (win[-1]["t"] + win[-1]["dur"] - win[0]["t"]) if win else 0.0
    busy = sum(s["dur"] for s in win)
    # cuts run back to back at the end (no round between): the rows going whole
    upto = [s for s in win if s["t"] + s["dur"] <= b_first]
    tail = 0
    for s in reversed(upto):
        if s["kind"] != "prefill":
            break
        tail += 1
    # each round's place after the last cut: the first round after a cut against the others
    nth, after = [], 0
    for s in win:
        if s["kind"] == "prefill":
            after = 0
        else:
            after += 1
            nth.append((after, s["dur"]))
    gaps = [b["t"] - (a["t"] + a["dur"]) for a, b in zip(win, win[1:])]
    rd = sorted(s["dur"] for s in rounds)
    pre = sorted(s["dur"] for s in steps if s["kind"] == "decode" and s["t"] < b_sent)
    med = lambda v: v[len(v) // 2] if v else float("nan")  # noqa: E731
    return {
        "share": share, "threads": eng.get("threads"), "dtype": eng.get("dtype"),
        "a_before_tok_s": (len(before) - 1) / (before[-1] - before[0]) if len(before) > 1 else float("nan"),
        "a_during_tok_s": len(during) / (b_first - b_sent),
        "fill_s": b_first - b_sent, "cuts": len(cuts), "cut_s": sum(s["dur"] for s in cuts),
        "rounds": len(rounds), "round_s": sum(rd), "round_med_ms": 1e3 * med(rd),
        "round_before_med_ms": 1e3 * med(pre), "gap_s": sum(gaps), "gap_med_ms": 1e3 * med(sorted(gaps)),
        "span_s": span, "busy_s": busy, "tail_cuts": tail,
        "tail_s": sum(s["dur"] for s in upto[len(upto) - tail:]),
        "first_after_cut_med_ms": 1e3 * med(sorted(d for n, d in nth if n == 1)),
        "second_after_cut_med_ms": 1e3 * med(sorted(d for n, d in nth if n == 2)),
        "later_med_ms": 1e3 * med(sorted(d for n, d in nth if n > 2)),
        "last_cuts_ms": [round(1e3 * s["dur"]) for s in cuts[-4:]],
        "decode_share_of_window": sum(rd) / span if span else float("nan"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shares", default="0.5,0.75")
    ap.add_argument("--b-tokens", type=int, default=4096)
    ap.add_argument("--b-at", type=float, default=3.0)
    ap.add_argument("--flags", default="", help="more tfengine serve flags, one string")
    args = ap.parse_args()
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    for p in [float(x) for x in args.shares.split(",")]:
        r = probe(p, args.b_tokens, args.b_at, args.flags.split())
        r["a_kept"] = r["a_during_tok_s"] / r["a_before_tok_s"]
        print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()}), flush=True)


if __name__ == "__main__":
    main()
