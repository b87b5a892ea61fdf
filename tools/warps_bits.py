"""Whether the split attention's bits depend on its warps a program (engine/cuda/decode_attention.py WARPS) or
its pipeline's stages (STAGES):
qwen3-8b's attention shapes (32 q heads, 8 KV heads, head_dim 128, bf16) on a random KV cache, rows
of 1-4,000 keys, decode_attention at each WARPS against the shipped 4: equal or the largest difference.

    PYTHONPATH=. python3 -m tools.warps_bits --out $OUT
"""
from __future__ import annotations

import json
import sys

import torch

import engine.cuda.decode_attention as K


class _KV:
    def __init__(self, lanes, max_len, kvh, d, g):
        shape = (1, lanes + 1, max_len, kvh, d)
        self.k = torch.randn(shape, generator=g, device="cuda").bfloat16()
        self.v = torch.randn(shape, generator=g, device="cuda").bfloat16()


def outputs(attr: str, values: dict, *args) -> dict:
    """decode_attention(*args) at each of `values` ({label: value}) of engine/cuda/decode_attention.py's `attr`; the
    module's own value restored after."""
    saved, got = getattr(K, attr), {}
    try:
        for label, v in values.items():
            setattr(K, attr, v)
            got[label] = K.decode_attention(*args)
    finally:
        setattr(K, attr, saved)
    return got


def main(argv):
    out = argv[argv.index("--out") + 1] if "--out" in argv else "/tmp/out"
    g = torch.Generator(device="cuda").manual_seed(0)
    kv, res = _KV(64, 4096, 8, 128, g), {}
    for p in (1, 8, 64):
        q = torch.randn(p, 32, 128, generator=g, device="cuda").bfloat16()
        lanes = torch.arange(p, device="cuda")
        pos = torch.tensor(([0, 63, 64, 128, 129, 1000, 2047, 4000] * 8)[:p] if p > 1 else [128], device="cuda")
        # the first value of each is the one the others are compared against
        for what, attr, values in (("warps", "WARPS", {4: 4, 2: 2, 8: 8}),
                                   ("stages", "STAGES", {st: {p: st} for st in (3, 2, 1)})):
            got = outputs(attr, values, kv, 0, q, lanes, pos)
            first, *others = got
            for v in others:
                res[f"{p} rows, {v} {what}"] = ("equal" if torch.equal(got[v], got[first])
                                                else float((got[v].float() - got[first].float()).abs().max()))
    print(json.dumps(res), flush=True)
    with open(f"{out}/warps_bits.json", "w") as f:
        json.dump(res, f)


if __name__ == "__main__":
    main(sys.argv[1:])
