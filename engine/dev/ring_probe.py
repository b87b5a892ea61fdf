"""Issue 14, run 29 (engine/dev/PERF.md): the decode products through engine/kernels_ring.py (a
warp-specialized TMA ring with wgmma, one kernel a product, W staged before the PDL wait) against
engine/kernels_skinny.py's Triton kernels, on qwen3-8b's weights:
  bits   each product (q/k/v, o, gated gate/up, down in 2 K ranges, lm_head) at 8, 4 and 1 rows: the
         ring's elements differing from the Triton kernel's, and its error against float32;
  chain  36 launches of one product in a CUDA graph, alone and each after an add+RMSNorm: us a launch;
  decode the round (replay and host-driven timers, 1 and 8 streams), tokens and logits against main's;
  32b    qwen3-32b at one stream (--parallel 4: 4 rows): main's round against the ring's (chain32: its chains).

    PYTHONPATH=. python3 -m engine.dev.ring_probe --out $OUT [--sections bits,chain,decode,32b,chain32]
"""
from __future__ import annotations

import json
import sys

import torch

import engine.dev.round2 as R2
import engine.dev.round4_call1 as C1
import engine.kernels_skinny as S
from engine.config import EngineConfig

RES, say, save = R2.RES, R2.say, R2.save
VARIANTS = {  # name -> KernelConfig knobs (the first: the plain kernels); runs 29-30 also ran PDL 2 alone,
    "main": {"ring": False, "pdl": 0},  # the ring alone and ring + PDL 2; run 31 q/k/v in 16 columns and
    "ring + pdl 3": {"ring": True, "pdl": 3},  # lm_head on the ring (engine/dev/PERF.md)
}
CHAIN = {"triton": (0, False), "ring pdl 3": (3, True)}
STAGED = ()  # run 33 ran 12 and 16 stages staged before the wait (the shipped 8 won)
# programs a product (kernels_ring.PROGRAMS): run 36 ran q/k/v's 192 tiles on 96 programs and gate/up's 768 on
# 128 (shipped since); run 37 fewer: each table a round, each count a chain
QKV, O, GU, DOWN = (6144, 4096), (4096, 4096), (24576, 4096, "gated"), (4096, 12288)
PROGRAM_TABLES = [{QKV: 96, GU: 96, O: 64, DOWN: 64}, {QKV: 64, GU: 96}]
PROGRAM_CHAINS = {QKV: (64,), GU: (96,), O: (64,), DOWN: (64,)}


def _mats(model):
    layers = model.model.layers
    return {"q/k/v": [l.self_attn.wqkv for l in layers], "o": [l.self_attn.o_proj.weight for l in layers],
            "gate/up gated": [l.mlp.w_gate_up for l in layers], "down": [l.mlp.down_proj.weight for l in layers],
            "lm_head": [model.lm_head.weight]}


def sec_bits(model):
    """Ring against Triton, eagerly, per product and row count."""
    from engine import kernels_ring as R
    out = RES.setdefault("bits", {})
    out["ring available"] = R.available()
    for name, ws in _mats(model).items():
        w = ws[0]
        gated = name.startswith("gate")
        for m in (8, 4, 1):
            g = torch.Generator(device=w.device).manual_seed(m)
            x = torch.randn(m, w.shape[1], generator=g, device=w.device).to(w.dtype)
            ref = S.gate_up_silu(x, w) if gated else S.linear(x, w)
            res = {}
            for pdl in (0, 2):
                with S.launch_mode(pdl=pdl, ring=True):
                    got = S.gate_up_silu(x, w) if gated else S.linear(x, w)
                torch.cuda.synchronize()
                res[f"pdl {pdl} differing"] = int((got != ref).sum())
            f = x.float() @ w.float().T
            if gated:
                i = w.shape[0] // 2
                f = torch.nn.functional.silu(f[:, :i]) * f[:, i:]
            res["of"] = ref.numel()
            res["ring max rel err vs float32"] = float((got.float() - f).abs().max() / f.abs().max())
            res["triton max rel err vs float32"] = float((ref.float() - f).abs().max() / f.abs().max())
            out[f"{name} rows {m}"] = res
            say("bits", name, m, json.dumps(res))
    save()


