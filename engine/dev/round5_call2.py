"""Issue 14, round 5, second device call (run 18, engine/dev/PERF.md): the q/k per-head RMSNorm +
RoPE + K/V cache write done by the split attention (engine/kernels_qkfold.py, KernelConfig.fold_qk_norm;
1 and 2 are the two lane layouts its sum of squares can reproduce), on top of the folded combine,
against the round of main (neither fold): tokens and logits bitwise first (qwen3-8b and qwen3-32b,
1 and 8 streams, rows of 1 to 3 splits), then the replay and host-driven timers at 1 and 8 streams,
a per-kernel profile of main and of the best, qwen3-32b side by side; and the layout Triton gives
the standalone q/k kernel on this device (which of 1 and 2 should match).

    PYTHONPATH=. python3 -m engine.dev.round5_call2 --out $OUT
    TRITON_INTERPRET=1 PYTHONPATH=. python3 -m engine.dev.round5_call2 --out /tmp/r5 --dry-run   # CPU, tiny
"""
from __future__ import annotations

import json
import sys
import time

import torch

import engine.dev.round2 as R2
import engine.dev.round4_call1 as C1
import engine.dev.round5_call1 as R51
from engine.config import EngineConfig

RES, say = R2.RES, R2.say
VARIANTS = {
    "main (no fold)": {"fold_combine": False},
    "fold combine (default)": {},
    "fold combine + qk fold, lanes 2l/2l+1": {"fold_qk_norm": 1},
    "fold combine + qk fold, lanes l/l+32": {"fold_qk_norm": 2},
}


def sec_layout(dev):
    """The standalone q/k kernel compiled here, at the engine's shapes: the layouts of its tensors."""
    from engine.kernels_fused import qk_norm_rope_write
    h, kvh, d = 32, 8, 128
    qkv = torch.randn(8, (h + 2 * kvh) * d, device=dev).to(torch.bfloat16)
    w = torch.ones(d, device=dev, dtype=torch.bfloat16)
    tab = torch.ones(64, d, device=dev, dtype=torch.bfloat16)
    kc = torch.zeros(9, 64, kvh, d, device=dev, dtype=torch.bfloat16)
    lanes, pos = torch.arange(8, device=dev), torch.arange(8, device=dev)
    qk_norm_rope_write(qkv, w, w, tab, tab, kc, kc.clone(), lanes, pos, h, kvh, d, 1e-6)
    import engine.kernels_fused as F
    found = []
    for cache in getattr(F._qk_norm_rope_kernel, "device_caches", {}).values():
        for ck in (cache[0] if isinstance(cache, tuple) else cache).values():
            asm = getattr(ck, "asm", {})
            found += [line.strip()[:160] for line in str(asm.get("ttgir", "")).splitlines() if line.startswith("#")]
    RES["standalone qk kernel layouts"] = found or "not found"
    say("layouts", json.dumps(found))


def main(argv):
    from engine.runner import ModelRunner
    dry = "--dry-run" in argv
    m8, m32, dev, dt = ("tiny", "tiny", "cpu", "float32") if dry else (C1.MODEL_8B, C1.MODEL_32B, "cuda", "bfloat16")
    if dry:
        R2.OUT = argv[argv.index("--out") + 1]
        torch.cuda.Event = R51._CpuEvent
        RES["ceilings"] = {"copy_bandwidth_Bps": 1e11}
        t0 = time.perf_counter()
    else:
        t0 = R2.begin(argv)
        R2._guard("layout", lambda: sec_layout(dev))
    import triton
    RES["triton"], RES["variants"] = triton.__version__, {k: str(v) for k, v in VARIANTS.items()}
    say(json.dumps(RES, default=str)[:2000])
    C1.tokens_of = R51.tokens_of  # sec_decode's bit check, with rows of several splits
    base = ModelRunner(EngineConfig(model=m8, device=dev, dtype=dt, parallel=8, max_model_len=2304,
                                    prefill_rows=4096))
    best = R2._guard("decode", lambda: C1.sec_decode(base, VARIANTS)) or {"fold_qk_norm": 1}
    del base
    if not dry:
        torch.cuda.empty_cache()
    R2._guard("32b", lambda: R51.sec_32b(best, m32, dev, dt, base_kw={"fold_combine": False}))
    R2.finish(t0)


if __name__ == "__main__":
    main(sys.argv[1:])
