"""Replays the float32 long-prompt receipt's stream A at runner level (no HTTP): A alone on the
cpu preset, T=1.0 with the harness's seed for A, on a runner of --parallel 1 (the plain
reference's) and of --parallel 4 (the servers'); prints where the two part, and where each parts
from the receipt's plain reference. Runs in about a minute on one core.

    PYTHONPATH=. python scripts/cpu_exactness_replay.py

Engine 9799600 (the receipt's): --parallel 1 equals the reference; --parallel 4 parts at token
267 with 235, run 3's token (its logits differ from the first round, by up to 2e-6), so B's cuts
played no part: runs 1, 2 and 4 ended before token 267. Engine 1ce9b89 (8-row tiles): --parallel
1 and 4 give the same bits, both part from the old reference at token 267 with 235: the reference
itself came from 1-row rounds, whose MKL kernel rounds differently (tests/engine/test_cpu_exactness.py).
"""
from pathlib import Path

import torch

from engine.config import EngineConfig
from engine.runner.build import build_runner
from engine.scheduler.sampling import SamplingParams
from tensorfold_bench import report
from tensorfold_bench.client.sampling import request_seed
from tensorfold_bench.workload.ids import prompt_ids

RECEIPT = Path(__file__).resolve().parent.parent / "receipts" / "20261130-105114-long-prompt.json.gz"


def reply(parallel: int, n: int) -> list[int]:
    r = build_runner(EngineConfig(model="cpu", dtype="float32", parallel=parallel, max_model_len=4352, seed=1234))
    sp = SamplingParams(temperature=1.0, seed=request_seed(1234, "A"))
    prompt = prompt_ids(1234, "A", 16, 512)
    ids = [r.prefill(0, prompt, 0, sp)]
    while len(ids) < n:
        ids += r.decode([0], [ids[-1]], [len(prompt) + len(ids) - 1], [sp])
    return ids


def first_diff(a: list[int], b: list[int]):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


if __name__ == "__main__":
    torch.set_num_threads(1)  # as the receipt's servers (every core but one, on 2 cores)
    data = report.read(RECEIPT)
    ref = data["plain"]["records"]["A"]["token_ids"]
    run3 = data["runs"][2]["records"]["A"]["token_ids"]
    one, four = reply(1, len(ref)), reply(4, len(ref))
    print(f"--parallel 1 vs 4: first differ at {first_diff(one, four)}")
    for name, ids in (("--parallel 1", one), ("--parallel 4", four)):
        at = first_diff(ids, ref)
        print(f"{name} vs the receipt's plain reference: first differ at {at}"
              + ("" if at is None else f" ({ids[at]} for {ref[at]}; run 3 had {run3[at]})"))