def sec_chain(model, rows: int = 8, label: str = "chain"):
    """us a launch: a launch of a product on each layer's matrix in one graph, alone and after a norm
    (lm_head: as many launches of its one matrix)."""
    from engine.kernels_fused import add_rmsnorm
    out = RES.setdefault(label, {})
    bw = RES["ceilings"]["copy_bandwidth_Bps"]
    mats = _mats(model)
    mats["lm_head"] = mats["lm_head"] * len(mats["o"])
    for pname, ws in mats.items():
        k = ws[0].shape[1]
        x = torch.randn(rows, k, device=ws[0].device).to(ws[0].dtype)
        r, nw = torch.randn_like(x), torch.ones(k, device=ws[0].device, dtype=ws[0].dtype)
        prod = S.gate_up_silu if pname.startswith("gate") else S.linear
        nbytes = ws[0].numel() * ws[0].element_size()
        from engine import kernels_ring as R
        modes = dict(CHAIN)
        if pname != "lm_head":  # run 33: stages of W asked for before the wait (8 shipped)
            modes |= {f"ring pdl 3, {n} staged": (3, True) for n in STAGED}
        key = (*ws[0].shape, "gated") if pname.startswith("gate") else tuple(ws[0].shape)
        modes |= {f"ring pdl 3, {n} programs": (3, True) for n in PROGRAM_CHAINS.get(key, ())}
        for mname, (pdl, ring) in modes.items():
            shipped, staged = dict(R.SHAPES), R._STAGED
            if mname.endswith("staged"):
                R._STAGED = int(mname.split()[-2])
            shipped_programs = dict(R.PROGRAMS)
            if mname.endswith("programs"):
                R.PROGRAMS[key] = int(mname.split()[-2])
            with S.launch_mode(pdl=pdl, ring=ring):
                alone = C1.graph_us(C1.chain_graph(lambda i: prod(x, ws[i]), len(ws))) / len(ws)
                normed = C1.graph_us(C1.chain_graph(lambda i: prod(add_rmsnorm(x, r, nw, 1e-6)[1], ws[i]),
                                                    len(ws))) / len(ws)
            R.SHAPES.clear(); R.SHAPES.update(shipped)  # noqa: E702
            R._STAGED = staged
            R.PROGRAMS.clear(); R.PROGRAMS.update(shipped_programs)  # noqa: E702
            out[f"{pname} {mname}"] = {"alone_us": alone, "alone_of_bw": nbytes / (alone * 1e-6) / bw,
                                       "after_norm_us": normed, "stream_us": nbytes / bw * 1e6}
            say(f"{label} {pname:14s} {mname:14s}: alone {alone:6.1f} us ({nbytes / (alone * 1e-6) / bw:5.1%} of copy),"
                f" after a norm {normed:6.1f} us; bytes at copy rate {nbytes / bw * 1e6:5.1f} us")
        save()


def sec_round(base):
    """The round: the defaults (TMA ring, PDL 3) against the plain kernels (ring off, PDL 0); bits, replay
    and host-driven timers (3 interleaved turns), the host's part of a 1-stream round."""
    from dataclasses import replace

    from engine.config import KernelConfig
    from engine.runner import ModelRunner
    out = RES.setdefault("round", {})
    from engine import kernels_ring as R
    plain = ModelRunner(replace(base.cfg, kernels=KernelConfig(ring=False, pdl=0)), model=base.model)
    runners = {"plain (ring off, PDL 0)": plain, "defaults": base}
    for n in STAGED:  # each runner captures its graph as it is made
        R._STAGED, shipped = n, R._STAGED
        runners[f"{n} staged"] = ModelRunner(base.cfg, model=base.model)
        R._STAGED = shipped
    for table in PROGRAM_TABLES:
        shipped = dict(R.PROGRAMS)
        R.PROGRAMS.update(table)
        runners["programs " + ", ".join(map(str, R.PROGRAMS.values()))] = ModelRunner(base.cfg, model=base.model)
        R.PROGRAMS.clear(); R.PROGRAMS.update(shipped)  # noqa: E702
    out["defaults describe"] = {k: base.describe().get(k) for k in ("decode_ring", "decode_pdl")}
    say(json.dumps(out["defaults describe"]))
    C1.check_bits(runners, out)
    save()
    C1.time_rounds(runners, out, "round")
    for name, r in runners.items():
        out[f"{name} host split"] = host_split(r)
        say("host split", name, json.dumps(out[f"{name} host split"]))
    save()


