"""Whether the split attention's bits depend on its warps a program (engine/kernels.py WARPS; run 77) or
its pipeline's stages (STAGES; run 81):
qwen3-8b's attention shapes (32 q heads, 8 KV heads, head_dim 128, bf16) on a random KV cache, rows
of 1-4,000 keys, decode_attention at each WARPS against the shipped 4: equal or the largest difference.

    PYTHONPATH=. python3 -m engine.dev.warps_bits --out $OUT
"""
from __future__ import annotations

import json
import sys

import torch

import engine.kernels as K


class _KV:
    def __init__(self, lanes, max_len, kvh, d, g):
        shape = (1, lanes + 1, max_len, kvh, d)
        self.k = torch.randn(shape, generator=g, device="cuda").bfloat16()
        self.v = torch.randn(shape, generator=g, device="cuda").bfloat16()


def main(argv):
    out = argv[argv.index("--out") + 1] if "--out" in argv else "/tmp/out"
    g = torch.Generator(device="cuda").manual_seed(0)
    kv, res = _KV(64, 4096, 8, 128, g), {}
    for p in (1, 8, 64):
        q = torch.randn(p, 32, 128, generator=g, device="cuda").bfloat16()
        lanes = torch.arange(p, device="cuda")
        pos = torch.tensor(([0, 63, 64, 128, 129, 1000, 2047, 4000] * 8)[:p] if p > 1 else [128], device="cuda")
        outs = {}
        for w in (4, 2, 8):
            K.WARPS = w
            outs[w] = K.decode_attention(kv, 0, q, lanes, pos)
        K.WARPS = 4
        for w in (2, 8):
            res[f"{p} rows, {w} warps"] = ("equal" if torch.equal(outs[w], outs[4])
                                           else float((outs[w].float() - outs[4].float()).abs().max()))
        stages = {}
        for st in (3, 2, 1):  # (run 81) the pipeline's stages at this row count
            K.STAGES = {p: st}
            stages[st] = K.decode_attention(kv, 0, q, lanes, pos)
        K.STAGES = {64: 2}
        for st in (2, 1):
            res[f"{p} rows, {st} stages"] = ("equal" if torch.equal(stages[st], stages[3])
                                             else float((stages[st].float() - stages[3].float()).abs().max()))
    print(json.dumps(res), flush=True)
    with open(f"{out}/warps_bits.json", "w") as f:
        json.dump(res, f)


if __name__ == "__main__":
    main(sys.argv[1:])
