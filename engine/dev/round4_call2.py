"""Issue 14, round 4, second device call (run 16): the decode round with PDL 2 and each skinny
program asking L2 for its own first weights before its grid-dependency wait (kernels_skinny.PRELOAD,
the pipelined loop untouched), 32 / 96 / 256 KiB a program, beside PDL off and PDL 2 alone and a
control without PDL; bits checked; product chains; qwen3-32b at one stream with the best.

    PYTHONPATH=. python3 -m engine.dev.round4_call2 --out $OUT
"""
from __future__ import annotations

import json
import sys

import torch
import triton

import engine.dev.round2 as R2
import engine.dev.round4_call1 as C1
from engine.config import EngineConfig

RES, say = R2.RES, R2.say
KB = 1 << 10
VARIANTS = {
    "pdl off (default)": {},
    "pdl 2": {"pdl": 2},
    "pdl 2 + l2 own 32K": {"pdl": 2, "preload": 32 * KB},
    "pdl 2 + l2 own 96K": {"pdl": 2, "preload": 96 * KB},
    "pdl 2 + l2 own 256K": {"pdl": 2, "preload": 256 * KB},
    "pdl off + l2 own 32K (control)": {"preload": 32 * KB},
}
CHAIN = {"pdl off": (0, 0), "pdl 2": (2, 0), "pdl 2 + l2 own 32K": (2, 32 * KB), "pdl 2 + l2 own 96K": (2, 96 * KB)}


def main(argv):
    from engine.runner import ModelRunner
    t0 = R2.begin(argv)
    RES["triton"], RES["variants"] = triton.__version__, {k: str(v) for k, v in VARIANTS.items()}
    say(json.dumps(RES))
    base = ModelRunner(EngineConfig(model=C1.MODEL_8B, device=C1.DEVICE, dtype=C1.DTYPE, parallel=8,
                                    max_model_len=2304, prefill_rows=4096))
    best = R2._guard("decode", lambda: C1.sec_decode(base, VARIANTS)) or {"pdl": 2}
    torch.cuda.empty_cache()
    R2._guard("chain", lambda: C1.sec_chain(base.model, CHAIN))
    del base
    torch.cuda.empty_cache()
    R2._guard("32b", lambda: C1.sec_32b(best))
    R2.finish(t0)


if __name__ == "__main__":
    main(sys.argv[1:])