def host_split(r, rounds: int = 60) -> dict:
    """Median us of a 1-stream round through decode() (the engine bench's timer, one round), and its
    parts on the runner's own path: _padded, the rows written into the pinned buffer, the replay call
    (the graph copies them in), the wait for the tokens (GPU time not yet done)."""
    import statistics
    import time
    lanes, toks, pos = [0], [r.prefill(0, R2.prompt(128, 3))], [128]
    keys = ("padded", "numpy write", "replay call", "tokens wait", "parts round", "decode() round")
    parts: dict = {k: [] for k in keys}
    with torch.inference_mode():
        for i in range(rounds):
            t = [time.perf_counter()]
            rows, where = r._padded(lanes, toks, pos)
            t.append(time.perf_counter())
            r._h_np[:3] = rows
            t.append(time.perf_counter())
            r.graph.replay()
            t.append(time.perf_counter())
            out = r._s_out.tolist()
            t.append(time.perf_counter())
            toks, pos = [out[row] for row in where], [p + 1 for p in pos]
            t0 = time.perf_counter()
            toks = r.decode(lanes, toks, pos)
            t1 = time.perf_counter()
            pos = [p + 1 for p in pos]
            if i >= 5:
                for k, v in zip(keys, [(b - a) * 1e6 for a, b in zip(t, t[1:])] + [(t[-1] - t[0]) * 1e6,
                                                                                   (t1 - t0) * 1e6]):
                    parts[k].append(v)
    return {k: statistics.median(v) for k, v in parts.items()}


def sec_32b(best: dict, chains: bool):
    """qwen3-32b at one stream (--parallel 4): its products' chains at 4 rows, then its round at PDL 0 and
    at the defaults (PDL 3; the ring takes none of its shapes)."""
    from dataclasses import replace

    from engine.config import KernelConfig
    from engine.runner import ModelRunner
    cfg = EngineConfig(model=C1.MODEL_32B, device="cuda", dtype="bfloat16", parallel=4, max_model_len=1024,
                       prefill_rows=1024)
    base = ModelRunner(cfg)
    if chains:
        R2._guard("chain32", lambda: sec_chain(base.model, rows=4, label="chain32"))
    runners = {"pdl 0": ModelRunner(replace(cfg, kernels=KernelConfig(pdl=0)), model=base.model),
               "defaults (pdl 3, no ring shape)": base}
    C1.time_32b(runners, base)


def main(argv):
    from engine.runner import ModelRunner
    t0 = R2.begin(argv)
    secs = (argv[argv.index("--sections") + 1] if "--sections" in argv else "bits,chain,decode,32b,chain32").split(",")
    import triton
    RES["triton"], RES["variants"] = triton.__version__, {k: str(v) for k, v in VARIANTS.items()}
    say(json.dumps(RES))
    best = {"ring": True, "pdl": 2}
    base = ModelRunner(EngineConfig(model=C1.MODEL_8B, device="cuda", dtype="bfloat16", parallel=8,
                                    max_model_len=2304, prefill_rows=4096))
    if "bits" in secs:
        R2._guard("bits", lambda: sec_bits(base.model))
    if "chain" in secs:
        R2._guard("chain", lambda: sec_chain(base.model))
    if "decode" in secs:
        best = R2._guard("decode", lambda: C1.sec_decode(base, VARIANTS)) or best
    if "round" in secs:
        R2._guard("round", lambda: sec_round(base))
    base = None
    torch.cuda.empty_cache()
    if "32b" in secs:
        R2._guard("32b", lambda: sec_32b(best, "chain32" in secs))
    R2.finish(t0)


if __name__ == "__main__":
    main(sys.argv[1:])
