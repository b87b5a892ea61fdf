"""Issue 14, run 39 (engine/dev/PERF.md): does the decode loop leave the GIL to the server's thread?
Run 38's long-prompt receipt saw B's first cut start 86 ms after its send where the last receipt saw
12-19 ms, while A decoded on. The server parses a request (32,000 ids of JSON) in its event loop's
thread, which needs the GIL the decode thread holds between its releases. Here a thread decodes one
stream back to back, as the lane host does, while the main thread parses a 32,000-id JSON body and
validates it in Python, ten times; the wall time of each parse against the same with no decoding:
  new path      decode() as shipped (rows written through numpy, the graph copies them in)
  old path      decode() with the two torch copies it made before the graph copied the rows in
  plain         the plain kernels' runner (ring off, PDL 0), new path

    PYTHONPATH=. python3 -m engine.dev.gil_probe --out $OUT
"""
from __future__ import annotations

import json
import statistics
import sys
import threading
import time

import torch

import engine.dev.round2 as R2
from engine.config import EngineConfig, KernelConfig

RES, say = R2.RES, R2.say


def parse_ms(body: str, n: int = 10) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        ids = json.loads(body)["prompt"]
        assert all(0 <= i < 151936 for i in ids)
        out.append((time.perf_counter() - t) * 1e3)
        time.sleep(0.02)
    return out


def with_decoding(r, body: str, old_path: bool) -> dict:
    stop, rounds = threading.Event(), [0]
    lanes, toks, pos = [0], [r.prefill(0, R2.prompt(128, 1))], [128]

    def loop():
        nonlocal toks, pos
        with torch.inference_mode():
            while not stop.is_set():
                if old_path:  # the two copies decode() made before: each a GIL release
                    r._h_in.copy_(torch.tensor(r._padded(lanes, toks, pos)[0], dtype=torch.long))
                    r._s_in.copy_(r._h_in, non_blocking=True)
                toks = r.decode(lanes, toks, pos)
                pos = [p + 1 for p in pos]
                rounds[0] += 1
                if pos[0] > 2000:
                    pos = [128]
    th = threading.Thread(target=loop)
    th.start()
    time.sleep(0.2)
    t0, n0 = time.perf_counter(), rounds[0]
    ms = parse_ms(body)
    rate = (rounds[0] - n0) / (time.perf_counter() - t0)
    stop.set()
    th.join()
    return {"parse_ms": statistics.median(ms), "all": ms, "rounds_per_s": rate}


def main(argv):
    from dataclasses import replace

    from engine.runner import ModelRunner
    t0 = R2.begin(argv)
    g = torch.Generator().manual_seed(0)
    body = json.dumps({"model": "x", "prompt": torch.randint(0, 151936, (32000,), generator=g).tolist()})
    RES["idle"] = {"parse_ms": statistics.median(parse_ms(body))}
    say("idle", json.dumps(RES["idle"]))
    base = ModelRunner(EngineConfig(model="qwen3-8b", device="cuda", dtype="bfloat16", parallel=4,
                                    max_model_len=2304, prefill_rows=1024))
    plain = ModelRunner(replace(base.cfg, kernels=KernelConfig(ring=False, pdl=0)), model=base.model)
    for name, r, old in (("new path", base, False), ("old path", base, True), ("plain", plain, False),
                         ("new path again", base, False)):
        RES[name] = with_decoding(r, body, old)
        say(name, json.dumps({k: v for k, v in RES[name].items() if k != "all"}))
        R2.save()
    R2.finish(t0)


if __name__ == "__main__":
    main(sys.argv[1:])
