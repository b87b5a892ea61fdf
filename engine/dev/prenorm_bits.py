"""Whether a ring that takes the add+RMSNorm in (engine/kernels_ring.py product_norm, NORM; run 91) gives
add_rmsnorm's bits: qwen3-8b's q/k/v and gated gate/up on a random row, with and without PDL, five launches
each, against add_rmsnorm then the plain ring: the new residual and the product, equal or the count differing.

    PYTHONPATH=. python3 -m engine.dev.prenorm_bits --out $OUT
"""
from __future__ import annotations

import json
import os
import sys

import torch

import engine.kernels_ring as R
from engine.kernels_fused import add_rmsnorm
from engine.kernels_skinny import ring_split


def main(argv):
    out = argv[argv.index("--out") + 1] if "--out" in argv else "/tmp/out"
    g = torch.Generator(device="cuda").manual_seed(0)
    res, eps = {}, 1e-6
    nw = (torch.rand(4096, generator=g, device="cuda") + 0.5).bfloat16()
    for name, n, gated in (("qkv", 6144, False), ("gate_up", 24576, True)):
        w = (torch.randn(n, 4096, generator=g, device="cuda") * 0.02).bfloat16()
        for rows in (1,):
            split = ring_split(n, 4096, rows, gated=gated)
            for pdl in (False, True):
                diffs = []
                for _ in range(5):
                    x, r = (torch.randn(rows, 4096, generator=g, device="cuda").bfloat16() for _ in range(2))
                    xo, h = add_rmsnorm(x, r, nw, eps)
                    want = R.product(h, w, split, gated, pdl)
                    got_x, got = R.product_norm(x, r, w, nw, eps, gated, pdl)
                    torch.cuda.synchronize()
                    diffs.append([int((got_x != xo).sum()), int((got != want).sum())])
                res[f"{name}, {rows} rows, pdl {int(pdl)}"] = diffs
                print(f"{name:8s} rows {rows} pdl {int(pdl)}: residual / product elements differing {diffs}", flush=True)
    res["all_equal"] = all(d == [0, 0] for v in res.values() for d in v)
    print(json.dumps({"all_equal": res["all_equal"]}), flush=True)
    os.makedirs(out, exist_ok=True)
    with open(f"{out}/prenorm_bits.json", "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
