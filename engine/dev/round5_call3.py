"""Issue 14, round 5, third device call (run 19, engine/dev/PERF.md): why the q/k fold of run 18
(engine/kernels_qkfold.py) did not give main's bits. At the kernel level, on random data at the
engine's shapes, against kernels_fused.qk_norm_rope_write + the split attention: the K and V rows it
writes, the q it attends with (read back from memory: fold_qk_norm 3), the attention output, with
the K/V loads through L1 or past it (4), counting the elements that differ. Then the engine's
tokens and logits for each form against main, timed as before, and qwen3-32b with the best.

    PYTHONPATH=. python3 -m engine.dev.round5_call3 --out $OUT
    TRITON_INTERPRET=1 PYTHONPATH=. python3 -m engine.dev.round5_call3 --out /tmp/r5 --dry-run   # CPU, small
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
    "+ qk fold": {"fold_qk_norm": 1},
    "+ qk fold, q through memory": {"fold_qk_norm": 3},
    "+ qk fold, q through memory, K/V .cg": {"fold_qk_norm": 4},
}
MODES = {1: (False, 0), 2: (True, 0), 3: (False, 1), 4: (False, 2)}  # fold_qk_norm -> (QK_STRIDED, QK_DIAG)


def _diff(a, b) -> dict:
    ne = a != b
    return {"differ": int(ne.sum()), "of": a.numel(), "max": float((a.float() - b.float()).abs().max())}


def sec_diag(dev, dtype):
    import engine.kernels as K
    from engine.kernels_fused import qk_norm_rope_write
    from engine.model import rope_tables
    from engine.config import ModelConfig
    out = RES.setdefault("diag", {})
    small = dev == "cpu"
    h, kvh, d, p = 32, 8, 128, 8
    max_len = 600 if small else 2304
    g = torch.Generator(device=dev).manual_seed(0)
    qkv = (torch.randn(p, (h + 2 * kvh) * d, generator=g, device=dev) * 2).to(dtype)
    wq = (1 + 0.3 * torch.randn(d, generator=g, device=dev)).to(dtype)
    wk = (1 + 0.3 * torch.randn(d, generator=g, device=dev)).to(dtype)
    cfg = ModelConfig(vocab_size=8, hidden_size=8, intermediate_size=8, num_hidden_layers=1, num_attention_heads=h,
                      num_key_value_heads=kvh, head_dim=d)
    cos, sin = (t.to(dtype) for t in rope_tables(cfg, max_len, dev))
    k0 = torch.randn(1, p + 1, max_len, kvh, d, generator=g, device=dev).to(dtype)
    v0 = torch.randn(1, p + 1, max_len, kvh, d, generator=g, device=dev).to(dtype)
    lanes = torch.arange(p, device=dev)
    pos = torch.tensor([0, 128, 255, 256, 300, 400, 599, 5] if small else [0, 128, 255, 256, 700, 1500, 2303, 5],
                       device=dev)

    class KV:
        pass
    a = KV()
    a.k, a.v = k0.clone(), v0.clone()
    q_ref = qk_norm_rope_write(qkv, wq, wk, cos, sin, a.k[0], a.v[0], lanes, pos, h, kvh, d, 1e-6)
    o_ref = K.decode_attention(a, 0, q_ref, lanes, pos)
    for mode, (strided, diag) in MODES.items():
        K.QK_STRIDED, K.QK_DIAG = strided, diag
        b = KV()
        b.k, b.v = k0.clone(), v0.clone()
        o = K.decode_attention(b, 0, qkv, lanes, pos, qk=(wq, wk, cos, sin, h, 1e-6))
        res = {"k rows": _diff(b.k, a.k), "v rows": _diff(b.v, a.v), "attention": _diff(o, o_ref)}
        if diag:
            res["q"] = _diff(K._diag_q[0], q_ref)
        out[f"mode {mode}"] = res
        say("diag", mode, json.dumps(res))
    K.QK_STRIDED, K.QK_DIAG = False, 0
    R2.save()


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
    import triton
    RES["triton"], RES["variants"] = triton.__version__, {k: str(v) for k, v in VARIANTS.items()}
    say(json.dumps(RES, default=str)[:2000])
    R2._guard("diag", lambda: sec_diag(dev, torch.float32 if dry else torch.bfloat16))
    C1.tokens_of = R51.tokens_of
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
