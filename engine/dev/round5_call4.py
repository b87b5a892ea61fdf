"""Issue 14, round 5, fourth device call (run 20, engine/dev/PERF.md): the two folds as shipped
(the combine and the q/k norm + RoPE + K/V write done by the split attention, q read back through
memory) against main's round and against the combine fold alone: at the kernel level (K and V rows,
q, attention output against the standalone kernels, counting differing elements), then tokens and
logits of qwen3-8b and qwen3-32b at 1 and 8 streams, replay and host-driven timers, a profile.
Runs 18 and 19 ran engine/dev/round5_call2.py and round5_call3.py at commits f122586 and 617fe7b
(the q/k fold with q from registers, two lane layouts, K/V loads past L1); removed with those forms.

    PYTHONPATH=. python3 -m engine.dev.round5_call4 --out $OUT
    TRITON_INTERPRET=1 PYTHONPATH=. python3 -m engine.dev.round5_call4 --out /tmp/r5 --dry-run   # CPU, small
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
MAIN = {"fold_combine": False, "fold_qk_norm": False}
VARIANTS = {
    "main (no fold)": MAIN,
    "fold combine only": {"fold_qk_norm": False},
    "both folds (default)": {"fold_combine": True, "fold_qk_norm": True},
}


def _diff(a, b) -> dict:
    return {"differ": int((a != b).sum()), "of": a.numel(), "max": float((a.float() - b.float()).abs().max())}


def sec_diag(dev, dtype):
    """The q/k fold against qk_norm_rope_write + the split attention on random data, the engine's shapes."""
    import engine.kernels as K
    from engine.config import ModelConfig
    from engine.kernels_fused import qk_norm_rope_write
    from engine.model import rope_tables
    out = RES.setdefault("diag", {})
    small = dev == "cpu"
    p, d, max_len = 8, 128, (600 if small else 2304)
    pos = torch.tensor([0, 128, 255, 256, 300, 400, 599, 5] if small else [0, 128, 255, 256, 700, 1500, 2303, 5],
                       device=dev)
    for h, kvh in ((32, 8), (64, 8)):  # qwen3-8b's and qwen3-32b's heads
        g = torch.Generator(device=dev).manual_seed(h)
        qkv = (torch.randn(p, (h + 2 * kvh) * d, generator=g, device=dev) * 2).to(dtype)
        wq, wk = ((1 + 0.3 * torch.randn(d, generator=g, device=dev)).to(dtype) for _ in range(2))
        cfg = ModelConfig(vocab_size=8, hidden_size=8, intermediate_size=8, num_hidden_layers=1,
                          num_attention_heads=h, num_key_value_heads=kvh, head_dim=d)
        cos, sin = (t.to(dtype) for t in rope_tables(cfg, max_len, dev))
        kv0 = [torch.randn(1, p + 1, max_len, kvh, d, generator=g, device=dev).to(dtype) for _ in range(2)]
        lanes = torch.arange(p, device=dev)

        class A:
            k, v = kv0[0].clone(), kv0[1].clone()

        class B:
            k, v = kv0[0].clone(), kv0[1].clone()
        q_ref = qk_norm_rope_write(qkv, wq, wk, cos, sin, A.k[0], A.v[0], lanes, pos, h, kvh, d, 1e-6)
        ref = K.decode_attention(A, 0, q_ref, lanes, pos, fold=False)
        o = K.decode_attention(B, 0, qkv, lanes, pos, fold=True, qk=(wq, wk, cos, sin, h, 1e-6))
        res = {"k rows": _diff(B.k, A.k), "v rows": _diff(B.v, A.v), "attention": _diff(o, ref)}
        out[f"heads {h}/{kvh}"] = res
        say("diag", h, kvh, json.dumps(res))
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
    R2._guard("decode", lambda: C1.sec_decode(base, VARIANTS))
    base = None  # the 8b runners go before the 32b model loads
    if not dry:
        torch.cuda.empty_cache()
    R2._guard("32b", lambda: R51.sec_32b({"fold_qk_norm": False}, m32, dev, dt, base_kw=MAIN))
    R2.finish(t0)


if __name__ == "__main__":
    main(sys.argv[1:])
